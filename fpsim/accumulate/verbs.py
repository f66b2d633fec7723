"""The public reductions :func:`sum`, :func:`dot`, :func:`matmul` and :func:`scaled_matmul`.

Each verb resolves its keywords once into an :class:`~fpsim.accumulate.spec.AccumulatorSpec`
and hands it, with the float32 operands, to a driver that cuts the outputs into tiles and
runs the schedule of :mod:`fpsim.accumulate._accumulator` on each (definitions: the
:mod:`fpsim.accumulate` package docstring).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..emulate.random import random_bits_at
from ..formats import BlockFormat, Format, RoundMode, get_format
from ._accumulator import Stream, as_f32, reduce_tile, spec_rounding_count
from ._operands import blocked_operand, product_rounder, round_operand, segment_scale
from .spec import AccumulatorSpec, Compensation, Order, SeedStream

__all__ = ["AccumulationInfo", "dot", "matmul", "matmul_spec", "scaled_matmul", "sum"]

TILE = 1 << 14  # output elements processed together (their temporaries stay in L2)

# a tile: (first output, end, addend(k) -> float64 products of step k, scale(c0) or None)
Tile = tuple[int, int, Callable[[int], np.ndarray], Callable[[int], np.ndarray] | None]


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

    def __repr__(self) -> str:
        """Totals and shapes, not the per-output arrays."""
        lost, adds = np.asarray(self.lost), np.asarray(self.nonzero_adds)
        return (
            f"AccumulationInfo(outputs={list(lost.shape)}, roundings={self.roundings}, "
            f"lost={int(lost.sum()):,} of {int(adds.sum()):,} nonzero additions "
            f"(lost_share={self.lost_share:.4g}))"
        )


# --- the driver -------------------------------------------------------------------------


def _given_words(spec: AccumulatorSpec, random_bits: Any, count: int, out_shape: tuple) -> np.ndarray | None:
    """``random_bits`` checked and flattened to (roundings, outputs); None when not used."""
    if not spec.stochastic:
        return None
    if random_bits is None:
        if spec.seed is None:
            raise ValueError("stochastic rounding needs random_bits= or seed=")
        return None
    bits = np.asarray(random_bits)
    if bits.dtype != np.uint32 or bits.shape != (count, *out_shape):
        raise ValueError(
            f"random_bits must be uint32 of shape {(count, *out_shape)} (rounding_count x output); "
            f"got {bits.dtype} {bits.shape}"
        )
    return bits.reshape(count, math.prod(out_shape))


def _word_source(spec: AccumulatorSpec, bits: np.ndarray | None, start: int, stop: int, n_out: int):
    """``source(j)``: the random words of rounding ``j`` of the outputs ``start .. stop``."""
    if bits is not None:
        return lambda j: bits[j, start:stop]
    if spec.stochastic:
        seed = spec.stream(SeedStream.ACCUMULATOR)
        return lambda j: random_bits_at(seed, j * n_out + start, stop - start)
    return None


def _run(
    spec: AccumulatorSpec,
    k: int,
    out_shape: tuple,
    tiles: Sequence[Tile],
    random_bits: Any,
    return_info: bool,
):
    """Evaluate the schedule tile by tile; the float32 result (and its AccumulationInfo)."""
    n_out = math.prod(out_shape)
    count = spec_rounding_count(spec, k)
    bits = _given_words(spec, random_bits, count, out_shape)
    out = np.empty(n_out, np.float64)
    lost = np.zeros(n_out, np.int64) if return_info else None
    nz = np.zeros(n_out, np.int64) if return_info else None
    for start, stop, addend, scale in tiles:
        counts = [np.zeros(stop - start, np.int64), np.zeros(stop - start, np.int64)] if return_info else None
        if k == 0:
            out[start:stop] = 0.0
        else:
            stream = Stream(_word_source(spec, bits, start, stop, n_out))
            out[start:stop] = reduce_tile(spec, k, addend, stream, scale, counts)
        if return_info:
            lost[start:stop], nz[start:stop] = counts
    result = out.astype(np.float32).reshape(out_shape)
    if return_info:
        return result, AccumulationInfo(lost.reshape(out_shape), nz.reshape(out_shape), count)
    return result


def _flat_tiles(n_out: int, tile: int) -> list[tuple[int, int]]:
    return [(s, min(s + tile, n_out)) for s in range(0, n_out, tile)] if n_out else []


def _matrix_tiles(nb: int, m: int, n: int, tile: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Flat-contiguous output tiles of a batch of (m, n) matrices: whole rows, or part of one."""
    for bi in range(nb):
        if n <= tile:
            rows = max(1, tile // max(n, 1))
            for r0 in range(0, m, rows):
                yield bi, r0, min(m, r0 + rows), 0, n
        else:
            for r in range(m):
                for c0 in range(0, n, tile):
                    yield bi, r, r + 1, c0, min(n, c0 + tile)


# --- public reductions ------------------------------------------------------------------


def sum(  # noqa: A001 - fpsim.sum mirrors numpy.sum
    x: Any,
    axis: int | tuple[int, ...] | None = None,
    *,
    accumulator: str | Format | int = "float32",
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    order: Order | str = Order.SEQUENTIAL,
    block: int | None = None,
    promote_every: int | None = None,
    promote_to: str | Format | int = "float32",
    promote_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    compensated: Compensation | bool | str = False,
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
        order: an :class:`Order` or its name, ``"sequential"``, ``"pairwise"`` or
            ``"blocked"`` (tree of width ``block``).
        block: the tree width ``W`` for ``order="blocked"``.
        promote_every: chunk length ``N`` after which the accumulator's partial sum is added
            into a ``promote_to`` accumulator (DeepSeek-V3 section 3.3.2); None: no promotion.
        promote_to, promote_rounding: that accumulator's format and rounding.
        compensated: a :class:`Compensation`, False, ``"kahan"`` (or True) or
            ``"neumaier"``, per group.
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

    Raises:
        ValueError: a bad setting, naming the argument and the allowed values.

    Example:
        >>> import numpy as np, fpsim.accumulate as fa
        >>> x = np.array([2048, 1, 1], np.float32)
        >>> float(fa.sum(x, accumulator="float16")), float(fa.sum(x, accumulator="float16", compensated=True))
        (2048.0, 2050.0)
    """
    spec = AccumulatorSpec.build(
        accumulator=accumulator,
        rounding=rounding,
        order=order,
        block=block,
        promote_every=promote_every,
        promote_to=promote_to,
        promote_rounding=promote_rounding,
        compensated=compensated,
        stochastic_bits=stochastic_bits,
        seed=seed,
        input_format=input_format,
        input_rounding=input_rounding,
        operands=("x",),
    )
    return sum_spec(spec, x, axis, random_bits, return_info)


def sum_spec(spec: AccumulatorSpec, x: Any, axis, random_bits: Any, return_info: bool, tile: int = TILE):
    """:func:`sum` with its settings resolved."""
    v = round_operand(x, spec.inputs[0], spec.stream(SeedStream.INPUT_A), "x")
    axes = tuple(range(v.ndim)) if axis is None else tuple(np.atleast_1d(axis).tolist())
    axes = tuple(sorted(a % max(v.ndim, 1) for a in axes)) if v.ndim else ()
    if len(set(axes)) != len(axes):
        raise ValueError(f"axis: repeated axis in {axis!r}")
    keep = [i for i in range(v.ndim) if i not in axes]
    out_shape = tuple(v.shape[i] for i in keep)
    k = math.prod(v.shape[i] for i in axes)
    xt = np.transpose(v, keep + list(axes)).reshape(math.prod(out_shape), k)
    xt = np.ascontiguousarray(xt.T, dtype=np.float64)
    tiles = [(s, e, lambda i, s=s, e=e: xt[i, s:e], None) for s, e in _flat_tiles(math.prod(out_shape), tile)]
    return _run(spec, k, out_shape, tiles, random_bits, return_info)


def dot(a: Any, b: Any, **kwargs: Any):
    """``sum_k a[..., k] * b[..., k]`` (numpy.vecdot semantics: last axes, broadcast batch).

    Keywords: those of :func:`sum` (except ``axis``), plus ``product_format`` (None: exact
    products, i.e. a fused multiply-add per step) and ``product_rounding``.
    ``input_format`` / ``input_rounding`` may be pairs ``(for a, for b)``.
    ``dot(a[i], b.T[j])`` equals ``matmul(a, b)[i, j]`` bit for bit.
    """
    return _products(dot_spec, a, b, **kwargs)


def matmul(a: Any, b: Any, **kwargs: Any):
    """``a @ b`` (numpy.matmul shapes: ``(..., M, K) @ (..., K, N)``, 1-D operands promoted).

    Each output element is the reduction of ``a[..., i, k] * b[..., k, j]`` over ``k`` with
    the schedule of :func:`dot`; keywords as :func:`dot`. Block-recipe inputs are blocked
    along K: ``a`` as given, ``b`` as ``b^T`` (layout ``(..., N, K)``, whose flat index
    also numbers ``b``'s stochastic input bits). Vectorised over the outputs: one rounded
    add per step on tiles of the output, so ``1024^3`` takes seconds, not hours.
    """
    return _products(_matmul, a, b, **kwargs)


def matmul_spec(spec: AccumulatorSpec, a: Any, b: Any) -> np.ndarray:
    """:func:`matmul` under an :class:`AccumulatorSpec` already resolved (the entry point of
    callers that hold a spec, e.g. the emulated GEMMs of :mod:`fpsim.train.gemm`): the same
    values, bit for bit; stochastic settings draw their words from the spec's seed."""
    return _matmul(spec, a, b, None, False)


def _products(
    driver: Callable[..., Any],
    a: Any,
    b: Any,
    *,
    accumulator: str | Format | int = "float32",
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    order: Order | str = Order.SEQUENTIAL,
    block: int | None = None,
    promote_every: int | None = None,
    promote_to: str | Format | int = "float32",
    promote_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    compensated: Compensation | bool | str = False,
    random_bits: Any = None,
    seed: int | None = None,
    stochastic_bits: int | None = None,
    input_format: Any = None,
    input_rounding: Any = RoundMode.NEAREST_EVEN,
    product_format: Any = None,
    product_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    return_info: bool = False,
):
    """The keywords of :func:`dot` / :func:`matmul` resolved into a spec, then ``driver``."""
    spec = AccumulatorSpec.build(
        accumulator=accumulator,
        rounding=rounding,
        order=order,
        block=block,
        promote_every=promote_every,
        promote_to=promote_to,
        promote_rounding=promote_rounding,
        compensated=compensated,
        stochastic_bits=stochastic_bits,
        seed=seed,
        input_format=input_format,
        input_rounding=input_rounding,
        product_format=product_format,
        product_rounding=product_rounding,
    )
    return driver(spec, a, b, random_bits, return_info)


def dot_spec(spec: AccumulatorSpec, a: Any, b: Any, random_bits: Any, return_info: bool, tile: int = TILE):
    """:func:`dot` with its settings resolved."""
    a, b = as_f32(a, "a"), as_f32(b, "b")
    if a.ndim == 0 or b.ndim == 0 or a.shape[-1] != b.shape[-1]:
        raise ValueError(f"dot: a and b need the same last axis; got shapes {a.shape} and {b.shape}")
    a = round_operand(a, spec.inputs[0], spec.stream(SeedStream.INPUT_A), "a")
    b = round_operand(b, spec.inputs[1], spec.stream(SeedStream.INPUT_B), "b")
    k = a.shape[-1]
    out_shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    n_out = math.prod(out_shape)
    at, bt = (
        np.ascontiguousarray(np.broadcast_to(v, (*out_shape, k)).reshape(n_out, k).T, np.float64)
        for v in (a, b)
    )
    prod = product_rounder(spec.product, spec.stream(SeedStream.PRODUCT), n_out, spec.stochastic_bits)

    def make(s, e):
        def addend(i):
            t = at[i, s:e] * bt[i, s:e]
            return t if prod is None else prod(t, i, s)

        return addend

    tiles = [(s, e, make(s, e), None) for s, e in _flat_tiles(n_out, tile)]
    return _run(spec, k, out_shape, tiles, random_bits, return_info)


def _matmul(spec: AccumulatorSpec, a: Any, b: Any, random_bits: Any, return_info: bool, tile: int = TILE):
    """:func:`matmul` with its settings resolved."""
    a2, b2, squeeze = _matmul_shapes(as_f32(a, "a"), as_f32(b, "b"))
    a2 = round_operand(a2, spec.inputs[0], spec.stream(SeedStream.INPUT_A), "a")
    bt = round_operand(np.swapaxes(b2, -1, -2), spec.inputs[1], spec.stream(SeedStream.INPUT_B), "b")
    b2 = np.swapaxes(bt, -1, -2)
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    m, k = a2.shape[-2:]
    n = b2.shape[-1]
    nb = math.prod(batch)
    at = np.ascontiguousarray(
        np.broadcast_to(a2, (*batch, m, k)).reshape(nb, m, k).transpose(0, 2, 1), np.float64
    )
    bb = np.ascontiguousarray(np.broadcast_to(b2, (*batch, k, n)).reshape(nb, k, n), np.float64)
    prod = product_rounder(spec.product, spec.stream(SeedStream.PRODUCT), nb * m * n, spec.stochastic_bits)

    def make(bi, r0, r1, c0, c1) -> Tile:
        buf = np.empty((r1 - r0, c1 - c0))
        start = (bi * m + r0) * n + c0

        def addend(i):
            t = np.multiply(at[bi, i, r0:r1, None], bb[bi, i, None, c0:c1], out=buf).reshape(-1)
            return t if prod is None else prod(t, i, start)

        return start, start + buf.size, addend, None

    tiles = [make(*t) for t in _matrix_tiles(nb, m, n, tile)]
    return _squeeze(_run(spec, k, (*batch, m, n), tiles, random_bits, return_info), squeeze)


def _matmul_shapes(a: np.ndarray, b: np.ndarray):
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: operands must have at least one axis")
    squeeze = (a.ndim == 1, b.ndim == 1)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: K mismatch, a has shape {a.shape} and b {b.shape}")
    return a2, b2, squeeze


def _squeeze(res, squeeze: tuple[bool, bool]):
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


# --- block-scaled matmul ----------------------------------------------------------------


def scaled_matmul(
    a: Any,
    b: Any,
    recipe_a: str | BlockFormat,
    recipe_b: str | BlockFormat,
    *,
    accumulator: str | Format | int = "float32",
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    order: Order | str = Order.SEQUENTIAL,
    block: int | None = None,
    promote_every: int | None = None,
    promote_to: str | Format | int = "float32",
    promote_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    compensated: Compensation | bool | str = False,
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

    Raises:
        TypeError: a recipe that is not a block recipe.
        ValueError: bad shapes or settings (``promote_every`` must divide ``G``).
    """
    recipes = tuple(get_format(r) for r in (recipe_a, recipe_b))
    for name, r in zip(("recipe_a", "recipe_b"), recipes):
        if not isinstance(r, BlockFormat):
            raise TypeError(f"{name}: need a block recipe (e.g. 'e4m3_block128'), got {r}")
    spec = AccumulatorSpec.build(
        accumulator=accumulator,
        rounding=rounding,
        order=order,
        block=block,
        promote_every=promote_every,
        promote_to=promote_to,
        promote_rounding=promote_rounding,
        compensated=compensated,
        stochastic_bits=stochastic_bits,
        seed=seed,
        input_format=recipes,
        input_rounding=input_rounding,
        always_promote=True,
    )
    return scaled_matmul_spec(spec, a, b, random_bits, return_info)


def scaled_matmul_spec(spec: AccumulatorSpec, a: Any, b: Any, random_bits: Any, return_info: bool):
    """:func:`scaled_matmul` with its settings resolved (``spec.inputs``: the two recipes)."""
    a, b = as_f32(a, "a"), as_f32(b, "b")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"scaled_matmul: need a (M, K) and b (K, N); got {a.shape} and {b.shape}")
    (m, k), n = a.shape, b.shape[1]
    ra, rb = spec.inputs
    va, sa_seg, ta = blocked_operand(a, ra, spec.stream(SeedStream.INPUT_A), "a")
    vb, sb_seg, tb = blocked_operand(np.ascontiguousarray(b.T), rb, spec.stream(SeedStream.INPUT_B), "b")
    seg = math.gcd(sa_seg[0], sb_seg[0])
    chunk = spec.promote_every or seg
    if seg % chunk:
        raise ValueError(
            f"promote_every must divide the scale segment length {seg} (gcd of the K blocks); got {chunk}"
        )
    spec = spec.with_chunk(chunk)
    at = np.ascontiguousarray(va.T, np.float64)  # (K, M)
    bt = np.ascontiguousarray(vb.T, np.float64)  # (K, N)
    tensor = None if ta is None and tb is None else np.float32(np.float32(ta or 1) * np.float32(tb or 1))

    def make(r0, r1, c0, c1) -> Tile:
        def addend(i):
            return np.multiply(at[i, r0:r1, None], bt[i, None, c0:c1]).reshape(-1)

        def scale(c):
            s = segment_scale(sa_seg, c)[r0:r1, None] * segment_scale(sb_seg, c)[None, c0:c1]
            if tensor is not None:
                s = s * tensor
            return s.astype(np.float64).reshape(-1)

        start = r0 * n + c0
        return start, start + (r1 - r0) * (c1 - c0), addend, scale

    tiles = [make(r0, r1, c0, c1) for _, r0, r1, c0, c1 in _matrix_tiles(1, m, n, TILE)]
    return _run(spec, k, (m, n), tiles, random_bits, return_info)
