"""Compiled quantize-dequantize of one tensor (numba): the float32 values a block or element
format stores for it, written in one pass without materializing the element codes (a tile's
buffer only); and :func:`hadamard16`, NVFP4's wgrad transform.

The loops here compose the compiled tier's rules, they hold none of their own: the element
codes are :func:`fpsim._compiled.measure.codes_tile` (the numpy tier's integer rounding rules,
stochastic words given or drawn by :func:`~fpsim._compiled.measure.random_word`), the blocks
are numbered as :func:`~fpsim._compiled.measure.block_ids` numbers them, the blocks' amaxes
are :func:`fpsim._compiled.loops.absmax` or :func:`~fpsim._compiled.loops.amax_nan` of their
pieces, and the per-block factors and decode scales come in from the numpy rules
(:func:`fpsim.emulate.scale_rules.block_factors`, one amax per block), applied by kind as
:func:`~fpsim._compiled.measure.block_tally` applies them. :mod:`fpsim.emulate.fused` drives
them; ``tests/emulate/test_fused.py`` compares every value with ``decode(encode(x))`` of the
numpy tier, bit for bit. With statistics, :func:`block_values` also counts the saturated
elements and each block's magnitude range, and :func:`tally` the rest of what
:func:`fpsim.train.opstats.operand_stats` decides on numpy (integer decisions: order-free;
``tests/train/test_operand_stats_fused.py`` compares the statistics). :func:`hadamard16`
runs the float64 operations of :func:`fpsim.train.gemm.hadamard16` in the same order
(``tests/train/test_fused_operand.py`` compares them).

Unlike :mod:`.loops` and :mod:`.measure`, these loops call compiled functions of other files,
whose compiled code numba stores inside this file's cache entries while checking only this
file's time stamp. So the disk cache is used only while this file is at least as new as
``loops.py`` and ``measure.py``; after an edit of either, the loops compile in memory in each
process (slower to start, never stale) until this file is touched again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from . import loops, measure
from .measure import D_POW2, D_TENSOR, F_PRODUCT, F_QUOTIENT, TILE, codes_tile

__all__ = ["block_amax", "block_values", "butterfly", "element_values", "hadamard16", "tally"]


def _fresh() -> bool:
    """Whether this file is at least as new as the files whose loops it calls (module doc)."""
    own = os.stat(__file__).st_mtime
    return all(own >= os.stat(m.__file__).st_mtime for m in (loops, measure))


def _compiler() -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit`` as :data:`fpsim._compiled.loops.jit` compiles (no fast-math), with the disk
    cache only where :func:`_fresh` and a writable cache folder allow it."""
    options: dict[str, Any] = {"nogil": True, "fastmath": False, "error_model": "numpy"}

    def decorate(fn: Callable[..., Any]) -> Any:
        if _fresh():
            try:
                return njit(cache=True, **options)(fn)
            except RuntimeError:  # "cannot cache function ...: no locator available"
                pass
        return njit(cache=False, **options)(fn)

    return decorate


jit = _compiler()


@jit
def block_amax(x, layout, ignore_nan, out):
    # measure.block_amax (the same blocks, numbers and values) run by run: the blocks' pieces
    # in each row reduced by loops.absmax (NaN skipped, fmaxf) where ignore_nan, else by
    # loops.amax_nan (torch.amax: the canonical quiet NaN if any), which vectorize; a tile's
    # rows combined with max, a NaN kept
    cols, bc, rows, br = layout[0], layout[1], layout[2], layout[3]
    per_row, bands = (cols + bc - 1) // bc, (rows + br - 1) // br
    for r in range(x.size // cols):  # row r of matrix r // rows
        first = ((r // rows) * bands + (r % rows) // br) * per_row
        row = x[r * cols : (r + 1) * cols]
        for k in range(per_row):
            piece = row[k * bc : min((k + 1) * bc, cols)]
            a = loops.absmax(piece) if ignore_nan else loops.amax_nan(piece)
            b = out[first + k]
            out[first + k] = a if (a > b) | (a != a) else b


@jit
def block_values(
    xs, layout, f32, f64, dscale, tscale, p, mode, nbits, mix, rand, table, out, top, sat, ranges
):
    # fpsim.emulate.blocks.decode_array(encode_array(xs)) of a float32 tensor (flat) under a
    # block recipe, into out (float32), in tiles of whole rows: blocks numbered as
    # measure.block_ids numbers them (layout: cols, bc, rows, br, kind, dkind), inputs by kind
    # (FactorKind) as measure.block_tally takes them (PRODUCT xs * f32[b], QUOTIENT xs / f32[b],
    # POW2 float64 xs * f64[b], NaN where f64[b] is), codes by measure.codes_tile under the
    # element parameters p (saturating), words rand[i] or, where rand is empty,
    # random_word(mix, i); values table[code] times dscale[b] by dkind (DecodeKind: POW2
    # float64 product, TENSOR (v * s) * tscale, PRODUCT v * s). Where sat is not empty, sat[0]
    # counts the saturated elements: code top[0] or top[1] (the codes of the element format's
    # largest magnitude) and |x| > |value| (float32 compares: those of the exact widenings),
    # and ranges (xbits, hi, lo: xs's uint32 view, per block the largest and smallest
    # magnitude bits of its finite nonzero elements, combined with what they hold) is filled
    cols, bc, rows, br, kind, dkind = layout[0], layout[1], layout[2], layout[3], layout[4], layout[5]
    per_row, bands, given = (cols + bc - 1) // bc, (rows + br - 1) // br, rand.size > 0
    track = sat.size > 0
    t0, t1 = (top[0], top[1]) if track else (np.uint64(0), np.uint64(0))
    xbits, bhi, blo = ranges
    step = max(1, TILE // cols)  # rows per tile
    codes, v = np.empty(step * cols, np.uint64), np.empty(step * cols, np.float64)
    nrows = xs.size // cols
    for r0 in range(0, nrows, step):
        r1 = min(nrows, r0 + step)
        lo, k = r0 * cols, (r1 - r0) * cols
        for r in range(r0, r1):
            first, at = ((r // rows) * bands + (r % rows) // br) * per_row, (r - r0) * cols
            for c in range(per_row):  # (loops over slices from 0: no wraparound checks)
                a, b, j = c * bc, min((c + 1) * bc, cols), first + c
                x, w = xs[r * cols + a : r * cols + b], v[at + a : at + b]
                if kind == F_PRODUCT:
                    f = f32[j]
                    for i in range(x.size):
                        w[i] = np.float64(x[i] * f)
                elif kind == F_QUOTIENT:
                    f = f32[j]
                    for i in range(x.size):
                        w[i] = np.float64(x[i] / f)
                else:
                    g = f64[j]
                    for i in range(x.size):
                        w[i] = np.nan if g != g else np.float64(x[i]) * g
                if track:  # the block's finite nonzero magnitudes' range
                    u, h, e = xbits[r * cols + a : r * cols + b], bhi[j], blo[j]
                    for i in range(u.size):
                        m = u[i] & np.uint32(0x7FFFFFFF)
                        finite = (m - np.uint32(1)) <= np.uint32(0x7F7FFFFE)  # 0 < m < inf, unsigned
                        h = max(h, m if finite else np.uint32(0))
                        e = min(e, m if finite else np.uint32(0xFFFFFFFF))
                    bhi[j], blo[j] = h, e
        codes_tile(v[:k], p, mode, nbits, mix, lo, rand[lo : lo + k] if given else rand, codes[:k])
        for r in range(r0, r1):
            first, at = ((r // rows) * bands + (r % rows) // br) * per_row, (r - r0) * cols
            for c in range(per_row):
                a, b, s = c * bc, min((c + 1) * bc, cols), dscale[first + c]
                cs, o = codes[at + a : at + b], out[r * cols + a : r * cols + b]
                if dkind == D_POW2:
                    for i in range(cs.size):
                        o[i] = np.float32(np.float64(table[cs[i]]) * np.float64(s))
                elif dkind == D_TENSOR:
                    for i in range(cs.size):
                        o[i] = (table[cs[i]] * s) * tscale
                else:
                    for i in range(cs.size):
                        o[i] = table[cs[i]] * s
        if track:  # the tile's saturated elements, in one loop
            ct, ot, xt, n = codes[:k], out[lo : lo + k], xs[lo : lo + k], 0
            for i in range(k):
                n += ((ct[i] == t0) | (ct[i] == t1)) & (abs(xt[i]) > abs(ot[i]))
            sat[0] += n


@jit
def element_values(x, p, mode, nbits, mix, rand, table, out):
    # fpsim.emulate.element.decode_array(encode_array(x)) of a float32 tensor (flat) under an
    # element format of at most 16 bits, into out (float32), tile by tile: x widened to
    # float64 (exact; codes_tile's loops run faster on it), codes by codes_tile (words as in
    # block_values), values table[code]
    n, given = x.size, rand.size > 0
    codes, v = np.empty(TILE, np.uint64), np.empty(TILE, np.float64)
    for lo in range(0, n, TILE):
        xs, o = x[lo : lo + TILE], out[lo : lo + TILE]
        for i in range(xs.size):
            v[i] = np.float64(xs[i])
        k = xs.size
        codes_tile(v[:k], p, mode, nbits, mix, lo, rand[lo : lo + k] if given else rand, codes[:k])
        for i in range(k):
            o[i] = table[codes[i]]


@jit
def tally(xs, bits, q, codes, top, limit, whole, sq, hi, lo, hif, lof, out):
    # the exact, order-free statistics of x (float32, flat; bits its uint32 view) quantized to
    # q, as fpsim.train.opstats.operand_stats decides them on numpy: out[0] the largest
    # magnitude bits without NaN (amax_ignore_nan), out[1] the count of x != 0 with q == 0,
    # out[2] the saturated count (codes[i] one of top[0], top[1] and |x| > |q| where codes is
    # not empty, else |x| > limit, none where limit is NaN; compares of the exact float64
    # widenings), out[3]
    # the block of max_block_dynamic_range's argmax over hi, lo (-1: none; hif, lof their
    # float32 views): per block the largest and smallest magnitude bits of its finite nonzero
    # elements (0 and 0xFFFFFFFF where none), found here where whole (one block: the tensor),
    # else by block_values; sq[i] = (f64(x) - f64(q))**2. Selects and integer reductions over
    # whole arrays (they vectorize)
    inf, big, none = np.uint32(0x7F800000), np.uint32(0x7F7FFFFE), np.uint32(0xFFFFFFFF)
    amax, under, sat, h, w = np.uint32(0), 0, 0, np.uint32(0), none
    for i in range(xs.size):
        m = bits[i] & np.uint32(0x7FFFFFFF)
        amax = max(amax, m if m <= inf else np.uint32(0))
        under += (xs[i] != 0) & (q[i] == 0)
        d = np.float64(xs[i]) - np.float64(q[i])
        sq[i] = d * d
    if whole:
        for i in range(xs.size):
            m = bits[i] & np.uint32(0x7FFFFFFF)
            finite = (m - np.uint32(1)) <= big  # 0 < m < inf, unsigned
            h = max(h, m if finite else np.uint32(0))
            w = min(w, m if finite else none)
        hi[0], lo[0] = h, w
    if codes.size > 0:
        t0, t1 = top[0], top[1]
        for i in range(xs.size):
            sat += ((codes[i] == t0) | (codes[i] == t1)) & (abs(xs[i]) > abs(q[i]))
    elif limit == limit:
        for i in range(xs.size):
            sat += abs(np.float64(xs[i])) > limit
    best, k = 0.0, -1
    for j in range(hi.size):  # np.argmax of top / bottom over the blocks with one: the first largest
        if hi[j] != 0:
            ratio = np.float64(hif[j]) / np.float64(lof[j])
            if k < 0 or ratio > best:
                best, k = ratio, j
    out[0], out[1], out[2], out[3] = amax, under, sat, k


@jit
def butterfly(v, h):
    # one butterfly stage: entries j and j + h of each 2h-group of the 16 in v become their
    # sum and difference (the 8 pairs, in order)
    for k in range(8):
        lo = (k // h) * 2 * h + k % h
        s, d = v[lo] + v[lo + h], v[lo] - v[lo + h]
        v[lo], v[lo + h] = s, d


@jit
def hadamard16(a, signs, out):
    # fpsim.train.gemm.hadamard16 of float32 a (flat, chunks of 16) into out (float32), the
    # same float64 operations in the same order: each entry times its sign (exact), the
    # butterfly stages h = 1, 2, 4, 8, then f32(v * 0.25), one rounding
    v = np.empty(16, np.float64)
    for c in range(a.size // 16):
        x, o = a[c * 16 : c * 16 + 16], out[c * 16 : c * 16 + 16]
        for j in range(16):
            v[j] = np.float64(x[j]) * signs[j]
        butterfly(v, 1)
        butterfly(v, 2)
        butterfly(v, 4)
        butterfly(v, 8)
        for j in range(16):
            o[j] = np.float32(v[j] * 0.25)
