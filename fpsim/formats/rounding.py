"""Rounding modes (IEEE 754-2019 section 4.3, plus stochastic rounding and round-to-odd)."""

from __future__ import annotations

from .codes import NumberedEnum

__all__ = ["RoundMode"]


class RoundMode(NumberedEnum):
    """How a value between two representable neighbours is rounded.

    Attributes:
        NEAREST_EVEN: roundTiesToEven (IEEE 754 4.3.1); the default of every cast.
        NEAREST_AWAY: roundTiesToAway (IEEE 754 4.3.1); what microxcaling and QPyTorch
            call "nearest".
        TOWARD_ZERO: roundTowardZero (IEEE 754 4.3.2), truncation.
        TOWARD_POSITIVE: roundTowardPositive (IEEE 754 4.3.2).
        TOWARD_NEGATIVE: roundTowardNegative (IEEE 754 4.3.2).
        STOCHASTIC: away from zero with probability equal to the truncated fraction of the
            gap, decided by caller-supplied random bits: with ``f`` in [0, 1) the position
            of ``|x|`` between its neighbours and ``R`` the low ``n`` bits of the random
            word, round away iff ``floor(f * 2**n) + R >= 2**n``. Exactly unbiased when the
            discarded bits fit in ``n``; otherwise biased toward zero by < ``2**-n`` ulp.
        ODD: round to odd (von Neumann / Boldo-Melquiond): truncate, then set the last
            significand bit when the result is inexact.

    Overflow (IEEE 754 7.4): nearest and stochastic modes go to infinity, toward-zero and
    odd to the largest finite value, directed modes by sign. A format without infinity
    gives NaN instead (or its max when it has no NaN either); ``saturate=True`` clamps
    every out-of-range value, infinities included, to the largest finite value.

    Each member is its name (``value``, what :meth:`parse` and the command line take) and its
    :attr:`code`, the integer the compiled loops and the Triton kernels number it by; those
    read it from here (tests/formats/test_codes.py).
    """

    NEAREST_EVEN = "nearest_even", 0
    NEAREST_AWAY = "nearest_away", 1
    TOWARD_ZERO = "toward_zero", 2
    TOWARD_POSITIVE = "toward_positive", 3
    TOWARD_NEGATIVE = "toward_negative", 4
    STOCHASTIC = "stochastic", 5
    ODD = "odd", 6

    @classmethod
    def parse(cls, mode: RoundMode | str) -> RoundMode:
        """Accept a RoundMode or its name; raise ValueError listing the names otherwise."""
        if isinstance(mode, cls):
            return mode
        try:
            return cls(mode)
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown rounding mode {mode!r}; allowed: {names}") from None
