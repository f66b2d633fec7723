"""Emulated low-precision accumulation: sums, dot products and matrix products.

Every addition is rounded once, exactly, into the accumulator's format, in a fixed order, so
swamping (an addend lost because it is below half an ulp of the running sum) and the error
growth of long reductions can be measured, e.g. the FP8 GEMMs of DeepSeek-V3 (arXiv
2412.19437, section 3.3.2), whose Hopper tensor cores keep about 14 bits of the sum.

Definitions (the schedule is data-independent, so a kernel can mirror it bit for bit):

Addends.
    ``sum`` adds the elements of ``x`` (reduced axes flattened in C order). ``dot`` adds the
    products ``a[..., k] * b[..., k]``; ``matmul`` the products ``a[i, k] * b[k, j]``.
    Inputs are first converted to float32 (float64 rounds to nearest even; narrower types
    are exact), then rounded to ``input_format`` if one is given (an element format, or a
    block recipe applied as fake quantization: values are the decoded float32 values).
    A product is exact (a product of two float32 values is exact in float64); with
    ``product_format`` it is rounded once to that format. ``product_format=None`` thus
    models a fused multiply-add (one rounding per step, as tensor cores and FFMA do);
    ``product_format="float32"`` models a separate multiply and add.

Rounding.
    ``R(v)`` rounds the exact real ``v`` to the accumulator format with ``rounding``
    (IEEE 754-2019 section 4.3 for the directed and nearest modes, overflow by section
    7.4, formats without infinity as :func:`fpsim.encode`; stochastic and odd as defined
    in :class:`fpsim.RoundMode`). ``R(u + v)`` is the exact sum rounded once.

Order (``order``, ``block``): a tree of width ``W`` over the ``n`` addends of a chunk.
    Level 0 holds the addends; the elements of each level are cut into consecutive groups
    of ``W`` (the last group may be shorter); each group is summed left to right,
    ``s = R(e_0)``, ``s = R(s + e_i)``; the group sums are the next level; this repeats
    until one value remains. ``"sequential"`` is ``W = n`` (one group: the plain left to
    right sum), ``"pairwise"`` is ``W = 2`` (a balanced binary tree; at every node the left
    child covers the largest power of two below the node's length), ``"blocked"`` takes
    ``block=W``. A group's partial sum never mixes with another group's before the group
    is complete.

Compensation (``compensated``), per group, every operation rounded by ``R``:
    ``"kahan"`` (Kahan 1965; Higham, Accuracy and Stability, Alg. 4.2):
    ``s = R(e_0), c = 0``; then ``y = R(e_i - c); u = R(s + y); c = R(R(u - s) - y); s = u``;
    the group's value is ``s``. ``"neumaier"`` (Neumaier 1974): ``s = R(e_0), c = 0``;
    then ``u = R(s + e_i)``, ``t = R(R(s - u) + e_i)`` if ``|s| >= |e_i|`` else
    ``t = R(R(e_i - u) + s)``, ``c = R(c + t)``, ``s = u``; the value is ``R(s + c)``.
    ``True`` means ``"kahan"``.

Promotion (``promote_every=N``, DeepSeek-V3 section 3.3.2 "increasing accumulation
precision"): the addends are cut into consecutive chunks of ``N``; each chunk is reduced in
the accumulator as above, and its value ``c_j`` is added into a second accumulator in
``promote_to`` (float32) with ``promote_rounding``: ``P = R'(c_0)``, ``P = R'(P + c_j)``.
:func:`scaled_matmul` multiplies ``c_j`` by the block scales first, see there.

Random bits (stochastic rounding). The roundings of one output element are numbered
``j = 0, 1, ...`` in the order they happen when the tree is evaluated depth first, left to
right (a group's value is added to its parent group as soon as the group is complete;
after a chunk's root, its promotion rounding). :func:`rounding_count` gives the total.
Rounding ``j`` of output element ``o`` (flat C index of the output) uses the low
``stochastic_bits`` bits of ``random_bits[j].flat[o]``, or of the word
``fpsim.emulate.random.random_bits_at(4 * seed, j * n_out + o, 1)`` when ``seed`` is given.
Products use ``random_bits_at(4 * seed + 1, k * n_out + o, 1)`` (also ``stochastic_bits``
bits); inputs ``a`` (or ``x``) and ``b`` use ``4 * seed + 2`` and ``4 * seed + 3`` at their
flat element index (32 bits, as :func:`fpsim.encode`).

Cost: the loop over K runs in Python; each step is about 16 numpy operations on a tile of
up to ``2**14`` outputs (float64 temporaries that stay in L2), so a 1024^3 matmul takes a
few seconds (``benchmarks/bench_accumulate.py``), while a single long 1-D sum runs at about
1e5 additions per second (1e4 with compensation).

Mirroring in a kernel: results are defined by the exact values above, so any correct
implementation agrees bit for bit. The emulator computes ``R(acc + t)`` in float64 (below);
a GPU kernel whose products are exact in float32 (inputs of at most 12 significant bits,
e.g. FP8 and FP16, or BF16 away from the bottom of its range) can compute the same with
float32 TwoSum and round-to-odd at 24 bits for accumulators of at most 22 bits (stochastic
rounding then takes at most ``23 - p`` random bits), looping in the order defined here and
contracting a multiply and an add only where the fused step is modelled.

The rounding core and the schedule live in :mod:`fpsim.accumulate._accumulator`, the exact
references in :mod:`fpsim.accumulate.exact`. Exactness of one rounded addition (see
``_Rounder.add``): for float64 operands ``u, v`` the float64 sum ``s = u + v`` and its error
``e`` (Knuth's TwoSum) satisfy ``u + v = s + e`` exactly. ``s`` is then replaced by the
round-to-odd value ``RO53(u + v)``: ``s`` itself when ``e = 0`` or ``s`` is odd, else the odd
neighbour of ``s`` on ``e``'s side. Rounding ``RO53(x)`` to ``p <= 51`` bits gives ``R(x)``
for every non-stochastic mode (Boldo and Melquiond, "Emulation of FMA and correctly rounded
sums: proved algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008, Theorem 1
for nearest; for the directed modes and odd because ``RO53(x)`` lies strictly between the same
two ``p``-bit neighbours as ``x`` when ``x`` is not a ``p``-bit number, and equals ``x`` when
it is). Stochastic rounding only reads the top ``n = stochastic_bits`` discarded bits and
whether any discarded bit is set; the odd bit sits below those bits when ``n <= 51 -
mantissa_bits``, so ``n`` is capped there (28 for a float32 accumulator, 32 for 14 bits or
fewer)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..emulate import element as emulate
from ..emulate.blocks import decode_blocks, encode_blocks
from ..emulate.random import random_bits_at
from ..formats import BlockFormat, Codebook, Format, IntFormat, RoundMode, get_format
from ._accumulator import (
    _TILE,
    _as_f32,
    _count,
    _decode64,
    _reduce_tile,
    _Rounder,
    _Spec,
    _spec,
    _Stream,
    accumulator_format,
    rounding_count,
)
from .exact import error_summary, exact_dot, exact_matmul, exact_sum, relative_error

__all__ = [
    "AccumulationInfo",
    "accumulator_format",
    "dot",
    "error_summary",
    "exact_dot",
    "exact_matmul",
    "exact_sum",
    "matmul",
    "relative_error",
    "rounding_count",
    "scaled_matmul",
    "sum",
]


def _round_to(x: np.ndarray, fmt, mode: RoundMode, rand, nbits: int = 32) -> np.ndarray:
    """``x`` (float64 or float32) rounded to an element format, as float64 (any width)."""
    if isinstance(fmt, IntFormat):
        return emulate.quantize(x, fmt, rounding=mode, random_bits=rand, stochastic_bits=nbits).astype(
            np.float64
        )
    x64 = np.array(x, np.float64, copy=True).reshape(-1)
    r = None if rand is None else np.asarray(rand).reshape(-1)
    if fmt.signed and fmt.has_zero:
        out = _Rounder(fmt, mode, nbits, 0).exact(x64, out=x64, rand=r)
    else:
        out = _decode64(emulate.encode(x64, fmt, rounding=mode, random_bits=r, stochastic_bits=nbits), fmt)
    return out.reshape(np.shape(x))


def _inputs(x: Any, fmt, rounding, seed_stream: int | None, name: str, along_last: bool = False):
    """float32 values of an input after ``input_format`` (element format or block recipe)."""
    v = _as_f32(x, name)
    if fmt is None:
        return v
    fmt = get_format(fmt)
    mode = RoundMode.parse(rounding)
    rand = None
    if mode is RoundMode.STOCHASTIC:
        if seed_stream is None:
            raise ValueError(f"{name}: stochastic input rounding needs seed=")
        rand = random_bits_at(seed_stream, 0, v.size).reshape(v.shape)
    if isinstance(fmt, BlockFormat):
        enc = encode_blocks(v, fmt, rounding=mode, random_bits=rand)
        return decode_blocks(enc, fmt)
    return _round_to(v, fmt, mode, rand).astype(np.float32)


def _pair(value, what: str) -> tuple:
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ValueError(f"{what}: a pair (for a, for b) or one value for both; got {value!r}")
        return value
    return value, value


# --- drivers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AccumulationInfo:
    """Swamping counts of a reduction (level-0 additions only, i.e. the original addends).

    Attributes:
        lost: per output element, additions ``R(s + t)`` with ``t != 0`` that returned ``s``
            unchanged: the addend was lost entirely (for Kahan, ``t`` is the corrected
            addend ``y`` and the loss may later be repaid by the compensation).
        nonzero_adds: per output element, additions with ``t != 0`` (the first addend of a
            group is loaded, not added, and is not counted).
        roundings: roundings per output element (:func:`rounding_count`).
    """

    lost: np.ndarray
    nonzero_adds: np.ndarray
    roundings: int

    @property
    def lost_share(self) -> float:
        """Share of nonzero additions whose addend was lost (0 when there were none)."""
        n = int(self.nonzero_adds.sum())
        return int(self.lost.sum()) / n if n else 0.0


def _run(
    spec: _Spec,
    k: int,
    out_shape: tuple,
    tiles: Sequence[tuple[int, int, Callable[[int], np.ndarray], Callable | None]],
    random_bits,
    seed: int | None,
    return_info: bool,
    promoted: bool,
):
    """Evaluate the schedule tile by tile; tiles are (start, stop, addend(k), scale(c0))."""
    n_out = math.prod(out_shape)
    count = _count(k, spec.width, spec.comp, spec.chunk, promoted)
    stochastic = RoundMode.STOCHASTIC in (spec.mode, spec.pmode if spec.promote else None)
    bits = None
    if stochastic and random_bits is not None:
        bits = np.asarray(random_bits)
        if bits.dtype != np.uint32 or bits.shape != (count, *out_shape):
            raise ValueError(
                f"random_bits must be uint32 of shape {(count, *out_shape)} (rounding_count x output); "
                f"got {bits.dtype} {bits.shape}"
            )
        bits = bits.reshape(count, n_out)
    elif stochastic and seed is None:
        raise ValueError("stochastic rounding needs random_bits= or seed=")
    out = np.empty(n_out, np.float64)
    lost = np.zeros(n_out, np.int64) if return_info else None
    nz = np.zeros(n_out, np.int64) if return_info else None
    for start, stop, addend, scale in tiles:
        if bits is not None:
            source = lambda j, s=start, e=stop: bits[j, s:e]  # noqa: E731
        elif stochastic:
            source = lambda j, s=start, e=stop: random_bits_at(4 * seed, j * n_out + s, e - s)  # noqa: E731
        else:
            source = None
        counts = [np.zeros(stop - start, np.int64), np.zeros(stop - start, np.int64)] if return_info else None
        if k == 0:
            out[start:stop] = 0.0
        else:
            out[start:stop] = _reduce_tile(spec, k, addend, _Stream(source), scale, counts)
        if return_info:
            lost[start:stop], nz[start:stop] = counts
    result = out.astype(np.float32).reshape(out_shape)
    if return_info:
        return result, AccumulationInfo(lost.reshape(out_shape), nz.reshape(out_shape), count)
    return result


def _product_fn(product_format, product_rounding, seed, n_out: int, nbits: int):
    """``f(t, k, start)``: round the exact products of step ``k`` of a tile starting at ``start``."""
    if product_format is None:
        return None
    fmt = get_format(product_format)
    if isinstance(fmt, BlockFormat):
        raise ValueError("product_format must be an element format, not a block recipe")
    mode = RoundMode.parse(product_rounding)
    if mode is RoundMode.STOCHASTIC and seed is None:
        raise ValueError("stochastic product rounding needs seed=")

    def f(t: np.ndarray, k: int, start: int) -> np.ndarray:
        rand = (
            random_bits_at(4 * seed + 1, k * n_out + start, t.size) if mode is RoundMode.STOCHASTIC else None
        )
        return _round_to(t, fmt, mode, rand, nbits)

    return f


def _flat_tiles(n_out: int):
    return [(s, min(s + _TILE, n_out)) for s in range(0, n_out, _TILE)] if n_out else []


# --- public reductions ------------------------------------------------------------------


def sum(  # noqa: A001 - fpsim.sum mirrors numpy.sum
    x: Any,
    axis: int | tuple[int, ...] | None = None,
    *,
    accumulator: str | Format | int = "float32",
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    order: str = "sequential",
    block: int | None = None,
    promote_every: int | None = None,
    promote_to: str | Format | int = "float32",
    promote_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    compensated: bool | str = False,
    random_bits: Any = None,
    seed: int | None = None,
    stochastic_bits: int | None = None,
    input_format: Any = None,
    input_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    return_info: bool = False,
):
    """Sum of ``x`` over ``axis`` with every addition rounded to ``accumulator``.

    Args:
        x: array (numpy, ml_dtypes, or anything ``np.asarray`` takes); converted to float32
            (module doc), then rounded to ``input_format`` when given.
        axis: int, tuple of ints or None (all); the reduced axes are flattened in C order
            into one sequence of ``K`` addends.
        accumulator: the accumulator's format: name, :class:`~fpsim.Format` or an int ``p``
            (float32 range, ``p`` significant bits), see :func:`accumulator_format`.
        rounding: the accumulator's :class:`~fpsim.RoundMode` (every mode).
        order: ``"sequential"``, ``"pairwise"`` or ``"blocked"`` (tree of width ``block``).
        block: the tree width ``W`` for ``order="blocked"``.
        promote_every: chunk length ``N`` after which the accumulator's partial sum is added
            into a ``promote_to`` accumulator (DeepSeek-V3 section 3.3.2); None: no promotion.
        promote_to, promote_rounding: that accumulator's format and rounding.
        compensated: False, ``"kahan"`` (or True) or ``"neumaier"``, per group.
        random_bits: uint32 array ``(rounding_count(K, ...), *out_shape)`` for stochastic
            rounding of the accumulator (and promotion) roundings.
        seed: int: counter-based random bits for every stochastic rounding (module doc).
        stochastic_bits: bits per stochastic rounding (default ``min(32, 51 - M)``).
        input_format, input_rounding: rounding of ``x`` before the sum (element format or
            block recipe).
        return_info: also return an :class:`AccumulationInfo` (lost addends).

    Returns:
        float32 array of the output shape (0-d for a full reduction), values exact in the
        accumulator's (or ``promote_to``'s) format; with ``return_info`` a pair.

    Example:
        >>> import numpy as np, fpsim.accumulate as fa
        >>> x = np.array([2048, 1, 1], np.float32)
        >>> float(fa.sum(x, accumulator="float16")), float(fa.sum(x, accumulator="float16", compensated=True))
        (2048.0, 2050.0)
    """
    spec = _spec(
        accumulator,
        rounding,
        order,
        block,
        promote_every,
        promote_to,
        promote_rounding,
        compensated,
        stochastic_bits,
    )
    v = _inputs(x, input_format, input_rounding, None if seed is None else 4 * seed + 2, "x")
    axes = tuple(range(v.ndim)) if axis is None else tuple(np.atleast_1d(axis).tolist())
    axes = tuple(sorted(a % max(v.ndim, 1) for a in axes)) if v.ndim else ()
    if len(set(axes)) != len(axes):
        raise ValueError(f"axis: repeated axis in {axis!r}")
    keep = [i for i in range(v.ndim) if i not in axes]
    out_shape = tuple(v.shape[i] for i in keep)
    k = math.prod(v.shape[i] for i in axes)
    xt = np.transpose(v, keep + list(axes)).reshape(math.prod(out_shape), k)
    xt = np.ascontiguousarray(xt.T, dtype=np.float64)
    tiles = [(s, e, lambda i, s=s, e=e: xt[i, s:e], None) for s, e in _flat_tiles(math.prod(out_shape))]
    return _run(spec, k, out_shape, tiles, random_bits, seed, return_info, spec.promote is not None)


def dot(a: Any, b: Any, **kwargs: Any):
    """``sum_k a[..., k] * b[..., k]`` (numpy.vecdot semantics: last axes, broadcast batch).

    Keywords: those of :func:`sum` (except ``axis``), plus ``product_format`` (None: exact
    products, i.e. a fused multiply-add per step) and ``product_rounding``.
    ``input_format`` / ``input_rounding`` may be pairs ``(for a, for b)``.
    ``dot(a[i], b.T[j])`` equals ``matmul(a, b)[i, j]`` bit for bit.
    """
    return _products("dot", a, b, **kwargs)


def matmul(a: Any, b: Any, **kwargs: Any):
    """``a @ b`` (numpy.matmul shapes: ``(..., M, K) @ (..., K, N)``, 1-D operands promoted).

    Each output element is the reduction of ``a[..., i, k] * b[..., k, j]`` over ``k`` with
    the schedule of :func:`dot`; keywords as :func:`dot`. Block-recipe inputs are blocked
    along K: ``a`` as given, ``b`` as ``b^T`` (layout ``(..., N, K)``, whose flat index
    also numbers ``b``'s stochastic input bits). Vectorised over the outputs: one rounded
    add per step on tiles of the output, so ``1024^3`` takes seconds, not hours.
    """
    return _products("matmul", a, b, **kwargs)


def _products(
    kind: str,
    a: Any,
    b: Any,
    *,
    accumulator: str | Format | int = "float32",
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    order: str = "sequential",
    block: int | None = None,
    promote_every: int | None = None,
    promote_to: str | Format | int = "float32",
    promote_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    compensated: bool | str = False,
    random_bits: Any = None,
    seed: int | None = None,
    stochastic_bits: int | None = None,
    input_format: Any = None,
    input_rounding: Any = RoundMode.NEAREST_EVEN,
    product_format: Any = None,
    product_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    return_info: bool = False,
):
    spec = _spec(
        accumulator,
        rounding,
        order,
        block,
        promote_every,
        promote_to,
        promote_rounding,
        compensated,
        stochastic_bits,
    )
    fa, fb = _pair(input_format, "input_format")
    ra, rb = _pair(input_rounding, "input_rounding")
    sa = None if seed is None else 4 * seed + 2
    sb = None if seed is None else 4 * seed + 3
    a = _as_f32(a, "a")
    b = _as_f32(b, "b")
    if kind == "dot":
        if a.ndim == 0 or b.ndim == 0 or a.shape[-1] != b.shape[-1]:
            raise ValueError(f"dot: a and b need the same last axis; got shapes {a.shape} and {b.shape}")
        a = _inputs(a, fa, ra, sa, "a")
        b = _inputs(b, fb, rb, sb, "b")
        k = a.shape[-1]
        out_shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
        n_out = math.prod(out_shape)
        at, bt = (
            np.ascontiguousarray(np.broadcast_to(v, (*out_shape, k)).reshape(n_out, k).T, np.float64)
            for v in (a, b)
        )
        prod = _product_fn(product_format, product_rounding, seed, n_out, spec.nbits)

        def make(s, e):
            def addend(i):
                t = at[i, s:e] * bt[i, s:e]
                return t if prod is None else prod(t, i, s)

            return addend

        tiles = [(s, e, make(s, e), None) for s, e in _flat_tiles(n_out)]
        return _run(spec, k, out_shape, tiles, random_bits, seed, return_info, spec.promote is not None)

    a2, b2, squeeze = _matmul_shapes(a, b)
    a2 = _inputs(a2, fa, ra, sa, "a")
    b2 = np.swapaxes(_inputs(np.swapaxes(b2, -1, -2), fb, rb, sb, "b"), -1, -2)
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    m, k = a2.shape[-2:]
    n = b2.shape[-1]
    nb = math.prod(batch)
    at = np.ascontiguousarray(
        np.broadcast_to(a2, (*batch, m, k)).reshape(nb, m, k).transpose(0, 2, 1), np.float64
    )
    bb = np.ascontiguousarray(np.broadcast_to(b2, (*batch, k, n)).reshape(nb, k, n), np.float64)
    n_out = nb * m * n
    prod = _product_fn(product_format, product_rounding, seed, n_out, spec.nbits)

    def tile(bi, r0, r1, c0, c1):
        buf = np.empty((r1 - r0, c1 - c0))
        start = (bi * m + r0) * n + c0

        def addend(i):
            t = np.multiply(at[bi, i, r0:r1, None], bb[bi, i, None, c0:c1], out=buf).reshape(-1)
            return t if prod is None else prod(t, i, start)

        return start, start + buf.size, addend, None

    tiles = [tile(*t) for t in _matrix_tiles(nb, m, n)]
    res = _run(spec, k, (*batch, m, n), tiles, random_bits, seed, return_info, spec.promote is not None)
    return _squeeze(res, squeeze)


def _matmul_shapes(a: np.ndarray, b: np.ndarray):
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: operands must have at least one axis")
    squeeze = (a.ndim == 1, b.ndim == 1)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: K mismatch, a has shape {a.shape} and b {b.shape}")
    return a2, b2, squeeze


def _squeeze(res, squeeze):
    def sq(v):
        if squeeze[1]:
            v = v[..., 0]
        if squeeze[0]:
            v = v[..., 0, :] if not squeeze[1] else v[..., 0]
        return v

    if isinstance(res, tuple):
        val, info = res
        return sq(val), replace(info, lost=sq(info.lost), nonzero_adds=sq(info.nonzero_adds))
    return sq(res)


def _matrix_tiles(nb: int, m: int, n: int):
    """Flat-contiguous output tiles of a batch of (m, n) matrices: whole rows, or part of one."""
    for bi in range(nb):
        if n <= _TILE:
            rows = max(1, _TILE // max(n, 1))
            for r0 in range(0, m, rows):
                yield bi, r0, min(m, r0 + rows), 0, n
        else:
            for r in range(m):
                for c0 in range(0, n, _TILE):
                    yield bi, r, r + 1, c0, min(n, c0 + _TILE)


# --- block-scaled matmul ----------------------------------------------------------------


def scaled_matmul(
    a: Any,
    b: Any,
    recipe_a: str | BlockFormat,
    recipe_b: str | BlockFormat,
    *,
    accumulator: str | Format | int = "float32",
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    order: str = "sequential",
    block: int | None = None,
    promote_every: int | None = None,
    promote_to: str | Format | int = "float32",
    promote_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    compensated: bool | str = False,
    random_bits: Any = None,
    seed: int | None = None,
    stochastic_bits: int | None = None,
    input_rounding: Any = RoundMode.NEAREST_EVEN,
    return_info: bool = False,
):
    """``a @ b`` of block-quantized operands with scales applied to partial sums.

    ``a`` (M, K) is encoded with ``recipe_a`` (blocks over its last axis, K) and ``b``
    (K, N) as ``b^T`` (N, K) with ``recipe_b`` (:func:`fpsim.emulate.blocks.encode_blocks`), e.g.
    DeepSeek-V3's ``"e4m3_block128"`` (1x128 activation tiles) and ``"e4m3_tile128"``
    (128x128 weight blocks), or ``"mxfp8_e4m3"`` for both. Then, as DeepSeek-V3 section
    3.3.2 and DeepGEMM compute it:

    * K is cut into segments of ``G = gcd(Ka, Kb)`` (``Ka``, ``Kb`` the block lengths along
      K; a per-tensor or per-row scale spans all of K), on which both scales are constant.
    * Each segment is cut into chunks of ``promote_every`` (default ``G``; must divide
      ``G``). A chunk's exact element products ``qa[i, k] * qb[k, j]`` are reduced in the
      accumulator (order, compensation, rounding as in :func:`sum`) to ``c``.
    * The segment's scale is the float32 product ``s = f32(sa[i] * sb[j])`` of the two
      decode scales (times ``f32(ta * tb)`` for NVFP4's tensor scales), and the chunk
      enters the promoted accumulator with one fused rounding (an FFMA, as in DeepGEMM):
      ``P = R'(c * s)`` for the first chunk, then ``P = R'(P + c * s)``.

    Without a low-precision accumulator (``accumulator="float32"``) and with per-tensor
    recipes this is an ordinary FP8 GEMM with float32 accumulation. Random bits: as
    :func:`sum`, with ``rounding_count(K, ..., promote_every=chunk, promoted=True)``.

    Returns:
        float32 (M, N) array (and an :class:`AccumulationInfo` with ``return_info``).
    """
    ra_, rb_ = (get_format(r) for r in (recipe_a, recipe_b))
    for name, r in (("recipe_a", ra_), ("recipe_b", rb_)):
        if not isinstance(r, BlockFormat):
            raise TypeError(f"{name}: need a block recipe (e.g. 'e4m3_block128'), got {r}")
    a = _as_f32(a, "a")
    b = _as_f32(b, "b")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"scaled_matmul: need a (M, K) and b (K, N); got {a.shape} and {b.shape}")
    (m, k), n = a.shape, b.shape[1]
    ia, ib = _pair(input_rounding, "input_rounding")
    va, sa_seg, ta = _blocked_operand(a, ra_, ia, None if seed is None else 4 * seed + 2, "a")
    vb, sb_seg, tb = _blocked_operand(
        np.ascontiguousarray(b.T), rb_, ib, None if seed is None else 4 * seed + 3, "b"
    )
    seg = math.gcd(sa_seg[0], sb_seg[0])
    chunk = seg if promote_every is None else promote_every
    if not isinstance(chunk, (int, np.integer)) or chunk < 1 or seg % chunk:
        raise ValueError(
            f"promote_every must divide the scale segment length {seg} (gcd of the K blocks); got {chunk}"
        )
    spec = _spec(
        accumulator, rounding, order, block, chunk, promote_to, promote_rounding, compensated, stochastic_bits
    )
    at = np.ascontiguousarray(va.T, np.float64)  # (K, M)
    bt = np.ascontiguousarray(vb.T, np.float64)  # (K, N)
    tensor = None if ta is None and tb is None else np.float32(np.float32(ta or 1) * np.float32(tb or 1))
    tiles = []
    for _, r0, r1, c0, c1 in _matrix_tiles(1, m, n):

        def addend(i, r0=r0, r1=r1, c0=c0, c1=c1):
            return np.multiply(at[i, r0:r1, None], bt[i, None, c0:c1]).reshape(-1)

        def scale(c, r0=r0, r1=r1, c0=c0, c1=c1):
            s = _segment_scale(sa_seg, c)[r0:r1, None] * _segment_scale(sb_seg, c)[None, c0:c1]
            if tensor is not None:
                s = s * tensor
            return s.astype(np.float64).reshape(-1)

        start = r0 * n + c0
        tiles.append((start, start + (r1 - r0) * (c1 - c0), addend, scale))
    return _run(spec, k, (m, n), tiles, random_bits, seed, return_info, True)


def _segment_scale(seg_info: tuple[int, np.ndarray], c: int) -> np.ndarray:
    """float32 decode scale of every row of an operand on the K segment holding index ``c``."""
    kblock, per_row = seg_info
    return per_row[:, c // kblock]


def _blocked_operand(x: np.ndarray, bf: BlockFormat, rounding, seed_stream, name: str):
    """Element values (R, K), (K block length, per-row scales (R, K blocks)), tensor scale."""
    if bf.flatten:
        raise ValueError(f"{name}: recipe {bf.name} blocks the flattened tensor, not along K")
    rows, k = x.shape
    if bf.block is None:
        rblock, kblock = rows, k
    elif len(bf.block) == 1:
        rblock, kblock = 1, (k if bf.block[0] == -1 else bf.block[0])
    elif len(bf.block) == 2:
        rblock = rows if bf.block[0] == -1 else bf.block[0]
        kblock = k if bf.block[1] == -1 else bf.block[1]
    else:
        raise ValueError(f"{name}: recipe {bf.name} has a {len(bf.block)}-D block; need 1-D or 2-D")
    mode = RoundMode.parse(rounding)
    rand = None
    if mode is RoundMode.STOCHASTIC:
        if seed_stream is None:
            raise ValueError(f"{name}: stochastic input rounding needs seed=")
        rand = random_bits_at(seed_stream, 0, x.size).reshape(x.shape)
    enc = encode_blocks(x, bf, rounding=mode, random_bits=rand)
    el = bf.element
    vals = el.table[enc.codes] if isinstance(el, Codebook) else emulate.decode(enc.codes, el)
    scales = emulate.decode(enc.scales, bf.scale_format).astype(np.float32).reshape(enc.scales.shape)
    per_row = np.repeat(scales.reshape(-(-rows // max(rblock, 1)), -1), max(rblock, 1), axis=0)[:rows]
    return vals.astype(np.float32), (max(kblock, 1), per_row), enc.tensor_scale
