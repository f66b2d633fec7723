"""Opt-in exhaustive check: every float32 input against ml_dtypes' cast.

``fpsim exhaustive FORMAT`` encodes all 2**32 float32 bit patterns with fpsim (nearest-even,
not saturating) and with ``ml_dtypes``' ``astype``, in chunks, and counts the inputs whose
codes differ. NaN is compared by class: two NaN codes are equal, and for formats without
NaN a NaN input that gives a zero of either sign is equal (ml_dtypes flips the NaN's sign
there, fpsim gives +0). Minutes per format on two cores (README, "How exactness is checked").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..emulate.element import decode, encode
from ..formats import Format, get_format

__all__ = ["ExhaustiveResult", "exhaustive_check"]


@dataclass
class ExhaustiveResult:
    """Outcome of :func:`exhaustive_check`."""

    format: str
    backend: str
    compared: int
    mismatches: int
    first: list[dict[str, Any]] = field(default_factory=list)


def exhaustive_check(
    fmt: str | Format,
    *,
    backend: str = "numpy",
    start: int = 0,
    stop: int = 1 << 32,
    chunk: int = 1 << 24,
    progress: bool = True,
) -> ExhaustiveResult:
    """Compare fpsim with ml_dtypes on the float32 bit patterns ``start <= b < stop``.

    Args:
        fmt: a float format that ml_dtypes (or numpy, for float16/float32) has.
        backend: ``"numpy"`` or ``"jax"`` (the jitted array tier).
        start, stop: range of float32 bit patterns; the default is all 2**32.
        chunk: patterns per step.
        progress: show a tqdm progress bar.
    """
    import ml_dtypes
    from tqdm.auto import tqdm

    fmt = get_format(fmt)
    if not isinstance(fmt, Format):
        raise ValueError(f"exhaustive check needs a float format, got {fmt.name}")
    dtype = np.float16 if fmt.name == "float16" else np.float32 if fmt.name == "float32" else None
    dtype = dtype or getattr(ml_dtypes, fmt.name, None)
    if dtype is None:
        raise ValueError(f"ml_dtypes has no {fmt.name}; nothing to compare against")
    if backend not in ("numpy", "jax"):
        raise ValueError(f"backend must be 'numpy' or 'jax', got {backend!r}")
    if not 0 <= start < stop <= 1 << 32:
        raise ValueError(f"need 0 <= start < stop <= 2**32, got start={start}, stop={stop}")
    run = _encoder(fmt, backend)
    mask = (1 << fmt.bits) - 1
    result = ExhaustiveResult(fmt.name, backend, 0, 0)
    bar = tqdm(total=stop - start, unit="B", unit_scale=True, disable=not progress, desc=fmt.name)
    for lo in range(start, stop, chunk):
        bits = np.arange(lo, min(lo + chunk, stop), dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            want = x.astype(dtype).view(fmt.code_dtype) & mask
        got = run(x)
        bad = want != got
        if bad.any():
            idx = np.flatnonzero(bad)
            same = _same_class(x[idx], want[idx], got[idx], fmt)
            idx = idx[~same]
            result.mismatches += idx.size
            for i in idx[: 10 - len(result.first)]:
                result.first.append(
                    {
                        "input_bits": f"0x{bits[i]:08x}",
                        "input": float(x[i]),
                        "ml_dtypes": f"0x{int(want[i]):x}",
                        "fpsim": f"0x{int(got[i]):x}",
                    }
                )
        result.compared += x.size
        bar.update(x.size)
    bar.close()
    return result


def _encoder(fmt: Format, backend: str):
    if backend == "numpy":
        return lambda x: encode(x, fmt)
    import jax

    f = jax.jit(lambda a: encode(a, fmt))
    return lambda x: np.asarray(f(jax.numpy.asarray(x)))


def _same_class(x: np.ndarray, want: np.ndarray, got: np.ndarray, fmt: Format) -> np.ndarray:
    vw, vg = decode(want, fmt), decode(got, fmt)
    both_nan = np.isnan(vw) & np.isnan(vg)
    nan_to_zero = np.isnan(x) & (vw == 0) & (vg == 0) & (not fmt.has_nan)
    return both_nan | nan_to_zero
