"""Validation of cast kernels: encode / quantize (:func:`validate`) and decode
(:func:`validate_decode`) against :mod:`fpsim.emulate.element`, bit for bit.

Triton on the CPU: the kernels of :mod:`fpsim.kernels` run in Triton's interpreter on CPU
tensors whatever the environment says (see :mod:`fpsim.kernels._loader`). A kernel of your
own that calls triton's library functions (``tl.randint``, ``tl.sum``, ...) needs
``TRITON_INTERPRET=1`` set before triton is first imported, because those are decorated
at that import; ``fpsim validate-kernels`` sets it when ``--device cpu`` and triton is not
imported yet (:mod:`fpsim.kernels.validate.cli`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fpsim.formats import AnyFormat, Format, RoundMode

from .common import (
    SHOWN,
    Case,
    Mismatch,
    check_cases,
    code_fields,
    f32_fields,
    guard,
    input_bits,
    is_nan_code,
    np_dtype,
    random_words,
    torch_module,
)
from .inputs import SPECIALS, InputSet, input_sets

EncodeFn = Callable[..., Any]
"""An encode-like host function: ``fn(x, fmt, **options) -> codes``."""


def _torch_input(torch, s: InputSet, device: str):
    a = np.ascontiguousarray(s.values)
    if a.dtype == np.float32:
        t = torch.from_numpy(a.copy())
    else:  # float16 / bfloat16 through their bits (torch.from_numpy has no bfloat16)
        t = torch.from_numpy(a.view(np.int16).copy())
        t = t.view(torch.float16 if a.dtype == np.float16 else torch.bfloat16)
    t = t.to(device)
    return t.t() if s.transpose else t


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
            from fpsim.kernels.validate import validate

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
    from ..cast import element_format

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
    run = _Run(torch_module(), kernel_encode, fmt, mode, kind, random, device, nan_by_class, rng)
    out = []
    for opts in _variants(fmt, mode, saturate, subnormals, stochastic_bits):
        options = {**opts, "input_dtype": input_dtype, "nan_by_class": nan_by_class}
        if mode is RoundMode.STOCHASTIC:
            options["random"] = random
        else:
            del options["stochastic_bits"]
        case = Case(name, fmt.name, mode.value, options)
        for k, s in enumerate(parts):
            if not run.compare(case, s, k, opts):
                break
        out.append(case)
    return out


@dataclass(frozen=True)
class _Run:
    """What :func:`validate` holds fixed while it runs one kernel over every input set."""

    torch: Any
    kernel: EncodeFn
    fmt: AnyFormat
    mode: RoundMode
    kind: str
    random: str
    device: str
    nan_by_class: bool
    rng: np.random.Generator

    def kwargs(self, x32: np.ndarray, k: int, opts: dict[str, Any]) -> tuple[dict, dict]:
        """The kernel's and the emulator's keyword arguments for input set ``k``."""
        from ..philox import philox_bits

        kw: dict[str, Any] = {
            "rounding": self.mode.value,
            "saturate": opts["saturate"],
            "subnormals": opts["subnormals"],
        }
        ekw = dict(kw)
        if self.mode is RoundMode.STOCHASTIC:
            kw["stochastic_bits"] = ekw["stochastic_bits"] = opts["stochastic_bits"]
            if self.random == "seed":
                seed = 1000 * k + 17
                kw["seed"] = seed
                ekw["random_bits"] = philox_bits(seed, x32.size).reshape(x32.shape)
            else:
                words = random_words(x32.size, self.rng).reshape(x32.shape)
                ekw["random_bits"] = words
                kw["random_bits"] = self.torch.from_numpy(words.view(np.int32).copy()).to(self.device)
        return kw, ekw

    def compare(self, case: Case, s: InputSet, k: int, opts: dict[str, Any]) -> bool:
        """Run the kernel and the emulator on input set ``k`` and tally ``case``; False when
        the kernel raised (recorded as the case's error)."""
        from fpsim.emulate import element as emulate

        x = _torch_input(self.torch, s, self.device)
        x32 = x.float().cpu().numpy()  # exact widening; what the emulator gets
        kw, ekw = self.kwargs(x32, k, opts)
        try:
            with guard(self.device):
                got = self.kernel(x, self.fmt, **kw)
            convert = _codes_numpy if self.kind == "encode" else _values_bits
            got_np = convert(self.torch, got, x32.shape)
        except Exception as e:  # report it as the case's error and go on with the next case
            case.error = f"[{s.name}] {type(e).__name__}: {e}"
            return False
        if self.kind == "encode":
            want = np.asarray(emulate.encode(x32, self.fmt, **ekw)).astype(np.int64)
        else:
            want = np.asarray(emulate.quantize(x32, self.fmt, **ekw)).view(np.uint32).astype(np.int64)
        _tally(case, s.name, x, want, got_np, self.fmt, self.kind, self.nan_by_class)
        return True


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


def _tally(case: Case, set_name: str, x, want, got, fmt, kind, nan_by_class) -> None:
    w, g = want.reshape(-1), got.reshape(-1)
    bad = w != g
    if nan_by_class and bad.any():
        if kind == "encode":
            bad &= ~(is_nan_code(w, fmt) & is_nan_code(g, fmt))
        else:
            bad &= ~(
                np.isnan(w.astype(np.uint32).view(np.float32))
                & np.isnan(g.astype(np.uint32).view(np.float32))
            )
    case.compared += w.size
    nbad = int(bad.sum())
    case.mismatches += nbad
    if not nbad or len(case.first) >= SHOWN:
        return
    xin = x.detach().cpu().contiguous().reshape(-1)
    xv = xin.view(_torch_int_of(xin)).numpy()
    fields = (lambda c: code_fields(c, fmt)) if kind == "encode" else f32_fields
    for i in np.flatnonzero(bad)[: SHOWN - len(case.first)]:
        raw = xv[i : i + 1]
        value = raw.view(np.float32 if raw.dtype == np.int32 else _src_np(xin))[0]
        case.first.append(
            Mismatch(
                set_name,
                int(i),
                input_bits(raw),
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

    return np_dtype("float16" if t.dtype == torch.float16 else "bfloat16")


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
    torch = torch_module()
    from fpsim.emulate import element as emulate

    from ..cast import element_format

    fmt = element_format(fmt)
    quick = check_cases(cases)
    name = name or getattr(kernel_decode, "__qualname__", repr(kernel_decode))
    if fmt.bits <= 16:
        codes = np.arange(1 << fmt.bits, dtype=np.int64)
    else:
        rng = np.random.default_rng(fmt.bits)
        codes = rng.integers(0, 1 << 32, size=1 << (12 if quick else 18), dtype=np.int64)
        codes = np.concatenate([codes, SPECIALS.view(np.uint32).astype(np.int64)])
    codes = codes.astype(fmt.code_dtype)
    case = Case(name, fmt.name, "-", {"nan_by_class": nan_by_class})
    tdt = getattr(torch, fmt.code_dtype)
    src = torch.from_numpy(codes.view({1: np.uint8, 2: np.int16, 4: np.int32}[codes.itemsize]).copy())
    t = (src if tdt is torch.uint8 else src.view(tdt)).to(device)
    try:
        with guard(device):
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
    for i in np.flatnonzero(bad)[:SHOWN]:
        c = int(codes[i])
        case.first.append(
            Mismatch(
                "codes",
                int(i),
                code_fields(c, fmt),
                float(c),
                int(w[i]),
                int(g[i]),
                f32_fields(w[i]),
                f32_fields(g[i]),
            )
        )
    return [case]
