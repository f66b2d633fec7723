"""Tier 1: the scalar reference, plain Python integers and exact fractions.

Slow and obvious by design. It follows the spec text directly: a value lies between two
neighbouring representable numbers ``lo = k * q`` and ``hi = (k + 1) * q`` (``q`` the
quantum of the binade, IEEE 754-2019 section 3.3), the rounding mode picks one (section
4.3), overflow follows section 7.4, and the code is assembled from sign, biased exponent and
trailing significand. The array tier (:mod:`fpsim.emulate.element`) is tested against it for every
rounding mode; it is tested against ml_dtypes and the published specs.
"""

from __future__ import annotations

import math
from fractions import Fraction

from ..formats import AnyFormat, Encoding, Format, IntFormat, RoundMode, get_format

__all__ = ["encode_scalar", "decode_scalar"]

_R = RoundMode


def decode_scalar(code: int, fmt: str | AnyFormat) -> float:
    """Value of ``code`` in ``fmt`` as a Python float (exact: every value fits float32)."""
    fmt = get_format(fmt)
    if not 0 <= code < (1 << fmt.bits):
        raise ValueError(f"code {code} out of range for {fmt.name} ({fmt.bits} bits)")
    if isinstance(fmt, IntFormat):
        k = code - (1 << fmt.bits) if fmt.signed and code >> (fmt.bits - 1) else code
        return math.ldexp(k, -fmt.fraction_bits)
    e_bits, m_bits = fmt.exponent_bits, fmt.mantissa_bits
    negative = bool(code & fmt.sign_mask)
    mag = code & ((1 << (e_bits + m_bits)) - 1)
    field, frac = mag >> m_bits, mag & ((1 << m_bits) - 1)
    enc = fmt.encoding
    if enc is Encoding.IEEE and field == (1 << e_bits) - 1:
        return math.nan if frac else (-math.inf if negative else math.inf)
    if enc is Encoding.FN and mag == (1 << (e_bits + m_bits)) - 1:
        return math.nan
    if enc is Encoding.FNUZ and negative and mag == 0:
        return math.nan
    if field == 0 and fmt.has_zero:
        value = Fraction(frac, 1 << m_bits) * _pow2(1 - fmt.bias) if fmt.subnormals else Fraction(0)
    else:
        value = (1 + Fraction(frac, 1 << m_bits)) * _pow2(field - fmt.bias)
    return -float(value) if negative else float(value)


def encode_scalar(
    x: float,
    fmt: str | AnyFormat,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    *,
    saturate: bool = False,
    subnormals: bool = True,
    random_bits: int = 0,
    stochastic_bits: int = 32,
) -> int:
    """Code of ``x`` in ``fmt``, same meaning of every argument as :func:`fpsim.encode`.

    ``random_bits`` is the one uint32 word used by stochastic rounding for this element.
    ``x`` may also be a ``fractions.Fraction`` (rounded exactly; float formats only), which is
    how the tests check compound operations such as fused multiply-add.
    """
    fmt, mode = get_format(fmt), RoundMode.parse(rounding)
    exact = x if isinstance(x, Fraction) else None  # an exact rational input (finite)
    x = float(x) if exact is None else (-1.0 if exact < 0 else 1.0)
    if isinstance(fmt, IntFormat):
        return _encode_int(x, fmt, mode, saturate, random_bits, stochastic_bits)
    negative = math.copysign(1.0, x) < 0
    sign = fmt.sign_mask if negative else 0
    nan = _nan_code(fmt, negative)
    if math.isnan(x):
        return 0 if nan is None else nan
    if not fmt.signed and negative and (x != 0 or not fmt.has_zero):
        return 0 if nan is None else nan  # unsigned: negatives have no code
    if math.isinf(x):
        if saturate or fmt.encoding is Encoding.FINITE:
            return sign | fmt.code_of_max
        return sign | fmt.code_of_inf if fmt.has_inf else nan
    v = abs(Fraction(x)) if exact is None else abs(exact)
    if v == 0:
        if not fmt.has_zero:
            return nan
        return 0 if fmt.encoding is Encoding.FNUZ else sign
    emin, m_bits = fmt.min_exponent, fmt.mantissa_bits
    if not fmt.has_zero and v < _pow2(emin):
        return 0  # nothing below the smallest value (E8M0): every mode gives it
    q = _pow2(max(_floor_log2(v), emin) - m_bits)
    k = math.floor(v / q)
    frac = v / q - k
    r = (k + _round_up(k, frac, negative, mode, random_bits, stochastic_bits)) * q
    if r > Fraction(fmt.max):
        away = mode in (_R.NEAREST_EVEN, _R.NEAREST_AWAY, _R.STOCHASTIC) or (
            mode is (_R.TOWARD_NEGATIVE if negative else _R.TOWARD_POSITIVE)
        )
        if saturate or not away or fmt.encoding is Encoding.FINITE:
            return sign | fmt.code_of_max
        return sign | fmt.code_of_inf if fmt.has_inf else nan
    if r < _pow2(emin):  # zero or subnormal
        mag = int(r / _pow2(emin - m_bits))
        if not (subnormals and fmt.subnormals):
            mag = 0  # flush to zero after rounding (PTX .ftz), sign kept
    else:
        e = _floor_log2(r)
        mag = ((e + fmt.bias) << m_bits) | int(r / _pow2(e - m_bits) - (1 << m_bits))
    if fmt.encoding is Encoding.FNUZ and mag == 0:
        return 0
    return sign | mag


def _round_up(k: int, frac: Fraction, negative: bool, mode: RoundMode, rbits: int, n: int) -> int:
    """1 to round the magnitude ``k + frac`` (in quanta) up to ``k + 1``, 0 to keep ``k``."""
    if frac == 0:
        return 0
    if mode is _R.NEAREST_EVEN:
        return int(frac > Fraction(1, 2) or (frac == Fraction(1, 2) and k % 2 == 1))
    if mode is _R.NEAREST_AWAY:
        return int(frac >= Fraction(1, 2))
    if mode is _R.TOWARD_ZERO:
        return 0
    if mode is _R.TOWARD_POSITIVE:
        return int(not negative)
    if mode is _R.TOWARD_NEGATIVE:
        return int(negative)
    if mode is _R.ODD:
        return int(k % 2 == 0)
    if not 1 <= n <= 32:
        raise ValueError(f"stochastic_bits must be in [1, 32], got {n}")
    return int(math.floor(frac * (1 << n)) + (rbits & ((1 << n) - 1)) >= (1 << n))


def _encode_int(x: float, fmt: IntFormat, mode: RoundMode, saturate: bool, rbits: int, n: int) -> int:
    mask = (1 << fmt.bits) - 1
    saturate = saturate or fmt.symmetric
    if math.isnan(x) or (math.isinf(x) and not saturate):
        return 0
    if math.isinf(x):
        return (fmt.max_int if x > 0 else fmt.min_int) & mask
    negative = x < 0
    v = abs(Fraction(x)) * (1 << fmt.fraction_bits)
    k = math.floor(v)
    r = k + _round_up(k, v - k, negative, mode, rbits, n)
    value = -r if negative else r
    if saturate:
        value = min(max(value, fmt.min_int), fmt.max_int)
    return value & mask


def _nan_code(fmt: Format, negative: bool) -> int | None:
    nan = fmt.code_of_nan
    if nan is None or fmt.encoding is Encoding.FNUZ:
        return nan
    return nan | (fmt.sign_mask if negative else 0)


def _pow2(e: int) -> Fraction:
    return Fraction(2) ** e


def _floor_log2(v: Fraction) -> int:
    e = v.numerator.bit_length() - v.denominator.bit_length()
    while _pow2(e) > v:
        e -= 1
    while _pow2(e + 1) <= v:
        e += 1
    return e
