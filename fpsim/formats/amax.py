"""The largest magnitude of an array (an amax), decided on its bit patterns, NaN ignored or
propagated: the one amax of the numpy tier.

Two rules are in use. Transformer Engine's amax kernels (and NVFP4's, and bitsandbytes'
absmax) reduce with CUDA's ``fmaxf``: a NaN is skipped, whatever its payload or quiet bit
(:func:`amax_ignore_nan`). ``torch.amax`` (torchao, the MX recipes, the linear absmax
rule) propagates NaN (:func:`amax_propagate_nan`).

numpy's own reductions cannot be trusted with either: ``np.fmax``, ``np.fmin``,
``np.nanmax`` and their ``.reduce`` run SIMD kernels picked at run time from the CPU's
features, and a *signaling* NaN (float32 ``0x7F800001``..``0x7FBFFFFF``, either sign) goes
through them differently per kernel and per position: on an AVX-512 CPU
``np.fmax.reduce`` over float32 data holding ``0x7F97C976`` returns NaN or a smaller
maximum for some lengths, and other lengths on AVX2 or SSE. Here every decision is an
integer comparison, which has no NaN: the sign bit is cleared, so the magnitudes order as
their bit patterns do (``+0 < subnormals < normals < inf``), and every NaN pattern lies
above infinity's. Ignoring NaN maps those patterns to 0 before an integer max;
propagating takes the integer max and turns a NaN result into the canonical quiet NaN
(``0x7FC00000``, ``0x7FF8000000000000``), as the Triton kernels (``_amax_bits``) and the
compiled loops (``amax_nan``) return it. The answer is the same whatever numpy's dispatch
and whatever the NaNs' payloads; ``tests/formats/test_amax.py`` checks it against Python's
``max`` over the ``math.isnan``-filtered values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["amax_ignore_nan", "amax_propagate_nan"]

Axis = int | tuple[int, ...] | None

# float dtype -> (unsigned twin, every bit but the sign, +inf, the canonical quiet NaN)
_LAYOUTS = {
    np.dtype(np.float32): (np.uint32, 0x7FFFFFFF, 0x7F800000, 0x7FC00000),
    np.dtype(np.float64): (np.uint64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000, 0x7FF8000000000000),
}


def amax_ignore_nan(x: Any, axis: Axis = None, keepdims: bool = False) -> Any:
    """Largest ``|x|`` with NaN skipped (CUDA's ``fmaxf``, Transformer Engine's amax).

    Infinities count; ``-0`` counts as ``+0``; an empty reduction or one over NaN only
    gives ``+0``.

    Args:
        x: a float32 or float64 array (any shape, any strides).
        axis: the axis or axes to reduce, as numpy's ``max`` takes them (None: all).
        keepdims: keep the reduced axes with length 1.

    Returns:
        The amax in ``x``'s dtype: a numpy scalar where every axis is reduced without
        ``keepdims``, else an array.

    Raises:
        TypeError: ``x`` is not float32 or float64.
    """
    a, mag, inf, _ = _magnitudes(x)
    mag[mag > inf] = 0
    return _as_float(np.max(mag, axis=axis, keepdims=keepdims, initial=0), a.dtype)


def amax_propagate_nan(x: Any, axis: Axis = None, keepdims: bool = False) -> Any:
    """Largest ``|x|``, NaN where a NaN is reduced (``torch.amax``), as the canonical quiet
    NaN ``0x7FC00000`` (float32) / ``0x7FF8000000000000`` (float64), whatever the NaNs'
    signs, payloads and quiet bits.

    Infinities count; ``-0`` counts as ``+0``; an empty reduction gives ``+0``.

    Args:
        x: a float32 or float64 array (any shape, any strides).
        axis: the axis or axes to reduce, as numpy's ``max`` takes them (None: all).
        keepdims: keep the reduced axes with length 1.

    Returns:
        The amax in ``x``'s dtype: a numpy scalar where every axis is reduced without
        ``keepdims``, else an array.

    Raises:
        TypeError: ``x`` is not float32 or float64.
    """
    a, mag, inf, qnan = _magnitudes(x)
    top = np.max(mag, axis=axis, keepdims=keepdims, initial=0)
    return _as_float(np.where(top > inf, qnan, top), a.dtype)


def _magnitudes(x: Any) -> tuple[np.ndarray, np.ndarray, np.unsignedinteger, np.unsignedinteger]:
    """``x`` as an array, a fresh array of its bit patterns with the sign cleared, and the
    patterns of +inf and of the canonical quiet NaN (of the unsigned twin's type)."""
    a = np.asarray(x)
    layout = _LAYOUTS.get(a.dtype)
    if layout is None:
        raise TypeError(f"an amax takes a float32 or float64 array, got dtype {a.dtype}")
    u, magnitude, inf, qnan = layout
    mag = np.bitwise_and(a.view(u), u(magnitude), out=np.empty(a.shape, u))  # an array, 0-d too
    return a, mag, u(inf), u(qnan)


def _as_float(bits: Any, dtype: np.dtype) -> Any:
    """Unsigned bit patterns as floats of ``dtype``: a numpy scalar for 0-d."""
    out = np.asarray(bits).view(dtype)
    return out[()] if out.ndim == 0 else out
