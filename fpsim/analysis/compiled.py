"""The compiled tier of the analysis: one pass per (chunk, format) through the loops of
:mod:`fpsim._compiled.measure`, giving the partials the numpy tier of
:mod:`fpsim.analysis.metrics` gives (the same counts, maxima and exact sums; tested against
each other on every format, rounding mode and recipe, with NaN, inf and subnormal inputs).

Used where the resolved :class:`~fpsim.Backend` is :attr:`~fpsim.Backend.COMPILED`; this module
imports numba only when a function runs.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from .. import _compiled
from .._compiled.kinds import NBINS
from ..emulate import element
from ..emulate.random import SEED_MULTIPLIER
from ..emulate.scale_rules import block_factors
from ..formats import AnyFormat, BlockFormat, Codebook, Format, RoundMode
from ..formats.codes import FactorKind
from .partials import Partial, SwampPartial, exact_from_bins

__all__ = ["Inputs", "block_partial", "element_partial", "inputs", "swamp_partials", "value_partial"]


def _mix(seed: int) -> np.uint64:
    return np.uint64((seed * SEED_MULTIPLIER) % (1 << 64))


class Inputs(NamedTuple):
    """What the tallies count of a chunk's input alone (the same under every format)."""

    elements: int
    nan: int
    finite: int
    nonzero: int
    sum_sq: Fraction
    max_abs: float
    hist: np.ndarray


def inputs(x: np.ndarray, with_hist: bool) -> Inputs:
    """The input tallies of chunk ``x`` (float32 or float64), in one compiled pass."""
    flat = _compiled.frozen(x)
    counts, bins, maxes = np.zeros(3, np.int64), np.zeros((1, NBINS), np.int64), np.zeros(1)
    hist = np.zeros(256, np.int64)
    _compiled.load_measure().input_tally(flat, with_hist, counts, bins, maxes, hist)
    nan, finite, nonzero = (int(c) for c in counts)
    return Inputs(flat.size, nan, finite, nonzero, exact_from_bins(bins[0]), float(maxes[0]), hist)


def _partial(
    inp: Inputs, counts: np.ndarray, bins: np.ndarray, maxes: np.ndarray, with_hist: bool
) -> Partial:
    """A :class:`Partial` from the input tallies and one format's (``tally_tile``'s layout)."""
    return Partial(
        elements=inp.elements,
        nonzero=inp.nonzero,
        nan_in=inp.nan,
        inf_in=inp.elements - inp.nan - inp.finite,
        underflow=int(counts[1]),
        subnormal=int(counts[2]),
        overflow=int(counts[0]),
        saturated=int(counts[3]),
        sum_sq_err=exact_from_bins(bins[0]),
        sum_sq_signal=inp.sum_sq,
        underflow_energy=exact_from_bins(bins[1]),
        max_abs_err=float(maxes[0]),
        max_rel_err=float(maxes[1]),
        max_abs_in=inp.max_abs,
        hist=inp.hist.copy() if with_hist else np.zeros(256, np.int64),
    )


def _outputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(4, np.int64), np.zeros((2, NBINS), np.int64), np.zeros(2)


def element_partial(
    x: np.ndarray,
    fmt: AnyFormat,
    mode: RoundMode,
    inp: Inputs,
    *,
    offset: int,
    seed: int,
    saturate: bool,
    with_hist: bool,
) -> Partial:
    """The partial of chunk ``x`` (float32 or float64, flat index ``offset`` onwards; ``inp``
    its :func:`inputs`) under an element format, as
    :func:`fpsim.analysis.metrics.tally_chunk` computes it."""
    flat = _compiled.frozen(x)
    ftz = isinstance(fmt, Format) and not fmt.subnormals
    p = element.loop_params(fmt, bool(saturate), ftz)
    out = _outputs()
    _compiled.load_measure().element_tally(
        flat, p, mode.code, 32, _mix(seed), offset, element.loop_table(fmt), *out
    )
    return _partial(inp, *out, with_hist)


def block_layout(shape: tuple[int, ...], bf: BlockFormat) -> tuple[int, int, int, int] | None:
    """How a chunk of ``shape`` (as :func:`fpsim.analysis.metrics.chunk_view` shapes it) is
    cut into blocks, as ``(cols, bc, rows, br)`` (:func:`fpsim._compiled.measure.block_ids`):
    rows of ``cols`` elements in matrices of ``rows`` rows, tiles of ``br`` x ``bc``. Per-tensor
    scaling: one block; flattened recipes: one row; blocks along the last axis: one row per
    matrix; 2-D tiles: the last two axes. None for codebooks (the replay's compiled codebook
    encoder runs them) and blocks over more than two axes, which stay on the numpy encoders."""
    n = math.prod(shape)
    if isinstance(bf.element, Codebook) or n == 0:
        return None
    if bf.block is None:
        return n, n, 1, 1
    if bf.flatten:
        return n, bf.block[0], 1, 1
    cols = shape[-1]
    if len(bf.block) == 1:
        return cols, cols if bf.block[0] == -1 else bf.block[0], 1, 1
    if len(bf.block) != 2 or len(shape) < 2:
        return None
    rows, (br, bc) = shape[-2], bf.block
    return cols, cols if bc == -1 else bc, rows, rows if br == -1 else br


def block_partial(
    x: np.ndarray,
    bf: BlockFormat,
    mode: RoundMode,
    inp: Inputs,
    *,
    offset: int,
    seed: int,
    tensor_amax: float | None,
    with_hist: bool,
) -> Partial | None:
    """The partial of chunk ``x`` (float32 or float64, shaped by
    :func:`fpsim.analysis.metrics.chunk_view`) under a block recipe whose blocks are runs of
    flat elements (:func:`block_layout`; None for the others), as the numpy tier computes it
    from :func:`fpsim.emulate.blocks.encode_array` and ``decode_array``: the blocks' amaxes
    in one compiled pass, their factors and scales by the numpy rules
    (:func:`fpsim.emulate.scale_rules.block_factors`, on one value per block), then the
    elements encoded, decoded and tallied in one compiled pass (same counts and sums:
    tests/analysis/test_compiled_analysis.py)."""
    layout = block_layout(x.shape, bf)
    if layout is None:
        return None
    cols, bc, rows, br = layout
    loops = _compiled.load_measure()
    flat = _compiled.frozen(x)
    xs = _compiled.frozen(element.as_float32(flat))
    kind, dkind = int(bf.rule.factor), int(bf.rule.decode)  # fpsim.formats.codes
    how = (cols, bc, rows, br, kind, dkind)
    if bf.block is None and tensor_amax is not None:
        amax = np.full(1, tensor_amax, np.float32)
    else:
        amax = np.zeros(flat.size // (cols * rows) * -(-cols // bc) * -(-rows // br), np.float32)
        loops.block_amax(xs, how, bf.amax_ignores_nan, amax)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        factor, scales, tensor = block_factors(amax, bf, tensor_amax)
        dscale = _compiled.frozen(element.decode_array(scales, bf.scale_format), np.float32)
    pow2 = bf.rule.factor is FactorKind.POW2
    f32 = _compiled.frozen(() if pow2 else factor, np.float32)
    f64 = _compiled.frozen(factor if pow2 else (), np.float64)
    el = bf.element
    p = element.loop_params(el, True, isinstance(el, Format) and not el.subnormals)
    tscale = np.float32(tensor if tensor is not None else 1)
    out = _outputs()
    loops.block_tally(
        flat, xs, how, f32, f64, dscale, tscale, p, mode.code, _mix(seed), offset,
        element.loop_table(el), *out,
    )  # fmt: skip
    return _partial(inp, *out, with_hist)


def value_partial(
    x: np.ndarray, q: np.ndarray, at_max: np.ndarray, sub: Any, inp: Inputs, with_hist: bool
) -> Partial:
    """The partial of chunk ``x`` stored as ``q`` (float32, a block recipe's values) with the
    element flags ``at_max`` and ``sub`` (None: no subnormals), as the numpy tier computes it."""
    flat = _compiled.frozen(x)  # (q and the flags writable, as element_tally's own buffers)
    qf, am = np.require(q, np.float32, "CW").reshape(-1), np.require(at_max, np.bool_, "CW").reshape(-1)
    sb = np.zeros(flat.size, np.bool_) if sub is None else np.require(sub, np.bool_, "CW").reshape(-1)
    out = _outputs()
    _compiled.load_measure().value_tally(flat, qf, am, sb, *out)
    return _partial(inp, *out, with_hist)


def swamp_partials(
    theta: np.ndarray, delta: np.ndarray, fmt: AnyFormat, *, scale: float, seed: int, offset: int
) -> tuple[SwampPartial, SwampPartial]:
    """The swamping partials of one chunk for nearest-even and stochastic rounding, as
    :func:`fpsim.analysis.metrics.swamping_partial` computes them (``theta`` and ``delta``
    float32; ``offset`` the chunk's flat index, where the random words continue)."""
    t, g = _compiled.frozen(theta, np.float32), _compiled.frozen(delta, np.float32)
    p = element.loop_params(fmt, False, isinstance(fmt, Format) and not fmt.subnormals)
    counts, bins = np.zeros(3, np.int64), np.zeros((3, NBINS), np.int64)
    _compiled.load_measure().swamp_tally(
        t, g, np.float32(scale), p, element.loop_table(fmt), _mix(seed), offset, counts, bins
    )
    intended = exact_from_bins(bins[0])  # the same update in both modes
    return tuple(
        SwampPartial(
            updates=int(counts[0]),
            lost=int(counts[1 + m]),
            sum_abs_intended=intended,
            sum_abs_realised=exact_from_bins(bins[1 + m]),
        )
        for m in range(2)
    )
