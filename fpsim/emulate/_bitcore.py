"""The array tier's integer kernels, written once for numpy and jax.numpy (``xp``).

Only integer operations on the input's IEEE 754 bit pattern, so the result does not depend
on the host's floating-point environment and the same code runs under ``jax.jit``. The
rounding, overflow and flush rules are those of :mod:`fpsim.emulate.reference` (tier 1), which the
tests compare this against for every mode.

A finite source value is ``sig * 2**qs`` with an integer significand ``sig``. Its quantum in
the target is ``2**(max(floor(log2 |x|), emin) - M)``; ``d`` is how many low bits of ``sig``
that drops. Rounding decides whether the kept part ``sig >> d`` goes up by one. The magnitude
code is then ``((e - emin) << M) + kept``: a carry out of the significand moves into the
exponent field, and a subnormal result has exponent field 0, exactly as in IEEE 754 codes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..formats import Encoding, Format, IntFormat, RoundMode

_R = RoundMode


class _Src:
    """Constants of the source float type (float32 or float64) and its integer twins."""

    def __init__(self, dtype: Any):
        wide = np.dtype(dtype) == np.float64
        self.U = np.uint64 if wide else np.uint32
        self.I = np.int64 if wide else np.int32
        self.width = 64 if wide else 32
        self.mbits = 52 if wide else 23
        self.bias = 1023 if wide else 127
        self.inf = (0x7FF << 52) if wide else (0xFF << 23)


def bitcast(xp: Any, a: Any, dtype: Any) -> Any:
    if xp is np:
        return a.view(dtype)
    import jax

    return jax.lax.bitcast_convert_type(a, dtype)


def _split(xp: Any, x: Any, s: _Src, emin: int):
    """Sign, magnitude bits, significand, its quantum exponent and floor(log2|x|)."""
    U, I = s.U, s.I
    bits = bitcast(xp, x, U)
    neg = (bits >> U(s.width - 1)) != 0
    mag = bits & U((1 << (s.width - 1)) - 1)
    es = (mag >> U(s.mbits)).astype(I)
    mant = mag & U((1 << s.mbits) - 1)
    sub = es == 0
    sig = xp.where(sub, mant, mant | U(1 << s.mbits))
    es1 = xp.maximum(es, I(1))
    qs = es1 - I(s.bias + s.mbits)
    if emin < 1 - s.bias:
        # The target reaches below the source's normal range (E8M0 from float32): find the
        # exponent of a subnormal source from the int -> float32 conversion of sig (exact).
        lead = (bitcast(xp, sig.astype(np.float32), np.uint32) >> np.uint32(23)).astype(I) - I(127)
        lg = xp.where(sub, lead + qs, es - I(s.bias))
    else:
        lg = es1 - I(s.bias)  # subnormal sources lie below emin; only max(lg, emin) is used
    return neg, mag, sig, qs, lg


def _round(xp, sig, d, neg, mode: RoundMode, rand, nbits: int, s: _Src):
    """Round ``sig / 2**d`` to an integer (d >= 0) as ``mode`` says; returns it as U."""
    U = s.U
    dc = xp.minimum(d, s.I(s.mbits + 2)).astype(U)  # beyond this everything is discarded
    kept = sig >> dc
    rem = sig & ((U(1) << dc) - U(1))
    if mode is _R.TOWARD_ZERO:
        return kept
    inexact = rem != 0
    if mode is _R.ODD:
        return kept | inexact.astype(U)
    if mode is _R.TOWARD_POSITIVE:
        up = inexact & ~neg
    elif mode is _R.TOWARD_NEGATIVE:
        up = inexact & neg
    elif mode is _R.NEAREST_EVEN:
        half = (U(1) << dc) >> U(1)
        up = (rem > half) | ((rem == half) & inexact & ((kept & U(1)) != 0))
    elif mode is _R.NEAREST_AWAY:
        half = (U(1) << dc) >> U(1)
        up = (rem >= half) & inexact
    else:  # stochastic: round away iff floor(frac * 2**n) + R >= 2**n
        r = rand.astype(U) & U((1 << nbits) - 1)
        dn = d - s.I(nbits)
        big = dn >= 0  # the discarded field is at least n bits wide: keep its top n bits
        top = rem >> xp.clip(dn, 0, s.mbits + 1).astype(U)
        low = r >> xp.clip(-dn, 0, s.width - 1).astype(U)
        a = xp.where(big, top, rem)
        b = xp.where(big, r, low)
        width = xp.minimum(d, s.I(nbits - 1)).astype(U)  # d < n here, so 2**d fits
        lim = xp.where(big, U((1 << nbits) - 1), (U(1) << width) - U(1))
        up = (a > lim - b) & inexact
    return kept + up.astype(U)


def encode_float(xp, x, fmt: Format, mode: RoundMode, saturate: bool, ftz: bool, rand, nbits: int):
    """Codes of float32/float64 array ``x`` in float format ``fmt``."""
    s = _Src(x.dtype)
    U, I = s.U, s.I
    m_bits, emin = fmt.mantissa_bits, fmt.min_exponent
    neg, mag, sig, qs, lg = _split(xp, x, s, emin)
    et = xp.maximum(lg, I(emin))
    kept = _round(xp, sig, et - I(m_bits) - qs, neg, mode, rand, nbits, s)
    code = ((et - I(emin)).astype(U) << U(m_bits)) + kept
    if not fmt.has_zero:
        one = U(1 << m_bits)  # field 0 is the normal 2**emin: drop the implicit bit
        code = xp.where(lg < I(emin), U(0), xp.maximum(code, one) - one)
    elif ftz and m_bits > 0:
        code = xp.where(code < U(1 << m_bits), U(0), code)

    # overflow (IEEE 754 7.4), then the special inputs
    is_inf, is_nan = mag == U(s.inf), mag > U(s.inf)
    over = (code > U(fmt.code_of_max)) | is_inf
    if saturate or fmt.encoding is Encoding.FINITE or mode in (_R.TOWARD_ZERO, _R.ODD):
        to_inf = is_inf & (not saturate and fmt.encoding is not Encoding.FINITE)
    elif mode is _R.TOWARD_POSITIVE:
        to_inf = over & (~neg | is_inf)
    elif mode is _R.TOWARD_NEGATIVE:
        to_inf = over & (neg | is_inf)
    else:
        to_inf = over
    code = xp.where(over, U(fmt.code_of_max), code)
    nan = is_nan
    if fmt.encoding is Encoding.IEEE:
        code = xp.where(to_inf, U(fmt.code_of_inf), code)
    elif fmt.has_nan:
        nan = nan | to_inf
    if not fmt.has_zero:
        nan = nan | (mag == U(0))
    if fmt.signed:
        sign_out = neg & (code != U(0)) if fmt.encoding is Encoding.FNUZ else neg
        code = code | (sign_out.astype(U) << U(fmt.exponent_bits + m_bits))
    else:
        nan = nan | (neg & (mag != U(0)))
    if fmt.has_nan:
        nan_code = U(fmt.code_of_nan)
        if fmt.encoding in (Encoding.IEEE, Encoding.FN) and fmt.signed:
            nan_code = nan_code | (neg.astype(U) << U(fmt.exponent_bits + m_bits))
        code = xp.where(nan, nan_code, code)
    else:
        code = xp.where(nan, U(0), code)  # no NaN code: NaN becomes +0 (documented)
    return code.astype(fmt.code_dtype)


def encode_int(xp, x, fmt: IntFormat, mode: RoundMode, saturate: bool, rand, nbits: int):
    """Codes (two's complement bit patterns) of ``x * 2**fraction_bits`` rounded to an integer."""
    s = _Src(x.dtype)
    U, I = s.U, s.I
    neg, mag, sig, qs, _ = _split(xp, x, s, 0)
    d = -(qs + I(fmt.fraction_bits))
    kept = _round(xp, sig, xp.maximum(d, I(0)), neg, mode, rand, nbits, s)
    big = d < 0  # |x| * 2**fraction_bits >= 2**(mbits + 1): an integer far out of range
    kept = xp.where(big, sig << xp.clip(-d, 0, fmt.bits).astype(U), kept)
    mask = U((1 << fmt.bits) - 1)
    if saturate or fmt.symmetric:
        lo = U(-fmt.min_int)
        pos = xp.where(big | (kept > U(fmt.max_int)), U(fmt.max_int), kept)
        negv = xp.where(big | (kept > lo), lo, kept)
        code = xp.where(neg, (U(0) - negv) & mask, pos)
        code = xp.where(mag > U(s.inf), U(0), code)  # NaN -> 0; +-inf clamp like finite
    else:
        code = xp.where(neg, U(0) - kept, kept) & mask
        code = xp.where(mag < U(s.inf), code, U(0))  # inf and NaN have no integer: 0
    return code.astype(fmt.code_dtype)


def encode_float_numpy(x, fmt: Format, mode: RoundMode, saturate: bool, ftz: bool, rand, nbits: int):
    """numpy fast path, same codes as :func:`encode_float`.

    Inside the target's normal range the quantum is a fixed ``d = Ms - M`` bits of the
    source pattern, so rounding is a constant shift of the magnitude bits (a carry moves into
    the exponent) and the code is that minus the bias difference. Elements outside it (zero,
    subnormal results, overflow, inf, NaN) go through :func:`encode_float`. Works on chunks
    that fit in cache.
    """
    if not (fmt.signed and fmt.has_zero) or mode is _R.STOCHASTIC:
        return encode_float(np, x, fmt, mode, saturate, ftz, rand, nbits)
    s = _Src(x.dtype)
    U, I = s.U, s.I
    d = s.mbits - fmt.mantissa_bits
    rebias = U((s.bias - fmt.bias) << fmt.mantissa_bits)
    lo = U((fmt.min_exponent + s.bias) << s.mbits)  # bits of the smallest normal value
    sign_shift = U(s.width - fmt.bits)
    sign_bit = U(fmt.sign_mask)
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, fmt.code_dtype)
    step = 1 << 18
    for i in range(0, flat.size, step):
        bits = flat[i : i + step].view(U)
        mag = bits & U((1 << (s.width - 1)) - 1)
        if d == 0:
            kept = mag
        elif mode is _R.NEAREST_EVEN:
            kept = (mag + ((mag >> U(d)) & U(1)) + U((1 << d >> 1) - 1)) >> U(d)
        else:
            neg = bits >= U(1 << (s.width - 1))
            kept = _round(np, mag, I(d), neg, mode, None, nbits, s)
        code = kept - rebias
        bad = (mag < lo) | (code > U(fmt.code_of_max))
        code |= (bits >> sign_shift) & sign_bit
        out[i : i + step] = code
        if bad.any():
            j = np.flatnonzero(bad)
            if mode is _R.NEAREST_EVEN:  # zero and subnormal results: integer RNE, no specials
                small = mag[j] < lo
                k = j[small]
                out[i + k] = _below_normal_rne(mag[k], bits[k], fmt, ftz, s)
                j = j[~small]
            if j.size:
                out[i + j] = encode_float(np, flat[i + j], fmt, mode, saturate, ftz, None, nbits)
    return out.reshape(x.shape)


def _below_normal_rne(mag, bits, fmt: Format, ftz: bool, s: _Src):
    """Nearest-even codes of magnitudes below the target's smallest normal (zero included).

    The quantum is the target's subnormal quantum, ``d = Ms - M + (emin + Bs - max(es, 1))``
    bits of the source significand; a carry out of the subnormal range gives the smallest
    normal code, as in :func:`encode_float`.
    """
    U, I = s.U, s.I
    m_bits = fmt.mantissa_bits
    es = (mag >> U(s.mbits)).astype(I)
    mant = mag & U((1 << s.mbits) - 1)
    sig = np.where(es == 0, mant, mant | U(1 << s.mbits))
    d = np.minimum(I(s.mbits - m_bits + fmt.min_exponent + s.bias) - np.maximum(es, I(1)), I(s.mbits + 2))
    d = d.astype(U)
    kept = sig >> d
    rem = sig & ((U(1) << d) - U(1))
    half = (U(1) << d) >> U(1)
    tie_odd = (rem == half) & (rem != 0) & ((kept & U(1)) != 0)  # rem == half == 0: exact (d = 0)
    code = kept + ((rem > half) | tie_odd).astype(U)
    if ftz and m_bits > 0:
        code = np.where(code < U(1 << m_bits), U(0), code)
    sign = (bits >> U(s.width - 1)).astype(U)
    if fmt.encoding is Encoding.FNUZ:
        sign = sign & (code != 0)
    return (code | (sign << U(fmt.exponent_bits + m_bits))).astype(fmt.code_dtype)


_INT_ROUND = {
    _R.NEAREST_EVEN: np.rint,
    _R.TOWARD_ZERO: np.trunc,
    _R.TOWARD_POSITIVE: np.ceil,
    _R.TOWARD_NEGATIVE: np.floor,
}


def encode_int_numpy(x, fmt: IntFormat, mode: RoundMode, saturate: bool, rand, nbits: int):
    """numpy fast path of :func:`encode_int` for clamping casts in the IEEE modes.

    ``x * 2**fraction_bits`` is exact (a power-of-two product; float64 has the range), the
    IEEE roundToIntegral operations are exact, and the clamp makes the int64 cast safe.
    """
    if not (saturate or fmt.symmetric) or mode not in _INT_ROUND:
        return encode_int(np, x, fmt, mode, saturate, rand, nbits)
    with np.errstate(invalid="ignore"):
        k = _INT_ROUND[mode](np.ldexp(x.astype(np.float64), fmt.fraction_bits))
        k = np.clip(np.where(np.isnan(k), 0.0, k), fmt.min_int, fmt.max_int).astype(np.int64)
    return (k & ((1 << fmt.bits) - 1)).astype(fmt.code_dtype)
