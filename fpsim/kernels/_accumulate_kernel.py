"""Portable Triton kernel of the emulated matmul / dot with limited-precision accumulation.

A port of :func:`fpsim.accumulate.matmul` / :func:`fpsim.accumulate.dot` for
``order="sequential"`` (see :mod:`fpsim.kernels.accumulate` for the operation order). Each
program owns a ``BM x BN`` tile of outputs and walks K left to right, exactly as the
emulator's ``_reduce_tile``: chunks of ``promote_every`` addends, the chunk's first addend
rounded, every later one added with one rounding, optional Kahan / Neumaier compensation,
then the chunk's value promoted into the second accumulator.

Arithmetic (the same exact-rounding argument as the :mod:`fpsim.accumulate` docstring's
"Exactness of one rounded addition"):

* Products ``a * b`` of two float32 values are formed in float64, where they are exact
  (48 significant bits, exponents far inside float64's range), as the emulator does. The
  float32 -> float64 widening is exact on the interpreter (numpy) and on a GPU.
* One rounded addition ``R(u + v)`` is the emulator's ``_Rounder.add``: Knuth's TwoSum in
  float64 gives ``s + err == u + v`` exactly, ``s`` is replaced by the round-to-odd value
  at 53 bits (a decrement and an OR on its bit pattern), and that is rounded to the
  accumulator's precision with integer operations on the float64 bit pattern (the same
  masks and carries as ``_Rounder._round``). Rounding to odd first makes this one
  rounding of the exact sum, not a double rounding (Boldo and Melquiond 2008).
* Values outside the format's normal range (zero, subnormal results, overflow, inf, NaN)
  take the integer port of :func:`fpsim.emulate._bitcore.encode_float` for a float64 source
  (what the emulator's slow path calls through :func:`fpsim.emulate.element.encode`), and the
  code is turned back into a float64 value with integer operations.
* Results are converted to float32 bit patterns with integer operations (every value of
  a :class:`~fpsim.Format` is a float32 number).

The only floating-point instructions are the float64 multiply of the product, the six
add/subtracts of TwoSum, the product ``err * s`` whose sign says on which side of ``s``
the exact sum lies (as in the emulator), comparisons, and exact int -> float64
conversions. Compiled launches pass ``enable_fp_fusion=False``, so the product is never
fused into the following addition.

Every variable shift amount is clamped into [0, 63] (a shift by 64 or more is undefined in
LLVM; both sides of a ``tl.where`` are evaluated).

Executed once per mode by :func:`fpsim.kernels._loader.kernel_module`; import it there.
"""

import os

import triton
import triton.language as tl

from fpsim.formats import Encoding, RoundMode
from fpsim.formats.params import FormatParams

from ._codes import Comp, Words
from .accumulate import FORMAT_PARAMS

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # set by _loader.kernel_module

# Helpers are @triton.jit functions for the compiler (which inlines them). For the
# interpreter they stay plain Python functions called from the interpreted kernel: the
# interpreter re-patches triton.language on every call of one jit function from another
# (about 0.4 ms, the bulk of a K step), while a plain function runs the same tl operations
# under the kernel's own patches. Measured with Triton 3.9 on the matmuls of
# test_accumulate_kernel.py (a K = 1023 sum, a 64 x 64 x 32 Kahan product, an 8 x 8 x 64
# stochastic one): @triton.jit helpers make the interpreted kernel about 1.5 times slower.
# The helpers use public triton.language only, so both forms compile the same operations.
_jit = (lambda fn: fn) if _INTERPRET else triton.jit

# The constexpr codes, as tl.constexpr globals for the compiler (which refuses other globals):
# rounding modes MODE, PMODE, QMODE (fpsim.formats.RoundMode.code); compensation COMP and the
# random-word source RAND (fpsim.kernels._codes.Comp and Words; product words are SplitMix64).
_NEAREST_EVEN = tl.constexpr(RoundMode.NEAREST_EVEN.code)
_NEAREST_AWAY = tl.constexpr(RoundMode.NEAREST_AWAY.code)
_TOWARD_ZERO = tl.constexpr(RoundMode.TOWARD_ZERO.code)
_TOWARD_POSITIVE = tl.constexpr(RoundMode.TOWARD_POSITIVE.code)
_TOWARD_NEGATIVE = tl.constexpr(RoundMode.TOWARD_NEGATIVE.code)
_STOCHASTIC = tl.constexpr(RoundMode.STOCHASTIC.code)
_ODD = tl.constexpr(RoundMode.ODD.code)
_COMP_NONE = tl.constexpr(int(Comp.NONE))
_KAHAN = tl.constexpr(int(Comp.KAHAN))
_NEUMAIER = tl.constexpr(int(Comp.NEUMAIER))
_WORDS_LOADED = tl.constexpr(int(Words.LOADED))
_WORDS_SPLITMIX64 = tl.constexpr(int(Words.SPLITMIX64))

# Layout of the int64 parameter tensor (fpsim.kernels.accumulate._params): three formats
# (accumulator, product, promotion) of _NF entries each, then the two SplitMix64 stream
# offsets (accumulator, products).
_NF = tl.constexpr(FORMAT_PARAMS)
# Where _format reads a format's numbers: the positions of fpsim.formats.params.FormatParams's
# fields in its row of the tensor.
_FIELDS = FormatParams._fields
_P_M, _P_EMIN, _P_LO, _P_MAX, _P_CMAX, _P_ENC, _P_FTZ = (
    tl.constexpr(_FIELDS.index(f))
    for f in ("m", "emin", "f64_min_normal", "f64_max", "code_max", "enc", "ftz")
)
_IEEE = tl.constexpr(Encoding.IEEE.code)
_FINITE = tl.constexpr(Encoding.FINITE.code)
_FNUZ = tl.constexpr(Encoding.FNUZ.code)
# Positions in the tuple _format returns.
_M, _EMIN, _LO, _SPAN, _CMAX, _HAS_INF, _NO_NAN, _NO_NEG0, _FTZ, _D, _KEEP, _HALF, _ZERO_SLOW = (
    tl.constexpr(i) for i in range(13)
)
_ABS = tl.constexpr(0x7FFFFFFFFFFFFFFF)
_INF64 = tl.constexpr(0x7FF0000000000000)
_NAN64 = tl.constexpr(0x7FF8000000000000)
_SIGN64 = tl.constexpr(0x8000000000000000)
_MANT64 = tl.constexpr(0x000FFFFFFFFFFFFF)


@_jit
def _any(flags):
    """Whether any element of the boolean tile ``flags`` is set (a scalar).

    The count of set elements is bin 1 of a two-bin ``tl.histogram`` of the flags as int32
    (public Triton API, exact integer counts in both modes; compiled for sm_90 it is a few
    shared-memory atomics and two barriers, like a block reduction). A ``tl.reduce`` with a
    combine function of this file would compile as well, but Triton 3.9's interpreter runs
    such a reduction as a Python loop over the elements (about 0.3 s for a 64 x 64 tile,
    against about 0.15 ms for this histogram). Triton's own ``tl.max`` / ``tl.sum`` cannot
    be called here: they are decorated when triton is imported, for the mode
    ``TRITON_INTERPRET`` selected then (``_loader.py``), so one of this file's two copies
    would call a function of the other mode (the compiled copy fails with "'value' object
    has no attribute 'data'" where triton was imported for the interpreter). The flags are
    the integers 0 and 1, so no NaN convention is involved.
    """
    counts = tl.histogram(tl.reshape(flags, (flags.numel,)).to(tl.int32), 2)
    _, n_set = tl.split(counts)
    return n_set != 0


@_jit
def _format(par_ptr, which):
    """The numbers of format ``which`` (0 accumulator, 1 product, 2 promotion), a tuple read
    from its :class:`~fpsim.formats.params.FormatParams` row: ``_M`` mantissa bits, ``_EMIN``,
    ``_LO`` the float64 bits of the smallest normal, ``_SPAN`` ``bits(max) - _LO``
    (magnitudes outside ``[min normal, max]`` wrap past it), ``_CMAX`` the code of the
    largest finite value, ``_HAS_INF`` / ``_NO_NAN`` / ``_NO_NEG0`` the encoding is IEEE /
    FINITE / FNUZ (0 or 1), ``_FTZ`` subnormal results flush to zero; then ``_D``
    ``d = 52 - m`` (uint64), ``_KEEP`` the mask keeping the top ``m`` float64 fraction bits,
    ``_HALF`` half a quantum ``2**(d - 1)``, ``_ZERO_SLOW`` 1 when zeros take the slow path
    (FNUZ: -0 becomes +0).
    """
    p = par_ptr + which * _NF
    m = tl.load(p + _P_M)
    enc = tl.load(p + _P_ENC)
    fnuz = (enc == _FNUZ).to(tl.int64)
    lo = tl.load(p + _P_LO).to(tl.uint64, bitcast=True)
    d = (52 - m).to(tl.uint64)
    one = (m * 0 + 1).to(tl.uint64)
    return (
        m,
        tl.load(p + _P_EMIN),
        lo,
        tl.load(p + _P_MAX).to(tl.uint64, bitcast=True) - lo,
        tl.load(p + _P_CMAX).to(tl.uint64, bitcast=True),
        (enc == _IEEE).to(tl.int64),
        (enc == _FINITE).to(tl.int64),
        fnuz,
        tl.load(p + _P_FTZ),
        d,
        ~((one << d) - 1),
        one << (d - 1),
        fnuz.to(tl.uint64),
    )


@_jit
def _word(r_ptr, j, n_out, o, mask, off, RAND: tl.constexpr):
    """Random word (uint64 < 2**32) of rounding ``j`` (int64) of outputs ``o`` (int64):
    loaded (``Words.LOADED``) or SplitMix64 of ``j * n_out + o`` in the stream with offset
    ``off`` (``Words.SPLITMIX64``, :func:`fpsim.emulate.random.random_bits_at`)."""
    idx = j * n_out + o
    if RAND == _WORDS_LOADED:
        w = tl.load(r_ptr + idx, mask=mask, other=0).to(tl.uint32, bitcast=True).to(tl.uint64)
    elif RAND == _WORDS_SPLITMIX64:
        z = idx.to(tl.uint64, bitcast=True) + off
        z = tl.mul(z ^ (z >> 30), 0xBF58476D1CE4E5B9, sanitize_overflow=False)
        z = tl.mul(z ^ (z >> 27), 0x94D049BB133111EB, sanitize_overflow=False)
        w = (z ^ (z >> 31)) & 0xFFFFFFFF
    else:
        w = (o * 0).to(tl.uint64, bitcast=True)
    return w


@_jit
def _round_sig(sig, d, neg, r, nbits, MODE: tl.constexpr):
    """fpsim.emulate._bitcore._round for a float64 source: ``sig / 2**d`` (sig < 2**53, int64
    d >= 0) rounded to an integer (uint64) as MODE says."""
    one = (d * 0 + 1).to(tl.uint64)
    dc = tl.minimum(d, 54).to(tl.uint64)  # beyond 54 every bit of sig is discarded
    kept = sig >> dc
    rem = sig & ((one << dc) - 1)
    if MODE == _TOWARD_ZERO:
        res = kept
    else:
        inexact = rem != 0
        if MODE == _ODD:
            res = kept | inexact.to(tl.uint64)
        else:
            if MODE == _TOWARD_POSITIVE:
                up = inexact & ~neg
            elif MODE == _TOWARD_NEGATIVE:
                up = inexact & neg
            elif MODE == _NEAREST_EVEN:
                half = (one << dc) >> 1
                up = (rem > half) | ((rem == half) & inexact & ((kept & 1) != 0))
            elif MODE == _NEAREST_AWAY:
                half = (one << dc) >> 1
                up = (rem >= half) & inexact
            else:  # stochastic: away iff floor(frac * 2**n) + R >= 2**n
                nb = nbits.to(tl.uint64)
                rn = r & ((one << nb) - 1)
                dn = d - nbits
                big = dn >= 0  # the discarded field has at least n bits: keep its top n
                top = rem >> tl.minimum(tl.maximum(dn, 0), 53).to(tl.uint64)
                low = rn >> tl.minimum(tl.maximum(-dn, 0), 63).to(tl.uint64)
                a = tl.where(big, top, rem)
                bb = tl.where(big, rn, low)
                width = tl.minimum(tl.maximum(tl.minimum(d, nbits - 1), 0), 63).to(tl.uint64)
                lim = tl.where(big, (one << nb) - 1, (one << width) - 1)  # d < n: 2**d fits
                up = (a > lim - bb) & inexact
            res = kept + up.to(tl.uint64)
    return res


@_jit
def _encode_value(b, r, nbits, m, emin, code_max, ieee, finite, fnuz, ftz, MODE: tl.constexpr):
    """float64 bits (uint64) of the float64 value with bits ``b`` rounded into the format:
    the codes of fpsim.emulate._bitcore.encode_float (float64 source, saturate off), decoded.

    Used where ``b`` lies outside the format's normal range: zero, subnormal results,
    overflow (IEEE 754-2019 section 7.4; FN / FNUZ formats give NaN, FINITE ones clamp),
    inf and NaN (formats without NaN give +0).
    """
    neg = (b >> 63) != 0
    mag = b & _ABS
    es = (mag >> 52).to(tl.int64)
    mant = mag & _MANT64
    sig = tl.where(es == 0, mant, mant | ((es * 0 + 1).to(tl.uint64) << 52))
    es1 = tl.maximum(es, 1)
    lg = es1 - 1023  # the formats' emin lies above float64's: only max(lg, emin) is used
    et = tl.maximum(lg, emin)
    d = et - m - (es1 - 1075)
    kept = _round_sig(sig, d, neg, r, nbits, MODE)
    mu = m.to(tl.uint64)
    one_m = (m * 0 + 1).to(tl.uint64) << mu
    code = ((et - emin).to(tl.uint64) << mu) + kept
    code = tl.where((ftz != 0) & (code < one_m), 0, code)
    is_inf = mag == _INF64
    is_nan = mag > _INF64
    over = (code > code_max) | is_inf
    if MODE == _TOWARD_ZERO or MODE == _ODD:
        to_inf = is_inf
    elif MODE == _TOWARD_POSITIVE:
        to_inf = over & (~neg | is_inf)
    elif MODE == _TOWARD_NEGATIVE:
        to_inf = over & (neg | is_inf)
    else:
        to_inf = over
    to_inf = to_inf & (finite == 0)
    code = tl.where(over, code_max, code)
    nan = is_nan | (to_inf & (ieee == 0))
    inf = to_inf & (ieee != 0)
    # decode the magnitude code: a normal field f >= 1 rebiased into float64; a subnormal
    # significand (< 2**24) converted exactly and moved down by its exponent in the bits
    f = (code >> mu).to(tl.int64)
    frac = code & (one_m - 1)
    normal = ((f - 1 + emin + 1023) << 52).to(tl.uint64, bitcast=True) | (frac << (52 - mu))
    sub = frac.to(tl.float64).to(tl.int64, bitcast=True) + ((emin - m) << 52)
    sub = tl.where(frac == 0, 0, sub.to(tl.uint64, bitcast=True))
    v = tl.where(f >= 1, normal, sub)
    sign = tl.where(fnuz != 0, neg & (code != 0), neg)
    v = v | (sign.to(tl.uint64) << 63)
    v = tl.where(inf, _INF64 | (neg.to(tl.uint64) << 63), v)
    v = tl.where(nan, tl.where(finite != 0, 0, _NAN64), v)
    return v


@_jit
def _rsum(u, v, r, nbits, F, MODE: tl.constexpr, EXACT: tl.constexpr):
    """``R(u + v)``, the exact sum rounded once into format ``F`` (see :func:`_format`):
    fpsim.accumulate._accumulator._Rounder.add; with EXACT, ``R(v)`` (``_Rounder.exact``; u unused).

    TwoSum in the emulator's order gives ``s + err == u + v`` exactly; ``s`` becomes the
    round-to-odd value at 53 bits of that sum (a decrement when the exact value lies below
    ``|s|``, then the odd bit). In the normal range the quantum is ``d = 52 - m`` bits of
    the float64 pattern and a carry moves into the exponent (``_Rounder._round``);
    everything else goes through :func:`_encode_value`. Under toward-negative an exact-zero
    sum of operands that are not both +0 is -0 (IEEE 754-2019 section 6.3); a nonzero sum
    that rounds to zero keeps its sign (the float64 ``s`` is zero only for an exact zero).
    """
    if EXACT:
        b = v.to(tl.uint64, bitcast=True)
    else:
        s = u + v
        bb = s - u
        err = s - bb
        err = u - err
        bb = v - bb
        err = err + bb
        below = (err * s) < 0  # the exact value lies below |s|
        nz = (err > 0) | (err < 0)  # a NaN (from inf operands) is not a remainder
        b = (s.to(tl.uint64, bitcast=True) - below.to(tl.uint64)) | nz.to(tl.uint64)
    mag = b & _ABS
    # outside [min normal, max] (uint64 wrap-around); zeros keep their bits but for FNUZ
    slow = ((mag - F[_LO]) > F[_SPAN]) & ((mag | F[_ZERO_SLOW]) != 0)
    d = F[_D]
    keep = F[_KEEP]
    if MODE == _NEAREST_EVEN:
        fast = (b + ((b >> d) & 1) + (F[_HALF] - 1)) & keep
    elif MODE == _NEAREST_AWAY:
        fast = (b + F[_HALF]) & keep
    elif MODE == _TOWARD_ZERO:
        fast = b & keep
    else:
        rem = b & ~keep
        fast = b & keep
        if MODE == _ODD:
            fast = fast | ((rem != 0).to(tl.uint64) << d)
        elif MODE == _STOCHASTIC:  # up iff floor(f * 2**n) + R >= 2**n
            sh = 52 - F[_M] - nbits
            top = tl.where(
                sh >= 0,
                rem >> tl.minimum(tl.maximum(sh, 0), 63).to(tl.uint64),
                rem << tl.minimum(tl.maximum(-sh, 0), 63).to(tl.uint64),
            )
            nb = nbits.to(tl.uint64)
            top = top + (r & (((F[_HALF] * 0 + 1) << nb) - 1))
            fast = fast + ((top >> nb) << d)
        else:
            neg = b > _ABS
            if MODE == _TOWARD_NEGATIVE:
                up = (rem != 0) & neg
            else:
                up = (rem != 0) & ~neg
            fast = fast + (up.to(tl.uint64) << d)
    if _any(slow):  # only where needed
        val = _encode_value(
            b, r, nbits, F[_M], F[_EMIN], F[_CMAX], F[_HAS_INF], F[_NO_NAN], F[_NO_NEG0], F[_FTZ], MODE
        )
        fast = tl.where(slow, val, fast)
    res = fast.to(tl.float64, bitcast=True)
    if MODE == _TOWARD_NEGATIVE and not EXACT:
        both_pos = (u.to(tl.uint64, bitcast=True) == 0) & (v.to(tl.uint64, bitcast=True) == 0)
        res = tl.where((s == 0) & ~both_pos, -0.0, res)
    return res


@_jit
def _to_f32_bits(x):
    """float32 bits (int32) of a float64 value that is a float32 number, inf or NaN."""
    b = x.to(tl.uint64, bitcast=True)
    sign = ((b >> 63) << 31).to(tl.uint32)
    mag = b & _ABS
    e = (mag >> 52).to(tl.int64)
    sig = (mag & _MANT64) | ((e * 0 + 1).to(tl.uint64) << 52)
    normal = (((e - 896) << 23).to(tl.uint64, bitcast=True) | ((mag >> 29) & 0x7FFFFF)).to(tl.uint32)
    shift = tl.minimum(tl.maximum(926 - e, 29), 63).to(tl.uint64)
    sub = (sig >> shift).to(tl.uint32)  # in quanta of 2**-149: exact for float32 subnormals
    out = tl.where(e >= 897, normal, tl.where(mag == 0, 0, sub))
    out = tl.where(e == 2047, tl.where((mag & _MANT64) == 0, 0x7F800000, 0x7FC00000), out)
    return (out | sign).to(tl.int32, bitcast=True)


@_jit
def _compensated_add(
    acc,
    comp,
    t,
    r_ptr,
    j,
    n_out,
    o,
    mask,
    off,
    nbits,
    AF,
    MODE: tl.constexpr,
    COMP: tl.constexpr,
    RAND: tl.constexpr,
):
    """One compensated step ``(s, c) <- (s, c) + t`` with the four roundings ``j .. j + 3``:
    Kahan ``y = R(t - c); u = R(s + y); c = R(R(u - s) - y); s = u``, or Neumaier
    ``u = R(s + t); c = R(c + R(R(big - u) + small)); s = u`` (the emulator's ``_push``)."""
    r0 = (o * 0).to(tl.uint64, bitcast=True)
    r1 = r0
    r2 = r0
    r3 = r0
    if MODE == _STOCHASTIC:
        r0 = _word(r_ptr, j, n_out, o, mask, off, RAND)
        r1 = _word(r_ptr, j + 1, n_out, o, mask, off, RAND)
        r2 = _word(r_ptr, j + 2, n_out, o, mask, off, RAND)
        r3 = _word(r_ptr, j + 3, n_out, o, mask, off, RAND)
    if COMP == _KAHAN:
        y = _rsum(t, -comp, r0, nbits, AF, MODE, False)
        u = _rsum(acc, y, r1, nbits, AF, MODE, False)
        z = _rsum(u, -acc, r2, nbits, AF, MODE, False)
        comp = _rsum(z, -y, r3, nbits, AF, MODE, False)
    else:
        u = _rsum(acc, t, r0, nbits, AF, MODE, False)
        first = tl.abs(acc) >= tl.abs(t)
        z = _rsum(tl.where(first, acc, t), -u, r1, nbits, AF, MODE, False)
        z = _rsum(z, tl.where(first, t, acc), r2, nbits, AF, MODE, False)
        comp = _rsum(comp, z, r3, nbits, AF, MODE, False)
    return u, comp


@_jit
def _close_chunk(
    acc,
    comp,
    total,
    first_chunk,
    m_c,
    j0,
    r_ptr,
    n_out,
    o,
    mask,
    off,
    nbits,
    AF,
    PF,
    MODE: tl.constexpr,
    PMODE: tl.constexpr,
    PROMOTE: tl.constexpr,
    COMP: tl.constexpr,
    RAND: tl.constexpr,
):
    """The end of a chunk of ``m_c`` addends whose roundings start at ``j0``: Neumaier's
    value ``R(s + c)``, then the promotion ``P = R'(c_0)`` (first chunk) or ``P = R'(P + c_j)``.
    Returns the chunk's value and the promoted total."""
    w0 = (o * 0).to(tl.uint64, bitcast=True)
    if COMP == _COMP_NONE:
        j_end = j0 + m_c
    else:
        j_end = j0 + 1 + 4 * (m_c - 1)
    if COMP == _NEUMAIER:
        w = w0
        if MODE == _STOCHASTIC:
            w = _word(r_ptr, j_end, n_out, o, mask, off, RAND)
        acc = _rsum(acc, comp, w, nbits, AF, MODE, False)
        j_end = j_end + 1
    if PROMOTE:
        w = w0
        if PMODE == _STOCHASTIC:
            w = _word(r_ptr, j_end, n_out, o, mask, off, RAND)
        if first_chunk:
            total = _rsum(acc, acc, w, nbits, PF, PMODE, True)
        else:
            total = _rsum(total, acc, w, nbits, PF, PMODE, False)
    return acc, total


_RUNTIME = ["M", "N", "K", "chunk", "nbits"]  # never value-specialised: one compile per constexpr set


@triton.jit(do_not_specialize=_RUNTIME)
def matmul_kernel(
    a_ptr,  # float32 a, contiguous (batch, M, K); DOT: (M, K)
    b_ptr,  # float32 b, contiguous (batch, K, N); DOT: (M, K), read like a
    out_ptr,  # the results' float32 bits as int32, (batch, M, N)
    r_ptr,  # RAND LOADED: uint32 words as int32, (roundings, batch, M, N) (else any pointer, unread)
    par_ptr,  # int64: three formats' numbers, then two SplitMix64 offsets (accumulate._params)
    M,  # rows of a and of the output (DOT: outputs)
    N,  # columns of b and of the output (DOT: 1)
    K,  # addends per output
    chunk,  # addends per chunk: promote_every, or K without promotion
    nbits,  # stochastic rounding: random bits per rounding
    MODE: tl.constexpr,  # accumulator rounding, a RoundMode.code
    PMODE: tl.constexpr,  # promotion rounding (PROMOTE), a RoundMode.code
    QMODE: tl.constexpr,  # product rounding (PROD), a RoundMode.code; stochastic draws SplitMix64 words
    PROMOTE: tl.constexpr,  # each chunk's value enters a second (promote_to) accumulator
    PROD: tl.constexpr,  # each product is rounded to product_format
    COMP: tl.constexpr,  # compensation, a _codes.Comp
    RAND: tl.constexpr,  # the accumulator's and promotion's random words, a _codes.Words
    DOT: tl.constexpr,  # fpsim.dot: output i reduces row i of a with row i of b
    BM: tl.constexpr,  # output rows per program, a power of two
    BN: tl.constexpr,  # output columns per program, a power of two (DOT: 1)
):
    """One ``BM x BN`` output tile of one batch matrix (``program_id(0)`` numbers batch x row
    tiles, ``program_id(1)`` column tiles): float32 bits (int32) of the reduction over K in
    the emulator's sequential order (module doc).

    ``a[bi, i, k]`` is read at ``(bi*M + i)*K + k``, ``b[bi, k, j]`` at ``(bi*K + k)*N + j``
    (DOT: ``b[i, k]`` at ``i*K + k``). Output ``(bi, i, j)`` has the flat index
    ``o = (bi*M + i)*N + j`` among ``n_out = batch*M*N`` outputs (batch from the grid), which
    numbers its random words: rounding ``j`` of the accumulator or the promotion uses word
    ``j * n_out + o``, the product of step ``k`` word ``k * n_out + o`` of the product stream.
    """
    n_mt = (M + BM - 1) // BM  # row tiles per matrix; program_id(0) = bi * n_mt + row tile
    pid_m = tl.program_id(0) % n_mt
    pid_n = tl.program_id(1)
    bi = (tl.program_id(0) // n_mt).to(tl.int64)
    k64 = K.to(tl.int64)
    rows = pid_m.to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
    cols = pid_n.to(tl.int64) * BN + tl.arange(0, BN).to(tl.int64)
    mask_m = rows < M
    mask2 = mask_m[:, None] & (cols < N)[None, :]
    o = (bi * M + rows[:, None]) * N + cols[None, :]
    n_out64 = (tl.num_programs(0) // n_mt).to(tl.int64) * M * N
    a_ptrs = a_ptr + (bi * M + rows) * k64  # + k: a is K-contiguous
    if DOT:
        b_ptrs = b_ptr + (rows[:, None] * k64 + cols[None, :] * 0)
        b_step = 1
    else:
        b_ptrs = b_ptr + (bi * k64 * N + cols)[None, :]
        b_step = N
    AF = _format(par_ptr, 0)
    QF = _format(par_ptr, 1)
    PF = _format(par_ptr, 2)
    off_acc = tl.load(par_ptr + 3 * _NF).to(tl.uint64, bitcast=True)
    off_prod = tl.load(par_ptr + 3 * _NF + 1).to(tl.uint64, bitcast=True)
    w0 = (o * 0).to(tl.uint64, bitcast=True)
    z64 = bi * 0  # int64 zero: loop counters are Python ints in the interpreter

    # roundings of a full chunk (the random-word numbering of fpsim.accumulate)
    if COMP == _COMP_NONE:
        per_chunk = chunk
    elif COMP == _KAHAN:
        per_chunk = 1 + 4 * (chunk - 1)
    else:
        per_chunk = 2 + 4 * (chunk - 1)
    if PROMOTE:
        per_chunk = per_chunk + 1

    acc = tl.full((BM, BN), 0.0, tl.float64)
    total = tl.full((BM, BN), 0.0, tl.float64)
    for c0 in range(0, K, chunk):
        c1 = tl.minimum(c0 + chunk, K)
        j0 = (c0 + z64) // chunk * per_chunk
        comp = tl.full((BM, BN), 0.0, tl.float64)
        for k in range(c0, c1):
            kk = k + z64
            av = tl.load(a_ptrs + kk, mask=mask_m, other=0.0).to(tl.float64)
            bv = tl.load(b_ptrs + kk * b_step, mask=mask2, other=0.0).to(tl.float64)
            t = av[:, None] * bv  # exact
            if PROD:
                w = w0
                if QMODE == _STOCHASTIC:
                    w = _word(r_ptr, kk, n_out64, o, mask2, off_prod, _WORDS_SPLITMIX64)
                t = _rsum(t, t, w, nbits, QF, QMODE, True)
            if k == c0:  # the chunk's first addend: s = R(t)
                w = w0
                if MODE == _STOCHASTIC:
                    w = _word(r_ptr, j0, n_out64, o, mask2, off_acc, RAND)
                acc = _rsum(t, t, w, nbits, AF, MODE, True)
            elif COMP == _COMP_NONE:  # s = R(s + t)
                w = w0
                if MODE == _STOCHASTIC:
                    w = _word(r_ptr, j0 + (kk - c0), n_out64, o, mask2, off_acc, RAND)
                acc = _rsum(acc, t, w, nbits, AF, MODE, False)
            else:
                j = j0 + 1 + 4 * (kk - c0 - 1)
                acc, comp = _compensated_add(
                    acc, comp, t, r_ptr, j, n_out64, o, mask2, off_acc, nbits, AF, MODE, COMP, RAND
                )
        acc, total = _close_chunk(
            acc,
            comp,
            total,
            c0 == 0,
            c1 - c0,
            j0,
            r_ptr,
            n_out64,
            o,
            mask2,
            off_acc,
            nbits,
            AF,
            PF,
            MODE,
            PMODE,
            PROMOTE,
            COMP,
            RAND,
        )
    if PROMOTE:
        res = total
    else:
        res = acc
    tl.store(out_ptr + o, _to_f32_bits(res), mask=mask2)
