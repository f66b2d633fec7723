"""The layout of exact sums in bins (free of numba: the analysis imports it). The kinds of
state the block loops store are :class:`fpsim.formats.codes.StateKind`."""

from __future__ import annotations

__all__ = ["KMIN", "NBINS"]

KMIN = -2200
"""Exponent of bin 0 of an exact sum in integer bins (:mod:`fpsim._compiled.measure`,
:mod:`fpsim.analysis.partials`): the smallest square of a float64 term lies above 2**-2200."""
NBINS = 4608
"""Bins of an exact sum: up to 2**2407, room for the squares of float64 values and the carries."""
