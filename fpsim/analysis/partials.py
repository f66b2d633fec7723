"""The mergeable partial results of the analysis: :class:`Partial` and :class:`SwampPartial`.

Counts are exact integers; float sums are exact sums of float64 terms kept as rationals
(``Fraction``), so partials merge with ``+`` in any order, across processes, to the same
answer (the mergeable partials of the README's Architecture section), and the numpy tier and
the compiled loops agree bit for bit. :mod:`fpsim.analysis.metrics` computes them.

A term is a float64 value ``|v|``, or a square ``v**2`` rounded to 53 bits with an unbounded
exponent (``frexp(v) = (f, e)``, the term ``fl(f * f) * 2**(2 e)``: the float64 product
wherever that is finite and normal, and still exact for squares beyond float64's range), so
every finite float64 has its term. :func:`exact_sum` adds terms on numpy (integer bins by
exponent, filled by ``bincount`` in two 26/27-bit halves so that every float64 partial sum is
an exact integer); the compiled loops fill the same bins (:mod:`fpsim._compiled.measure`) and
:func:`exact_from_bins` reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any

import numpy as np

from .._compiled.kinds import KMIN, NBINS

__all__ = ["Partial", "SwampPartial", "as_float", "exact_from_bins", "exact_sum"]

_SCALE = 1 << -KMIN
_PIECE = 1 << 24  # terms per bincount: 2**24 halves of 2**27 sum exactly in float64


def _zero() -> Fraction:
    return Fraction(0)


def exact_from_bins(bins: np.ndarray) -> Fraction:
    """The exact value of integer bins (bin ``i`` counts units of ``2**(i + KMIN)``)."""
    total = 0
    for i in np.flatnonzero(bins):
        total += int(bins[i]) << int(i)
    return Fraction(total, _SCALE) if total else Fraction(0)


def exact_sum(v: np.ndarray, square: bool = False) -> Fraction:
    """The exact sum of the terms of ``v`` (finite float64; see the module doc): ``|v|``, or
    with ``square`` the squares rounded to 53 bits with an unbounded exponent.

    Tested against ``Fraction`` arithmetic and against the compiled loops' bins.
    """
    a = np.abs(np.asarray(v, np.float64).reshape(-1))
    a = a[a != 0]
    if not a.size:
        return Fraction(0)
    f, e = np.frexp(a)
    e = e.astype(np.int64)
    if square:
        f, e2 = np.frexp(f * f)
        e = e2 + 2 * e
    m = np.ldexp(f, 53).astype(np.int64)
    k = e - 53 - KMIN
    total = Fraction(0)
    for i in range(0, a.size, _PIECE):
        kk, mm = k[i : i + _PIECE], m[i : i + _PIECE]
        hi = np.bincount(kk, (mm >> 26).astype(np.float64), NBINS).astype(np.int64)
        lo = np.bincount(kk, (mm & ((1 << 26) - 1)).astype(np.float64), NBINS).astype(np.int64)
        total += exact_from_bins(hi) * (1 << 26) + exact_from_bins(lo)
    return total


def as_float(v: Fraction | float) -> float:
    """``float(v)``, inf (with v's sign) where ``v`` is beyond float64's range."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _log10(v: Fraction) -> float:
    """log10 of a positive rational of any size."""
    return math.log10(v.numerator) - math.log10(v.denominator)


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

    def __repr__(self) -> str:
        """One line: the counts and the derived errors (the exact sums and the 256-bin histogram
        would fill a screen; they stay in the fields)."""
        return (
            f"Partial(elements={self.elements:,}, nonzero={self.nonzero:,}, underflow={self.underflow:,}, "
            f"subnormal={self.subnormal:,}, overflow={self.overflow:,}, saturated={self.saturated:,}, "
            f"nan_in={self.nan_in:,}, inf_in={self.inf_in:,}, sqnr_db={self.sqnr_db:.2f}, "
            f"rel_l2_error={self.rel_l2_error:.3e}, max_abs_in={self.max_abs_in:.4g})"
        )

    @property
    def sqnr_db(self) -> float:
        """Signal-to-quantization-noise ratio in dB (inf when there is no error)."""
        if self.sum_sq_err == 0:
            return math.inf
        if self.sum_sq_signal == 0:
            return -math.inf
        return 10 * (_log10(Fraction(self.sum_sq_signal)) - _log10(Fraction(self.sum_sq_err)))

    @property
    def rel_l2_error(self) -> float:
        """``||q - x|| / ||x||`` over the finite elements (0 for an all-zero tensor)."""
        return (
            math.sqrt(as_float(Fraction(self.sum_sq_err) / self.sum_sq_signal)) if self.sum_sq_signal else 0.0
        )

    @property
    def underflow_energy_share(self) -> float:
        """Share of the squared norm carried by the elements that underflowed."""
        return as_float(Fraction(self.underflow_energy) / self.sum_sq_signal) if self.sum_sq_signal else 0.0

    def totals(self) -> dict[str, Any]:
        """Counts, sums (as floats) and the derived metrics, without the histogram."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name != "hist":
                v = getattr(self, f.name)
                out[f.name] = as_float(v) if isinstance(v, Fraction) else v
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
        if not self.sum_abs_intended:
            return 1.0
        return as_float(Fraction(self.sum_abs_realised) / self.sum_abs_intended)

    def totals(self) -> dict[str, Any]:
        return {
            "updates": self.updates,
            "lost": self.lost,
            "swamped_share": self.swamped_share,
            "update_ratio": self.update_ratio,
        }
