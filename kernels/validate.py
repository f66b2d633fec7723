"""Bit-exact validation of cast kernels against the emulator (DESIGN.md, section Kernels).

:func:`validate` runs any encode-like callable (yours or one of fpsim's) on the inputs where
a rounding can go wrong and compares its codes with :func:`fpsim.emulate.element.encode`, zero
tolerance. :func:`validate_all` does that for every registered kernel x format x rounding
mode (:data:`KERNELS`; later kernels register themselves with :func:`register_kernel`), and
:func:`main` is the ``fpsim validate-kernels`` command (:func:`add_parser` wires it into a
parent parser).

Inputs (float32 unless a 16-bit input dtype is asked for), see :func:`input_sets`:

* ``codes``: every code of the format decoded, and its negative (formats up to 16 bits;
  float32: a sample of bit patterns);
* ``midpoints``: every tie between neighbouring values and its two float32 neighbours
  (integers: the halves and quarters);
* ``boundaries``: overflow points (max, the midpoint above it, max + ulp, 2 max), the
  subnormal and underflow boundaries, every power of two of float32 with its neighbours;
* ``specials``: +-0, +-inf, quiet, signalling and payload NaNs of both signs;
* ``random``: random bit patterns (every exponent) and random values spanning the format;
* ``shape ...``: odd shapes, (1,), (1023,), (2049,), (3, 5, 7) and a non-contiguous view,
  each a separate call (sizes that are no multiple of any block size);
* ``trace``: the tensors of the bundled sample trace (:func:`fpsim.trace.sample_trace_path`),
  as recorded and scaled by a power of two to the format's range.

Block kernels (``KernelSpec(recipes=True)``, e.g. ``blocks.encode_blocks``) run over the
block recipes of :data:`fpsim.formats.block.RECIPES` instead, codes and scale codes compared
with :func:`fpsim.emulate.blocks.encode_blocks` (inputs: :mod:`fpsim.kernels._validate_blocks`).

For float16 / bfloat16 inputs the set ``inputs`` holds every 16-bit pattern (exhaustive;
a sample with ``cases="quick"``).

Triton on the CPU: the kernels of :mod:`fpsim.kernels` run in Triton's interpreter on CPU
tensors whatever the environment says (see :mod:`fpsim.kernels._loader`). A kernel of your
own that calls triton's library functions (``tl.randint``, ``tl.sum``, ...) needs
``TRITON_INTERPRET=1`` set before triton is first imported, because those are decorated
at that import; :func:`main` sets it when ``--device cpu`` and triton is not imported yet.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fpsim.formats import FORMATS, AnyFormat, Format, IntFormat, RoundMode

__all__ = [
    "Case",
    "Mismatch",
    "InputSet",
    "KernelSpec",
    "KERNELS",
    "register_kernel",
    "input_sets",
    "validate",
    "validate_decode",
    "validate_all",
    "add_parser",
    "main",
]

_SHOWN = 8  # mismatches kept per case
_SHAPES_FULL = [(1,), (1023,), (2049,), (4097,), (3, 5, 7), (65537,)]
_SHAPES_QUICK = [(1,), (1023,), (2049,), (3, 5, 7)]


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


@dataclass(frozen=True)
class InputSet:
    """Named inputs: a numpy array (float32, float16 or bfloat16) of any shape.

    ``transpose`` asks for a non-contiguous tensor: the kernel gets ``x.T`` of the array,
    whose shape is then reversed.
    """

    name: str
    values: np.ndarray
    transpose: bool = False


# --- input sets ---------------------------------------------------------------------------------


def _f32(bits: Iterable[int]) -> np.ndarray:
    return np.asarray(list(bits), dtype=np.uint32).view(np.float32)


_SPECIALS = _f32(
    [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001]
    + [0x7FBFFFFF, 0x7FC00001, 0x7FFFFFFF, 0xFFFFFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000]
    + [0x7F7FFFFF, 0xFF7FFFFF]
)


def _exact_f32_with_neighbours(values: Iterable[float]) -> np.ndarray:
    """The values that are finite float32 numbers, their float32 neighbours, both signs."""
    v = np.asarray(list(values), dtype=np.float64)
    v = v[np.isfinite(v) & (np.abs(v) <= float(np.finfo(np.float32).max))]
    with np.errstate(over="ignore"):
        v32 = v.astype(np.float32)
    v32 = v32[v32.astype(np.float64) == v]
    with np.errstate(over="ignore"):
        parts = [v32, np.nextafter(v32, np.float32(np.inf)), np.nextafter(v32, np.float32(-np.inf))]
    a = np.concatenate(parts)
    return np.concatenate([a, -a])


def _sample(a: np.ndarray, n: int | None, rng: np.random.Generator, keep_ends: int = 64) -> np.ndarray:
    """``a`` (sorted) or, when longer than n, its two ends and a random subset."""
    if n is None or a.size <= n:
        return a
    mid = rng.choice(a[keep_ends:-keep_ends], size=max(0, n - 2 * keep_ends), replace=False)
    return np.concatenate([a[:keep_ends], mid, a[-keep_ends:]])


def _scaled_to(fmt: AnyFormat, a: np.ndarray) -> np.ndarray:
    """``a`` times the power of two that brings its largest magnitude just under fmt.max."""
    finite = np.abs(a[np.isfinite(a)].astype(np.float64))
    amax = float(finite.max()) if finite.size else 0.0
    if amax == 0.0:
        return a
    k = math.floor(math.log2(fmt.max / amax))
    k = max(-100, min(100, k))
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(a.astype(np.float32), k).astype(np.float32)


@functools.cache
def _trace_tensors(quick: bool) -> tuple[tuple[str, tuple[np.ndarray, ...]], ...]:
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


def _trace_sets(fmt: AnyFormat, quick: bool) -> list[InputSet]:
    """Recorded tensors: each step's tensors flattened, as recorded and each scaled by a
    power of two (exact) so that its largest magnitude lands just under the format's max."""
    out = []
    for name, arrays in _trace_tensors(quick):
        if len(arrays) == 1:
            out.append(InputSet(name, arrays[0].copy()))
            continue
        flat = [a.reshape(-1) for a in arrays]
        out.append(InputSet(name, np.concatenate(flat + [_scaled_to(fmt, a) for a in flat])))
    return out


def _shape_sets(fmt: AnyFormat, quick: bool, rng: np.random.Generator) -> list[InputSet]:
    lo, hi = _range(fmt)
    out = []
    for shape in _SHAPES_QUICK if quick else _SHAPES_FULL:
        n = math.prod(shape)
        v = np.exp(rng.uniform(math.log(lo), math.log(hi), size=n)) * rng.choice([-1.0, 1.0], size=n)
        out.append(InputSet(f"shape {shape}", v.astype(np.float32).reshape(shape)))
    v = np.exp(rng.uniform(math.log(lo), math.log(hi), size=33 * 64)).astype(np.float32).reshape(33, 64)
    out.append(InputSet("shape (64, 33) non-contiguous", v, transpose=True))
    return out


def _range(fmt: AnyFormat) -> tuple[float, float]:
    """Magnitudes to draw random values from: a little beyond the format's range."""
    if isinstance(fmt, IntFormat):
        return 2.0 ** (-fmt.fraction_bits - 3), min(fmt.max * 4, 3.0e38)
    return max(fmt.min_subnormal / 8, 1e-45), min(fmt.max * 4, 3.0e38)


def _float_sets(fmt: Format, quick: bool, rng: np.random.Generator) -> list[InputSet]:
    from fpsim.emulate.element import decode_table

    cap = 4096 if quick else None
    sets = []
    if fmt.bits <= 16:
        table = decode_table(fmt)
        vals = np.unique(table[np.isfinite(table)].astype(np.float64))
        codes = np.concatenate([table, -table])
        sets.append(InputSet("codes", _sample(np.unique(codes.view(np.uint32)).view(np.float32), cap, rng)))
        allv = np.unique(np.concatenate([vals, -vals]))
        mids = (allv[:-1] + allv[1:]) / 2  # exact in float64
        sets.append(InputSet("midpoints", _exact_f32_with_neighbours(_sample(mids, cap, rng))))
    else:
        n = 1 << (12 if quick else 16)
        bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint32)
        sets.append(InputSet("codes", bits.view(np.float32)))
        v = np.unique(bits.view(np.float32)[np.isfinite(bits.view(np.float32))].astype(np.float64))
        sets.append(InputSet("midpoints", _exact_f32_with_neighbours(v[:: max(1, v.size // 2000)])))
    m = fmt.mantissa_bits
    ulp = math.ldexp(1.0, fmt.max_exponent - m)
    mx = fmt.max
    edges = [mx, mx + ulp / 2, mx + ulp, 2 * mx, mx - ulp / 2, mx - ulp, float(np.finfo(np.float32).max)]
    sub, nrm = fmt.min_subnormal, fmt.min_normal
    edges += [sub / 2, sub, 1.5 * sub, 0.75 * sub, sub / 4, nrm, nrm - sub / 2, nrm - sub, nrm + sub / 2]
    edges += [1.0, 1.0 + fmt.eps / 2, 1.0 + fmt.eps, 1.0 - fmt.eps / 4]
    edges += [math.ldexp(1.0, e) for e in range(-149, 128)]
    sets.append(InputSet("boundaries", _exact_f32_with_neighbours(edges)))
    return sets


def _int_sets(fmt: IntFormat, quick: bool, rng: np.random.Generator) -> list[InputSet]:
    q = math.ldexp(1.0, -fmt.fraction_bits)
    ints = np.arange(fmt.min_int - 3, fmt.max_int + 4, dtype=np.float64) * q
    halves = ints + q / 2
    quarters = np.concatenate([ints + q / 4, ints + 3 * q / 4])
    cap = 4096 if quick else None
    edges = [math.ldexp(1.0, e) for e in range(-149, 128)]
    edges += [2.0**24 + 2, 2.0**24 - 1, 1e30, 3.4e38, float(np.finfo(np.float32).max), 0.49999997]
    edges += [fmt.max, fmt.max + q / 2, fmt.max + q, fmt.min, fmt.min - q / 2, fmt.min - q]
    return [
        InputSet("codes", np.concatenate([ints, -ints]).astype(np.float32)),
        InputSet(
            "midpoints", _exact_f32_with_neighbours(np.concatenate([_sample(halves, cap, rng), quarters]))
        ),
        InputSet("boundaries", _exact_f32_with_neighbours(edges)),
    ]


def _random_set(fmt: AnyFormat, n: int, rng: np.random.Generator) -> InputSet:
    bits = rng.integers(0, 1 << 32, size=n // 2, dtype=np.uint32).view(np.float32)
    lo, hi = _range(fmt)
    k = n - n // 2
    mag = np.exp(rng.uniform(math.log(lo), math.log(hi), size=k)) * rng.choice([-1.0, 1.0], size=k)
    with np.errstate(over="ignore", under="ignore"):
        return InputSet("random", np.concatenate([bits, mag.astype(np.float32)]))


def input_sets(fmt: Any, cases: str = "full", input_dtype: str = "float32", seed: int = 0) -> list[InputSet]:
    """The inputs :func:`validate` feeds a kernel for ``fmt`` (see the module docstring).

    Args:
        fmt: a format or its name.
        cases: "full" or "quick" (fewer codes, midpoints, random values, shapes and trace steps).
        input_dtype: "float32", "float16" or "bfloat16".
        seed: seed of the random parts (the sets are deterministic for a seed).

    Returns:
        InputSets with read-only numpy values of ``input_dtype`` (cached: the same call
        returns the same arrays).
    """
    from .cast import element_format

    _check_cases(cases)
    _np_dtype(input_dtype)
    return list(_input_sets(element_format(fmt), cases, input_dtype, seed))


@functools.lru_cache(maxsize=128)
def _input_sets(fmt: AnyFormat, cases: str, input_dtype: str, seed: int) -> tuple[InputSet, ...]:
    parts = _make_input_sets(fmt, cases, input_dtype, seed)
    for p in parts:
        p.values.flags.writeable = False
    return tuple(parts)


def _make_input_sets(fmt: AnyFormat, cases: str, input_dtype: str, seed: int) -> list[InputSet]:
    quick = cases == "quick"
    rng = np.random.default_rng([seed, sum(fmt.name.encode()), fmt.bits])
    if input_dtype == "float32":
        parts = _int_sets(fmt, quick, rng) if isinstance(fmt, IntFormat) else _float_sets(fmt, quick, rng)
        parts.append(InputSet("specials", _SPECIALS))
        parts.append(_random_set(fmt, 1 << (12 if quick else 18), rng))
        return parts + _shape_sets(fmt, quick, rng) + _trace_sets(fmt, quick)
    dt = _np_dtype(input_dtype)
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    if quick:
        every = np.concatenate([every[:256], rng.choice(every, 8192, replace=False), every[-256:]])
        every = np.concatenate([every, every ^ np.uint16(0x8000)])
    parts = [InputSet("inputs", every.view(dt))]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for s in _shape_sets(fmt, quick, rng) + _trace_sets(fmt, quick):
            parts.append(InputSet(s.name, s.values.astype(dt), s.transpose))
    return parts


def _np_dtype(name: str) -> np.dtype:
    if name == "float16":
        return np.dtype(np.float16)
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name == "float32":
        return np.dtype(np.float32)
    raise ValueError(f"input_dtype must be float32, float16 or bfloat16, got {name!r}")


def _check_cases(cases: str) -> bool:
    if cases not in ("full", "quick"):
        raise ValueError(f"cases must be 'full' or 'quick', got {cases!r}")
    return cases == "quick"


# --- describing codes -----------------------------------------------------------------------


def _code_fields(code: int, fmt: AnyFormat) -> str:
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


def _f32_fields(bits: int) -> str:
    bits = int(bits) & 0xFFFFFFFF
    v = float(np.uint32(bits).view(np.float32))
    return f"0x{bits:08x} (s={bits >> 31} e={(bits >> 23) & 0xFF:08b} m={bits & 0x7FFFFF:023b}) = {v!r}"


def _input_bits(v: np.ndarray) -> str:
    u = {2: np.uint16, 4: np.uint32}[v.dtype.itemsize]
    return f"0x{int(v.reshape(1).view(u)[0]):0{2 * v.dtype.itemsize}x}"


# --- running a kernel ---------------------------------------------------------------------------

EncodeFn = Callable[..., Any]


def _torch_input(torch, s: InputSet, device: str):
    a = np.ascontiguousarray(s.values)
    if a.dtype == np.float32:
        t = torch.from_numpy(a.copy())
    else:  # float16 / bfloat16 through their bits (torch.from_numpy has no bfloat16)
        t = torch.from_numpy(a.view(np.int16).copy())
        t = t.view(torch.float16 if a.dtype == np.float16 else torch.bfloat16)
    t = t.to(device)
    return t.t() if s.transpose else t


def _random_words(n: int, rng: np.random.Generator) -> np.ndarray:
    """Random uint32 words with the edge words 0, 1, 2**31 - 1, 2**31, 2**32 - 1 mixed in."""
    w = rng.integers(0, 1 << 32, size=n, dtype=np.uint32)
    edge = np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF], dtype=np.uint32)
    pick = rng.random(n) < 0.1
    w[pick] = rng.choice(edge, size=int(pick.sum()))
    return w


def _flags(value: Any, default: tuple) -> tuple:
    if value is None:
        return default
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _variants(fmt: AnyFormat, mode: RoundMode, saturate, subnormals, stochastic_bits) -> list[dict[str, Any]]:
    has_sub = isinstance(fmt, Format) and fmt.subnormals and fmt.mantissa_bits > 0
    sats = _flags(saturate, (False, True))
    subs = _flags(subnormals, (True, False) if has_sub else (True,))
    nbits = _flags(stochastic_bits, (32, 3)) if mode is RoundMode.STOCHASTIC else (None,)
    return [
        {"saturate": bool(s), "subnormals": bool(u), "stochastic_bits": b}
        for s in sats
        for u in subs
        for b in nbits
    ]


def validate(
    kernel_encode: EncodeFn,
    fmt: Any,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    *,
    cases: str = "full",
    device: str = "cpu",
    name: str | None = None,
    kind: str = "encode",
    input_dtype: str = "float32",
    random: str = "bits",
    saturate: bool | Sequence[bool] | None = None,
    subnormals: bool | Sequence[bool] | None = None,
    stochastic_bits: int | Sequence[int] | None = None,
    nan_by_class: bool = False,
    sets: Sequence[str] | None = None,
) -> list[Case]:
    """Compare an encode kernel with :func:`fpsim.emulate.element.encode`, bit for bit.

    The kernel is called as ``kernel_encode(x, fmt, rounding=..., saturate=...,
    subnormals=...)`` with ``x`` a torch tensor on ``device`` and ``fmt`` the
    :class:`~fpsim.Format` / :class:`~fpsim.IntFormat`; for stochastic rounding also with
    ``stochastic_bits=`` and ``random_bits=`` (a torch.int32 tensor of ``x``'s shape holding
    the uint32 words the emulator gets) or, with ``random="seed"``, ``seed=`` (the emulator
    then gets :func:`fpsim.kernels.philox.philox_bits`). It returns a tensor of codes of
    ``x``'s shape (any integer dtype; with ``kind="quantize"`` float32 values, compared as
    bit patterns with :func:`fpsim.emulate.element.quantize`). Inputs: :func:`input_sets`.

    Args:
        kernel_encode: the kernel's host function.
        fmt: a format or its name.
        rounding: the rounding mode.
        cases: "full" or "quick".
        device: "cpu" (Triton's interpreter) or "cuda".
        name: the kernel's name in the report (default: the callable's qualified name).
        kind: "encode" (codes) or "quantize" (float32 values).
        input_dtype: "float32", "float16" or "bfloat16" inputs.
        random: "bits" (pass random_bits) or "seed" (pass seed) for stochastic rounding.
        saturate: a flag or flags to try (default both).
        subnormals: a flag or flags to try (default both where the format has subnormals).
        stochastic_bits: value(s) to try in stochastic mode (default 32 and 3).
        nan_by_class: count two NaN codes of the format as equal (hardware casts).
        sets: only the input sets whose names start with one of these.

    Returns:
        One :class:`Case` per option combination (saturate x subnormals x stochastic_bits),
        each over every input set.

    Example:
        Validate your own kernel; here a (wrong) one that truncates float32 to bfloat16
        by dropping the low 16 bits::

            import torch
            from .validate import validate

            def truncate_bf16(x, fmt, *, rounding, saturate, subnormals, **_):
                return ((x.view(torch.int32) >> 16) & 0xFFFF).to(torch.uint16)

            cases = validate(truncate_bf16, "bfloat16", "nearest_even", cases="quick",
                             saturate=False, subnormals=True)
            for c in cases:
                print(c.kernel, c.format, c.compared, c.mismatches)
                for m in c.first:
                    print(m.describe())

        A Triton kernel is validated the same way through its host wrapper; on the CPU set
        ``TRITON_INTERPRET=1`` before importing triton (see the module docstring).
    """
    torch = _torch()
    from fpsim.emulate import element as emulate

    from .cast import element_format
    from .philox import philox_bits

    fmt, mode = element_format(fmt), RoundMode.parse(rounding)
    if kind not in ("encode", "quantize"):
        raise ValueError(f"kind must be 'encode' or 'quantize', got {kind!r}")
    if random not in ("bits", "seed"):
        raise ValueError(f"random must be 'bits' or 'seed', got {random!r}")
    name = name or getattr(kernel_encode, "__qualname__", repr(kernel_encode))
    parts = input_sets(fmt, cases, input_dtype)
    if sets is not None:
        parts = [p for p in parts if any(p.name.startswith(s) for s in sets)]
    rng = np.random.default_rng([7, fmt.bits, list(RoundMode).index(mode)])
    out = []
    for opts in _variants(fmt, mode, saturate, subnormals, stochastic_bits):
        options = {**opts, "input_dtype": input_dtype, "nan_by_class": nan_by_class}
        if mode is RoundMode.STOCHASTIC:
            options["random"] = random
        else:
            del options["stochastic_bits"]
        case = Case(name, fmt.name, mode.value, options)
        for k, s in enumerate(parts):
            x = _torch_input(torch, s, device)
            x32 = x.float().cpu().numpy()  # exact widening; what the emulator gets
            kw: dict[str, Any] = {
                "rounding": mode.value,
                "saturate": opts["saturate"],
                "subnormals": opts["subnormals"],
            }
            ekw = dict(kw)
            if mode is RoundMode.STOCHASTIC:
                kw["stochastic_bits"] = ekw["stochastic_bits"] = opts["stochastic_bits"]
                if random == "seed":
                    seed = 1000 * k + 17
                    kw["seed"] = seed
                    ekw["random_bits"] = philox_bits(seed, x32.size).reshape(x32.shape)
                else:
                    words = _random_words(x32.size, rng).reshape(x32.shape)
                    ekw["random_bits"] = words
                    kw["random_bits"] = torch.from_numpy(words.view(np.int32).copy()).to(device)
            try:
                with _guard(device):
                    got = kernel_encode(x, fmt, **kw)
                convert = _codes_numpy if kind == "encode" else _values_bits
                got_np = convert(torch, got, x32.shape)
            except Exception as e:  # report it as the case's error and go on with the next case
                case.error = f"[{s.name}] {type(e).__name__}: {e}"
                break
            if kind == "encode":
                want = np.asarray(emulate.encode(x32, fmt, **ekw)).astype(np.int64)
            else:
                want = np.asarray(emulate.quantize(x32, fmt, **ekw)).view(np.uint32).astype(np.int64)
            _tally(case, s.name, x, want, got_np, fmt, kind, nan_by_class)
        out.append(case)
    return out


def _codes_numpy(torch, got, shape) -> np.ndarray:
    if not isinstance(got, torch.Tensor):
        raise TypeError(f"the kernel must return a torch tensor, got {type(got).__name__}")
    g = got.detach().cpu()
    if tuple(g.shape) != tuple(shape):
        raise ValueError(f"the kernel returned shape {tuple(g.shape)} for input shape {tuple(shape)}")
    if g.dtype in (torch.uint16, torch.uint32):
        g = g.to(torch.int64)
    return g.numpy().astype(np.int64)


def _values_bits(torch, got, shape) -> np.ndarray:
    if not isinstance(got, torch.Tensor):
        raise TypeError(f"the kernel must return a torch tensor, got {type(got).__name__}")
    g = got.detach().cpu()
    if g.dtype != torch.float32 or tuple(g.shape) != tuple(shape):
        raise ValueError(
            f"quantize must return float32 of shape {tuple(shape)}, got {g.dtype} {tuple(g.shape)}"
        )
    return g.contiguous().view(torch.int32).numpy().view(np.uint32).astype(np.int64)


def _is_nan_code(codes: np.ndarray, fmt: AnyFormat) -> np.ndarray:
    if isinstance(fmt, IntFormat):
        return np.zeros(codes.shape, bool)
    from fpsim.emulate.element import decode_table

    ok = (codes >= 0) & (codes < (1 << fmt.bits))
    safe = np.where(ok, codes, 0)
    if fmt.bits == 32:
        return ok & np.isnan(safe.astype(np.uint32).view(np.float32))
    return ok & np.isnan(decode_table(fmt)[safe])


def _tally(case: Case, set_name: str, x, want, got, fmt, kind, nan_by_class) -> None:
    w, g = want.reshape(-1), got.reshape(-1)
    bad = w != g
    if nan_by_class and bad.any():
        if kind == "encode":
            bad &= ~(_is_nan_code(w, fmt) & _is_nan_code(g, fmt))
        else:
            bad &= ~(
                np.isnan(w.astype(np.uint32).view(np.float32))
                & np.isnan(g.astype(np.uint32).view(np.float32))
            )
    case.compared += w.size
    nbad = int(bad.sum())
    case.mismatches += nbad
    if not nbad or len(case.first) >= _SHOWN:
        return
    xin = x.detach().cpu().contiguous().reshape(-1)
    xv = xin.view(_torch_int_of(xin)).numpy()
    fields = (lambda c: _code_fields(c, fmt)) if kind == "encode" else _f32_fields
    for i in np.flatnonzero(bad)[: _SHOWN - len(case.first)]:
        raw = xv[i : i + 1]
        value = raw.view(np.float32 if raw.dtype == np.int32 else _src_np(xin))[0]
        case.first.append(
            Mismatch(
                set_name,
                int(i),
                _input_bits(raw),
                float(value),
                int(w[i]),
                int(g[i]),
                fields(w[i]),
                fields(g[i]),
            )
        )


def _torch_int_of(t) -> Any:
    """The signed integer torch dtype of a float tensor's width (for bit views)."""
    import torch

    return {4: torch.int32, 2: torch.int16}[t.element_size()]


def _src_np(t) -> np.dtype:
    import torch

    return _np_dtype("float16" if t.dtype == torch.float16 else "bfloat16")


def validate_decode(
    kernel_decode: Callable[[Any, Any], Any],
    fmt: Any,
    *,
    cases: str = "full",
    device: str = "cpu",
    name: str | None = None,
    nan_by_class: bool = False,
) -> list[Case]:
    """Compare a decode kernel ``kernel_decode(codes, fmt) -> float32 tensor`` with
    :func:`fpsim.emulate.element.decode` on every code (formats up to 16 bits) or a sample of
    bit patterns (float32), as float32 bit patterns.

    Codes are passed as a torch tensor of the format's code dtype (uint8/uint16/uint32).
    Returns one :class:`Case` (rounding "-").
    """
    torch = _torch()
    from fpsim.emulate import element as emulate

    from .cast import element_format

    fmt = element_format(fmt)
    quick = _check_cases(cases)
    name = name or getattr(kernel_decode, "__qualname__", repr(kernel_decode))
    if fmt.bits <= 16:
        codes = np.arange(1 << fmt.bits, dtype=np.int64)
    else:
        rng = np.random.default_rng(fmt.bits)
        codes = rng.integers(0, 1 << 32, size=1 << (12 if quick else 18), dtype=np.int64)
        codes = np.concatenate([codes, _SPECIALS.view(np.uint32).astype(np.int64)])
    codes = codes.astype(fmt.code_dtype)
    case = Case(name, fmt.name, "-", {"nan_by_class": nan_by_class})
    tdt = getattr(torch, fmt.code_dtype)
    src = torch.from_numpy(codes.view({1: np.uint8, 2: np.int16, 4: np.int32}[codes.itemsize]).copy())
    t = (src if tdt is torch.uint8 else src.view(tdt)).to(device)
    try:
        with _guard(device):
            got = kernel_decode(t, fmt)
    except Exception as e:
        case.error = f"{type(e).__name__}: {e}"
        return [case]
    want = np.asarray(emulate.decode(codes, fmt)).view(np.uint32).astype(np.int64)
    g = _values_bits(torch, got, codes.shape)
    w, bad = want, want != g
    if nan_by_class:
        bad &= ~(
            np.isnan(w.astype(np.uint32).view(np.float32)) & np.isnan(g.astype(np.uint32).view(np.float32))
        )
    case.compared, case.mismatches = int(codes.size), int(bad.sum())
    for i in np.flatnonzero(bad)[:_SHOWN]:
        c = int(codes[i])
        case.first.append(
            Mismatch(
                "codes",
                int(i),
                _code_fields(c, fmt),
                float(c),
                int(w[i]),
                int(g[i]),
                _f32_fields(w[i]),
                _f32_fields(g[i]),
            )
        )
    return [case]


def _guard(device: str) -> Any:
    """On the CPU, leave triton.language as it was after the kernel ran (a Triton 3.9
    interpreter leak; see :func:`fpsim.kernels._loader.interpreter_patches_restored`)."""
    from ._loader import interpreter_patches_restored, is_interpreted

    if is_interpreted(device) and "triton" in sys.modules:
        return interpreter_patches_restored()
    return contextlib.nullcontext()


def _torch() -> Any:
    from ._loader import require_torch

    return require_torch()


# --- the registry of kernels ------------------------------------------------------------------


@dataclass(frozen=True)
class KernelSpec:
    """A kernel known to :func:`validate_all`.

    Attributes:
        name: its name in reports and on the command line.
        run: ``run(fmt, rounding, cases=..., device=...) -> list[Case]``.
        applies: whether the kernel exists for a format and rounding mode (rows are made
            only for those).
        skip: why it cannot run for (format, rounding, device), or None.
        recipes: the kernel takes block recipes (:data:`fpsim.formats.block.RECIPES`) instead
            of element formats (:data:`fpsim.FORMATS`).
        formats: the kernel's own format table, ``formats() -> {name: format}`` (e.g. the
            accumulators of ``accumulate.matmul``), used instead of FORMATS / RECIPES.
    """

    name: str
    run: Callable[..., list[Case]]
    applies: Callable[[AnyFormat, RoundMode], bool] = lambda f, m: True
    skip: Callable[[AnyFormat, RoundMode, str], str | None] = lambda f, m, d: None
    recipes: bool = False
    formats: Callable[[], Mapping[str, Any]] | None = None


KERNELS: dict[str, KernelSpec] = {}
"""The registered kernels, by name."""


def register_kernel(spec: KernelSpec) -> KernelSpec:
    """Add (or replace) a kernel in :data:`KERNELS`; returns it."""
    KERNELS[spec.name] = spec
    return spec


def _cast(kind: str, input_dtype: str = "float32", random: str = "bits") -> Callable[..., list[Case]]:
    def run(fmt, rounding, *, cases, device, name):
        from fpsim.kernels import cast

        fn = cast.encode if kind == "encode" else cast.quantize
        return validate(
            fn,
            fmt,
            rounding,
            cases=cases,
            device=device,
            name=name,
            kind=kind,
            input_dtype=input_dtype,
            random=random,
        )

    return run


def _decode_run(fmt, rounding, *, cases, device, name):
    from fpsim.kernels import cast

    return validate_decode(cast.decode, fmt, cases=cases, device=device, name=name)


def _hw_run(fmt, rounding, *, cases, device, name):
    from fpsim.kernels import hwcast

    return validate(
        hwcast.encode, fmt, rounding, cases=cases, device=device, name=name, nan_by_class=True, sets=None
    )


def _hw_skip(fmt, rounding, device):
    from fpsim.kernels import hwcast

    return hwcast.unavailable_reason(fmt, device, rounding)


def _blocks_run(fmt, rounding, *, cases, device, name):
    from fpsim.kernels import blocks

    from ._validate_blocks import validate_blocks

    return validate_blocks(blocks.encode_blocks, fmt, rounding, cases=cases, device=device, name=name)


def _blocks_applies(bf, mode) -> bool:
    """Codebook recipes round to the nearest entry only; lookup-table codebooks have no kernel."""
    from fpsim.formats import Codebook

    if isinstance(bf.element, Codebook):
        return mode is RoundMode.NEAREST_EVEN and not bf.element.lut_bins
    return True


_SR = RoundMode.STOCHASTIC
for _spec in (
    KernelSpec("cast.encode", _cast("encode")),
    KernelSpec("cast.encode[float16 in]", _cast("encode", "float16")),
    KernelSpec("cast.encode[bfloat16 in]", _cast("encode", "bfloat16")),
    KernelSpec("cast.encode[seed]", _cast("encode", random="seed"), applies=lambda f, m: m is _SR),
    KernelSpec("cast.quantize", _cast("quantize")),
    KernelSpec("cast.decode", _decode_run, applies=lambda f, m: m is RoundMode.NEAREST_EVEN),
    KernelSpec(
        "hwcast.encode",
        _hw_run,
        applies=lambda f, m: (
            f.name in ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2") and m is RoundMode.NEAREST_EVEN
        ),
        skip=_hw_skip,
    ),
    KernelSpec("blocks.encode_blocks", _blocks_run, applies=_blocks_applies, recipes=True),
):
    register_kernel(_spec)


# The emulated matmul with limited-precision accumulation (kernels/accumulate.py) for the
# accumulators of kernels/_validate_accumulate.py, against fpsim.accumulate.matmul.
def _accumulate_run(fmt, rounding, *, cases, device, name):
    from ._validate_accumulate import run

    return run(fmt, rounding, cases=cases, device=device, name=name)


def _accumulators() -> Mapping[str, Any]:
    from ._validate_accumulate import accumulators

    return accumulators()


register_kernel(KernelSpec("accumulate.matmul", _accumulate_run, formats=_accumulators))


# The fused optimizer step (kernels/optim.py): one row per 8-bit / FP8 state recipe x master
# rounding, kernel vs its twin (kernels/_validate_optim.py).
def _optim_run(fmt, rounding, *, cases, device, name):
    from ._validate_optim import run

    return run(fmt, rounding, cases=cases, device=device, name=name)


def _optim_applies(bf, mode) -> bool:
    from ._validate_optim import applies

    return applies(bf, mode)


register_kernel(KernelSpec("optim.adamw_step", _optim_run, applies=_optim_applies, recipes=True))


def validate_all(
    device: str = "cpu",
    quick: bool = False,
    *,
    formats: Sequence[str] | None = None,
    kernels: Sequence[str] | None = None,
    roundings: Sequence[str] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Validate every registered kernel x format x rounding mode against the emulator.

    Args:
        device: "cpu" (Triton's interpreter) or "cuda".
        quick: fewer inputs per case (:func:`input_sets` with ``cases="quick"``).
        formats: only these format names (default: all of :data:`fpsim.FORMATS`, and for
            block kernels all of :data:`fpsim.formats.block.RECIPES`; recipe names and the
            names of kernels' own format tables, ``KernelSpec.formats``, are accepted too).
        kernels: only these kernels (names in :data:`KERNELS`).
        roundings: only these rounding modes.
        progress: show a progress bar.

    Returns:
        ``{"device", "quick", "seconds", "compared", "mismatches", "errors", "skipped",
        "cases": [...]}``; one case row per kernel x format x rounding with its ``kernel``,
        ``format``, ``rounding``, ``compared`` and ``mismatches`` summed over the option
        variants, plus ``variants``, ``skipped``, ``errors`` and the ``first`` mismatches
        (with their options).
    """
    from tqdm.auto import tqdm

    from fpsim.formats import RECIPES

    own = [n for s in KERNELS.values() if s.formats is not None for n in s.formats()]
    fmts = _pick(formats, list(dict.fromkeys([*FORMATS, *RECIPES, *own])), "format")
    specs = [KERNELS[k] for k in _pick(kernels, list(KERNELS), "kernel")]
    modes = [RoundMode.parse(m) for m in _pick(roundings, [m.value for m in RoundMode], "rounding")]
    plan = [
        (s, table[f], m)
        for s in specs
        for table in [s.formats() if s.formats is not None else RECIPES if s.recipes else FORMATS]
        for f in fmts
        if f in table
        for m in modes
        if s.applies(table[f], m)
    ]
    t0 = time.perf_counter()
    rows = []
    for spec, fmt, mode in tqdm(plan, disable=not progress, desc="validate-kernels", unit="case"):
        row: dict[str, Any] = {"kernel": spec.name, "format": fmt.name, "rounding": mode.value}
        row.update(compared=0, mismatches=0, variants=0, skipped=None, errors=[], first=[])
        reason = spec.skip(fmt, mode, device)
        if reason is not None:
            row["skipped"] = reason
            rows.append(row)
            continue
        if spec.name == "cast.decode":
            row["rounding"] = "-"
        for c in spec.run(fmt, mode, cases="quick" if quick else "full", device=device, name=spec.name):
            row["variants"] += 1
            row["compared"] += c.compared
            row["mismatches"] += c.mismatches
            if c.error:
                row["errors"].append({"options": c.options, "error": c.error})
            for m in c.first[: max(0, _SHOWN - len(row["first"]))]:
                row["first"].append({"options": c.options, **asdict(m)})
        rows.append(row)
    return {
        "device": device,
        "quick": quick,
        "seconds": round(time.perf_counter() - t0, 3),
        "compared": sum(r["compared"] for r in rows),
        "mismatches": sum(r["mismatches"] for r in rows),
        "errors": sum(len(r["errors"]) for r in rows),
        "skipped": sum(r["skipped"] is not None for r in rows),
        "cases": rows,
    }


def _pick(asked: Sequence[str] | None, known: list[str], what: str) -> list[str]:
    if not asked:
        return known
    bad = [a for a in asked if a not in known]
    if bad:
        raise ValueError(f"unknown {what} {bad[0]!r}; known: {', '.join(known)}")
    return [k for k in known if k in asked]


# --- command line -------------------------------------------------------------------------


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``validate-kernels`` subcommand to an argparse ``subparsers`` object.

    The parser's default ``run`` is :func:`run_args` (``args.run(args)`` returns the exit
    status), as the other ``fpsim`` subcommands. In ``fpsim/cli.py``'s ``build_parser``::

        from .validate import add_parser as add_validate_kernels

        add_validate_kernels(sub)

    Importing this module imports neither torch nor triton.
    """
    p = subparsers.add_parser(
        "validate-kernels",
        help="compare the Triton kernels with the emulator bit for bit (CPU interpreter or GPU)",
        description="Run every Triton kernel on the inputs where rounding can go wrong and compare "
        "its codes with the emulator's, zero tolerance. Exit status 1 on any mismatch or error.",
    )
    _arguments(p)
    p.set_defaults(run=run_args)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="cpu: Triton's interpreter (default)"
    )
    p.add_argument("--quick", action="store_true", help="fewer inputs per case (minutes on the CPU)")
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
    p.add_argument("--format", action="append", metavar="F", help="only this format (repeatable)")
    p.add_argument(
        "--kernel", action="append", metavar="K", help="only this kernel (repeatable): " + ", ".join(KERNELS)
    )
    p.add_argument(
        "--rounding",
        action="append",
        choices=[m.value for m in RoundMode],
        metavar="M",
        help="only this rounding mode (repeatable)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _prepare_triton_env(device: str) -> None:
    """Select Triton's interpreter for ``--device cpu`` before triton is imported.

    TRITON_INTERPRET is read when a function is decorated with ``@triton.jit``; triton's
    own library functions are decorated when triton is imported. fpsim's kernels do not
    depend on it (see :mod:`fpsim.kernels._loader`), but kernels that call the library do.
    """
    if "triton" in sys.modules:
        return
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    elif os.environ.get("TRITON_INTERPRET") == "1":
        os.environ["TRITON_INTERPRET"] = "0"


def run_args(args: argparse.Namespace) -> int:
    """Run ``validate-kernels`` for parsed arguments; print the table; return the exit status."""
    _prepare_triton_env(args.device)
    if args.device == "cuda":
        torch = _torch()
        if not torch.cuda.is_available():
            print("validate-kernels: error: --device cuda but torch sees no CUDA device", file=sys.stderr)
            return 2
    report = validate_all(
        args.device,
        args.quick,
        formats=args.format,
        kernels=args.kernel,
        roundings=args.rounding,
        progress=not args.quiet,
    )
    print_report(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1, default=str)
        print(f"wrote {args.json}")
    return 1 if report["mismatches"] or report["errors"] else 0


def print_report(report: dict[str, Any], file: Any = None) -> None:
    """The table of a :func:`validate_all` report, then the first mismatches with their bits."""
    file = file or sys.stdout
    heads = ["kernel", "format", "rounding", "compared", "mismatches"]
    cells = []
    for r in report["cases"]:
        status = str(r["mismatches"])
        if r["skipped"]:
            status = "skipped"
        elif r["errors"]:
            status = f"{r['mismatches']} + {len(r['errors'])} errors"
        cells.append([r["kernel"], r["format"], r["rounding"], str(r["compared"]), status])
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    print(
        "  ".join(h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in enumerate(zip(heads, widths))),
        file=file,
    )
    for c in cells:
        print(
            "  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths))),
            file=file,
        )
    skipped = {r["skipped"] for r in report["cases"] if r["skipped"]}
    for reason in sorted(skipped):
        print(f"skipped: {reason}", file=file)
    for r in report["cases"]:
        for e in r["errors"][:2]:
            print(f"\n{r['kernel']} {r['format']} {r['rounding']} {e['options']}: {e['error']}", file=file)
        if r["first"]:
            print(
                f"\n{r['kernel']} {r['format']} {r['rounding']}: {r['mismatches']} mismatches; first:",
                file=file,
            )
            for m in r["first"]:
                mismatch = Mismatch(**{k: m[k] for k in Mismatch.__dataclass_fields__})
                print(f"  {m['options']}\n  {mismatch.describe()}", file=file)
    quick = " (quick)" if report["quick"] else ""
    print(
        f"\n{report['device']}{quick}: {report['compared']} elements compared, "
        f"{report['mismatches']} mismatches, {report['errors']} errors, {report['skipped']} skipped "
        f"in {report['seconds']:.1f} s",
        file=file,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``fpsim validate-kernels [--device cpu|cuda] [--quick] [--json OUT] ...``.

    Prints the table kernel x format x rounding x compared x mismatches and the first
    mismatches with their bits; returns 1 on any mismatch or kernel error, 2 on bad
    arguments, 0 otherwise. With ``--device cpu`` it sets ``TRITON_INTERPRET=1`` before
    triton is imported (when it is not imported yet; see :func:`_prepare_triton_env`).
    """
    p = argparse.ArgumentParser(prog="fpsim validate-kernels", description=__doc__.splitlines()[0])
    _arguments(p)
    args = p.parse_args(argv)
    try:
        return run_args(args)
    except (ValueError, TypeError, OSError) as err:
        print(f"fpsim validate-kernels: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
