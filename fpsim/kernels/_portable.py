"""Portable Triton cast kernels: integer bit operations only (README, "Triton kernels").

A port of :mod:`fpsim.emulate._bitcore` (``_split``, ``_round``, ``encode_float``, ``encode_int``)
and of :func:`fpsim.emulate.element.decode`. Inputs arrive as integer views of their float bits
(float32 as int32, float16 and bfloat16 as int16); float16 and bfloat16 are widened to
float32 bit patterns with integer operations (exact, IEEE 754-2019 section 3.4). No
floating-point arithmetic is executed, so the results depend neither on the Triton CPU
interpreter's float casts (wrong for float8 and bfloat16) nor on fma contraction; the one
float instruction is the conversion of an integer below 2**24 to float32, exact, to read
its leading bit (as ``_bitcore._split`` does). Decode builds float32 bit patterns and
stores them as int32; the caller views them as float32.

What changes the code path is ``tl.constexpr`` (rounding mode, encoding, sign, zero,
integer or float, input type, random source, fused decode); the numbers of a format
(mantissa width, emin, codes of max / inf / NaN, saturate and flush limits) are int32
runtime arguments that are never specialised, so the formats of one structure share a
compiled kernel (about 250 specialisations cover every format x mode x input type).

Every variable shift amount is clamped into [0, 31]: a shift by 32 or more is undefined in
LLVM and gives 0 in numpy (the interpreter), and both sides of a ``tl.where`` are
evaluated.

This file is executed by :func:`fpsim.kernels._loader.kernel_module` once for the
interpreter and once for the compiler; import it through there.
"""

import triton
import triton.language as tl

from fpsim.formats import Encoding, RoundMode

from ._codes import Overflow, Random, Source

# The constexpr codes (fpsim/kernels/_codes.py), as tl.constexpr globals for the compiler.
_NEAREST_EVEN = tl.constexpr(RoundMode.NEAREST_EVEN.code)
_NEAREST_AWAY = tl.constexpr(RoundMode.NEAREST_AWAY.code)
_TOWARD_ZERO = tl.constexpr(RoundMode.TOWARD_ZERO.code)
_TOWARD_POSITIVE = tl.constexpr(RoundMode.TOWARD_POSITIVE.code)
_TOWARD_NEGATIVE = tl.constexpr(RoundMode.TOWARD_NEGATIVE.code)
_ODD = tl.constexpr(RoundMode.ODD.code)
_IEEE = tl.constexpr(Encoding.IEEE.code)
_FN = tl.constexpr(Encoding.FN.code)
_FNUZ = tl.constexpr(Encoding.FNUZ.code)
_FINITE = tl.constexpr(Encoding.FINITE.code)
_OVF_NOWHERE = tl.constexpr(int(Overflow.NOWHERE))
_OVF_POSITIVE = tl.constexpr(int(Overflow.POSITIVE))
_OVF_NEGATIVE = tl.constexpr(int(Overflow.NEGATIVE))
_OVF_ALWAYS = tl.constexpr(int(Overflow.ALWAYS))
_SRC_FLOAT32 = tl.constexpr(int(Source.FLOAT32))
_SRC_BFLOAT16 = tl.constexpr(int(Source.BFLOAT16))
_RAND_LOADED = tl.constexpr(int(Random.LOADED))
_RAND_PHILOX = tl.constexpr(int(Random.PHILOX))


@triton.jit
def _msb(v):
    """floor(log2(v)) of a uint32 tensor with 0 < v < 2**24, as int32 (-127 where v == 0).

    From the exponent of ``v`` converted to float32, which is exact below 2**24 (the
    emulator's ``_split`` finds the exponent of a float32 subnormal the same way).
    """
    return (v.to(tl.float32).to(tl.uint32, bitcast=True) >> 23).to(tl.int32) - 127


@triton.jit
def _offsets(n, BLOCK: tl.constexpr, I64: tl.constexpr):
    pid = tl.program_id(0)
    if I64:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < n


@triton.jit
def _load_f32_bits(x_ptr, offs, mask, SRC: tl.constexpr):
    """float32 bit patterns (uint32) of the input elements, widened exactly from 16 bits."""
    if SRC == _SRC_FLOAT32:
        b = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    else:
        h = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.uint16, bitcast=True).to(tl.uint32)
        if SRC == _SRC_BFLOAT16:  # bfloat16: the top half of a float32
            b = h << 16
        else:  # float16: rebias the exponent; a subnormal m * 2**-24 is float32(m) / 2**24
            sign = (h & 0x8000) << 16
            e = (h >> 10) & 0x1F
            m = h & 0x3FF
            t = (h & 0x7FFF) << 13
            b = t + tl.where(e == 0x1F, 224 << 23, 112 << 23)  # exponent + 112; inf/NaN to 0xFF
            sub = m.to(tl.float32).to(tl.uint32, bitcast=True) - (24 << 23)  # exact: m < 2**10
            b = tl.where(e == 0, tl.where(m == 0, 0, sub), b) | sign
    return b


@triton.jit
def _philox_word(seed_lo, seed_hi, offs):
    """First word of Philox4x32-10 with counter [offs lo, offs hi, 0, 0] and key [seed_lo,
    seed_hi]: what ``tl.randint(seed, offs)`` returns (``triton/language/random.py``).

    Written out here rather than calling ``tl.randint``: triton's own library functions are
    decorated when triton is imported, so they are interpreted or compiled according to
    TRITON_INTERPRET at that moment, which would tie this module to the environment.
    """
    c0 = offs.to(tl.uint32)
    if offs.dtype.primitive_bitwidth > 32:
        c1 = (offs >> 32).to(tl.uint32)
    else:
        c1 = c0 * 0
    c2 = c0 * 0
    c3 = c0 * 0
    k0 = seed_lo.to(tl.uint32)
    k1 = seed_hi.to(tl.uint32)
    for _ in tl.static_range(10):
        p0 = c0
        p2 = c2
        c0 = tl.umulhi(p2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = tl.umulhi(p0, 0xD2511F53) ^ c3 ^ k1
        c1 = tl.mul(p2, 0xCD9E8D57, sanitize_overflow=False)
        c3 = tl.mul(p0, 0xD2511F53, sanitize_overflow=False)
        k0 = tl.add(k0, 0x9E3779B9, sanitize_overflow=False)
        k1 = tl.add(k1, 0xBB67AE85, sanitize_overflow=False)
    return c0


@triton.jit
def _random_words(r_ptr, seed_lo, seed_hi, offs, mask, RAND: tl.constexpr):
    """uint32 random word of each element: loaded, or Philox4x32-10 of (seed, flat index)."""
    if RAND == _RAND_LOADED:
        r = tl.load(r_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    elif RAND == _RAND_PHILOX:
        r = _philox_word(seed_lo, seed_hi, offs)
    else:
        r = (offs * 0).to(tl.uint32)
    return r


@triton.jit
def _split(b):
    """fpsim.emulate._bitcore._split for float32 bits: sign (0/1), magnitude bits, significand with
    its implicit bit, and the biased exponent field clamped to >= 1 (the quantum exponent
    of the significand is ``es1 - 150``)."""
    negu = b >> 31
    mag = b & 0x7FFFFFFF
    es = (mag >> 23).to(tl.int32)
    sig = (mag & 0x7FFFFF) | (tl.minimum(es, 1).to(tl.uint32) << 23)
    return negu, mag, sig, es, tl.maximum(es, 1)


@triton.jit
def _round(sig, d, negu, r, nbits, rmask, MODE: tl.constexpr):
    """fpsim.emulate._bitcore._round: ``sig / 2**d`` (sig < 2**24, int32 d >= 0) rounded to an
    integer (uint32) as MODE says.

    Nearest-even and nearest-away add the rounding increment before the shift (one add
    instead of comparing the remainder with the half): with ``k = sig >> d``, nearest even
    is ``(2 sig + 2**d - 1 + (k & 1)) >> (d + 1)``, which is right for d = 0 too, and
    nearest away is ``(sig + 2**d / 2) >> d``. The other modes test the remainder as
    ``_bitcore`` does.
    """
    dc = tl.minimum(d, 25).to(tl.uint32)  # beyond 25 every bit of sig is discarded
    kept = sig >> dc
    if MODE == _NEAREST_EVEN:
        res = ((sig << 1) + (1 << dc) - 1 + (kept & 1)) >> (dc + 1)
    elif MODE == _NEAREST_AWAY:
        res = (sig + ((1 << dc) >> 1)) >> dc
    elif MODE == _TOWARD_ZERO:
        res = kept
    else:
        rem = sig & ((1 << dc) - 1)
        inexact = rem != 0
        if MODE == _ODD:
            res = kept | inexact.to(tl.uint32)
        else:
            if MODE == _TOWARD_POSITIVE:
                up = inexact & (negu == 0)
            elif MODE == _TOWARD_NEGATIVE:
                up = inexact & (negu != 0)
            else:  # stochastic: away iff floor(frac * 2**n) + R >= 2**n
                rn = r & rmask
                dn = d - nbits
                big = dn >= 0  # the discarded field has at least n bits: keep its top n
                top = rem >> tl.minimum(tl.maximum(dn, 0), 24).to(tl.uint32)
                low = rn >> tl.minimum(tl.maximum(-dn, 0), 31).to(tl.uint32)
                a = tl.where(big, top, rem)
                bb = tl.where(big, rn, low)
                width = tl.minimum(d, nbits - 1).to(tl.uint32)  # d < n here: 2**d fits
                lim = tl.where(big, rmask, (1 << width) - 1)
                up = (a > lim - bb) & inexact
            res = kept + up.to(tl.uint32)
    return res


@triton.jit
def _encode_float(
    b,
    r,
    nbits,
    rmask,
    m,
    emin,
    emin_b,
    d0,
    code_max,
    inf_lim,
    ftz_lim,
    mant_one,
    code_inf,
    code_nan,
    sign_shift,
    MODE: tl.constexpr,
    ENC: tl.constexpr,
    SIGNED: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    EMIN_LOW: tl.constexpr,
    OVF: tl.constexpr,
):
    """fpsim.emulate._bitcore.encode_float for float32 bits ``b``: the codes (uint32).

    The quantum of |x| in the target is ``2**(max(floor(log2|x|), emin) - m)``; ``d`` is how
    many low bits of the significand it drops and ``hi`` the exponent field above the
    smallest binade, so the magnitude code is ``(hi << m) + round(sig >> d)`` (a carry out
    of the significand moves into the exponent, a subnormal result has field 0). With
    ``emin_b = emin + 127`` and ``d0 = 23 - m`` (float32 inputs): ``d = d0 + max(emin_b -
    es, 0)`` and ``hi = max(es - emin_b, 0)``; targets reaching below float32's normal range
    (EMIN_LOW, E8M0) take floor(log2|x|) of subnormal inputs from their leading bit.

    Runtime limits: ``inf_lim`` is ``code_max`` (0xFFFFFFFF when saturating: nothing goes
    to infinity), ``ftz_lim`` the first normal code (0 when subnormals are kept). OVF says
    where overflow goes (IEEE 754-2019 section 7.4), a :class:`fpsim.kernels._codes.Overflow`:
    nowhere (finite formats), to infinity for positives only (toward +inf), for negatives
    only, always (nearest, stochastic), or only for infinite inputs (toward zero, odd).
    """
    negu, mag, sig, es, es1 = _split(b)
    if EMIN_LOW:
        lg = tl.where(es == 0, _msb(sig) - 149, es - 127)  # floor(log2|x|)
        et = tl.maximum(lg, emin)
        d = et - m - (es1 - 150)
        hi = (et - emin).to(tl.uint32)
    else:
        lg = es1 - 127  # exact at and above float32's smallest normal, enough here
        d = tl.maximum(emin_b - es1, 0) + d0
        hi = tl.maximum(es1 - emin_b, 0).to(tl.uint32)
    code = (hi << m.to(tl.uint32)) + _round(sig, d, negu, r, nbits, rmask, MODE)
    if not HAS_ZERO:  # field 0 is the normal 2**emin: drop the implicit bit
        code = tl.where(lg < emin, 0, tl.maximum(code, mant_one) - mant_one)
    else:  # flush subnormal results after rounding (PTX .ftz)
        code = tl.where(code < ftz_lim, 0, code)

    # overflow (IEEE 754 7.4): inf and NaN inputs give codes above code_max too
    if OVF != _OVF_NOWHERE:
        if OVF == _OVF_ALWAYS:
            to_inf = code > inf_lim
        elif OVF == _OVF_POSITIVE:
            to_inf = (code > inf_lim) & ((negu == 0) | (mag == 0x7F800000))
        elif OVF == _OVF_NEGATIVE:
            to_inf = (code > inf_lim) & ((negu != 0) | (mag == 0x7F800000))
        else:
            to_inf = (code > inf_lim) & (mag == 0x7F800000)
    code = tl.minimum(code, code_max)  # the largest finite code for everything beyond it
    nan = mag > 0x7F800000
    if OVF != _OVF_NOWHERE:
        if ENC == _IEEE:
            code = tl.where(to_inf, code_inf, code)
        else:
            nan = nan | to_inf
    if not HAS_ZERO:
        nan = nan | (mag == 0)
    if SIGNED:
        if ENC == _FNUZ:  # FNUZ: no negative zero
            sign = (negu & (code != 0).to(tl.uint32)) << sign_shift
        else:
            sign = negu << sign_shift
        code = code | sign
    else:
        nan = nan | ((negu != 0) & (mag != 0))
    if ENC != _FINITE:
        if SIGNED and (ENC == _IEEE or ENC == _FN):  # IEEE and FN NaNs keep the input's sign
            code = tl.where(nan, code_nan | sign, code)
        else:
            code = tl.where(nan, code_nan, code)
    else:
        code = tl.where(nan, 0, code)  # no NaN code: NaN becomes +0 (documented)
    return code


@triton.jit
def _encode_int(b, r, nbits, rmask, fb, ibits, imask, max_int, lo, clamp, MODE: tl.constexpr):
    """fpsim.emulate._bitcore.encode_int: two's complement codes (uint32) of ``x * 2**fb`` rounded.

    ``clamp`` (runtime) clamps to [-lo, max_int] (saturate or symmetric formats) instead of
    wrapping modulo ``2**bits``.
    """
    negu, mag, sig, es, es1 = _split(b)
    d = 150 - es1 - fb  # bits of sig below the integer's units
    kept = _round(sig, tl.maximum(d, 0), negu, r, nbits, rmask, MODE)
    big = d < 0  # |x| * 2**fb >= 2**24: an integer far out of range
    kept = tl.where(big, sig << tl.minimum(-d, ibits).to(tl.uint32), kept)
    neg = negu != 0
    pos = tl.where(big | (kept > max_int), max_int, kept)
    negv = tl.where(big | (kept > lo), lo, kept)
    clamped = tl.where(neg, (0 - negv) & imask, pos)
    clamped = tl.where(mag > 0x7F800000, 0, clamped)  # NaN -> 0; +-inf clamp like finite
    wrapped = tl.where(neg, 0 - kept, kept) & imask
    wrapped = tl.where(mag < 0x7F800000, wrapped, 0)  # inf and NaN have no integer: 0
    return tl.where(clamp != 0, clamped, wrapped)


@triton.jit
def _compose(signif, scale):
    """float32 bits (uint32) of ``signif * 2**scale`` (uint32 signif < 2**24, int32 scale)
    when it is a float32 number (normal or subnormal), as the Format invariants promise.

    float32(signif) is exact; a normal result adds ``scale`` to its exponent field, a
    subnormal one is ``signif << (scale + 149)`` (zero for signif == 0).
    """
    f = signif.to(tl.float32).to(tl.uint32, bitcast=True)
    e = (f >> 23).to(tl.int32) - 127 + scale
    normal = f + (scale << 23).to(tl.uint32, bitcast=True)
    subnormal = signif << tl.minimum(tl.maximum(scale + 149, 0), 31).to(tl.uint32)
    return tl.where(e >= -126, normal, subnormal)


@triton.jit
def _decode(
    c,
    m,
    bias,
    emin,
    subn_mask,
    sign_mask,
    mag_mask,
    frac_mask,
    mant_one,
    top_field,
    fb,
    ibits,
    imask,
    IS_INT: tl.constexpr,
    BITS32: tl.constexpr,
    ENC: tl.constexpr,
    SIGNED: tl.constexpr,
    HAS_ZERO: tl.constexpr,
):
    """float32 bits (uint32) of codes ``c`` (uint32): fpsim.emulate.element.decode without a table.

    ``subn_mask`` is 0xFFFFFFFF when subnormal codes are numbers, 0 when they decode to zero.
    """
    if BITS32:
        bits = c
    elif IS_INT:
        c = c & imask
        scale = (c * 0).to(tl.int32) - fb
        if SIGNED:  # two's complement: magnitude and sign
            negu = c >> (ibits - 1)
            k = tl.where(negu != 0, (imask + 1) - c, c)
            bits = _compose(k, scale) | (negu << 31)
        else:
            bits = _compose(c, scale)
    else:
        mag = c & mag_mask
        field = mag >> m
        frac = mag & frac_mask
        if HAS_ZERO:
            normal = field != 0
            scale = tl.where(normal, field.to(tl.int32) - bias, emin) - m.to(tl.int32)
            signif = tl.where(normal, frac | mant_one, frac & subn_mask)
        else:
            scale = field.to(tl.int32) - bias - m.to(tl.int32)
            signif = frac | mant_one
        bits = _compose(signif, scale)
        if SIGNED:
            bits = bits | (((c & sign_mask) != 0).to(tl.uint32) << 31)
        if ENC == _IEEE:  # IEEE: +-inf and NaN in the top binade
            top = field == top_field
            bits = tl.where(top, tl.where(frac == 0, (bits & 0x80000000) | 0x7F800000, 0x7FC00000), bits)
        elif ENC == _FN:  # FN: the all-ones magnitude
            bits = tl.where(mag == mag_mask, 0x7FC00000, bits)
        elif ENC == _FNUZ:  # FNUZ: the negative-zero code
            bits = tl.where(c == sign_mask, 0x7FC00000, bits)
    return bits


@triton.jit
def _u32(v):
    """A runtime int32 kernel argument read as uint32 (the host passes uint32 values wrapped)."""
    return v.to(tl.uint32, bitcast=True)
