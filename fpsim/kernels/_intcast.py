"""Integer-only Triton casts shared by the kernels: encode, decode, random words, loads.

A port of :mod:`fpsim.emulate._bitcore` (``_split``, ``_round``, ``encode_float``, ``encode_int``)
and of :func:`fpsim.emulate.element.decode` (README, "Triton kernels"). Inputs arrive as
float32 bit patterns (uint32); float16 and bfloat16 are widened to them with integer
operations (exact, IEEE 754-2019 section 3.4). No floating-point arithmetic is executed,
so the results depend neither on the Triton CPU interpreter's float casts (wrong for
float8 and bfloat16) nor on fma contraction; the one float instruction is the conversion
of an integer below 2**24 to float32, exact, to read its leading bit (as
``_bitcore._split`` does). Decode builds float32 bit patterns.

A format arrives as two tuples (:mod:`fpsim.kernels.format_args`): ``f``, the runtime
:class:`~fpsim.formats.params.FormatParams` (the tuple the numba loops read too), read only
through :func:`i32` / :func:`u32` (a field may arrive as a compiled constant), and ``F``, the
constexpr :class:`~fpsim.kernels.format_args.FormatPaths`. The rounding mode ``MODE`` is
:attr:`fpsim.formats.RoundMode.code` and the overflow rule ``OVF`` an
:class:`~fpsim.kernels._codes.Overflow`. The kernel files (``_cast_kernel.py``,
``_optim_kernel.py``, ``_blocks_kernel.py``) call these helpers; they are tested through
those kernels against the emulator (tests/kernels/).

Every variable shift amount is clamped into [0, 31]: a shift by 32 or more is undefined in
LLVM and gives 0 in numpy (the interpreter), and both sides of a ``tl.where`` are
evaluated.

Executed once per mode by :func:`fpsim.kernels._loader.kernel_module`; load it there.
"""

import triton
import triton.language as tl

from fpsim.formats import Encoding, RoundMode

from ._codes import Overflow, Random, Source

# The constexpr codes (RoundMode.code, Encoding.code, fpsim/kernels/_codes.py), as tl.constexpr
# globals for the compiler.
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
def u32(v):
    """``v`` (an int32 kernel argument, tuple field or constant) as uint32 bits."""
    return tl.cast(v, tl.uint32, bitcast=True)


@triton.jit
def i32(v):
    """``v`` (an int32 kernel argument, tuple field or constant) as int32."""
    return tl.cast(v, tl.int32)


@triton.jit
def f32(v):
    """float32 of uint32 / int32 bits."""
    return v.to(tl.float32, bitcast=True)


@triton.jit
def bits(v):
    """uint32 bits of a float32 (or int32) tensor."""
    return v.to(tl.uint32, bitcast=True)


@triton.jit
def imax(a, b):
    """Combine function of the integer max reductions (``tl.reduce``: Triton's library ``tl.max``
    is decorated when triton is imported and cannot be mixed between interpreter and compiler)."""
    return tl.maximum(a, b)


@triton.jit
def msb(v):
    """floor(log2(v)) of a uint32 tensor with 0 < v < 2**24, as int32 (-127 where v == 0).

    From the exponent of ``v`` converted to float32, which is exact below 2**24 (the
    emulator's ``_split`` finds the exponent of a float32 subnormal the same way).
    """
    return (v.to(tl.float32).to(tl.uint32, bitcast=True) >> 23).to(tl.int32) - 127


@triton.jit
def offsets(n, BLOCK: tl.constexpr, I64: tl.constexpr):
    """This program's ``BLOCK`` flat offsets (int64 when ``I64``) and their mask ``< n``."""
    pid = tl.program_id(0)
    if I64:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < n


@triton.jit
def load_f32_bits(x_ptr, offs, mask, SRC: tl.constexpr):
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
def philox_word(seed_lo, seed_hi, offs):
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
def random_words(r_ptr, seed_lo, seed_hi, offs, mask, RAND: tl.constexpr):
    """uint32 random word of each element: loaded, or Philox4x32-10 of (seed, flat index)."""
    if RAND == _RAND_LOADED:
        r = tl.load(r_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    elif RAND == _RAND_PHILOX:
        r = philox_word(seed_lo, seed_hi, offs)
    else:
        r = (offs * 0).to(tl.uint32)
    return r


@triton.jit
def split(b):
    """fpsim.emulate._bitcore._split for float32 bits: sign (0/1), magnitude bits, significand with
    its implicit bit, and the biased exponent field clamped to >= 1 (the quantum exponent
    of the significand is ``es1 - 150``)."""
    negu = b >> 31
    mag = b & 0x7FFFFFFF
    es = (mag >> 23).to(tl.int32)
    sig = (mag & 0x7FFFFF) | (tl.minimum(es, 1).to(tl.uint32) << 23)
    return negu, mag, sig, es, tl.maximum(es, 1)


@triton.jit
def round_shift(sig, d, negu, r, nbits, rmask, MODE: tl.constexpr):
    """fpsim.emulate._bitcore._round: ``sig / 2**d`` (sig < 2**24, int32 d >= 0) rounded to an
    integer (uint32) as MODE says.

    Nearest-even and nearest-away add the rounding increment before the shift (one add
    instead of comparing the remainder with the half): with ``k = sig >> d``, nearest even
    is ``(2 sig + 2**d - 1 + (k & 1)) >> (d + 1)``, which is right for d = 0 too, and
    nearest away is ``(sig + 2**d / 2) >> d``. The other modes test the remainder as
    ``_bitcore`` does. Stochastic rounding uses the low ``nbits`` bits (``rmask``) of the
    random words ``r``.
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
def encode_float(b, r, nbits, rmask, f, F: tl.constexpr, MODE: tl.constexpr, OVF: tl.constexpr, shift=0):
    """fpsim.emulate._bitcore.encode_float for float32 bits ``b``: the codes (uint32).

    Args:
        b: float32 bit patterns (uint32).
        r, nbits, rmask: random words, their bit count (int32) and ``2**nbits - 1`` (uint32)
            for stochastic rounding (unused by the other modes).
        f: the format's runtime :class:`~fpsim.formats.params.FormatParams`.
        F: its constexpr :class:`~fpsim.kernels.format_args.FormatPaths`.
        MODE: the rounding mode (:attr:`fpsim.formats.RoundMode.code`).
        OVF: where overflow goes (:class:`~fpsim.kernels._codes.Overflow`, IEEE 754-2019
            section 7.4): nowhere (finite formats), to infinity for positives only (toward
            +inf), for negatives only, always (nearest, stochastic), or only for infinite
            inputs (toward zero, odd).
        shift: int32 ``e``: encode ``x * 2**-e`` exactly (the block kernels' shared MX
            exponent) by moving the format's ``emin`` up by ``e``; values below float32's
            normal range need ``F.EMIN_LOW``.

    The quantum of |x| in the target is ``2**(max(floor(log2|x|), emin) - m)``; ``d`` is how
    many low bits of the significand it drops and ``hi`` the exponent field above the
    smallest binade, so the magnitude code is ``(hi << m) + round(sig >> d)`` (a carry out
    of the significand moves into the exponent, a subnormal result has field 0). With
    ``emin_b = emin + 127`` and ``d0 = 23 - m`` (float32 inputs): ``d = d0 + max(emin_b -
    es, 0)`` and ``hi = max(es - emin_b, 0)``; targets reaching below float32's normal range
    (EMIN_LOW, E8M0) take floor(log2|x|) of subnormal inputs from their leading bit.
    ``inf_lim`` is ``code_max`` (0xFFFFFFFF when saturating: nothing goes to infinity),
    ``ftz_lim`` the first normal code (0 when subnormals are kept).
    """
    m = i32(f.m)
    emin = i32(f.emin) + shift
    emin_b = i32(f.emin_b) + shift
    inf_lim = u32(f.inf_lim)
    mant_one = u32(f.mant_one)
    negu, mag, sig, es, es1 = split(b)
    if F.EMIN_LOW:
        lg = tl.where(es == 0, msb(sig) - 149, es - 127)  # floor(log2|x|)
        et = tl.maximum(lg, emin)
        d = et - m - (es1 - 150)
        hi = (et - emin).to(tl.uint32)
    else:
        lg = es1 - 127  # exact at and above float32's smallest normal, enough here
        d = tl.maximum(emin_b - es1, 0) + i32(f.d0)
        hi = tl.maximum(es1 - emin_b, 0).to(tl.uint32)
    code = (hi << m.to(tl.uint32)) + round_shift(sig, d, negu, r, nbits, rmask, MODE)
    if not F.HAS_ZERO:  # field 0 is the normal 2**emin: drop the implicit bit
        code = tl.where(lg < emin, 0, tl.maximum(code, mant_one) - mant_one)
    else:  # flush subnormal results after rounding (PTX .ftz)
        code = tl.where(code < u32(f.ftz_lim), 0, code)

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
    code = tl.minimum(code, u32(f.code_max))  # the largest finite code for everything beyond it
    nan = mag > 0x7F800000
    if OVF != _OVF_NOWHERE:
        if F.ENC == _IEEE:
            code = tl.where(to_inf, u32(f.code_inf), code)
        else:
            nan = nan | to_inf
    if not F.HAS_ZERO:
        nan = nan | (mag == 0)
    if F.SIGNED:
        if F.ENC == _FNUZ:  # FNUZ: no negative zero
            sign = (negu & (code != 0).to(tl.uint32)) << u32(f.sign_shift)
        else:
            sign = negu << u32(f.sign_shift)
        code = code | sign
    else:
        nan = nan | ((negu != 0) & (mag != 0))
    if F.ENC != _FINITE:
        if F.SIGNED and (F.ENC == _IEEE or F.ENC == _FN):  # IEEE and FN NaNs keep the input's sign
            code = tl.where(nan, u32(f.code_nan) | sign, code)
        else:
            code = tl.where(nan, u32(f.code_nan), code)
    else:
        code = tl.where(nan, 0, code)  # no NaN code: NaN becomes +0 (documented)
    return code


@triton.jit
def encode_int(b, r, nbits, rmask, f, MODE: tl.constexpr, shift=0):
    """fpsim.emulate._bitcore.encode_int: two's complement codes (uint32) of ``x * 2**frac`` rounded.

    ``b``, ``r``, ``nbits``, ``rmask``, ``f``, ``MODE`` and ``shift`` as for :func:`encode_float`
    (``shift`` lowers the fraction bits ``frac``).
    ``f.clamp`` (runtime) clamps to [min_int, max_int] (saturate or symmetric formats) instead
    of wrapping modulo ``2**bits``.
    """
    imask = u32(f.imask)
    max_int = u32(f.max_int)
    lo = 0 - u32(f.min_int)  # -min_int
    negu, mag, sig, es, es1 = split(b)
    d = 150 - es1 - (i32(f.frac) - shift)  # bits of sig below the integer's units
    kept = round_shift(sig, tl.maximum(d, 0), negu, r, nbits, rmask, MODE)
    big = d < 0  # |x| * 2**frac >= 2**24: an integer far out of range
    kept = tl.where(big, sig << tl.minimum(-d, i32(f.bits)).to(tl.uint32), kept)
    neg = negu != 0
    pos = tl.where(big | (kept > max_int), max_int, kept)
    negv = tl.where(big | (kept > lo), lo, kept)
    clamped = tl.where(neg, (0 - negv) & imask, pos)
    clamped = tl.where(mag > 0x7F800000, 0, clamped)  # NaN -> 0; +-inf clamp like finite
    wrapped = tl.where(neg, 0 - kept, kept) & imask
    wrapped = tl.where(mag < 0x7F800000, wrapped, 0)  # inf and NaN have no integer: 0
    return tl.where(i32(f.clamp) != 0, clamped, wrapped)


@triton.jit
def encode(b, r, nbits, rmask, f, F: tl.constexpr, MODE: tl.constexpr, OVF: tl.constexpr, shift=0):
    """Codes (uint32) of float32 bits ``b`` in any element format: :func:`encode_int` or
    :func:`encode_float` as ``F.IS_INT`` says (arguments as for :func:`encode_float`)."""
    if F.IS_INT:
        code = encode_int(b, r, nbits, rmask, f, MODE, shift=shift)
    else:
        code = encode_float(b, r, nbits, rmask, f, F, MODE, OVF, shift=shift)
    return code


@triton.jit
def compose(signif, scale):
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
def decode(c, f, F: tl.constexpr):
    """float32 bits (uint32) of codes ``c`` (uint32): fpsim.emulate.element.decode without a table.

    ``f`` and ``F`` are the format's tuples (:func:`encode_float`); ``f.subn_mask`` is
    0xFFFFFFFF when subnormal codes are numbers, 0 when they decode to zero.
    """
    if F.BITS32:
        bits = c
    elif F.IS_INT:
        imask = u32(f.imask)
        c = c & imask
        scale = (c * 0).to(tl.int32) - i32(f.frac)
        if F.SIGNED:  # two's complement: magnitude and sign
            negu = c >> (u32(f.bits) - 1)
            k = tl.where(negu != 0, (imask + 1) - c, c)
            bits = compose(k, scale) | (negu << 31)
        else:
            bits = compose(c, scale)
    else:
        m = u32(f.m)
        sign_mask = u32(f.sign_mask)
        mag_mask = u32(f.mag_mask)
        mant_one = u32(f.mant_one)
        mag = c & mag_mask
        field = mag >> m
        frac = mag & u32(f.frac_mask)
        if F.HAS_ZERO:
            normal = field != 0
            scale = tl.where(normal, field.to(tl.int32) - i32(f.bias), i32(f.emin)) - m.to(tl.int32)
            signif = tl.where(normal, frac | mant_one, frac & u32(f.subn_mask))
        else:
            scale = field.to(tl.int32) - i32(f.bias) - m.to(tl.int32)
            signif = frac | mant_one
        bits = compose(signif, scale)
        if F.SIGNED:
            bits = bits | (((c & sign_mask) != 0).to(tl.uint32) << 31)
        if F.ENC == _IEEE:  # IEEE: +-inf and NaN in the top binade
            top = field == u32(f.top_field)
            bits = tl.where(top, tl.where(frac == 0, (bits & 0x80000000) | 0x7F800000, 0x7FC00000), bits)
        elif F.ENC == _FN:  # FN: the all-ones magnitude
            bits = tl.where(mag == mag_mask, 0x7FC00000, bits)
        elif F.ENC == _FNUZ:  # FNUZ: the negative-zero code
            bits = tl.where(c == sign_mask, 0x7FC00000, bits)
    return bits
