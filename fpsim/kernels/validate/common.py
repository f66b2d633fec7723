"""What every validation of :mod:`fpsim.kernels.validate` shares: the result types
(:class:`Case`, :class:`Mismatch`), the description of codes field by field, the random
words of stochastic rounding, the sample trace's tensors and the interpreter guard.

Nothing here imports torch or triton at import time; the per-kernel modules (``cast``,
``blocks``, ``optim``, ``accumulate``) import from here, never the other way round.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fpsim.formats import AnyFormat, IntFormat

SHOWN = 8
"""Mismatches kept per case."""


# --- results ----------------------------------------------------------------------------------


@dataclass
class Mismatch:
    """One element where the kernel and the emulator disagree.

    Attributes:
        inputs: the input set (``"midpoints"``, ``"shape (3, 5, 7)"``, ...).
        index: flat index in that set.
        input_bits: the input's bit pattern in hex (float32, or float16/bfloat16 input).
        input: the input value.
        expected / got: the emulator's and the kernel's code (for value kernels: float32 bits).
        expected_fields / got_fields: the codes split into sign, exponent and mantissa
            (integers: the signed value), with their value.
    """

    inputs: str
    index: int
    input_bits: str
    input: float
    expected: int
    got: int
    expected_fields: str
    got_fields: str

    def describe(self) -> str:
        """Two lines: the input, then expected and obtained code field by field."""
        return (
            f"[{self.inputs} #{self.index}] x={self.input!r} bits={self.input_bits}\n"
            f"      want {self.expected_fields}\n      got  {self.got_fields}"
        )


@dataclass
class Case:
    """The comparison of one kernel with the emulator for one format, mode and option set.

    Attributes:
        kernel: the kernel's name.
        format: the format's name.
        rounding: the rounding mode's name ("-" for decode).
        options: saturate, subnormals, stochastic_bits, input dtype, random source.
        compared: how many elements were compared.
        mismatches: how many differ (NaNs of the format compared by class when
            ``options["nan_by_class"]``).
        first: the first few mismatches, with bits.
        skipped: why the case did not run (then compared == 0 and it counts as passed).
        error: the exception the kernel raised (the case fails).
    """

    kernel: str
    format: str
    rounding: str
    options: dict[str, Any] = field(default_factory=dict)
    compared: int = 0
    mismatches: int = 0
    first: list[Mismatch] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """No mismatch and no error."""
        return self.mismatches == 0 and self.error is None

    def row(self) -> dict[str, Any]:
        """A JSON-ready dict (the mismatches as dicts)."""
        d = asdict(self)
        d["ok"] = self.ok
        return d


@functools.cache
def trace_tensors(quick: bool) -> tuple[tuple[str, tuple[np.ndarray, ...]], ...]:
    """(name, float32 tensors) of the bundled sample trace's steps used for validation."""
    from fpsim.trace import open_trace, sample_trace_path

    trace = open_trace(sample_trace_path())
    steps = trace.steps
    picked = [steps[-1]] if quick else sorted({steps[0], steps[len(steps) // 2], steps[-1]})
    out = []
    for step in picked:
        arrays = tuple(
            np.asarray(trace.read(e), dtype=np.float32) for e in trace.entries(step=step) if e.is_float
        )
        out.append((f"trace step {step}", arrays))
    if not quick:  # one recorded tensor with its own 2-D shape
        e = max(trace.entries(step=steps[-1], role="grad"), key=lambda e: e.size)
        out.append((f"trace {e.name} {tuple(e.shape)}", (np.array(trace.read(e), dtype=np.float32),)))
    return tuple(out)


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of an input dtype name: float32, float16 or bfloat16 (ValueError else)."""
    if name == "float16":
        return np.dtype(np.float16)
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name == "float32":
        return np.dtype(np.float32)
    raise ValueError(f"input_dtype must be float32, float16 or bfloat16, got {name!r}")


def check_cases(cases: str) -> bool:
    """Whether ``cases`` is "quick" (ValueError unless it is "full" or "quick")."""
    if cases not in ("full", "quick"):
        raise ValueError(f"cases must be 'full' or 'quick', got {cases!r}")
    return cases == "quick"


# --- describing codes -----------------------------------------------------------------------


def code_fields(code: int, fmt: AnyFormat) -> str:
    """A code in hex with its sign, exponent and mantissa fields (integers: the signed value)
    and the value it decodes to."""
    from fpsim.emulate.reference import decode_scalar

    code = int(code)
    width = (fmt.bits + 3) // 4
    if not 0 <= code < (1 << fmt.bits):
        return f"0x{code:x} (out of range for {fmt.bits} bits)"
    value = decode_scalar(code, fmt)
    if isinstance(fmt, IntFormat):
        k = code - (1 << fmt.bits) if fmt.signed and code >> (fmt.bits - 1) else code
        return f"0x{code:0{width}x} (k={k}) = {value!r}"
    m, e = fmt.mantissa_bits, fmt.exponent_bits
    man, exp = code & ((1 << m) - 1), (code >> m) & ((1 << e) - 1)
    fields = f"e={exp:0{e}b} m={man:0{m}b}" if m else f"e={exp:0{e}b}"
    if fmt.signed:
        fields = f"s={code >> (e + m)} " + fields
    return f"0x{code:0{width}x} ({fields}) = {value!r}"


def f32_fields(bits: int) -> str:
    """float32 bits in hex, split into sign, exponent and mantissa, with their value."""
    bits = int(bits) & 0xFFFFFFFF
    v = float(np.uint32(bits).view(np.float32))
    return f"0x{bits:08x} (s={bits >> 31} e={(bits >> 23) & 0xFF:08b} m={bits & 0x7FFFFF:023b}) = {v!r}"


def input_bits(v: np.ndarray) -> str:
    """The bit pattern of a one-element float32 / float16 / bfloat16 array in hex."""
    u = {2: np.uint16, 4: np.uint32}[v.dtype.itemsize]
    return f"0x{int(v.reshape(1).view(u)[0]):0{2 * v.dtype.itemsize}x}"


def binade_spread(rng: np.random.Generator, shape: int | tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    """Random float64 magnitudes spread evenly over the binades ``2**lo`` to ``2**(hi + 1)``.

    Each is ``2**e`` times a 24-bit significand in [1, 2), ``e`` an integer drawn uniformly from
    [lo, hi]: every binade equally likely and, within it, every float32 value (a cast to float32
    is exact down to 2**-126 and rounds below). Made of integer draws and ``ldexp`` only, so the
    same values on every CPU, unlike ``np.exp`` / ``np.exp2`` of a uniform draw: their last bits
    differ with numpy's SIMD dispatch, and a value on a float32 rounding boundary would move a
    validation's inputs (and its mismatch counts) from one machine to the next.
    Tested in tests/kernels/test_validate.py against the float32 fields of the values.
    """
    e = rng.integers(lo, hi, shape, endpoint=True)
    significand = rng.integers(1 << 23, 1 << 24, shape)
    return np.ldexp(significand.astype(np.float64), e - 23)


def random_words(n: int, rng: np.random.Generator) -> np.ndarray:
    """Random uint32 words with the edge words 0, 1, 2**31 - 1, 2**31, 2**32 - 1 mixed in."""
    w = rng.integers(0, 1 << 32, size=n, dtype=np.uint32)
    edge = np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF], dtype=np.uint32)
    pick = rng.random(n) < 0.1
    w[pick] = rng.choice(edge, size=int(pick.sum()))
    return w


def is_nan_code(codes: np.ndarray, fmt: AnyFormat) -> np.ndarray:
    """Which int64 codes are NaN codes of ``fmt`` (never for integer formats; out-of-range
    codes are not)."""
    if isinstance(fmt, IntFormat):
        return np.zeros(codes.shape, bool)
    from fpsim.emulate.element import decode_table

    ok = (codes >= 0) & (codes < (1 << fmt.bits))
    safe = np.where(ok, codes, 0)
    if fmt.bits == 32:
        return ok & np.isnan(safe.astype(np.uint32).view(np.float32))
    return ok & np.isnan(decode_table(fmt)[safe])


def guard(device: str) -> Any:
    """On the CPU, leave triton.language as it was after the kernel ran (a Triton 3.9
    interpreter leak; see :func:`fpsim.kernels._loader.interpreter_patches_restored`)."""
    from .._loader import interpreter_patches_restored, is_interpreted

    if is_interpreted(device) and "triton" in sys.modules:
        return interpreter_patches_restored()
    return contextlib.nullcontext()


def torch_module() -> Any:
    """torch, or ImportError saying how to install it."""
    from .._loader import require_torch

    return require_torch()
