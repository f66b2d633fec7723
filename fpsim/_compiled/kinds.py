"""The layout of exact sums in bins, and the recipes the block loops store an optimizer state
in (free of numba: the analysis and the replay import it). The kinds of state the block loops
store are :class:`fpsim.formats.codes.StateKind`; :data:`SCALED_STATES` is the one place that
says which scale rules and elements their scaled kinds compute."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from ..formats import RECIPES, BlockFormat, ScaleRule, get_format
from ..formats.codes import StateKind

__all__ = ["KMIN", "NBINS", "SCALED_STATES", "ScaledKinds", "scaled_state"]

KMIN = -2200
"""Exponent of bin 0 of an exact sum in integer bins (:mod:`fpsim._compiled.measure`,
:mod:`fpsim.analysis.partials`): the smallest square of a float64 term lies above 2**-2200."""
NBINS = 4608
"""Bins of an exact sum: up to 2**2407, room for the squares of float64 values and the carries."""


class ScaledKinds(NamedTuple):
    """The block loops' kinds for one scale rule and element with float32 scales.

    Args:
        kind: the kind storing the rule's scale.
        pow2_kind: the kind where :attr:`fpsim.formats.BlockFormat.pow2` rounds the scale to a
            power of two (``kind`` where the rule ignores ``pow2``).
        per_tensor_only: the loop takes the whole tensor as one block (per-tensor scaling
            only; blocked recipes of the rule are not covered).
    """

    kind: StateKind
    pow2_kind: StateKind
    per_tensor_only: bool


_E4M3 = get_format("float8_e4m3fn")
_INT8 = RECIPES["int8_block256"].element  # int8_symmetric (-127..127)

SCALED_STATES: Mapping[tuple[ScaleRule, Any], ScaledKinds] = MappingProxyType(
    {
        # ScaleRule.ABSMAX (fpsim.emulate.scale_rules.block_factors; pow2 does not apply to it):
        # the loops' absmax_tile
        (ScaleRule.ABSMAX, _INT8): ScaledKinds(StateKind.INT8_ABSMAX, StateKind.INT8_ABSMAX, False),
        (ScaleRule.ABSMAX, _E4M3): ScaledKinds(StateKind.E4M3_ABSMAX, StateKind.E4M3_ABSMAX, False),
        # ScaleRule.TE, Transformer Engine's current scaling of the whole tensor: te_block
        (ScaleRule.TE, _E4M3): ScaledKinds(StateKind.TE, StateKind.TE_POW2, True),
    }
)
"""The :class:`~fpsim.formats.codes.StateKind` of each ``(rule, element)`` the block loops of
:mod:`fpsim._compiled.loops` encode with a float32 scale; a rule or element missing here is
not covered (the fused optimizer step, :mod:`fpsim.replay.fused`, refuses it). A new kind of
the loops adds its line here (tests/replay/test_compiled.py checks every entry against the
numpy encoder)."""


def scaled_state(bf: BlockFormat, per_tensor: bool) -> StateKind | None:
    """The block loops' kind for block recipe ``bf`` (a non-codebook element; ``per_tensor``:
    one scale for the whole tensor) by :data:`SCALED_STATES`, or None where they do not
    cover it."""
    kinds = SCALED_STATES.get((bf.rule, bf.element))
    if kinds is None or bf.scale_format.name != "float32" or (kinds.per_tensor_only and not per_tensor):
        return None
    return kinds.pow2_kind if bf.pow2 else kinds.kind
