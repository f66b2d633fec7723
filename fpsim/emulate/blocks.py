"""Encode and decode with block formats: scales from block maxima, then element casts.

Each rule of :class:`~fpsim.formats.block.ScaleRule` is written from its source (Transformer
Engine's recipe kernels, OCP MX v1.0 section 6.3, torchao's MX and low-bit optimizer code,
bitsandbytes' blockwise quantization), with float32 arithmetic in the order those systems
use, so the codes and scales match them bit for bit. Elements are cast with
:func:`fpsim.emulate.element.encode` (saturating, any rounding mode). Tested against bitsandbytes,
torchao and values worked out from the specs by hand.

Blocks: the recipe's block shape covers the trailing axes (or the flattened tensor); a
ragged last block along an axis is allowed when ``pad`` is set and behaves as if padded
with zeros (zeros never raise an amax); its scale covers only the real elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _compiled
from ..formats import BlockFormat, Codebook, Format, RoundMode, ScaleRule, get_format
from . import element as emulate
from .random import random_words

__all__ = ["BlockCodes", "encode_blocks", "decode_blocks"]

_F32 = np.float32
_FLT_MAX = np.finfo(np.float32).max
_R = RoundMode


@dataclass(frozen=True)
class BlockCodes:
    """Result of encoding with a block format.

    Attributes:
        codes: element codes, the input's shape.
        scales: one scale code per block in the recipe's ``scale_format`` (uint32 float32
            bit patterns, or uint8 E8M0 / E4M3 codes), shaped as the grid of blocks. The
            scale is the *decode* multiplier: value = element value x scale (x
            ``tensor_scale``).
        tensor_scale: NVFP4's float32 per-tensor decode scale ``1 / S_enc``, else None.
    """

    codes: np.ndarray
    scales: np.ndarray
    tensor_scale: float | None = None


def encode_blocks(
    x: Any,
    fmt: str | BlockFormat,
    *,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    random_bits: Any = None,
    rng: np.random.Generator | int | None = None,
    stochastic_bits: int = 32,
    tensor_amax: float | None = None,
) -> BlockCodes:
    """Scale ``x`` block by block and cast the elements (saturating), see the module doc.

    ``tensor_amax``: for per-tensor recipes (``block=None``) and NVFP4, the amax of the
    whole tensor when ``x`` is one chunk of it (fpsim.analysis.metrics streams tensors this way).

    Inputs are converted to float32 first (exact for float16/bfloat16; float64 is rounded
    to nearest), as the systems emulated here take float32 or narrower tensors. Rounding
    applies to the elements; scales follow their rule. Stochastic rounding takes
    ``random_bits`` of ``x``'s shape (or ``rng``), one word per element.
    """
    bf = _recipe(fmt)
    mode = RoundMode.parse(rounding)
    x = _as_f32(x)
    work, blk = block_geometry(x.shape, bf)
    if compiled_codebook(bf, mode, work):
        return _encode_codebook_compiled(x, bf)
    xb = _to_blocks(x.reshape(work), blk)
    rand = None
    if mode is _R.STOCHASTIC:
        bits = random_words(np, random_bits, rng, x.shape)
        rand = _to_blocks(np.asarray(bits).reshape(work), blk)
    grid = tuple(xb.shape[0::2])
    rows = _rows_per_chunk(bf, xb)
    if rows < xb.shape[0]:  # whole rows of blocks are independent of each other
        parts = [
            _encode_rows(
                bf, xb[i : i + rows], None if rand is None else rand[i : i + rows], mode, stochastic_bits
            )
            for i in range(0, xb.shape[0], rows)
        ]
        codes, scales, tensor = (
            np.concatenate([c for c, _, _ in parts]),
            np.concatenate([s for _, s, _ in parts]),
            None,
        )
    else:
        codes, scales, tensor = _encode_rows(bf, xb, rand, mode, stochastic_bits, tensor_amax)
    return BlockCodes(_from_blocks(codes, work).reshape(x.shape), scales.reshape(grid), tensor)


def compiled_codebook(bf: BlockFormat, mode: RoundMode, work: tuple) -> bool:
    """Nearest-entry codebooks over one axis of blocks (the bitsandbytes optimizer states) have
    a compiled loop in :mod:`fpsim._compiled.loops` with the same bits (tests/replay/test_compiled.py)."""
    el = bf.element
    return (
        isinstance(el, Codebook)
        and not el.lut_bins
        and mode is _R.NEAREST_EVEN
        and len(work) == 1
        and work[0] > 0
        and _compiled.available()
    )


def _encode_codebook_compiled(x: np.ndarray, bf: BlockFormat, values: bool = False):
    """BlockCodes (and with ``values`` their decoded float32 values) in one compiled pass."""
    flat = np.ascontiguousarray(x).reshape(-1)
    b = bf.block[0] if bf.block is not None else flat.size
    codes = np.empty(flat.size, np.uint8)
    amax = np.empty(-(-flat.size // b), _F32)
    vals = np.empty(flat.size if values else 0, _F32)
    base, thr = nearest_buckets(bf.element.table)
    _compiled.load().codebook_encode(flat, b, base, thr, bf.element.table, codes, amax, vals, values)
    enc = BlockCodes(codes.reshape(x.shape), amax.view(np.uint32), None)
    return (enc, vals.reshape(x.shape)) if values else enc


def encode_decode_blocks(x: Any, fmt: str | BlockFormat) -> tuple[BlockCodes, np.ndarray]:
    """``(encode_blocks(x, fmt), decode_blocks(...))`` (nearest rounding); one pass where a
    compiled loop exists (nearest-entry codebooks over one axis of blocks)."""
    bf = _recipe(fmt)
    x = _as_f32(x)
    if compiled_codebook(bf, _R.NEAREST_EVEN, block_geometry(x.shape, bf)[0]):
        return _encode_codebook_compiled(x, bf, values=True)
    enc = encode_blocks(x, bf)
    return enc, decode_blocks(enc, bf)


def _decode_codebook_compiled(codes: np.ndarray, scales: Any, bf: BlockFormat) -> np.ndarray:
    flat = np.ascontiguousarray(codes).reshape(-1)
    b = bf.block[0] if bf.block is not None else flat.size
    nb = -(-flat.size // b)
    if np.shape(scales) != (nb,):
        raise ValueError(f"{bf.name}: scales have shape {np.shape(scales)}, the codes need {(nb,)}")
    s = np.ascontiguousarray(emulate.decode(np.asarray(scales), bf.scale_format), _F32).reshape(-1)
    out = np.empty(flat.size, _F32)
    _compiled.load().table_decode(flat, bf.element.table, s, b, out)
    return out.reshape(codes.shape)


def _rows_per_chunk(bf: BlockFormat, xb: np.ndarray) -> int:
    """Rows of blocks (along the first blocked axis) per chunk: whole-tensor temporaries are
    fresh, page-faulted memory that costs more than the arithmetic, so large tensors go
    through in chunks of whole blocks, about 2^16 elements (fastest for every recipe in
    ``benchmarks/bench_blocks.py``; at 2^18 glibc hands float64 temporaries back to the OS
    between chunks and MX encodes ran 3x slower). Per-tensor scales and NVFP4 (a tensor
    scale from the whole amax) take the tensor in one piece."""
    if bf.block is None or bf.rule is ScaleRule.NVFP4:
        return xb.shape[0]
    return max(1, (1 << 16) // max(1, math.prod(xb.shape[1:])))


def _encode_rows(bf: BlockFormat, xb, rand, mode: RoundMode, nbits: int, tensor_amax: float | None = None):
    """Element codes, scale codes and tensor scale of blocked ``xb`` (see :func:`encode_blocks`)."""
    axes = tuple(range(1, xb.ndim, 2))
    ignore_nan = bf.rule in (ScaleRule.TE, ScaleRule.NVFP4) or isinstance(bf.element, Codebook)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ax = np.abs(xb)
        if ignore_nan:  # fmaxf reductions skip NaN
            amax = np.fmax.reduce(ax, axis=axes, keepdims=True, initial=0, dtype=_F32)
        else:  # torch.amax propagates NaN
            amax = np.max(ax, axis=axes, keepdims=True, initial=0)
        if tensor_amax is not None and bf.block is None:
            amax = np.full_like(amax, tensor_amax)
        if isinstance(bf.element, Codebook):
            return _codebook(xb, amax, bf.element, mode, rand, nbits)
        v, scales, tensor = _prescale(xb, amax, bf, tensor_amax)
        codes = emulate.encode(
            v, bf.element, rounding=mode, saturate=True, random_bits=rand, stochastic_bits=nbits
        )
        return codes, scales, tensor


def decode_blocks(encoded: BlockCodes, fmt: str | BlockFormat) -> np.ndarray:
    """float32 values of ``encoded`` (codes and scales from :func:`encode_blocks`)."""
    bf = _recipe(fmt)
    if not isinstance(encoded, BlockCodes):
        raise TypeError(
            f"decode with {bf.name} needs the BlockCodes that encode returned, got {type(encoded).__name__}"
        )
    codes = np.asarray(encoded.codes)
    work, blk = block_geometry(codes.shape, bf)
    if compiled_codebook(bf, RoundMode.NEAREST_EVEN, work) and codes.dtype == np.uint8:
        return _decode_codebook_compiled(codes, encoded.scales, bf)
    cb = _to_blocks(codes.reshape(work), blk)
    grid = tuple(cb.shape[0::2])
    if tuple(encoded.scales.shape) != grid:
        raise ValueError(f"{bf.name}: scales have shape {encoded.scales.shape}, the codes need {grid}")
    keep = [n for g in grid for n in (g, 1)]
    s = emulate.decode(encoded.scales, bf.scale_format).reshape(keep)
    rows = _rows_per_chunk(bf, cb)
    if rows >= cb.shape[0]:
        out = _decode_rows(bf, cb, s, encoded.tensor_scale)
    else:
        out = np.empty(cb.shape, _F32)
        for i in range(0, cb.shape[0], rows):
            out[i : i + rows] = _decode_rows(bf, cb[i : i + rows], s[i : i + rows], encoded.tensor_scale)
    return _from_blocks(out, work).reshape(codes.shape)


def _decode_rows(bf: BlockFormat, cb: np.ndarray, s: np.ndarray, tensor_scale: float | None) -> np.ndarray:
    el = bf.element
    vb = el.table[cb] if isinstance(el, Codebook) else emulate.decode(cb, el)
    with np.errstate(invalid="ignore", over="ignore"):
        if bf.rule.is_mx:  # exact power-of-two product, one rounding
            return (vb.astype(np.float64) * s.astype(np.float64)).astype(_F32)
        if bf.rule is ScaleRule.NVFP4:
            return (vb * s) * _F32(tensor_scale)
        return vb * s


# --- scale rules -----------------------------------------------------------------------


def _prescale(xb: np.ndarray, amax: np.ndarray, bf: BlockFormat, tensor_amax: float | None):
    """Element inputs (before the cast), scale codes and tensor scale for non-codebook rules."""
    rule, elem_max = bf.rule, _F32(bf.elem_max)
    if rule is ScaleRule.TE:
        # Transformer Engine recipe_common.cuh compute_scale_from_amax
        a = np.where(amax < _F32(bf.eps), _F32(bf.eps), amax)
        scale = np.where(np.isinf(a) | (a == 0) | np.isnan(a), _F32(1), elem_max / a)
        scale = np.where(np.isinf(scale), _FLT_MAX, scale).astype(_F32)
        if bf.pow2:
            scale = (scale.view(np.uint32) & np.uint32(0xFF800000)).view(_F32)
        return xb * scale, (_F32(1) / scale).view(np.uint32), None
    if rule is ScaleRule.ABSMAX:
        s = (np.maximum(amax, _F32(bf.eps)) / elem_max).astype(_F32)
        return xb / np.where(s == 0, _F32(1), s), s.view(np.uint32), None
    if rule is ScaleRule.NVFP4:
        return _nvfp4(xb, amax, bf, tensor_amax)
    e = _mx_exponent(amax, bf)
    nan = ~np.isfinite(amax) | (e > 127)
    e = np.maximum(e, -127)
    codes = np.where(nan, 255, e + 127).astype(np.uint8)
    v = np.where(nan, np.nan, np.ldexp(xb.astype(np.float64), np.where(nan, 0, -e).astype(np.int32)))
    return v, codes, None


def _mx_exponent(amax: np.ndarray, bf: BlockFormat) -> np.ndarray:
    """Unclamped shared exponent of each block (OCP MX v1.0 6.3 and its variants)."""
    emax = math.frexp(bf.elem_max)[1] - 1  # floor(log2(elem_max)): E4M3 8, E2M1 2, INT8 0
    bits = amax.astype(_F32).view(np.uint32)
    if bf.rule is ScaleRule.MX_EVEN:  # round amax half-up to the element's significand width
        el = bf.element
        m = el.mantissa_bits if isinstance(el, Format) else el.bits - 2
        bits = (bits + np.uint32(1 << (22 - m))) & np.uint32(0xFF800000)
    if bf.rule is ScaleRule.MX_RCEIL:  # ceil to a power of two of amax * (1 / elem_max)
        d = (amax.astype(_F32) * _F32(1 / bf.elem_max)).view(np.uint32)
        biased, mant = (d >> 23).astype(np.int64), d & np.uint32(0x7FFFFF)
        up = np.where(biased == 0, mant > 0x400000, mant != 0)
        return biased + up - 127
    e = ((bits >> 23) & np.uint32(0xFF)).astype(np.int64) - 127 - emax
    if bf.rule is ScaleRule.MX_CEIL:
        e = e + ((bits & np.uint32(0x7FFFFF)) != 0)
    return e


def _nvfp4(xb: np.ndarray, amax: np.ndarray, bf: BlockFormat, tensor_amax: float | None):
    """Transformer Engine NVFP4 (core_nvfp4.cuh): FP32 tensor scale, E4M3 block scales."""
    if tensor_amax is None:
        amax_t = np.fmax.reduce(amax, axis=None, initial=0, dtype=_F32)
    else:
        amax_t = _F32(tensor_amax)
    s_enc = np.fmin(_F32(2688) / amax_t, _FLT_MAX)  # 448 * 6
    s_enc = _F32(1) if (amax_t == 0 or s_enc == 0) else _F32(s_enc)
    s_dec = _F32(1) / s_enc
    sdb = np.fmin(amax * (s_enc * _F32(1 / 6)), _FLT_MAX)
    e4m3 = bf.scale_format
    s8 = emulate.encode(sdb, e4m3, saturate=True)
    s8v = emulate.decode(s8, e4m3)
    c = np.where(s8v == 0, _FLT_MAX, np.fmin(_F32(1) / (s8v * s_dec), _FLT_MAX))
    return xb * c, s8, float(s_dec)


def _codebook(xb, amax, book: Codebook, mode: RoundMode, rand, nbits: int):
    """bitsandbytes blockwise quantization: ``x * f32(1/absmax)``, then a codebook index."""
    c = book.table
    if book.lut_bins:  # bitsandbytes 0.50.2 CPU kernel
        v = np.clip(xb * (_F32(1) / amax), _F32(-1), _F32(1))
        a = ((v + _F32(1)) * _F32(0.5)).astype(np.float64)
        k = (a * (book.lut_bins - 1) + 0.5).astype(_F32)  # one rounding, as the fused FMA
        k = np.where(np.isnan(k), 0, np.trunc(k)).astype(np.int64) & 0xFFFF
        q = _bnb_lut(book)[k]
        q = np.where(amax == 0, 0, q).astype(np.uint8)
    else:  # bitsandbytes' CUDA and pure-torch paths: nearest entry, ties to the lower one
        v = xb * (_F32(1) / np.maximum(amax, _F32(1e-38)))
        if mode is not _R.NEAREST_EVEN:  # (the nearest-entry buckets map |v| > 1 to the ends)
            v = np.clip(v, _F32(-1), _F32(1))
        q = _codebook_round(v, c, mode, rand, nbits)
    return q, amax.astype(_F32).view(np.uint32), None


def _codebook_round(v, c, mode: RoundMode, rand, nbits: int) -> np.ndarray:
    if mode is _R.NEAREST_EVEN:
        base, thr = nearest_buckets(c)
        key = v.astype(_F32, copy=False).view(np.uint32) >> np.uint32(16)
        q = base[key]
        np.add(q, v > thr[key], out=q, casting="unsafe")
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
    return np.where(v < c[0], 0, q).astype(np.uint8)  # below the first entry: it is the only one


_BUCKETS: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}


def nearest_buckets(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """O(1) form of ``searchsorted(f32 midpoints, v, side="left")`` for float32 ``v``.

    The float32 values sharing their top 16 bits form an interval; over it the index is a
    step function with at most one step for these codebooks, so index = ``base[key] +
    (v > thr[key])`` (``thr`` = the midpoint inside the interval, or +inf); values beyond
    the ends get the end entries and NaN the last entry. Built once per codebook; intervals
    holding two or more midpoints are refused (they do not occur in the bitsandbytes maps;
    the tests compare with searchsorted on every float32 bucket edge).
    """
    k = c.tobytes()
    if k not in _BUCKETS:
        mid = (c[:-1] + c[1:]) / _F32(2)
        keys = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
        a, b = keys.view(_F32), (keys | np.uint32(0xFFFF)).view(_F32)
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        with np.errstate(invalid="ignore"):
            q_lo = np.searchsorted(mid, lo, side="left")
            q_hi = np.searchsorted(mid, hi, side="left")
        finite = np.isfinite(lo) & np.isfinite(hi)
        if np.any(finite & (q_hi - q_lo > 1)):
            raise ValueError("codebook too dense for the bucket lookup")
        thr = np.where(q_hi > q_lo, mid[np.minimum(q_lo, mid.size - 1)], np.inf).astype(_F32)
        nan = (keys & np.uint32(0x7F800000)) == np.uint32(0x7F800000)  # NaN (and inf) keys
        q_lo[nan], thr[nan] = c.size - 1, np.inf  # NaN -> the last entry, as bitsandbytes
        _BUCKETS[k] = (q_lo.astype(np.uint8), thr)
    return _BUCKETS[k]


_LUTS: dict[tuple, np.ndarray] = {}


def _bnb_lut(book: Codebook) -> np.ndarray:
    """Index of the nearest entry for each of the bins' grid points (bitsandbytes CPU)."""
    key = book.values
    if key not in _LUTS:
        c = book.table
        i = np.arange(book.lut_bins, dtype=_F32)
        grid = (i + i) / _F32(book.lut_bins - 1) - _F32(1)
        mid = (c[:-1] + c[1:]) * _F32(0.5)
        _LUTS[key] = np.searchsorted(mid, grid, side="left").astype(np.uint8)
    return _LUTS[key]


# --- geometry --------------------------------------------------------------------------


def _recipe(fmt: str | BlockFormat) -> BlockFormat:
    bf = get_format(fmt)
    if not isinstance(bf, BlockFormat):
        raise TypeError(f"{bf.name} is an element format; use fpsim.encode / fpsim.emulate.element for it")
    return bf


def _as_f32(x: Any) -> np.ndarray:
    if type(x).__module__.startswith("jax"):
        raise TypeError("block formats run on numpy arrays; convert with np.asarray first")
    x = np.asarray(x)
    if x.dtype != _F32:
        with np.errstate(over="ignore"):
            x = emulate._as_float_array(x)[1].astype(_F32)
    return x


def block_geometry(shape: tuple, bf: BlockFormat) -> tuple[tuple, tuple]:
    """The shape that is blocked and the block size along each of its axes."""
    if bf.flatten:
        work = (math.prod(shape),)
        blk = bf.block
    elif bf.block is None:
        work = shape or (1,)
        blk = tuple(max(t, 1) for t in work)
    else:
        k = len(bf.block)
        if len(shape) < k:
            raise ValueError(
                f"{bf.name}: blocks {bf.block} span the last {k} axes; got a tensor of shape {shape}"
            )
        work = shape
        tail = tuple(max(t, 1) if b == -1 else b for t, b in zip(shape[-k:], bf.block))
        blk = (1,) * (len(shape) - k) + tail
    if not bf.pad:
        for axis, (t, b) in enumerate(zip(work, blk)):
            if t % b:
                raise ValueError(
                    f"{bf.name}: axis {axis} has length {t}, not a multiple of the "
                    f"block {b}, and padding is off (pad=False)"
                )
    return work, blk


def _to_blocks(a: np.ndarray, blk: tuple) -> np.ndarray:
    """Pad each axis with zeros to a multiple of its block; axes become (count, block) pairs."""
    pads = [(0, (-t) % b) for t, b in zip(a.shape, blk)]
    if any(p for _, p in pads):
        a = np.pad(a, pads)
    return a.reshape([n for t, b in zip(a.shape, blk) for n in (t // b, b)])


def _from_blocks(ab: np.ndarray, work: tuple) -> np.ndarray:
    padded = tuple(ab.shape[i] * ab.shape[i + 1] for i in range(0, ab.ndim, 2))
    return ab.reshape(padded)[tuple(slice(0, t) for t in work)]
