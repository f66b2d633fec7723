"""Portable Triton block-quantization kernels (README, "Triton kernels"); the RULE codes are
:class:`fpsim.kernels._codes.Rule`.

Ports :func:`fpsim.emulate.blocks.encode_blocks`: one program instance per block (a tile of up to
``BRP x BCP`` elements of a ``(P, R, C)`` view), amax by an integer max of the magnitude
bits (exact, independent of the device's float max and its NaN convention), the scale in
float32 scalar arithmetic in the emulator's order (``tl.math.div_rn`` for every division:
Triton's plain ``/`` is an approximate division on NVIDIA GPUs; fma contraction is turned
off at launch), and the element cast with the integer helpers of ``_portable.py``.

MX scales are applied exactly, without float arithmetic: the shared exponent ``e`` shifts
the element format's ``emin`` (float elements) or its fraction bits (integer elements), so
``x * 2**-e`` is rounded once, as the emulator does in float64.

Triton's library reductions (``tl.max``, ``tl.sum``) are decorated when triton is imported
and cannot be mixed between interpreter and compiler, so the reductions here are
``tl.reduce`` with combine functions of this file.

Executed once per mode by :func:`fpsim.kernels._loader.kernel_module`; import it there.
"""

import os

import triton
import triton.language as tl

from ._codes import Rule
from ._loader import kernel_module

_P = kernel_module("_portable", os.environ.get("TRITON_INTERPRET") == "1")
_encode_float = _P._encode_float
_encode_int = _P._encode_int
_decode = _P._decode
_u32 = _P._u32

# The RULE codes (fpsim/kernels/_codes.py Rule) and the cast codes, as tl.constexpr globals.
_TE = tl.constexpr(int(Rule.TE))
_ABSMAX = tl.constexpr(int(Rule.ABSMAX))
_MX_FLOOR = tl.constexpr(int(Rule.MX_FLOOR))
_MX_CEIL = tl.constexpr(int(Rule.MX_CEIL))
_MX_EVEN = tl.constexpr(int(Rule.MX_EVEN))
_MX_RCEIL = tl.constexpr(int(Rule.MX_RCEIL))
_NVFP4 = tl.constexpr(int(Rule.NVFP4))
_UE8M0_CEIL = tl.constexpr(int(Rule.UE8M0_CEIL))
_CODEBOOK = tl.constexpr(int(Rule.CODEBOOK))
_NEAREST_EVEN = _P._NEAREST_EVEN
_FN = _P._FN
_OVF_ALWAYS = _P._OVF_ALWAYS
_IEEE = _P._IEEE
_FLT_MAX_BITS = tl.constexpr(0x7F7FFFFF)


@triton.jit
def _imax(a, b):
    return tl.maximum(a, b)


@triton.jit
def _f32(bits):
    """float32 of uint32 / int32 bits."""
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _bits(v):
    return v.to(tl.uint32, bitcast=True)


@triton.jit
def _amax_bits(b, mask, IGNORE_NAN: tl.constexpr):
    """Bits of max |x| (int32, >= 0) over the masked tile: NaN skipped (fmaxf) or a NaN
    result (torch.amax), returned as the canonical 0x7FC00000."""
    mag = (b & 0x7FFFFFFF).to(tl.int32, bitcast=True)
    if IGNORE_NAN:
        mag = tl.where(mag > 0x7F800000, 0, mag)
    mag = tl.where(mask, mag, 0)
    a = tl.reduce(tl.reduce(mag, 1, _imax), 0, _imax)
    return tl.where(a > 0x7F800000, 0x7FC00000, a)


@triton.jit
def amax_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, IGNORE_NAN: tl.constexpr):
    """out[pid] = bits of max |x| over the program's chunk (pass 1), NaN skipped or kept as
    0x7FC00000 (which the integer max of the partials keeps)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = offs < n
    b = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    tl.store(out_ptr + tl.program_id(0), _amax_bits(b, mask, IGNORE_NAN))


@triton.jit
def _cast(
    v,
    r,
    et_shift,
    nbits,
    rmask,
    m,
    emin,
    code_max,
    inf_lim,
    ftz_lim,
    mant_one,
    code_inf,
    code_nan,
    sign_shift,
    fb,
    ibits,
    imask,
    max_int,
    lo,
    clamp,
    IS_INT: tl.constexpr,
    MODE: tl.constexpr,
    ENC: tl.constexpr,
    SIGNED: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    OVF: tl.constexpr,
):
    """Saturating codes of the float32 bits ``v`` times ``2**-et_shift`` (exact)."""
    if IS_INT:
        code = _encode_int(v, r, nbits, rmask, fb - et_shift, ibits, imask, max_int, lo, clamp, MODE)
    else:
        em = emin + et_shift
        code = _encode_float(
            v,
            r,
            nbits,
            rmask,
            m,
            em,
            em + 127,
            23 - m,
            code_max,
            inf_lim,
            ftz_lim,
            mant_one,
            code_inf,
            code_nan,
            sign_shift,
            MODE,
            ENC,
            SIGNED,
            HAS_ZERO,
            True,
            OVF,
        )
    return code


@triton.jit
def _te_scaled(b, amax, eps_bits, elem_max_bits, POW2: tl.constexpr):
    """Transformer Engine ``compute_scale_from_amax``: (bits of ``x * scale``, bits of the
    stored ``1 / scale``)."""
    one = tl.full((1, 1), 1.0, tl.float32)
    eps = _f32(_u32(eps_bits))
    a = tl.where(amax < eps, eps, amax)
    abits = _bits(a)
    bad = ((abits & 0x7FFFFFFF) >= 0x7F800000) | (abits == 0)
    scale = tl.where(bad, one, tl.math.div_rn(_f32(_u32(elem_max_bits)) * one, tl.where(bad, one, a)))
    sb = _bits(scale)
    sb = tl.where(sb == 0x7F800000, _FLT_MAX_BITS, sb)
    if POW2:
        sb = sb & 0xFF800000
    scale = _f32(sb)
    return _bits(_f32(b) * scale), _bits(tl.math.div_rn(one, scale))


@triton.jit
def _absmax_scaled(b, amax, eps_bits, elem_max_bits):
    """ABSMAX: ``s = max(amax, eps) / elem_max``; (bits of ``x / s``, bits of ``s``)."""
    one = tl.full((1, 1), 1.0, tl.float32)
    eps = _f32(_u32(eps_bits))
    a = tl.where(amax < eps, eps, amax)
    s = tl.math.div_rn(a, _f32(_u32(elem_max_bits)) * one)
    return _bits(tl.math.div_rn(_f32(b), tl.where(s == 0, one, s))), _bits(s)


@triton.jit
def _nvfp4_scaled(b, amax, tamax_ptr, nbits, rm, s_fmt, d_fmt):
    """NVFP4 (Transformer Engine core_nvfp4.cuh): (bits of ``x`` times the block's
    encode factor, the block's float8_e4m3fn scale code). ``s_fmt`` / ``d_fmt``: the E4M3
    scale format's encode and decode numbers (see ``blocks._kernel_args``)."""
    s_m, s_emin, s_code_max, s_mant_one, s_code_nan, s_sign_shift = s_fmt
    d_m, d_bias, d_emin, d_subn_mask, d_sign_mask, d_mag_mask, d_frac_mask, d_mant_one, d_top_field = d_fmt
    one = tl.full((1, 1), 1.0, tl.float32)
    flt_max = _f32(tl.full((1, 1), _FLT_MAX_BITS, tl.uint32))
    at = _f32(tl.load(tamax_ptr).to(tl.uint32, bitcast=True)) * one
    at_safe = tl.where(at == 0, one, at)
    s_enc = tl.math.div_rn(2688.0 * one, at_safe)
    s_enc = tl.where(s_enc > flt_max, flt_max, s_enc)
    s_enc = tl.where((at == 0) | (s_enc == 0), one, s_enc)
    s_dec = tl.math.div_rn(one, s_enc)
    sixth = _f32(tl.full((1, 1), 0x3E2AAAAB, tl.uint32))  # f32(1/6)
    sdb = amax * (s_enc * sixth)
    sdb = tl.where(sdb > flt_max, flt_max, sdb)
    zero = rm * 0
    s8 = _encode_float(
        _bits(sdb),
        zero,
        nbits,
        rm,
        s_m,
        s_emin,
        s_emin + 127,
        23 - s_m,
        _u32(s_code_max),
        ~zero,
        zero,
        _u32(s_mant_one),
        0,
        _u32(s_code_nan),
        _u32(s_sign_shift),
        _NEAREST_EVEN,
        _FN,
        True,
        True,
        True,
        _OVF_ALWAYS,
    )
    s8v = _f32(
        _decode(
            s8,
            _u32(d_m),
            d_bias,
            d_emin,
            _u32(d_subn_mask),
            _u32(d_sign_mask),
            _u32(d_mag_mask),
            _u32(d_frac_mask),
            _u32(d_mant_one),
            _u32(d_top_field),
            0,
            8,
            255,
            False,
            False,
            _FN,
            True,
            True,
        )
    )
    den = s8v * s_dec
    c = tl.math.div_rn(one, tl.where(den == 0, one, den))
    c = tl.where(den == 0, flt_max, c)
    c = tl.where(s8v == 0, flt_max, tl.where(c > flt_max, flt_max, c))
    return _bits(_f32(b) * c), s8


@triton.jit
def _codebook_codes(b, amax, mask, mid_ptr, NMID: tl.constexpr, NMID_LOG2: tl.constexpr):
    """bitsandbytes' CUDA kernel (kQuantizeBlockwise, dQuantize): ``v = x * f32(1 / amax)``
    (amax 0 gives inf), the index ``#{i : t[i] < v}`` by binary search over the host's
    thresholds (fpsim.emulate.scale_rules.nearest_thresholds: ties to the even entry); NaN: 0."""
    one = tl.full((1, 1), 1.0, tl.float32)
    xs = _f32(b) * tl.math.div_rn(one, amax)
    q = (b * 0).to(tl.int32)
    for step_log in tl.static_range(NMID_LOG2):
        step = (NMID >> 1) >> step_log
        below = tl.load(mid_ptr + (q + step - 1), mask=mask, other=0.0) < xs
        q = q + tl.where(below, step, 0)
    return tl.where(xs != xs, 0, q)


@triton.jit
def _ceil_log2(d):
    """Exact ``ceil(log2 d)`` (int32) of float32 ``d >= 0`` from its bits: a subnormal through
    its integer significand, converted exactly to float32, less 149 (no float arithmetic on it)."""
    db = _bits(d) & 0x7FFFFFFF
    sub = db < 0x800000
    b = tl.where(sub, _bits(db.to(tl.int32).to(tl.float32)), db)
    e = ((b >> 23) & 0xFF).to(tl.int32) - 127 + ((b & 0x7FFFFF) != 0).to(tl.int32)
    return tl.where(sub, e - 149, e)


@triton.jit
def _mx_scaled(b, amax, ab, inv_max_bits, even_inc, emax, eps_bits, elem_max_bits, RULE: tl.constexpr):
    """E8M0 rules: the block's shared exponent ``e`` by the rule; (the input bits, NaN for a NaN
    scale, the E8M0 scale code, the exponent shift of the element cast)."""
    if RULE == _UE8M0_CEIL:  # DeepGEMM: ceil(log2(f32(max(amax, eps) / elem_max)))
        one = tl.full((1, 1), 1.0, tl.float32)
        eps = _f32(_u32(eps_bits))
        a = tl.where(amax < eps, eps, amax)
        e = _ceil_log2(tl.math.div_rn(a, _f32(_u32(elem_max_bits)) * one))
    elif RULE == _MX_RCEIL:  # f32(amax * f32(1/elem_max)) rounded up to a power of two
        d = _bits(amax * _f32(_u32(inv_max_bits)))
        biased = (d >> 23).to(tl.int32)
        mant = d & 0x7FFFFF
        up = tl.where(biased == 0, mant > 0x400000, mant != 0)
        e = biased + up.to(tl.int32) - 127
    else:
        ebits = ab
        if RULE == _MX_EVEN:
            ebits = (ab + _u32(even_inc)) & 0xFF800000
        e = ((ebits >> 23) & 0xFF).to(tl.int32) - 127 - emax
        if RULE == _MX_CEIL:
            e = e + ((ebits & 0x7FFFFF) != 0).to(tl.int32)
    nan = (ab >= 0x7F800000) | (e > 127)
    e = tl.maximum(e, -127)
    sc = tl.where(nan, 255, e + 127).to(tl.uint32)
    return tl.where(nan, 0x7FC00000, b), sc, tl.where(nan, 0, e)


_RT = ["nbits", "rmask", "m", "emin", "code_max", "inf_lim", "ftz_lim", "mant_one", "code_inf"]
_RT += ["code_nan", "sign_shift", "fb", "ibits", "imask", "max_int", "lo", "clamp"]
_RT += ["s_m", "s_emin", "s_code_max", "s_mant_one", "s_code_nan", "s_sign_shift"]
_RT += ["d_m", "d_bias", "d_emin", "d_subn_mask", "d_sign_mask", "d_mag_mask", "d_frac_mask"]
_RT += ["d_mant_one", "d_top_field", "elem_max_bits", "eps_bits", "inv_max_bits", "emax", "even_inc"]


@triton.jit(do_not_specialize=_RT + ["R", "C", "n_r", "n_c", "BR", "BC"])
def block_kernel(
    x_ptr,
    r_ptr,
    code_ptr,
    scale_ptr,
    tamax_ptr,
    mid_ptr,
    R,
    C,
    n_r,
    n_c,
    BR,
    BC,
    nbits,
    rmask,
    m,
    emin,
    code_max,
    inf_lim,
    ftz_lim,
    mant_one,
    code_inf,
    code_nan,
    sign_shift,
    fb,
    ibits,
    imask,
    max_int,
    lo,
    clamp,
    s_m,
    s_emin,
    s_code_max,
    s_mant_one,
    s_code_nan,
    s_sign_shift,
    d_m,
    d_bias,
    d_emin,
    d_subn_mask,
    d_sign_mask,
    d_mag_mask,
    d_frac_mask,
    d_mant_one,
    d_top_field,
    elem_max_bits,
    eps_bits,
    inv_max_bits,
    emax,
    even_inc,
    RULE: tl.constexpr,
    IGNORE_NAN: tl.constexpr,
    POW2: tl.constexpr,
    TAMAX: tl.constexpr,
    ONE_SCALE: tl.constexpr,
    RAND: tl.constexpr,
    IS_INT: tl.constexpr,
    MODE: tl.constexpr,
    ENC: tl.constexpr,
    SIGNED: tl.constexpr,
    HAS_ZERO: tl.constexpr,
    OVF: tl.constexpr,
    SCALE8: tl.constexpr,
    NMID: tl.constexpr,
    NMID_LOG2: tl.constexpr,
    BRP: tl.constexpr,
    BCP: tl.constexpr,
):
    """Codes and the scale of one block (program ``pid`` = block ``(p, i, j)`` row-major)."""
    pid = tl.program_id(0)
    j = pid % n_c
    t = pid // n_c
    i = t % n_r
    p = t // n_r
    rr = tl.arange(0, BRP)[:, None]
    cc = tl.arange(0, BCP)[None, :]
    row = i * BR + rr
    col = j * BC + cc
    mask = (rr < BR) & (row < R) & (cc < BC) & (col < C)
    offs = p * R * C + row * C + col
    b = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    if RAND:
        r = tl.load(r_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    else:
        r = b * 0
    rm = _u32(rmask)
    if ONE_SCALE:  # per-tensor: the amax of pass 1 (a program holds one chunk of the tensor)
        ab = tl.load(tamax_ptr).to(tl.uint32, bitcast=True)
    else:  # IGNORE_NAN: fmaxf skips NaN (BlockFormat.amax_ignores_nan), else torch.amax
        ab = _amax_bits(b, mask, IGNORE_NAN).to(tl.uint32, bitcast=True)
    amax = _f32(ab)
    shift = (b * 0).to(tl.int32)
    if RULE == _TE:
        v, sc = _te_scaled(b, amax, eps_bits, elem_max_bits, POW2)
    elif RULE == _ABSMAX:
        v, sc = _absmax_scaled(b, amax, eps_bits, elem_max_bits)
    elif RULE == _NVFP4:
        s_fmt = (s_m, s_emin, s_code_max, s_mant_one, s_code_nan, s_sign_shift)
        d_fmt = (
            d_m,
            d_bias,
            d_emin,
            d_subn_mask,
            d_sign_mask,
            d_mag_mask,
            d_frac_mask,
            d_mant_one,
            d_top_field,
        )
        v, sc = _nvfp4_scaled(b, amax, tamax_ptr, nbits, rm, s_fmt, d_fmt)
    elif RULE == _CODEBOOK:
        q = _codebook_codes(b, amax, mask, mid_ptr, NMID, NMID_LOG2)
        sc = ab
    else:
        v, sc, e = _mx_scaled(b, amax, ab, inv_max_bits, even_inc, emax, eps_bits, elem_max_bits, RULE)
        shift = shift + e
    if RULE == _CODEBOOK:
        code = q.to(tl.uint32)
    else:
        code = _cast(
            v,
            r,
            shift,
            nbits,
            rm,
            m,
            emin,
            _u32(code_max),
            _u32(inf_lim),
            _u32(ftz_lim),
            _u32(mant_one),
            _u32(code_inf),
            _u32(code_nan),
            _u32(sign_shift),
            fb,
            ibits,
            _u32(imask),
            _u32(max_int),
            _u32(lo),
            clamp,
            IS_INT,
            MODE,
            ENC,
            SIGNED,
            HAS_ZERO,
            OVF,
        )
    tl.store(code_ptr + offs, code.to(code_ptr.dtype.element_ty), mask=mask)
    spos = tl.full((1, 1), 0, tl.int32) + pid
    smask = spos >= 0
    if ONE_SCALE:
        spos = spos * 0
        smask = spos == pid
    if SCALE8:
        tl.store(scale_ptr + spos, sc.to(tl.uint8), mask=smask)
    else:
        tl.store(scale_ptr + spos, sc.to(tl.int32, bitcast=True), mask=smask)
