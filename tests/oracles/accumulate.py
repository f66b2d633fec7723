"""Independent slow references for the accumulation tests (never call fpsim.accumulate).

Values are exact rationals (:class:`fractions.Fraction`); every operation is rounded by
:func:`round_frac`, written from the text of IEEE 754-2019 (sections 4.3 and 7.4) and of
:class:`fpsim.RoundMode` (stochastic: up iff ``floor(f * 2**n) + R >= 2**n``; odd: an inexact
result takes the odd neighbour). The reduction order follows the definitions in the
``fpsim.accumulate`` module docstring: a tree of width W evaluated depth first, optional
Kahan / Neumaier compensation per group, chunks promoted into a second accumulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from fractions import Fraction

from fpsim import Format

_NEAREST = ("nearest_even", "nearest_away", "stochastic")


def round_frac(v: Fraction, fmt: Format, mode: str, rbits: int = 0, nbits: int = 32) -> Fraction | float:
    """``v`` rounded to ``fmt`` (a Fraction, or a float inf / NaN on overflow)."""
    if v == 0:
        return Fraction(0)
    neg = v < 0
    a = -v if neg else v
    m, emin = fmt.mantissa_bits, fmt.min_exponent
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    q = Fraction(2) ** (max(e, emin) - m)  # quantum of the binade (subnormal: of emin)
    k = math.floor(a / q)
    rem = a / q - k
    up = {
        "nearest_even": rem > Fraction(1, 2) or (rem == Fraction(1, 2) and k % 2 == 1),
        "nearest_away": rem >= Fraction(1, 2),
        "toward_zero": False,
        "toward_positive": rem > 0 and not neg,
        "toward_negative": rem > 0 and neg,
        "odd": rem > 0 and k % 2 == 0,
        "stochastic": math.floor(rem * 2**nbits) + (rbits & ((1 << nbits) - 1)) >= 2**nbits,
    }[mode]
    res = (k + up) * q
    if not fmt.subnormals and res < Fraction(2) ** emin:
        res = Fraction(0)
    if res > Fraction(fmt.max):
        if mode in _NEAREST or mode == ("toward_negative" if neg else "toward_positive"):
            if fmt.encoding.value == "ieee":
                return -math.inf if neg else math.inf
            if fmt.encoding.value != "finite":
                return math.nan
        res = Fraction(fmt.max)
    return -res if neg else res


class Rounder:
    """``R(v)``: rounds into one format, drawing the next random word for every rounding."""

    def __init__(self, bits: Iterator[int], nbits: int):
        self.bits, self.nbits, self.used = bits, nbits, 0

    def __call__(self, v: Fraction, fmt: Format, mode: str) -> Fraction:
        self.used += 1
        out = round_frac(v, fmt, mode, next(self.bits), self.nbits)
        assert not isinstance(out, float), f"reference overflow: {float(v)} in {fmt.name}"
        return out


def group_sum(
    thunks: list[Callable[[], Fraction]], R: Callable[[Fraction], Fraction], comp, lost
) -> Fraction:
    """Left-to-right sum of one group, every operation rounded (optionally compensated)."""
    s = c = Fraction(0)
    for i, th in enumerate(thunks):
        e = th()
        if i == 0:
            s, c = R(e), Fraction(0)
            continue
        if comp is None:
            new, t = R(s + e), e
        elif comp == "kahan":
            t = R(e - c)
            new = R(s + t)
            c = R(R(new - s) - t)
        else:
            new, t = R(s + e), e
            d = R(R(s - new) + e) if abs(s) >= abs(e) else R(R(e - new) + s)
            c = R(c + d)
        if lost is not None and t != 0:
            lost[1] += 1
            lost[0] += new == s
        s = new
    return R(s + c) if comp == "neumaier" else s


def tree_sum(vals: list[Fraction], width: int | None, R, comp, lost) -> Fraction:
    """The width-W tree over ``vals`` (W = len(vals) for the sequential order), depth first."""
    n = len(vals)
    w = max(n, 2) if width is None else width
    sizes = [n]
    while len(sizes) == 1 or sizes[-1] > 1:
        sizes.append(-(-sizes[-1] // w))

    def node(level: int, idx: int) -> Fraction:
        if level == 0:
            return vals[idx]
        lo, hi = idx * w, min(idx * w + w, sizes[level - 1])
        counts = lost if level == 1 else None
        return group_sum([lambda c=c: node(level - 1, c) for c in range(lo, hi)], R, comp, counts)

    return node(len(sizes) - 1, 0)


def reduce_ref(
    terms: list[Fraction],
    *,
    acc: Format,
    mode: str,
    width: int | None = None,
    comp: str | None = None,
    chunk: int | None = None,
    promote: Format | None = None,
    pmode: str = "nearest_even",
    scales: list[Fraction] | None = None,
    bits: list[int] | None = None,
    nbits: int = 32,
    lost: list | None = None,
) -> tuple[Fraction, int]:
    """The reduction of ``terms`` as defined in fpsim.accumulate; returns (value, roundings).

    ``scales[j]`` multiplies chunk ``j`` before promotion (scaled GEMMs); promotion happens
    when ``promote`` is given.
    """
    rnd = Rounder(iter(bits) if bits is not None else iter(lambda: 0, 1), nbits)

    def R(v: Fraction) -> Fraction:
        return rnd(v, acc, mode)

    if promote is None:
        return tree_sum(terms, width, R, comp, lost), rnd.used
    total = None
    for j, c0 in enumerate(range(0, len(terms), chunk)):
        c = tree_sum(terms[c0 : c0 + chunk], width, R, comp, lost)
        x = c * (scales[j] if scales is not None else 1)
        total = rnd(x, promote, pmode) if total is None else rnd(total + x, promote, pmode)
    return total, rnd.used
