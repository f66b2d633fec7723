"""The scale rules of block formats: from the blocks' amaxes to scales and element inputs.

Each rule of :class:`~fpsim.formats.block.ScaleRule` is written from its source (Transformer
Engine's recipe kernels, OCP MX v1.0 section 6.3, torchao's MX and low-bit optimizer code,
bitsandbytes' blockwise quantization), with float32 arithmetic in the order those systems
use, so the codes and scales match them bit for bit. Element casts go through
:func:`fpsim.emulate.element.encode_array` (saturating, any rounding mode). The blocking
itself (shapes, chunks, the compiled loops) is :mod:`fpsim.emulate.blocks`.

All functions take blocked arrays (axes in (count, block) pairs) and resolved objects.
"""

from __future__ import annotations

import math

import numpy as np

from .._compiled import Backend
from ..formats import BlockFormat, Codebook, Format, RoundMode, ScaleRule
from ..formats.amax import amax_ignore_nan
from ..formats.codes import FactorKind
from . import element

__all__ = [
    "apply_factor",
    "block_factors",
    "prescale",
    "codebook_codes",
    "codebook_round",
    "nearest_thresholds",
    "nearest_buckets",
    "threshold_buckets",
    "codebook_lut",
]

_F32 = np.float32
_FLT_MAX = np.finfo(np.float32).max
_R = RoundMode


def prescale(xb: np.ndarray, amax: np.ndarray, bf: BlockFormat, tensor_amax: float | None):
    """Element inputs (before the cast), scale codes and tensor scale for non-codebook rules."""
    factor, codes, tensor = block_factors(amax, bf, tensor_amax)
    return apply_factor(xb, factor, bf.rule), codes, tensor


def block_factors(
    amax: np.ndarray, bf: BlockFormat, tensor_amax: float | None, *, backend: Backend = Backend.NUMPY
):
    """What each block's elements are scaled by, its scale code and the tensor scale.

    Args:
        amax: the blocks' amaxes (float32, any shape; NaN as the rule's reduction left it).
        bf: a block format of a non-codebook rule.
        tensor_amax: NVFP4's tensor amax, or None to reduce ``amax``.
        backend: where NVFP4's E4M3 scale cast runs (:func:`fpsim.emulate.element.encode_array`,
            the same codes either way).

    Returns:
        ``(factor, codes, tensor)``: the per-block factor of :func:`apply_factor` (float32,
        float64 powers of two for the MX rules, NaN for an MX block with the NaN scale), the
        scale codes and the tensor scale (NVFP4) or None.
    """
    rule, elem_max = bf.rule, _F32(bf.elem_max)
    if rule is ScaleRule.TE:
        # Transformer Engine recipe_common.cuh compute_scale_from_amax
        a = np.where(amax < _F32(bf.eps), _F32(bf.eps), amax)
        scale = np.where(np.isinf(a) | (a == 0) | np.isnan(a), _F32(1), elem_max / a)
        scale = np.where(np.isinf(scale), _FLT_MAX, scale).astype(_F32)
        if bf.pow2:
            scale = (scale.view(np.uint32) & np.uint32(0xFF800000)).view(_F32)
        return scale, (_F32(1) / scale).view(np.uint32), None
    if rule is ScaleRule.ABSMAX:
        s = (np.where(amax < _F32(bf.eps), _F32(bf.eps), amax) / elem_max).astype(_F32)  # NaN stays
        return np.where(s == 0, _F32(1), s), s.view(np.uint32), None
    if rule is ScaleRule.NVFP4:
        return _nvfp4(amax, bf, tensor_amax, backend)
    if rule.factor is not FactorKind.POW2:
        raise ValueError(f"the numpy tier has no scale arithmetic for ScaleRule.{rule.name}")
    e = _mx_exponent(amax, bf)
    nan = ~np.isfinite(amax) | (e > 127)
    e = np.maximum(e, -127)
    codes = np.where(nan, 255, e + 127).astype(np.uint8)
    return np.where(nan, np.nan, np.ldexp(1.0, np.where(nan, 0, -e).astype(np.int32))), codes, None


def apply_factor(xb: np.ndarray, factor: np.ndarray, rule: ScaleRule) -> np.ndarray:
    """The element inputs by the rule's :attr:`~fpsim.formats.ScaleRule.factor`: float32
    ``xb * factor`` (TE, NVFP4), ``xb / factor`` (ABSMAX), or the exact float64 ``xb * 2**-e``
    (MX; NaN in a block of the NaN scale)."""
    if rule.factor is FactorKind.QUOTIENT:
        return xb / factor
    if rule.factor is FactorKind.PRODUCT:
        return xb * factor
    return np.where(np.isnan(factor), np.nan, xb.astype(np.float64) * factor)


def _mx_exponent(amax: np.ndarray, bf: BlockFormat) -> np.ndarray:
    """Unclamped shared exponent of each block (OCP MX v1.0 6.3 and its variants)."""
    emax = math.frexp(bf.elem_max)[1] - 1  # floor(log2(elem_max)): E4M3 8, E2M1 2, INT8 0
    bits = amax.astype(_F32).view(np.uint32)
    if bf.rule is ScaleRule.MX_EVEN:  # round amax half-up to the element's significand width
        el = bf.element
        m = el.mantissa_bits if isinstance(el, Format) else el.bits - 2
        bits = (bits + np.uint32(1 << (22 - m))) & np.uint32(0xFF800000)
    if bf.rule is ScaleRule.UE8M0_CEIL:  # DeepGEMM: ceil(log2(f32(max(amax, eps) / elem_max)))
        a = np.where(amax < _F32(bf.eps), _F32(bf.eps), amax).astype(_F32)
        return _ceil_log2((a / _F32(bf.elem_max)).astype(_F32))
    if bf.rule is ScaleRule.MX_RCEIL:  # ceil to a power of two of amax * (1 / elem_max)
        d = (amax.astype(_F32) * _F32(1 / bf.elem_max)).view(np.uint32)
        biased, mant = (d >> 23).astype(np.int64), d & np.uint32(0x7FFFFF)
        up = np.where(biased == 0, mant > 0x400000, mant != 0)
        return biased + up - 127
    e = ((bits >> 23) & np.uint32(0xFF)).astype(np.int64) - 127 - emax
    if bf.rule is ScaleRule.MX_CEIL:
        e = e + ((bits & np.uint32(0x7FFFFF)) != 0)
    return e


def _ceil_log2(d: np.ndarray) -> np.ndarray:
    """Exact ``ceil(log2 d)`` of float32 ``d >= 0`` from its bits (a subnormal through its integer
    significand, converted exactly to float32, less 149); 0 gives -276, inf 128, NaN 129."""
    b = d.view(np.uint32) & np.uint32(0x7FFFFFFF)
    sub = b < np.uint32(0x800000)
    b = np.where(sub, b.astype(_F32).view(np.uint32), b)
    e = ((b >> 23) & np.uint32(0xFF)).astype(np.int64) - 127 + ((b & np.uint32(0x7FFFFF)) != 0)
    return np.where(sub, e - 149, e)


def _nvfp4(amax: np.ndarray, bf: BlockFormat, tensor_amax: float | None, backend: Backend):
    """Transformer Engine NVFP4 (core_nvfp4.cuh): FP32 tensor scale, E4M3 block scales; the
    factor ``f32(1 / f32(s8 * s_dec))`` (FLT_MAX for a zero scale)."""
    if tensor_amax is None:
        amax_t = amax_ignore_nan(np.asarray(amax, _F32))
    else:
        amax_t = _F32(tensor_amax)
    s_enc = np.fmin(_F32(2688) / amax_t, _FLT_MAX)  # 448 * 6
    s_enc = _F32(1) if (amax_t == 0 or s_enc == 0) else _F32(s_enc)
    s_dec = _F32(1) / s_enc
    sdb = np.fmin(amax * (s_enc * _F32(1 / 6)), _FLT_MAX)
    e4m3 = bf.scale_format
    s8 = element.encode_array(sdb, e4m3, _R.NEAREST_EVEN, saturate=True, backend=backend)
    s8v = element.decode_table(e4m3)[s8]  # decode_array of the codes just made (in range)
    c = np.where(s8v == 0, _FLT_MAX, np.fmin(_F32(1) / (s8v * s_dec), _FLT_MAX))
    return c, s8, float(s_dec)


def codebook_codes(xb, amax, book: Codebook, mode: RoundMode, rand, nbits: int):
    """bitsandbytes blockwise quantization: ``x * f32(1/absmax)``, then a codebook index."""
    c = book.table
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = _F32(1) / amax  # absmax 0 up to 2**-128 -> inf, inf -> 0 (no clamp)
        if book.lut_bins:  # bitsandbytes 0.50.2 CPU kernel
            v = np.clip(xb * inv, _F32(-1), _F32(1))
            a = ((v + _F32(1)) * _F32(0.5)).astype(np.float64)
            k = (a * (book.lut_bins - 1) + 0.5).astype(_F32)  # one rounding, as the fused FMA
            k = np.where(np.isnan(k), 0, np.trunc(k)).astype(np.int64) & 0xFFFF
            q = codebook_lut(book)[k]
            q = np.where(amax == 0, 0, q).astype(np.uint8)
        else:  # bitsandbytes' CUDA kernel (kQuantizeBlockwise, dQuantize): see Codebook
            v = xb * inv
            if mode is not _R.NEAREST_EVEN:  # (the nearest search maps |v| > 1 to the ends)
                v = np.clip(v, _F32(-1), _F32(1))
            q = codebook_round(v, c, mode, rand, nbits)
    return q, amax.astype(_F32).view(np.uint32), None


def codebook_round(v, c, mode: RoundMode, rand, nbits: int) -> np.ndarray:
    """Codebook index of each float32 ``v``; NaN gives index 0 in every mode (bitsandbytes'
    dQuantize: every comparison with NaN is false)."""
    nan = v != v
    if mode is _R.NEAREST_EVEN:
        base, thr = nearest_buckets(c)
        key = v.astype(_F32, copy=False).view(np.uint32) >> np.uint32(16)
        q = base[key]
        np.add(q, v > thr[key], out=q, casting="unsafe")
        np.putmask(q, nan, 0)
        return q
    if mode not in (_R.STOCHASTIC, _R.TOWARD_ZERO, _R.TOWARD_POSITIVE, _R.TOWARD_NEGATIVE):
        raise ValueError(
            f"codebook elements take rounding nearest_even, stochastic or a directed mode, got {mode.value}"
        )
    lo = np.clip(np.searchsorted(c, v, side="right") - 1, 0, c.size - 2)
    exact = c[lo] == v
    if mode is _R.STOCHASTIC:  # up iff floor(f * 2**n) + R >= 2**n, f the fraction of the gap
        f = (v.astype(np.float64) - c[lo]) / (c[lo + 1].astype(np.float64) - c[lo])
        r = (rand & np.uint32((1 << nbits) - 1)).astype(np.float64)
        up = np.floor(f * 2.0**nbits) + r >= 2.0**nbits
    elif mode is _R.TOWARD_POSITIVE:
        up = ~exact
    elif mode is _R.TOWARD_NEGATIVE:
        up = np.zeros(v.shape, bool)
    else:
        up = (~exact) & (v < 0)
    q = lo + (up & ~exact)
    return np.where((v < c[0]) | nan, 0, q).astype(np.uint8)  # below the first entry: it is the only one


def nearest_thresholds(c: np.ndarray) -> np.ndarray:
    """The nearest-entry rule of bitsandbytes' CUDA kernel as thresholds: the index of a
    float32 ``v`` is ``#{i : v > t[i]}`` (``searchsorted(t, v, side="left")``), NaN aside.

    ``t[i]`` is the float32 midpoint ``m = f32(f32(c[i] + c[i+1]) * 0.5)`` for even ``i`` and
    the float32 just below it for odd ``i``: a ``v`` equal to a midpoint goes to the even one
    of the two entries (``dQuantize`` in csrc/kernels.cu, see :class:`~fpsim.formats.Codebook`).
    """
    c = np.asarray(c, _F32)
    mid = ((c[:-1] + c[1:]) * _F32(0.5)).astype(_F32)
    odd = (np.arange(mid.size) & 1).astype(bool)
    return np.where(odd, np.nextafter(mid, _F32(-np.inf)), mid).astype(_F32)


_BUCKETS: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}


def nearest_buckets(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """O(1) form of ``searchsorted(nearest_thresholds(c), v, side="left")`` for float32 ``v``:
    :func:`threshold_buckets` of :func:`nearest_thresholds` (the tests compare with searchsorted
    on every float32 bucket edge)."""
    return threshold_buckets(nearest_thresholds(c), np.asarray(c).size)


def threshold_buckets(t: np.ndarray, entries: int) -> tuple[np.ndarray, np.ndarray]:
    """O(1) form of the index ``searchsorted(t, v, side="left")`` (``#{i : v > t[i]}``) of
    float32 ``v`` for increasing float32 thresholds ``t`` between ``entries`` table entries.

    The float32 values sharing their top 16 bits form an interval; over it the index is a
    step function with at most one step for the tables used here, so index = ``base[key] +
    (v > thr[key])`` (``thr`` = the threshold inside the interval, or +inf); +inf gets the
    last entry and -inf the first. NaN is left to the caller (index 0: the keys of +-inf
    hold NaNs too). Built once per threshold table.

    Raises:
        ValueError: an interval holds two or more thresholds (a table too dense for the lookup).
    """
    t = np.asarray(t, _F32)
    k = t.tobytes() + entries.to_bytes(4, "little")
    if k not in _BUCKETS:
        keys = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
        a, b = keys.view(_F32), (keys | np.uint32(0xFFFF)).view(_F32)
        special = (keys & np.uint32(0x7F800000)) == np.uint32(0x7F800000)  # +-inf and NaN keys
        with np.errstate(invalid="ignore"):
            lo, hi = np.where(special, 0, np.minimum(a, b)), np.where(special, 0, np.maximum(a, b))
        q_lo = np.searchsorted(t, lo, side="left")
        q_hi = np.searchsorted(t, hi, side="left")
        if np.any(q_hi - q_lo > 1):
            raise ValueError("codebook too dense for the bucket lookup")
        thr = np.where(q_hi > q_lo, t[np.minimum(q_lo, t.size - 1)], np.inf).astype(_F32)
        q_lo[special], thr[special] = np.where(keys[special] >> np.uint32(31), 0, entries - 1), np.inf
        _BUCKETS[k] = (q_lo.astype(np.uint8), thr)
    return _BUCKETS[k]


_LUTS: dict[tuple, np.ndarray] = {}


def codebook_lut(book: Codebook) -> np.ndarray:
    """Index of the nearest entry for each of ``book.lut_bins`` grid points on [-1, 1]: the table of
    bitsandbytes' CPU quantizer (the numpy tier and the fused optimizer step share it, cached)."""
    key = book.values
    if key not in _LUTS:
        c = book.table
        i = np.arange(book.lut_bins, dtype=_F32)
        grid = (i + i) / _F32(book.lut_bins - 1) - _F32(1)
        mid = (c[:-1] + c[1:]) * _F32(0.5)
        _LUTS[key] = np.searchsorted(mid, grid, side="left").astype(np.uint8)
    return _LUTS[key]
