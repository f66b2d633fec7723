"""The mergeable partial results of the analysis: :class:`Partial` and :class:`SwampPartial`.

Counts are exact integers; float sums are kept as exact rationals (``Fraction``), so partials
of canonical chunks merge with ``+`` in any order, across processes, to the same answer (the
mergeable partials of the README's Architecture section). :mod:`fpsim.analysis.metrics`
computes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = ["Partial", "SwampPartial"]


def _zero() -> Fraction:
    return Fraction(0)


@dataclass
class Partial:
    """Mergeable partial metrics of one tensor (or part of one) under one format."""

    elements: int = 0
    nonzero: int = 0
    nan_in: int = 0
    inf_in: int = 0
    underflow: int = 0
    subnormal: int = 0
    overflow: int = 0
    saturated: int = 0
    sum_sq_err: Fraction = field(default_factory=_zero)
    sum_sq_signal: Fraction = field(default_factory=_zero)
    underflow_energy: Fraction = field(default_factory=_zero)
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    max_abs_in: float = 0.0
    hist: np.ndarray = field(default_factory=lambda: np.zeros(256, np.int64))

    def __add__(self, other: Partial) -> Partial:
        out = Partial()
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            setattr(out, f.name, max(a, b) if f.name.startswith("max_") else a + b)
        return out

    @property
    def sqnr_db(self) -> float:
        """Signal-to-quantization-noise ratio in dB (inf when there is no error)."""
        if self.sum_sq_err == 0:
            return math.inf
        if self.sum_sq_signal == 0:
            return -math.inf
        return 10 * math.log10(self.sum_sq_signal / self.sum_sq_err)

    @property
    def rel_l2_error(self) -> float:
        """``||q - x|| / ||x||`` over the finite elements (0 for an all-zero tensor)."""
        return math.sqrt(self.sum_sq_err / self.sum_sq_signal) if self.sum_sq_signal else 0.0

    @property
    def underflow_energy_share(self) -> float:
        """Share of the squared norm carried by the elements that underflowed."""
        return float(self.underflow_energy / self.sum_sq_signal) if self.sum_sq_signal else 0.0

    def totals(self) -> dict[str, Any]:
        """Counts, sums (as floats) and the derived metrics, without the histogram."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name != "hist":
                v = getattr(self, f.name)
                out[f.name] = float(v) if isinstance(v, Fraction) else v
        out.update(
            sqnr_db=self.sqnr_db,
            rel_l2_error=self.rel_l2_error,
            underflow_energy_share=self.underflow_energy_share,
        )
        return out


@dataclass
class SwampPartial:
    """Mergeable swamping counts: how much of an update survives ``fl(theta + delta)``."""

    updates: int = 0
    lost: int = 0
    sum_abs_intended: Fraction = field(default_factory=_zero)
    sum_abs_realised: Fraction = field(default_factory=_zero)

    def __add__(self, other: SwampPartial) -> SwampPartial:
        return SwampPartial(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def swamped_share(self) -> float:
        """Share of nonzero updates fully lost (``fl(theta + delta) == theta``)."""
        return self.lost / self.updates if self.updates else 0.0

    @property
    def update_ratio(self) -> float:
        """``sum |realised update| / sum |intended update|`` (1 when nothing is lost)."""
        return float(self.sum_abs_realised / self.sum_abs_intended) if self.sum_abs_intended else 1.0

    def totals(self) -> dict[str, Any]:
        return {
            "updates": self.updates,
            "lost": self.lost,
            "swamped_share": self.swamped_share,
            "update_ratio": self.update_ratio,
        }
