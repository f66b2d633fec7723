"""The kinds of 8-bit state the block loops store, and the layout of exact sums in bins (free
of numba: the replay and the analysis import them)."""

from __future__ import annotations

import enum

__all__ = ["KMIN", "NBINS", "StateKind"]

KMIN = -2200
"""Exponent of bin 0 of an exact sum in integer bins (:mod:`fpsim._compiled.measure`,
:mod:`fpsim.analysis.partials`): the smallest square of a float64 term lies above 2**-2200."""
NBINS = 4608
"""Bins of an exact sum: up to 2**2407, room for the squares of float64 values and the carries."""


class StateKind(enum.IntEnum):
    """How the block loops of :mod:`fpsim._compiled.loops` store an 8-bit state (their ``kind``
    argument is the member's int value): element codes with one float32 scale per block.

    ``CODEBOOK``: a codebook rounded to the nearest entry (the bitsandbytes dynamic maps);
    ``INT8_ABSMAX``: linear int8 with an absmax scale; ``E4M3_ABSMAX``: float8_e4m3fn with an
    absmax scale; ``TE``: float8_e4m3fn with Transformer Engine's per-tensor current scaling;
    ``TE_POW2``: the same with the scale rounded down to a power of two; ``QMAP``: torchao's
    quantizer (``x / max(amax, 1e-12)``, NaN propagating, into a table of values:
    :mod:`fpsim.replay.qmap`); ``CODEBOOK_LUT``: a codebook through bitsandbytes' CPU lookup table
    of 65536 bins (:attr:`fpsim.formats.Codebook.lut_bins`).
    """

    CODEBOOK = 0
    INT8_ABSMAX = 1
    E4M3_ABSMAX = 2
    TE = 3
    TE_POW2 = 4
    QMAP = 5
    CODEBOOK_LUT = 6
