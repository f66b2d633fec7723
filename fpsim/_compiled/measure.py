"""Compiled loops of the analysis and of the numpy-facing element verbs (numba).

One loop per job, each one read of its inputs: :func:`codes_tile` (the element verb ``encode``),
:func:`element_tally` (a chunk of a tensor encoded, decoded and tallied under one element format:
every count, the error and signal sums, the maxima and the log2 histogram), :func:`block_tally` (the
same under a block recipe, from the amaxes of :func:`block_amax`), :func:`value_tally` (the tallies
of values computed elsewhere) and :func:`swamp_tally` (the swamping of an update, both rounding
modes of the analysis in one pass). They give the bits of the numpy tier
(:mod:`fpsim.emulate._bitcore` for the codes, :mod:`fpsim.analysis.metrics` for the tallies):
:func:`encode_float` and :func:`encode_int` are its integer rules on the float64 bit pattern (a
float32 input is widened exactly first), and the float sums are exact.

Exact sums: a sum is kept as integer bins, bin ``k`` counting units of ``2**(k + KMIN)``. A term is
a float64 significand (53 bits) times a power of two: ``|v|`` itself, or the square of ``v`` rounded
to 53 bits without overflow or underflow (``frexp(v) = (f, e)``, the term ``(f * f) * 2**(2 e)``:
the float64 product wherever that is finite and normal). Bins are carried into 32-bit digits every
:data:`TILE` elements, so none overflows. :func:`fpsim.analysis.partials.exact_from_bins` adds the
bins into one integer, so a sum does not depend on order, tiling, threads or processes, and equals
the numpy tier's (:func:`fpsim.analysis.partials.exact_sum`).

Like :mod:`.loops`, every loop this module runs is defined in this file (numba checks a cached
function against its own file only), compiled without fast-math and cached on disk; the loops are
single-threaded and release the GIL (the callers run pieces on a thread pool). Per-element helpers
take scalars or a tuple (an array argument is reference-counted per element).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types

from ..formats import Encoding, RoundMode
from ..formats.codes import DecodeKind, FactorKind
from ..formats.params import FormatParams
from .kinds import KMIN, NBINS
from .loops import bitcast, bits32, float32_of, jit

NEAREST_EVEN, NEAREST_AWAY, ODD = RoundMode.NEAREST_EVEN.code, RoundMode.NEAREST_AWAY.code, RoundMode.ODD.code
TOWARD_ZERO, STOCHASTIC = RoundMode.TOWARD_ZERO.code, RoundMode.STOCHASTIC.code
TOWARD_POSITIVE, TOWARD_NEGATIVE = RoundMode.TOWARD_POSITIVE.code, RoundMode.TOWARD_NEGATIVE.code
IEEE, FN, FNUZ, FINITE = Encoding.IEEE.code, Encoding.FN.code, Encoding.FNUZ.code, Encoding.FINITE.code
F_PRODUCT, F_QUOTIENT = int(FactorKind.PRODUCT), int(FactorKind.QUOTIENT)
D_POW2, D_TENSOR = int(DecodeKind.POW2), int(DecodeKind.TENSOR)
TILE = 1000
"""Elements between carries: 1000 terms of 53 bits on a 32-bit digit stay below 2**63."""

(P_INT, P_M, P_E, P_EMIN, P_ZERO, P_SIGNED, P_NAN, P_ENC, P_MAX, P_INF, P_NANCODE, P_FRAC, P_BITS, P_CLAMP,
 P_MAXINT, P_MININT, P_SAT, P_FTZ, P_WIDE, P_SUB, P_FAST) = map(FormatParams._fields.index, (  # loop_params
    "is_int", "m", "e", "emin", "has_zero", "signed", "has_nan", "enc", "code_max", "code_inf", "code_nan",
    "frac", "bits", "clamp", "max_int", "min_int", "saturate", "ftz", "wide", "subnormal", "fast",
))  # fmt: skip

_U = np.uint64
_INF64 = _U(0x7FF0000000000000)
_MAG64 = _U(0x7FFFFFFFFFFFFFFF)
_MANT64 = _U((1 << 52) - 1)
bits64 = bitcast(types.float64, types.uint64, ir.IntType(64))
float64_of = bitcast(types.uint64, types.float64, ir.DoubleType())


@jit
def random_word(mix, index):
    # fpsim.emulate.random.random_bits_at: SplitMix64 of index + seed * G, low 32 bits
    z = _U(index) + mix
    z = (z ^ (z >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U(27))) * _U(0x94D049BB133111EB)
    return (z ^ (z >> _U(31))) & _U(0xFFFFFFFF)


@jit
def round_sig(sig, d, neg, mode, r, nbits):
    # fpsim.emulate._bitcore._round of one float64 significand: sig / 2**d to an integer.
    # Data-dependent conditions are combined with & and | (selects, not branches: a
    # mispredicted branch per element costs more than the whole rounding)
    dc = _U(min(d, np.int64(54)))
    kept = sig >> dc
    rem = sig & ((_U(1) << dc) - _U(1))
    if mode == TOWARD_ZERO:
        return kept
    inexact = rem != _U(0)
    if mode == ODD:
        return kept | _U(inexact)
    if mode == TOWARD_POSITIVE:
        up = inexact & ~neg
    elif mode == TOWARD_NEGATIVE:
        up = inexact & neg
    elif mode == NEAREST_EVEN:
        half = (_U(1) << dc) >> _U(1)
        up = (rem > half) | ((rem == half) & inexact & ((kept & _U(1)) != _U(0)))
    elif mode == NEAREST_AWAY:
        half = (_U(1) << dc) >> _U(1)
        up = (rem >= half) & inexact
    else:  # stochastic: round away iff floor(frac * 2**n) + R >= 2**n
        full = (_U(1) << _U(nbits)) - _U(1)
        rr = r & full
        dn = d - nbits
        big = dn >= 0
        top = rem >> _U(min(max(dn, np.int64(0)), np.int64(53)))
        low = rr >> _U(min(max(-dn, np.int64(0)), np.int64(63)))
        lim_small = (_U(1) << _U(min(d, nbits - 1))) - _U(1)
        a = top if big else rem
        b = rr if big else low
        lim = full if big else lim_small
        up = (a > lim - b) & inexact
    return kept + _U(up)


@jit
def encode_float(x, p, mode, r, nbits):
    # fpsim.emulate._bitcore.encode_float of one value (float64; p: the format's parameters);
    # branches only on the format and the mode, selects on the data
    m_bits, emin = p[P_M], p[P_EMIN]
    b = bits64(x)
    neg = (b >> _U(63)) != _U(0)
    mag = b & _MAG64
    es = np.int64(mag >> _U(52))
    mant = mag & _MANT64
    sig = mant if es == 0 else mant | (_U(1) << _U(52))
    es1 = max(es, np.int64(1))
    lg = es1 - 1023
    et = max(lg, emin)
    kept = round_sig(sig, et - m_bits - (es1 - 1075), neg, mode, r, nbits)
    code = (_U(et - emin) << _U(m_bits)) + kept
    small = _U(1) << _U(m_bits)
    if p[P_ZERO] == 0:
        code = _U(0) if lg < emin else max(code, small) - small
    elif p[P_FTZ] != 0 and m_bits > 0:
        code = _U(0) if code < small else code
    enc, sat = p[P_ENC], p[P_SAT] != 0
    is_inf, is_nan = mag == _INF64, mag > _INF64
    cmax = _U(p[P_MAX])
    over = (code > cmax) | is_inf
    if sat or enc == FINITE or mode == TOWARD_ZERO or mode == ODD:
        to_inf = is_inf & (not sat and enc != FINITE)
    elif mode == TOWARD_POSITIVE:
        to_inf = over & (~neg | is_inf)
    elif mode == TOWARD_NEGATIVE:
        to_inf = over & (neg | is_inf)
    else:
        to_inf = over
    code = cmax if over else code
    nan = is_nan
    if enc == IEEE:
        code = _U(p[P_INF]) if to_inf else code
    elif p[P_NAN] != 0:
        nan = nan | to_inf
    if p[P_ZERO] == 0:
        nan = nan | (mag == _U(0))
    shift = _U(p[P_E] + m_bits)
    if p[P_SIGNED] != 0:
        sign_out = (neg & (code != _U(0))) if enc == FNUZ else neg
        code = code | (_U(sign_out) << shift)
    else:
        nan = nan | (neg & (mag != _U(0)))
    nan_code = _U(0)
    if p[P_NAN] != 0:
        nan_code = _U(p[P_NANCODE])
        if (enc == IEEE or enc == FN) and p[P_SIGNED] != 0:
            nan_code = nan_code | (_U(neg) << shift)
    return nan_code if nan else code


@jit
def beyond_code(x, p):
    # encode_float in nearest-even or stochastic rounding where the rounded magnitude code is
    # beyond the largest finite one (x overflows, is inf or NaN) in a signed format with a
    # zero: its branches taken for such an x, scalars only (4x faster than the whole rule)
    b = bits64(x)
    neg, nan = (b >> _U(63)) != _U(0), (b & _MAG64) > _INF64
    enc, shift = p[P_ENC], _U(p[P_E] + p[P_M])
    to_inf = not (p[P_SAT] != 0 or enc == FINITE)
    code = _U(p[P_INF]) if enc == IEEE and to_inf else _U(p[P_MAX])
    nan = nan | (enc != IEEE and p[P_NAN] != 0 and to_inf)
    code = code | (_U(neg & (code != _U(0)) if enc == FNUZ else neg) << shift)
    nan_code = _U(p[P_NANCODE]) if p[P_NAN] != 0 else _U(0)
    nan_code = nan_code | (_U(neg and p[P_NAN] != 0 and (enc == IEEE or enc == FN)) << shift)
    return nan_code if nan else code


@jit
def encode_int(x, p, mode, r, nbits):
    # fpsim.emulate._bitcore.encode_int of one value (float64): x * 2**fraction_bits rounded
    b = bits64(x)
    neg = (b >> _U(63)) != _U(0)
    mag = b & _MAG64
    es = np.int64(mag >> _U(52))
    mant = mag & _MANT64
    sig = mant if es == 0 else mant | (_U(1) << _U(52))
    d = -(max(es, np.int64(1)) - 1075 + p[P_FRAC])
    kept = round_sig(sig, max(d, np.int64(0)), neg, mode, r, nbits)
    big = d < 0
    kept = (sig << _U(min(max(-d, np.int64(0)), p[P_BITS]))) if big else kept
    mask = (_U(1) << _U(p[P_BITS])) - _U(1)
    if p[P_CLAMP] != 0:
        lo, hi = _U(-p[P_MININT]), _U(p[P_MAXINT])
        v = lo if big | (kept > lo) else kept
        pos = hi if big | (kept > hi) else kept
        code = ((_U(0) - v) & mask) if neg else pos
        return _U(0) if mag > _INF64 else code
    code = ((_U(0) - kept) if neg else kept) & mask
    return _U(0) if mag >= _INF64 else code


@jit
def signed_code(b, c, m, shift, fnuz, ftz):
    # (magnitude code, code) of nearest_code and stochastic_code: c flushed to zero below the
    # normal range where ftz, the sign of the float64 bits b added (none on a zero in FNUZ)
    c = _U(0) if ftz and c < (_U(1) << _U(m)) else c
    neg = (b >> _U(63)) != _U(0)
    return c, c | (_U((neg & (c != _U(0))) if fnuz else neg) << shift)


@jit
def nearest_code(x, m, emin, shift, fnuz, ftz):
    # encode_float in nearest-even for p[P_FAST] formats without the special cases, as
    # fpsim.emulate._bitcore.encode_float_numpy does it: normal range, the magnitude bits
    # rounded at a fixed position minus the bias difference; below it, x in units of the
    # subnormal quantum rounded by adding 2**52 (exact, and rounds to nearest-even). Right
    # where the magnitude code is at most the largest finite one (else beyond_code).
    # Scalar arguments, so that it inlines into the loops and vectorizes
    b = bits64(x)
    mag = b & _MAG64
    d = _U(52 - m)
    nor = ((mag + ((mag >> d) & _U(1)) + ((_U(1) << (d - _U(1))) - _U(1))) >> d) - _U((1022 + emin) << m)
    two52 = 4503599627370496.0
    scale = float64_of(_U(1023 + m - emin) << _U(52))
    sub = bits64(float64_of(mag) * scale + two52) - bits64(two52)
    return signed_code(b, sub if mag < _U((emin + 1023) << 52) else nor, m, shift, fnuz, ftz)


@jit
def stochastic_code(x, r, m, emin, shift, fnuz, ftz):
    # encode_float in stochastic rounding, 32-bit words r, p[P_FAST] formats of at most 20
    # mantissa bits (at least 32 bits discarded: keep their top 32, top, round away iff
    # top + r >= 2**32), without the special cases: normal range at nearest_code's fixed
    # position; below it at the subnormal quantum, d = emin - m + 1075 - max(es, 1) bits
    # (d >= 33, clamped where all is discarded). Right where nearest_code is
    b = bits64(x)
    mag = b & _MAG64
    d = _U(52 - m)
    kept = mag >> d
    top = (mag & ((_U(1) << d) - _U(1))) >> (d - _U(32))
    nor = kept + ((top + r) >> _U(32)) - _U((1022 + emin) << m)
    es = np.int64(mag >> _U(52))
    mant = mag & _MANT64
    sig = mant if es == 0 else mant | (_U(1) << _U(52))
    dv = min(max(emin - m + 1075 - max(es, np.int64(1)), np.int64(33)), np.int64(95))
    dk = _U(min(dv, np.int64(63)))
    top_s = (sig & ((_U(1) << dk) - _U(1))) >> _U(dv - 32)
    sub = (sig >> dk) + ((top_s + r) >> _U(32))
    return signed_code(b, sub if mag < _U((emin + 1023) << 52) else nor, m, shift, fnuz, ftz)


@jit
def stochastic_fast(x, p, mix, offset, rand, out):
    # encode in stochastic rounding (32-bit words: rand[i], or random_word(mix, offset + i)
    # where rand is empty) for formats with p[P_FAST] and at most 20 mantissa bits:
    # stochastic_code, beyond_code where it does not apply
    m, emin, shift = p[P_M], p[P_EMIN], _U(p[P_E] + p[P_M])
    fnuz, ftz, cmax = p[P_ENC] == FNUZ, p[P_FTZ] != 0, _U(p[P_MAX])
    given = rand.size > 0
    bad = 0
    for i in range(x.size):
        r = _U(rand[i]) if given else random_word(mix, offset + i)
        c, code = stochastic_code(np.float64(x[i]), r, m, emin, shift, fnuz, ftz)
        out[i] = code
        bad += c > cmax
    if bad:
        for i in range(x.size):
            xi = np.float64(x[i])
            r = _U(rand[i]) if given else random_word(mix, offset + i)
            c, code = stochastic_code(xi, r, m, emin, shift, fnuz, ftz)
            out[i] = beyond_code(xi, p) if c > cmax else code


@jit
def encode_fast(x, p, out):
    # encode in nearest-even for formats with p[P_FAST]: nearest_code, beyond_code where it
    # does not apply; the parameters taken out of p once
    m, emin, shift = p[P_M], p[P_EMIN], _U(p[P_E] + p[P_M])
    fnuz, ftz, cmax = p[P_ENC] == FNUZ, p[P_FTZ] != 0, _U(p[P_MAX])
    bad = 0
    for i in range(x.size):
        c, code = nearest_code(np.float64(x[i]), m, emin, shift, fnuz, ftz)
        out[i] = code
        bad += c > cmax
    if bad:  # (a select, not a branch: as many out of range as in is common)
        for i in range(x.size):
            xi = np.float64(x[i])
            c, code = nearest_code(xi, m, emin, shift, fnuz, ftz)
            out[i] = beyond_code(xi, p) if c > cmax else code


@jit
def codes_tile(x, p, mode, nbits, mix, offset, rand, out):
    # out[i] = the code of x[i] (float32 or float64) under the element format p; stochastic
    # words rand[i] (x's size), or random_word(mix, offset + i) where rand is empty
    # (fpsim.emulate.element.encode_array on numpy: the verb's words, offset 0)
    if mode == NEAREST_EVEN and p[P_FAST] != 0 and p[P_INT] == 0:
        encode_fast(x, p, out)
        return
    if mode == STOCHASTIC and p[P_FAST] != 0 and p[P_INT] == 0 and p[P_M] <= 20 and nbits == 32:
        stochastic_fast(x, p, mix, offset, rand, out)
        return
    given = rand.size > 0
    for i in range(x.size):
        r = _U(0)
        if mode == STOCHASTIC:
            r = _U(rand[i]) if given else random_word(mix, offset + i)
        xi = np.float64(x[i])
        out[i] = encode_int(xi, p, mode, r, nbits) if p[P_INT] != 0 else encode_float(xi, p, mode, r, nbits)


@jit
def values_tile(codes, p, table, q, at_max, sub):
    # q[i] = the float32 value of codes[i] (table lookup, float32 codes reinterpreted), and
    # fpsim.analysis.metrics.element_flags: at_max (the code is +-max), sub (subnormal)
    wide, isint, signed = p[P_WIDE] != 0, p[P_INT] != 0, p[P_SIGNED] != 0
    m, cmax, subok = _U(p[P_M]), _U(p[P_MAX]), p[P_SUB] != 0
    magmask = (_U(1) << _U(p[P_E] + p[P_M])) - _U(1)
    bits, maxint, minint = p[P_BITS], p[P_MAXINT], p[P_MININT]
    for i in range(codes.size):
        c = codes[i]
        q[i] = float32_of(np.uint32(c)) if wide else table[c]
        if isint:
            k = np.int64(c)
            k = k - (np.int64(1) << bits) if signed and k >= (np.int64(1) << (bits - 1)) else k
            at_max[i] = (k == maxint) | (k == minint)
            sub[i] = False
        else:
            mag = c & magmask
            at_max[i] = mag == cmax
            sub[i] = subok & ((mag >> m) == _U(0))


@jit
def abs_term(v):
    # |v| (finite, nonzero float64) as (significand, bin): m * 2**(j + KMIN)
    b = bits64(v) & _MAG64
    e = np.int64(b >> _U(52))
    m = np.int64(b & _MANT64)
    if e == 0:
        return m, -1074 - KMIN
    return m | (np.int64(1) << 52), e - 1075 - KMIN


@jit
def square_term(v):
    # v**2 (finite, nonzero float64) rounded to 53 bits, exponent unbounded (module doc)
    b = bits64(v) & _MAG64
    e = np.int64(b >> _U(52))
    if e == 0:  # subnormal: scale by 2**64 (exact)
        b = bits64(float64_of(b) * 18446744073709551616.0)
        e = np.int64(b >> _U(52)) - 64
    f = float64_of((b & _MANT64) | _U(1022 << 52))  # frexp: v = f * 2**(e - 1022), f in [0.5, 1)
    pb = bits64(f * f)
    ep = np.int64(pb >> _U(52))
    return np.int64(pb & _MANT64) | (np.int64(1) << 52), ep - 1075 + 2 * (e - 1022) - KMIN


@jit
def carry(bins, lo, hi):
    # every row's bins lo..hi (and above, as carries go) to 32-bit digits: a carry moves 32 bins up
    for row in range(bins.shape[0]):
        i, top = lo, hi
        while i <= top:
            c = bins[row, i] >> 32
            if c != 0:
                bins[row, i] &= np.int64(0xFFFFFFFF)
                bins[row, i + 32] += c
                top = max(top, i + 32)
            i += 1


@jit
def input_tally(x, hist_on, counts, bins, maxes, hist):
    # what fpsim.analysis.metrics._tally counts of the input alone, the same for every format
    # (computed once per chunk): counts nan, finite, nonzero; bins row 0: sum x**2; maxes[0]:
    # the largest finite |x|; the log2 histogram of the nonzero finite elements
    n = x.size
    m_in = maxes[0]
    c_nan = c_fin = c_nz = 0
    for lo in range(0, n, TILE):
        jlo, jhi = NBINS, -1
        for i in range(lo, min(n, lo + TILE)):
            xi = np.float64(x[i])
            ax = abs(xi)
            fin = ax < np.inf
            nz = fin & (xi != 0)
            c_nan += xi != xi
            c_fin += fin
            c_nz += nz
            m_in = max(m_in, ax if fin else 0.0)
            if nz:
                if hist_on:
                    hist[(bits32(np.float32(xi)) >> np.uint32(23)) & np.uint32(0xFF)] += 1
                m, j = square_term(xi)
                bins[0, j] += m
                jlo, jhi = min(jlo, j), max(jhi, j)
        carry(bins, jlo, jhi)
    counts[0] += c_nan
    counts[1] += c_fin
    counts[2] += c_nz
    maxes[0] = m_in


@jit
def tally_tile(x, q, at_max, sub, counts, bins, maxes):
    # what fpsim.analysis.metrics._tally counts of one tile (at most TILE elements) under one
    # format: x the input, q the stored values, at_max (code is +-max) and sub (code is
    # subnormal) the element flags. counts: overflow, underflow, subnormal, saturated; bins
    # rows: sum (q - x)**2, sum x**2 of the underflows (their error is -x: the same term);
    # maxes: |err|, |err| / |x|. Counts from selects in local variables (no branch on the
    # data but the error's); the quotient of every element (independent divisions pipeline)
    lo, hi = NBINS, -1
    m_err, m_rel = maxes[0], maxes[1]
    c_over = c_under = c_sub = c_sat = 0
    for i in range(x.size):
        xi = np.float64(x[i])
        qi = np.float64(q[i])
        ax = abs(xi)
        fin = ax < np.inf
        nz = fin & (xi != 0)
        qfin = abs(qi) < np.inf
        zq = qi == 0
        under = nz & zq
        c_over += fin & ~qfin
        c_under += under
        c_sub += nz & ~zq & sub[i]
        c_sat += fin & at_max[i] & (ax > abs(qi))
        err = qi - xi if fin & qfin else 0.0
        aerr = abs(err)
        m_err = max(m_err, aerr)
        rel = aerr / ax  # for every element: a quotient only where it may raise the maximum
        m_rel = max(m_rel, rel if nz else 0.0)  # chains the maximum through the division, 4x slower
        if err != 0:
            m, j = square_term(err)
            bins[0, j] += m
            bins[1, j] += m if under else 0
            lo, hi = min(lo, j), max(hi, j)
    counts[0] += c_over
    counts[1] += c_under
    counts[2] += c_sub
    counts[3] += c_sat
    maxes[0], maxes[1] = m_err, m_rel
    carry(bins, lo, hi)


@jit
def element_tally(x, p, mode, nbits, mix, offset, table, counts, bins, maxes):
    # one chunk (flat, float32 or float64, starting at flat index `offset` of its tensor) encoded
    # (stochastic words random_word(mix, offset + i)), decoded and tallied (tally_tile), tile by tile
    n, nowords = x.size, np.zeros(0, np.uint32)
    codes, q = np.empty(TILE, np.uint64), np.empty(TILE, np.float32)
    at_max, sub = np.empty(TILE, np.bool_), np.empty(TILE, np.bool_)
    for lo in range(0, n, TILE):
        k = min(n, lo + TILE) - lo
        codes_tile(x[lo : lo + k], p, mode, nbits, mix, offset + lo, nowords, codes[:k])
        values_tile(codes[:k], p, table, q[:k], at_max[:k], sub[:k])
        tally_tile(x[lo : lo + k], q[:k], at_max[:k], sub[:k], counts, bins, maxes)


@jit
def value_tally(x, q, at_max, sub, counts, bins, maxes):
    # tally_tile over a chunk whose stored values q (float32) and element flags (bool arrays)
    # a block recipe computed
    n = x.size
    for lo in range(0, n, TILE):
        hi = min(n, lo + TILE)
        tally_tile(x[lo:hi], q[lo:hi], at_max[lo:hi], sub[lo:hi], counts, bins, maxes)


@jit
def swamp_tally(theta, g, scale, p, table, mix, offset, counts, bins):
    # fpsim.analysis.metrics.swamping_partial of one chunk for nearest-even (mode 0) and
    # stochastic rounding (mode 1, words random_word(mix, offset + i)): t = theta stored
    # (nearest-even), d = float32(scale * g), the sum t + d (float64) rounded once.
    # counts[0]: updates, [1 + mode]: lost; bins row 0: sum |d| (both modes), row 1 + mode:
    # sum |realised|. Constants go to calls as int64 (a literal compiles another version)
    n, nowords, w32, ne = theta.size, np.zeros(0, np.uint32), np.int64(32), np.int64(NEAREST_EVEN)
    codes, q = np.empty(TILE, np.uint64), np.empty(TILE, np.float32)
    at_max, sub = np.empty(TILE, np.bool_), np.empty(TILE, np.bool_)
    t, s = np.empty(TILE, np.float64), np.empty(TILE, np.float64)
    new, d = np.empty((2, TILE), np.float32), np.empty(TILE, np.float32)
    for lo in range(0, n, TILE):
        k = min(n, lo + TILE) - lo
        codes_tile(theta[lo : lo + k], p, ne, w32, mix, offset + lo, nowords, codes[:k])
        values_tile(codes[:k], p, table, q[:k], at_max[:k], sub[:k])
        for i in range(k):
            t[i] = np.float64(q[i])
            d[i] = scale * g[lo + i]
            s[i] = t[i] + np.float64(d[i])
        for m in range(2):
            codes_tile(
                s[:k], p, NEAREST_EVEN if m == 0 else STOCHASTIC, w32, mix, offset + lo, nowords, codes[:k]
            )
            values_tile(codes[:k], p, table, new[m, :k], at_max[:k], sub[:k])
        jlo, jhi = NBINS, -1
        c_up = c_lost0 = c_lost1 = 0  # (local counters: no store-to-load chain per element)
        for i in range(k):
            di, ti = np.float64(d[i]), t[i]
            if not ((abs(di) < np.inf) & (di != 0) & (abs(ti) < np.inf)):
                continue
            a, j = abs_term(di)
            jlo, jhi = min(jlo, j), max(jhi, j)
            c_up += 1
            bins[0, j] += a
            n0, n1 = np.float64(new[0, i]), np.float64(new[1, i])
            c_lost0 += n0 == ti
            c_lost1 += n1 == ti
            if abs(n0) < np.inf and n0 != ti:
                b, jj = abs_term(n0 - ti)
                bins[1, jj] += b
                jlo, jhi = min(jlo, jj), max(jhi, jj)
            if abs(n1) < np.inf and n1 != ti:
                b, jj = abs_term(n1 - ti)
                bins[2, jj] += b
                jlo, jhi = min(jlo, jj), max(jhi, jj)
        counts[0] += c_up
        counts[1] += c_lost0
        counts[2] += c_lost1
        carry(bins, jlo, jhi)


@jit
def block_ids(bi, layout, state):
    # bi[i] = the block of each next element, cut as fpsim.emulate.blocks cuts: rows of cols
    # elements, matrices of rows rows, br x bc tiles ragged at the ends (as if padded),
    # numbered band by band; state (column, in tile, row, in band, block, matrix's first
    # block, band) carried from tile to tile, no division
    cols, bc, rows, br = layout[0], layout[1], layout[2], layout[3]
    per_row, bands = (cols + bc - 1) // bc, (rows + br - 1) // br
    c, cb, r, rb, b, m0, band = state[0], state[1], state[2], state[3], state[4], state[5], state[6]
    for i in range(bi.size):
        bi[i] = b
        c, cb = c + 1, cb + 1
        if c == cols:
            c, cb, r, rb = 0, 0, r + 1, rb + 1
            if r == rows:
                r, rb, band, m0 = 0, 0, 0, m0 + per_row * bands
            elif rb == br:
                rb, band = 0, band + 1
            b = m0 + band * per_row
        elif cb == bc:
            cb, b = 0, b + 1
    state[0], state[1], state[2], state[3], state[4], state[5], state[6] = c, cb, r, rb, b, m0, band


@jit
def block_amax(x, layout, ignore_nan, out):
    # blocks._encode_rows' amax of each block (numbered as block_ids does) of a chunk
    # (float32, flat) into out (zeros): max(|x|), NaN skipped (fmaxf) where ignore_nan,
    # else kept (torch.amax) as the canonical quiet NaN (fpsim.formats.amax)
    cols, bc, rows, br = layout[0], layout[1], layout[2], layout[3]
    per_row, bands, keep_nan = (cols + bc - 1) // bc, (rows + br - 1) // br, not ignore_nan
    for r in range(x.size // cols):  # row r of matrix r // rows
        first = ((r // rows) * bands + (r % rows) // br) * per_row
        for k in range(per_row):
            a = out[first + k]
            for i in range(r * cols + k * bc, min(r * cols + (k + 1) * bc, (r + 1) * cols)):
                v = abs(x[i])
                a = v if (v > a) | ((v != v) & keep_nan) else a
            out[first + k] = a if a == a else np.float32(np.nan)


@jit
def block_tally(x, xs, layout, f32, f64, dscale, tscale, p, mode, mix, offset, table, counts, bins, maxes):
    # a chunk under a block recipe (layout: block_ids' and kind, dkind) tallied against x (float32
    # or float64) as fpsim.emulate.blocks encodes and decodes xs (x as float32): inputs (apply_factor)
    # by kind (FactorKind): PRODUCT xs * f32[b], QUOTIENT xs / f32[b], POW2 float64 xs * f64[b] (NaN
    # where f64[b] is); elements in p (saturating), words random_word(mix, offset + i); values with
    # scales dscale[b] by dkind (DecodeKind): POW2 float64 product, TENSOR (v*s) * tscale, PRODUCT v*s
    kind, dkind, n, nowords = layout[4], layout[5], x.size, np.zeros(0, np.uint32)
    codes, q = np.empty(TILE, np.uint64), np.empty(TILE, np.float32)
    at_max, sub, v = np.empty(TILE, np.bool_), np.empty(TILE, np.bool_), np.empty(TILE, np.float64)
    bi, state = np.empty(TILE, np.int64), np.zeros(7, np.int64)
    for lo in range(0, n, TILE):
        k = min(n, lo + TILE) - lo
        block_ids(bi[:k], layout, state)
        for i in range(k):
            xi, j = xs[lo + i], bi[i]
            if kind == F_PRODUCT:
                v[i] = np.float64(xi * f32[j])
            elif kind == F_QUOTIENT:
                v[i] = np.float64(xi / f32[j])
            else:
                fj = f64[j]
                v[i] = np.nan if fj != fj else np.float64(xi) * fj
        codes_tile(v[:k], p, mode, np.int64(32), mix, offset + lo, nowords, codes[:k])
        values_tile(codes[:k], p, table, q[:k], at_max[:k], sub[:k])
        for i in range(k):
            s = dscale[bi[i]]
            if dkind == D_POW2:
                q[i] = np.float32(np.float64(q[i]) * np.float64(s))
            elif dkind == D_TENSOR:
                q[i] = (q[i] * s) * tscale
            else:
                q[i] = q[i] * s
        tally_tile(x[lo : lo + k], q[:k], at_max[:k], sub[:k], counts, bins, maxes)
