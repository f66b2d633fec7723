"""The compiled tier of the analysis: one pass per (chunk, format) through the loops of
:mod:`fpsim._compiled.measure`, giving the partials the numpy tier of
:mod:`fpsim.analysis.metrics` gives (the same counts, maxima and exact sums; tested against
each other on every format, rounding mode and recipe, with NaN, inf and subnormal inputs).

Used where the resolved :class:`~fpsim.Backend` is :attr:`~fpsim.Backend.COMPILED`; this module
imports numba only when a function runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _compiled
from .._compiled.kinds import NBINS
from ..emulate import element
from ..emulate.random import SEED_MULTIPLIER
from ..formats import AnyFormat, Format, RoundMode
from .partials import Partial, SwampPartial, exact_from_bins

__all__ = ["element_partial", "swamp_partials", "value_partial"]


def _mix(seed: int) -> np.uint64:
    return np.uint64((seed * SEED_MULTIPLIER) % (1 << 64))


def _outputs() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(7, np.int64), np.zeros((3, NBINS), np.int64), np.zeros(3), np.zeros(256, np.int64)


def _partial(n: int, counts, bins, maxes, hist) -> Partial:
    """A :class:`Partial` of ``n`` elements from the loops' outputs (``tally_one``'s layout)."""
    nan, finite = int(counts[0]), int(counts[1])
    return Partial(
        elements=n,
        nonzero=int(counts[2]),
        nan_in=nan,
        inf_in=n - nan - finite,
        underflow=int(counts[4]),
        subnormal=int(counts[5]),
        overflow=int(counts[3]),
        saturated=int(counts[6]),
        sum_sq_err=exact_from_bins(bins[0]),
        sum_sq_signal=exact_from_bins(bins[1]),
        underflow_energy=exact_from_bins(bins[2]),
        max_abs_err=float(maxes[0]),
        max_rel_err=float(maxes[1]),
        max_abs_in=float(maxes[2]),
        hist=hist,
    )


def element_partial(
    x: np.ndarray, fmt: AnyFormat, mode: RoundMode, *, offset: int, seed: int, saturate: bool, with_hist: bool
) -> Partial:
    """The partial of chunk ``x`` (float32 or float64, flat index ``offset`` onwards) under an
    element format, as :func:`fpsim.analysis.metrics.tally_chunk` computes it."""
    flat = np.ascontiguousarray(x).reshape(-1)
    ftz = isinstance(fmt, Format) and not fmt.subnormals
    p = element.loop_params(fmt, bool(saturate), ftz)
    out = _outputs()
    _compiled.load_measure().element_tally(
        flat, p, element.MODE_CODES[mode], 32, _mix(seed), offset, element.loop_table(fmt), with_hist, *out
    )
    return _partial(flat.size, *out)


def value_partial(x: np.ndarray, q: np.ndarray, at_max: np.ndarray, sub: Any, with_hist: bool) -> Partial:
    """The partial of chunk ``x`` stored as ``q`` (float32, a block recipe's values) with the
    element flags ``at_max`` and ``sub`` (None: no subnormals), as the numpy tier computes it."""
    flat = np.ascontiguousarray(x).reshape(-1)
    qf = np.ascontiguousarray(q, np.float32).reshape(-1)
    am = np.ascontiguousarray(at_max, np.uint8).reshape(-1)
    sb = np.zeros(0, np.uint8) if sub is None else np.ascontiguousarray(sub, np.uint8).reshape(-1)
    out = _outputs()
    _compiled.load_measure().value_tally(flat, qf, am, sb, with_hist, *out)
    return _partial(flat.size, *out)


def swamp_partials(
    theta: np.ndarray, delta: np.ndarray, fmt: AnyFormat, *, scale: float, seed: int, offset: int
) -> tuple[SwampPartial, SwampPartial]:
    """The swamping partials of one chunk for nearest-even and stochastic rounding, as
    :func:`fpsim.analysis.metrics.swamping_partial` computes them (``theta`` and ``delta``
    float32; ``offset`` the chunk's flat index, where the random words continue)."""
    t = np.ascontiguousarray(theta, np.float32).reshape(-1)
    g = np.ascontiguousarray(delta, np.float32).reshape(-1)
    p = element.loop_params(fmt, False, isinstance(fmt, Format) and not fmt.subnormals)
    counts, bins = np.zeros(4, np.int64), np.zeros((4, NBINS), np.int64)
    _compiled.load_measure().swamp_tally(
        t, g, np.float32(scale), p, element.loop_table(fmt), _mix(seed), offset, counts, bins
    )
    return tuple(
        SwampPartial(
            updates=int(counts[2 * m]),
            lost=int(counts[2 * m + 1]),
            sum_abs_intended=exact_from_bins(bins[2 * m]),
            sum_abs_realised=exact_from_bins(bins[2 * m + 1]),
        )
        for m in range(2)
    )
