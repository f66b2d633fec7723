"""Statistics of one quantized GEMM operand (:class:`OperandStats`), on either backend.

The numpy tier is the reference: :func:`operand_stats` takes the operand ``a``, its values
``q`` and the element codes' at-max marks and decode scales from the unfused encode, and
decides each field with numpy (``tests/train/test_gemm.py`` checks them against TE's
formulas and per-element Python oracles). On the compiled backend :func:`fused_stats`
builds the same record from one compiled quantize pass and one compiled tally pass
(:func:`fpsim.emulate.fused.quantize_tally`): the counts, the amax and each block's
largest and smallest magnitude are exact integer decisions (order-free); the reductions
whose result depends on the order of a sum (``mse``, ``scale_inv_std``) and the float
formulas (``min``/``max`` of the scales, the range's ``log2``) run the same numpy calls on
the same arrays in both tiers (:func:`fpsim.emulate.fused.mean_square`, :func:`_record`),
so every field is equal
(``tests/train/test_operand_stats_fused.py`` compares them, NaN by class).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..emulate import blocks, fused
from ..emulate.fused import Tally
from ..formats import BlockFormat
from ..formats.amax import amax_ignore_nan

__all__ = ["OperandStats", "fused_stats", "max_block_dynamic_range", "operand_stats"]


@dataclass(frozen=True)
class OperandStats:
    """One quantized GEMM operand, as TE's debug tools log it (``log_fp8_tensor_stats``).

    Attributes:
        numel: elements.
        amax: largest magnitude of the high-precision operand (after the Hadamard transform
            where there is one), NaN ignored.
        underflow_pct: nonzero elements quantized to zero (-0 counts as zero), % of ``numel``.
        saturated_pct: elements clamped: magnitude above the element format's largest value
            times the element's decode scale (TE's ``overflows%``), % of ``numel``; for element
            formats (bf16) the elements beyond the format's range. As in TE, per-tensor scaling
            can count the tensor's own amax element: ``max * f32(1 / scale)`` may round below
            it (tested against TE's formula under ``fp8-current``).
        scale_inv_min, scale_inv_max, scale_inv_std: over the decode scales of the blocks (NVFP4:
            block scale times tensor scale; min over the nonzero ones); NaN for element formats.
        mse: mean squared error of the dequantized operand (float64).
        max_block_dynamic_range: :func:`max_block_dynamic_range` of the high-precision operand
            over the blocks of its format (the whole tensor for per-tensor, delayed and element
            formats), in binades (log2).
    """

    numel: int
    amax: float
    underflow_pct: float
    saturated_pct: float
    scale_inv_min: float
    scale_inv_max: float
    scale_inv_std: float
    mse: float
    max_block_dynamic_range: float


def operand_stats(
    a: np.ndarray,
    q: np.ndarray,
    at_max: np.ndarray,
    scale_inv: np.ndarray | None,
    *,
    saturated: np.ndarray | None = None,
    block_format: BlockFormat | None = None,
) -> OperandStats:
    """:class:`OperandStats` of ``a`` quantized to ``q``: ``at_max`` marks elements coded at the
    format's largest magnitude (saturated when ``|a| > |q|``, unless ``saturated`` is given),
    ``scale_inv`` the decode scales (None: no scales), ``block_format`` the blocks of the
    dynamic range (None: the whole tensor)."""
    n = a.size
    with np.errstate(invalid="ignore", over="ignore"):
        if saturated is None:
            saturated = at_max & (np.abs(a.astype(np.float64)) > np.abs(q.astype(np.float64)))
        under = int(np.count_nonzero((a != 0) & (q == 0)))
        d = a.astype(np.float64, order="C") - q  # (C order: the same sum as fused_stats')
        mse = fused.mean_square(d * d)
    amax = float(amax_ignore_nan(a)) if n else math.nan
    dr = max_block_dynamic_range(a, block_format)
    return _record(n, amax, under, int(np.count_nonzero(saturated)), scale_inv, mse, dr)


def fused_stats(tally: Tally) -> OperandStats:
    """:class:`OperandStats` from the :class:`fpsim.emulate.fused.Tally` of a nonempty operand
    (the compiled backend): the same fields :func:`operand_stats` gives for the same input."""
    n = tally.numel
    if n == 0:
        raise ValueError("fused_stats: an empty operand has no tally (operand_stats takes it)")
    w = tally.widest
    dr = 0.0 if w is None else _binades(w[0], w[1])
    return _record(n, tally.amax, tally.underflow, tally.saturated, tally.scale_inv, tally.mse, dr)


def _record(
    n: int,
    amax: float,
    under: int,
    saturated: int,
    scale_inv: np.ndarray | None,
    mse: float,
    dr: float,
) -> OperandStats:
    """The record from what both tiers decide alike (module doc): the counts as percentages, the
    scales' min over the nonzero ones, max and std (``mse`` is
    :func:`fpsim.emulate.fused.mean_square` on both)."""
    smin, smax, sstd = _scale_summary(scale_inv)
    pct = 100.0 / n if n else math.nan
    return OperandStats(n, amax, under * pct, saturated * pct, smin, smax, sstd, mse, dr)


def _scale_summary(scale_inv: np.ndarray | None) -> tuple[float, float, float]:
    """min over the nonzero scales (0.0 where none), max and std (numpy's ``min``, ``max``,
    ``std``; NaN without scales). One scale (per-tensor scaling) is read off directly, as numpy
    computes it: ``x`` itself (min: 0.0 where 0), std ``sqrt((x - x)**2)``: 0.0, NaN for an
    infinite or NaN ``x`` (tests/train/test_operand_stats_fused.py compares with numpy)."""
    if scale_inv is None or scale_inv.size == 0:
        return math.nan, math.nan, math.nan
    if scale_inv.size == 1:
        x = float(scale_inv.reshape(-1)[0])
        return (0.0 if x == 0 else x), x, (0.0 if math.isfinite(x) else math.nan)
    nz = scale_inv[scale_inv != 0]
    smin = float(nz.min()) if nz.size else 0.0
    return smin, float(scale_inv.max()), float(scale_inv.std())


def _binades(top: float, bottom: float) -> float:
    """The dynamic range of a block whose finite nonzero magnitudes span ``bottom..top``."""
    return math.log2(top) - math.log2(bottom)


_MAG = np.uint32(0x7FFFFFFF)
_INF_BITS = np.uint32(0x7F800000)


def max_block_dynamic_range(a: np.ndarray, block_format: BlockFormat | None = None) -> float:
    """The largest dynamic range of a block of ``a``, in binades.

    A block's dynamic range is ``log2(max|x|) - log2(min |x|)`` over its finite nonzero
    elements (NaN, infinities and zeros of either sign left out; 0 for a block without any);
    the result is the largest over the blocks of ``block_format`` along ``a``'s axes (its
    :func:`fpsim.emulate.blocks.block_geometry`: 1x32 blocks along the contraction axis,
    16x16 or 128x128 tiles; padding adds no element), or of the whole tensor as one block
    when ``block_format`` is None or scales the whole tensor. Transformer Engine's
    ``LogTensorStats`` stat ``max_blockwise_dynamic_range`` (``block_size``, ``dims`` 1 or 2,
    in ``debug/features/utils/stats_computation.py``) is the same quantity over blocks of the
    flattened 2-D tensor it chooses, except that its torch reductions let an infinity through
    (an infinite range) and a NaN poison its block.

    Each decision is an integer comparison of float32 bit patterns (no NaN-dependent SIMD
    reduction); the block with the largest ``max / min`` (a float64 quotient, correctly
    rounded) gives ``math.log2(max) - math.log2(min)`` (exact for powers of two).

    Raises:
        TypeError: ``a`` is not float32.
    """
    if a.dtype != np.float32:
        raise TypeError(f"max_block_dynamic_range takes a float32 array, got {a.dtype}")
    if a.size == 0:  # no block holds a finite nonzero element
        return 0.0
    mag = np.ascontiguousarray(a).view(np.uint32) & _MAG
    keep = (mag != 0) & (mag < _INF_BITS)
    hi = np.where(keep, mag, np.uint32(0))
    lo = np.where(keep, mag, np.uint32(0xFFFFFFFF))
    if block_format is None or block_format.block is None or a.ndim == 0:
        hi, lo = hi.reshape(1, -1), lo.reshape(1, -1)
    else:
        work, blk = blocks.block_geometry(a.shape, block_format)
        pads = [(0, (-t) % b) for t, b in zip(work, blk)]
        split = [n for t, b in zip(work, blk) for n in ((t + (-t) % b) // b, b)]
        hi = np.pad(hi.reshape(work), pads, constant_values=0).reshape(split)
        lo = np.pad(lo.reshape(work), pads, constant_values=0xFFFFFFFF).reshape(split)
        inner = tuple(range(1, 2 * len(work), 2))
        hi = hi.transpose(*range(0, 2 * len(work), 2), *inner).reshape(-1, math.prod(blk))
        lo = lo.transpose(*range(0, 2 * len(work), 2), *inner).reshape(-1, math.prod(blk))
    hi, lo = hi.max(axis=1), lo.min(axis=1)
    some = hi != 0
    if not some.any():
        return 0.0
    top = hi[some].view(np.float32).astype(np.float64)
    bottom = lo[some].view(np.float32).astype(np.float64)
    k = int(np.argmax(top / bottom))
    return _binades(top[k], bottom[k])
