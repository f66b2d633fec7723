"""Compiled loops of the analysis and of the numpy-facing element verbs (numba).

One loop per job, each one read of its inputs: :func:`encode` (the element verb ``encode``),
:func:`element_tally` (a chunk of a tensor encoded, decoded and tallied under one element
format: every count, the error and signal sums, the maxima and the log2 histogram),
:func:`value_tally` (the same tallies for values a block recipe produced) and
:func:`swamp_tally` (the swamping of an update, both rounding modes of the analysis in one
pass). They give the bits of the numpy tier (:mod:`fpsim.emulate._bitcore` for the codes,
:mod:`fpsim.analysis.metrics` for the tallies): ``_encode_float`` and ``_encode_int`` are its
integer rules on the float64 bit pattern, element by element (a float32 input is widened
exactly first; the rules depend on the value only), and the float sums are exact.

Exact sums: a sum is kept as integer bins, bin ``k`` counting units of ``2**(k + KMIN)``. A
term is a float64 significand (53 bits) times a power of two: ``|v|`` itself, or the square
of ``v`` rounded to 53 bits without overflow or underflow (``frexp(v) = (f, e)``, the term
``(f * f) * 2**(2 e)``: the float64 product wherever that is finite and normal). Bins are
carried into 32-bit digits every :data:`TILE` elements, so none overflows. The Python side
(:func:`fpsim.analysis.partials.exact_from_bins`) adds the bins into one integer, so a sum
does not depend on order, tiling, threads or processes, and equals the numpy tier's
(:func:`fpsim.analysis.partials.exact_sum`).

Like :mod:`.loops`, every loop this module runs is defined in this file (numba checks a
cached function against its own file only), compiled without fast-math and cached on disk;
the loops are single-threaded and release the GIL (the callers run pieces on a thread pool).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .kinds import KMIN, NBINS
from .loops import jit

# rounding modes and encodings as the loops number them (fpsim.emulate.element maps the enums)
NEAREST_EVEN, NEAREST_AWAY, TOWARD_ZERO, TOWARD_POSITIVE, TOWARD_NEGATIVE, STOCHASTIC, ODD = range(7)
IEEE, FN, FNUZ, FINITE = range(4)

TILE = 1000
"""Elements between carries: 1000 terms of 53 bits on a 32-bit digit stay below 2**63."""

# element-format parameters, in the int64 array the loops take (fpsim.emulate.element.loop_params)
P_INT, P_M, P_E, P_EMIN, P_ZERO, P_SIGNED, P_NAN, P_ENC, P_MAX, P_INF, P_NANCODE = range(11)
P_FRAC, P_BITS, P_CLAMP, P_MAXINT, P_MININT, P_SAT, P_FTZ, P_WIDE, P_SUB = range(11, 20)
NPARAMS = 20

_U = np.uint64
_INF64 = _U(0x7FF0000000000000)
_MAG64 = _U(0x7FFFFFFFFFFFFFFF)
_MANT64 = _U((1 << 52) - 1)
_GOLD1 = _U(0xBF58476D1CE4E5B9)
_GOLD2 = _U(0x94D049BB133111EB)


@intrinsic
def bits64(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.uint64(types.float64), codegen


@intrinsic
def float64_of(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.uint64), codegen


@intrinsic
def float32_of(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@intrinsic
def bits32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@jit
def random_word(mix, index):
    # fpsim.emulate.random.random_bits_at: SplitMix64 of index + seed * G, low 32 bits
    z = _U(index) + mix
    z = (z ^ (z >> _U(30))) * _GOLD1
    z = (z ^ (z >> _U(27))) * _GOLD2
    return (z ^ (z >> _U(31))) & _U(0xFFFFFFFF)


@jit
def round_sig(sig, d, neg, mode, r, nbits):
    # fpsim.emulate._bitcore._round of one float64 significand: sig / 2**d to an integer
    dc = _U(min(d, np.int64(54)))
    kept = sig >> dc
    rem = sig & ((_U(1) << dc) - _U(1))
    if mode == TOWARD_ZERO:
        return kept
    inexact = rem != _U(0)
    if mode == ODD:
        return kept | _U(inexact)
    if mode == TOWARD_POSITIVE:
        up = inexact and not neg
    elif mode == TOWARD_NEGATIVE:
        up = inexact and neg
    elif mode == NEAREST_EVEN:
        half = (_U(1) << dc) >> _U(1)
        up = rem > half or (rem == half and inexact and (kept & _U(1)) != _U(0))
    elif mode == NEAREST_AWAY:
        half = (_U(1) << dc) >> _U(1)
        up = rem >= half and inexact
    else:  # stochastic: round away iff floor(frac * 2**n) + R >= 2**n
        full = (_U(1) << _U(nbits)) - _U(1)
        rr = r & full
        dn = d - nbits
        if dn >= 0:
            a, b, lim = rem >> _U(min(dn, np.int64(53))), rr, full
        else:
            width = min(d, nbits - 1)
            a, b, lim = rem, rr >> _U(min(-dn, np.int64(63))), (_U(1) << _U(width)) - _U(1)
        up = a > lim - b and inexact
    return kept + _U(up)


@jit
def encode_float(x, p, mode, r, nbits):
    # fpsim.emulate._bitcore.encode_float of one value (float64; p: the format's parameters)
    m_bits, emin = p[P_M], p[P_EMIN]
    b = bits64(x)
    neg = (b >> _U(63)) != _U(0)
    mag = b & _MAG64
    es = np.int64(mag >> _U(52))
    sig = mag & _MANT64 if es == 0 else (mag & _MANT64) | (_U(1) << _U(52))
    es1 = max(es, np.int64(1))
    lg = es1 - 1023
    et = max(lg, emin)
    kept = round_sig(sig, et - m_bits - (es1 - 1075), neg, mode, r, nbits)
    code = (_U(et - emin) << _U(m_bits)) + kept
    if p[P_ZERO] == 0:
        one = _U(1) << _U(m_bits)
        code = _U(0) if lg < emin else max(code, one) - one
    elif p[P_FTZ] != 0 and m_bits > 0 and code < (_U(1) << _U(m_bits)):
        code = _U(0)
    enc, sat = p[P_ENC], p[P_SAT] != 0
    is_inf, is_nan = mag == _INF64, mag > _INF64
    over = code > _U(p[P_MAX]) or is_inf
    if sat or enc == FINITE or mode == TOWARD_ZERO or mode == ODD:
        to_inf = is_inf and not sat and enc != FINITE
    elif mode == TOWARD_POSITIVE:
        to_inf = over and (not neg or is_inf)
    elif mode == TOWARD_NEGATIVE:
        to_inf = over and (neg or is_inf)
    else:
        to_inf = over
    if over:
        code = _U(p[P_MAX])
    nan = is_nan
    if enc == IEEE:
        if to_inf:
            code = _U(p[P_INF])
    elif p[P_NAN] != 0:
        nan = nan or to_inf
    if p[P_ZERO] == 0:
        nan = nan or mag == _U(0)
    sign_bit = _U(1) << _U(p[P_E] + m_bits)
    if p[P_SIGNED] != 0:
        if neg and (enc != FNUZ or code != _U(0)):
            code |= sign_bit
    else:
        nan = nan or (neg and mag != _U(0))
    if nan:
        code = _U(0)
        if p[P_NAN] != 0:
            code = _U(p[P_NANCODE])
            if (enc == IEEE or enc == FN) and p[P_SIGNED] != 0 and neg:
                code |= sign_bit
    return code


@jit
def encode_int(x, p, mode, r, nbits):
    # fpsim.emulate._bitcore.encode_int of one value (float64): x * 2**fraction_bits rounded
    b = bits64(x)
    neg = (b >> _U(63)) != _U(0)
    mag = b & _MAG64
    es = np.int64(mag >> _U(52))
    sig = mag & _MANT64 if es == 0 else (mag & _MANT64) | (_U(1) << _U(52))
    d = -(max(es, np.int64(1)) - 1075 + p[P_FRAC])
    kept = round_sig(sig, max(d, np.int64(0)), neg, mode, r, nbits)
    big = d < 0
    if big:
        kept = sig << _U(min(-d, p[P_BITS]))
    mask = (_U(1) << _U(p[P_BITS])) - _U(1)
    if p[P_CLAMP] != 0:
        if neg:
            lo = _U(-p[P_MININT])
            v = lo if big or kept > lo else kept
            code = (_U(0) - v) & mask
        else:
            code = _U(p[P_MAXINT]) if big or kept > _U(p[P_MAXINT]) else kept
        if mag > _INF64:
            code = _U(0)
    else:
        code = ((_U(0) - kept) if neg else kept) & mask
        if mag >= _INF64:
            code = _U(0)
    return code


@jit
def encode_one(x, p, mode, r, nbits):
    # the code of one value under the element format p
    if p[P_INT] != 0:
        return encode_int(x, p, mode, r, nbits)
    return encode_float(x, p, mode, r, nbits)


@jit
def encode(x, p, mode, rand, nbits, out):
    # fpsim.emulate.element.encode_array on numpy: out[i] = the code of x[i]; rand holds the
    # stochastic words (x's size) or is empty; rand is read only in the stochastic mode
    stochastic = mode == STOCHASTIC
    for i in range(x.size):
        r = _U(rand[i]) if stochastic else _U(0)
        out[i] = encode_one(np.float64(x[i]), p, mode, r, nbits)


@jit
def value_of(code, p, table):
    # the float32 value of a code: table lookup, float32 codes reinterpreted
    if p[P_WIDE] != 0:
        return float32_of(np.uint32(code))
    return table[code]


@jit
def add_term(bins, row, m, k, lohi):
    # bins[row] += m * 2**k (m < 2**53), the touched range kept in lohi
    j = k - KMIN
    bins[row, j] += m
    lohi[0] = min(lohi[0], j)
    lohi[1] = max(lohi[1], j)


@jit
def add_abs(bins, row, v, lohi):
    # |v| (finite float64) as a term
    b = bits64(v) & _MAG64
    if b == _U(0):
        return
    e = np.int64(b >> _U(52))
    m = np.int64(b & _MANT64)
    if e == 0:
        add_term(bins, row, m, -1074, lohi)
    else:
        add_term(bins, row, m | (np.int64(1) << 52), e - 1075, lohi)


@jit
def add_square(bins, row, v, lohi):
    # v**2 rounded to 53 bits, exponent unbounded (module doc), as a term
    b = bits64(v) & _MAG64
    if b == _U(0):
        return
    e = np.int64(b >> _U(52))
    if e == 0:  # subnormal: scale by 2**64 (exact)
        b = bits64(float64_of(b) * 18446744073709551616.0)
        e = np.int64(b >> _U(52)) - 64
    f = float64_of((b & _MANT64) | _U(1022 << 52))  # frexp: v = f * 2**(e - 1022), f in [0.5, 1)
    pb = bits64(f * f)
    ep = np.int64(pb >> _U(52))
    add_term(bins, row, np.int64(pb & _MANT64) | (np.int64(1) << 52), ep - 1075 + 2 * (e - 1022), lohi)


@jit
def carry(bins, lohi):
    # every row's touched bins to 32-bit digits (the carries move 32 bins up)
    for row in range(bins.shape[0]):
        i, top = lohi[0], lohi[1]
        while i <= top:
            c = bins[row, i] >> 32
            if c != 0:
                bins[row, i] &= np.int64(0xFFFFFFFF)
                bins[row, i + 32] += c
                top = max(top, i + 32)
            i += 1
    lohi[0] = NBINS
    lohi[1] = -1


@jit
def tally_one(xi, q, at_max, sub, hist_on, counts, bins, maxes, hist, lohi):
    # fpsim.analysis.metrics._tally of one element: xi the input (float64), q its stored
    # value (float64), at_max (code is +-max) and sub (code is subnormal) its element flags.
    # counts: nan, finite, nonzero, overflow, underflow, subnormal, saturated;
    # bins rows: sum (q - x)**2, sum x**2, sum x**2 of the underflows; maxes: |err|, rel, |x|
    if xi != xi:
        counts[0] += 1
        return
    ax = abs(xi)
    if ax == np.inf:
        return
    counts[1] += 1
    nz = xi != 0
    qfin = abs(q) < np.inf
    if nz:
        counts[2] += 1
        if hist_on:
            hist[(bits32(np.float32(xi)) >> np.uint32(23)) & np.uint32(0xFF)] += 1
    if not qfin:
        counts[3] += 1
    if nz and q == 0:
        counts[4] += 1
        add_square(bins, 2, xi, lohi)
    if nz and q != 0 and sub:
        counts[5] += 1
    if at_max and ax > abs(q):
        counts[6] += 1
    add_square(bins, 1, xi, lohi)
    maxes[2] = max(maxes[2], ax)
    if qfin:
        err = q - xi
        add_square(bins, 0, err, lohi)
        aerr = abs(err)
        maxes[0] = max(maxes[0], aerr)
        if nz:
            maxes[1] = max(maxes[1], aerr / ax)


@jit
def element_flags(code, p):
    # fpsim.analysis.metrics.element_flags of one code: (+-max, subnormal)
    if p[P_INT] != 0:
        k = np.int64(code)
        if p[P_SIGNED] != 0 and k >= (np.int64(1) << (p[P_BITS] - 1)):
            k -= np.int64(1) << p[P_BITS]
        return k == p[P_MAXINT] or k == p[P_MININT], False
    mag = code & ((_U(1) << _U(p[P_E] + p[P_M])) - _U(1))
    return mag == _U(p[P_MAX]), p[P_SUB] != 0 and (mag >> _U(p[P_M])) == _U(0)


@jit
def element_tally(x, p, mode, nbits, mix, offset, table, hist_on, counts, bins, maxes, hist):
    # one chunk (flat, float32 or float64, starting at flat index `offset` of its tensor)
    # encoded (stochastic words random_word(mix, offset + i)), decoded and tallied
    # (tally_one); bins carried every TILE elements
    lohi = np.array([NBINS, -1], np.int64)
    stochastic = mode == STOCHASTIC
    n = x.size
    for lo in range(0, n, TILE):
        for i in range(lo, min(n, lo + TILE)):
            xi = np.float64(x[i])
            r = random_word(mix, offset + i) if stochastic else _U(0)
            code = encode_one(xi, p, mode, r, nbits)
            at_max, sub = element_flags(code, p)
            q = np.float64(value_of(code, p, table))
            tally_one(xi, q, at_max, sub, hist_on, counts, bins, maxes, hist, lohi)
        carry(bins, lohi)


@jit
def value_tally(x, q, at_max, sub, hist_on, counts, bins, maxes, hist):
    # tally_one over a chunk whose stored values q (float32) and element flags (uint8 arrays;
    # sub may be empty: no subnormals) a block recipe computed
    lohi = np.array([NBINS, -1], np.int64)
    has_sub = sub.size > 0
    n = x.size
    for lo in range(0, n, TILE):
        for i in range(lo, min(n, lo + TILE)):
            s = sub[i] != 0 if has_sub else False
            tally_one(
                np.float64(x[i]),
                np.float64(q[i]),
                at_max[i] != 0,
                s,
                hist_on,
                counts,
                bins,
                maxes,
                hist,
                lohi,
            )
        carry(bins, lohi)


@jit
def swamp_tally(theta, g, scale, p, table, mix, offset, counts, bins):
    # fpsim.analysis.metrics.swamping_partial of one chunk for nearest-even (row 0) and
    # stochastic rounding (row 1, words random_word(mix, offset + i)): t = theta stored
    # (nearest-even), d = float32(scale * g), the sum t + d (float64) rounded once.
    # counts[mode]: updates, lost; bins rows 2 mode + 0: sum |d|, 2 mode + 1: sum |realised|
    lohi = np.array([NBINS, -1], np.int64)
    n = theta.size
    for lo in range(0, n, TILE):
        for i in range(lo, min(n, lo + TILE)):
            t = np.float64(value_of(encode_one(np.float64(theta[i]), p, NEAREST_EVEN, _U(0), 32), p, table))
            d = np.float32(scale * g[i])
            if not (abs(d) < np.inf and d != 0 and abs(t) < np.inf):
                continue
            s = t + np.float64(d)
            for m in range(2):
                mode = NEAREST_EVEN if m == 0 else STOCHASTIC
                r = random_word(mix, offset + i) if m == 1 else _U(0)
                new = np.float64(value_of(encode_one(s, p, mode, r, 32), p, table))
                counts[2 * m] += 1
                if new == t:
                    counts[2 * m + 1] += 1
                add_abs(bins, 2 * m, np.float64(d), lohi)
                if abs(new) < np.inf:
                    add_abs(bins, 2 * m + 1, new - t, lohi)
        carry(bins, lohi)
