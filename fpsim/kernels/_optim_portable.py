"""Portable Triton kernel of one Adam / AdamW step with block-quantized states.

Ports, per element and block, what :func:`fpsim.replay.engine.replay` does for one tensor and step
(:func:`fpsim.kernels.optim.adamw_step_reference` is the numpy twin):

1. decode the master parameter (bfloat16 / float16 / float32 codes, widened exactly with
   integer operations; NaN codes give 0x7FC00000 as :func:`fpsim.emulate.element.decode`), the
   gradient and both moments: FP32 states as stored, block states as
   ``table[code] * scale`` (:func:`fpsim.emulate.blocks.decode_blocks`; the 256-entry table holds
   the emulator's decoded value of every code, so the lookup is exact by construction);
2. the update of :class:`fpsim.replay.optim.Adam` / ``AdamW`` in float32, in its order::

       AdamW: p = p * f32(1 - lr * wd)          Adam (L2): g = fma(p, f32(wd), g)
       m = fma(f32(1 - b1), g - m, m)
       v = fma(f32(1 - b2) * g, g, v * f32(b2))
       denom = sqrt_rn(v) / f32(sqrt(1 - b2**t)) + f32(eps)
       p = p + (f32(-lr / (1 - b1**t)) * m) / denom

   ``tl.fma`` is one rounding (exact in the interpreter, ``fma.rn.f32`` on the GPU), the
   divisions are ``tl.math.div_rn`` and the square root ``tl.math.sqrt_rn`` (correctly
   rounded: numpy in the interpreter, ``div.rn.f32`` / ``sqrt.rn.f32`` on the GPU; Triton's
   plain ``/`` is approximate there). Every other operation is a plain float32 add, sub or
   mul; the host launches compiled kernels with ``enable_fp_fusion=False`` so that none of
   them is contracted into an fma (the sm_90 PTX is checked in the tests). The scalars
   arrive as float32 bit patterns computed on the host as :mod:`fpsim.replay.optim` computes them;
3. the new moments re-encoded with their recipe's ABSMAX rule, nearest-even, as
   ``_blocks_portable.block_kernel`` does (the ABSMAX rule for integer and float elements, the
   CODEBOOK rule for the bitsandbytes codebooks): the block amax is an integer max of the magnitude bits,
   elements are cast with the integer helpers of ``_portable.py``;
4. the FP32 parameter rounded once to the master format, nearest-even or stochastic (random
   words loaded, or Philox of the flat index as ``tl.randint``).

One program handles ``K`` whole state blocks of ``B`` elements (a ``K x BP`` tile, ``BP``
the next power of two of ``B``); every element and every block scale is read and written
by the same program, so the outputs may alias the inputs (in-place update).

Executed once per mode by :func:`fpsim.kernels._loader.kernel_module`; import it there.
"""

import os

import triton
import triton.language as tl

from ._codes import Decay, Source, StateKind
from ._loader import kernel_module

_P = kernel_module("_portable", os.environ.get("TRITON_INTERPRET") == "1")
_encode_float = _P._encode_float
_encode_int = _P._encode_int
_load_f32_bits = _P._load_f32_bits
_random_words = _P._random_words
_u32 = _P._u32

# The KIND, DECAY and source codes (fpsim/kernels/_codes.py) and the cast codes, as tl.constexpr globals.
_FP32 = tl.constexpr(int(StateKind.FP32))
_CODEBOOK = tl.constexpr(int(StateKind.CODEBOOK))
_INT = tl.constexpr(int(StateKind.INT))
_DECOUPLED = tl.constexpr(int(Decay.DECOUPLED))
_L2 = tl.constexpr(int(Decay.L2))
_SRC_FLOAT32 = tl.constexpr(int(Source.FLOAT32))
_NEAREST_EVEN = _P._NEAREST_EVEN
_IEEE = _P._IEEE
_OVF_NOWHERE = _P._OVF_NOWHERE
_OVF_ALWAYS = _P._OVF_ALWAYS


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
def _row_amax_bits(b, mask, IGNORE_NAN: tl.constexpr):
    """Bits (uint32, ``K x 1``) of each row's max |x| over the masked tile: NaN skipped
    (fmaxf, codebooks) or a NaN result (torch.amax), returned as 0x7FC00000."""
    mag = (b & 0x7FFFFFFF).to(tl.int32, bitcast=True)
    if IGNORE_NAN:
        mag = tl.where(mag > 0x7F800000, 0, mag)
    mag = tl.where(mask, mag, 0)
    a = tl.reduce(mag, 1, _imax, keep_dims=True)
    return tl.where(a > 0x7F800000, 0x7FC00000, a).to(tl.uint32, bitcast=True)


@triton.jit
def _load_state(c_ptr, s_ptr, tab_ptr, offs, blk, mask, rmask, KIND: tl.constexpr):
    """float32 values of a state: FP32 as stored, else ``table[code] * scale``."""
    if KIND == _FP32:
        x = _f32(tl.load(c_ptr + offs, mask=mask, other=0))
    else:
        code = tl.load(c_ptr + offs, mask=mask, other=0).to(tl.int32)
        val = tl.load(tab_ptr + code, mask=mask, other=0.0)
        s = _f32(tl.load(s_ptr + blk, mask=rmask, other=0))
        x = val * s
    return x


@triton.jit
def _store_state(
    x,
    mask,
    rmask,
    c_ptr,
    s_ptr,
    mid_ptr,
    offs,
    blk,
    m,
    emin,
    code_max,
    ftz_lim,
    code_nan,
    sign_shift,
    fb,
    ibits,
    imask,
    max_int,
    lo,
    eps_bits,
    elem_max_bits,
    KIND: tl.constexpr,
    ENC: tl.constexpr,
):
    """Store a state: FP32 as is, else codes and one float32 scale per row (block), as
    fpsim.emulate.blocks.encode_blocks with the ABSMAX rule and nearest-even rounding."""
    b = _bits(x)
    if KIND == _FP32:
        tl.store(c_ptr + offs, b.to(tl.int32, bitcast=True), mask=mask)
    else:
        one = tl.full((1, 1), 1.0, tl.float32)
        zero = b * 0
        if KIND == _CODEBOOK:  # bitsandbytes' CUDA kernel: v = x * f32(1 / amax), no clamp
            ab = _row_amax_bits(b, mask, True)
            amax = _f32(ab)
            xs = x * tl.math.div_rn(one, amax)  # amax 0: inf (x = 0 gives NaN)
            q = zero.to(tl.int32)  # thresholds below xs (ties to the even entry): binary search
            for step_log in tl.static_range(8):
                step = 128 >> step_log
                below = tl.load(mid_ptr + (q + step - 1), mask=mask, other=0.0) < xs
                q = q + tl.where(below, step, 0)
            code = tl.where(xs != xs, 0, q).to(tl.uint32)  # NaN: entry 0, as dQuantize
            sc = ab
        else:  # ABSMAX: s = f32(max(amax, eps) / elem_max); cast(f32(x / s)), saturating
            ab = _row_amax_bits(b, mask, False)
            amax = _f32(ab)
            eps = _f32(_u32(eps_bits)) * one
            a = tl.where(amax < eps, eps, amax)
            s = tl.math.div_rn(a, _f32(_u32(elem_max_bits)) * one)
            v = _bits(tl.math.div_rn(x, tl.where(s == 0, one, s)))
            rm = tl.full((1, 1), 0xFFFFFFFF, tl.uint32)
            if KIND == _INT:
                code = _encode_int(
                    v, zero, 32, rm, fb, ibits, _u32(imask), _u32(max_int), _u32(lo), 1, _NEAREST_EVEN
                )
            else:
                # saturating: inf_lim = 0xFFFFFFFF, so nothing overflows to inf/NaN (OVF 0)
                code = _encode_float(
                    v,
                    zero,
                    32,
                    rm,
                    m,
                    emin,
                    emin + 127,
                    23 - m,
                    _u32(code_max),
                    rm,
                    _u32(ftz_lim),
                    _u32(1 << m),
                    0,
                    _u32(code_nan),
                    _u32(sign_shift),
                    _NEAREST_EVEN,
                    ENC,
                    True,
                    True,
                    False,
                    _OVF_NOWHERE,
                )
            sc = _bits(s)
        tl.store(c_ptr + offs, code.to(tl.uint8), mask=mask)
        tl.store(s_ptr + blk, sc.to(tl.int32, bitcast=True), mask=rmask)


_RT = ["n", "n_blocks", "seed_lo", "seed_hi", "decay", "omb1", "omb2", "beta2", "neg_step", "bias2", "eps"]
_RT += ["p_m", "p_emin", "p_code_max", "p_code_inf", "p_code_nan", "p_sign_shift"]
_STATE_RT = ["m", "emin", "code_max", "ftz_lim", "code_nan", "sign_shift", "fb", "ibits", "imask"]
_STATE_RT += ["max_int", "lo", "eps_bits", "elem_max_bits"]
_RT += ["m_" + k for k in _STATE_RT] + ["v_" + k for k in _STATE_RT]


@triton.jit(do_not_specialize=_RT)
def adam_kernel(
    p_ptr,
    g_ptr,
    mc_ptr,
    ms_ptr,
    vc_ptr,
    vs_ptr,
    p_out,
    mc_out,
    ms_out,
    vc_out,
    vs_out,
    r_ptr,
    m_tab,
    m_mid,
    v_tab,
    v_mid,
    n,
    n_blocks,
    seed_lo,
    seed_hi,
    decay,
    omb1,
    omb2,
    beta2,
    neg_step,
    bias2,
    eps,
    p_m,
    p_emin,
    p_code_max,
    p_code_inf,
    p_code_nan,
    p_sign_shift,
    m_m,
    m_emin,
    m_code_max,
    m_ftz_lim,
    m_code_nan,
    m_sign_shift,
    m_fb,
    m_ibits,
    m_imask,
    m_max_int,
    m_lo,
    m_eps_bits,
    m_elem_max_bits,
    v_m,
    v_emin,
    v_code_max,
    v_ftz_lim,
    v_code_nan,
    v_sign_shift,
    v_fb,
    v_ibits,
    v_imask,
    v_max_int,
    v_lo,
    v_eps_bits,
    v_elem_max_bits,
    DECAY: tl.constexpr,
    P_SRC: tl.constexpr,
    G_SRC: tl.constexpr,
    RAND: tl.constexpr,
    P_MODE: tl.constexpr,
    M_KIND: tl.constexpr,
    M_ENC: tl.constexpr,
    V_KIND: tl.constexpr,
    V_ENC: tl.constexpr,
    B: tl.constexpr,
    BP: tl.constexpr,
    K: tl.constexpr,
    I64: tl.constexpr,
):
    """One optimizer step of the ``K`` blocks ``pid * K ..`` (``B`` elements each)."""
    pid = tl.program_id(0)
    rows = tl.arange(0, K)[:, None]
    cols = tl.arange(0, BP)[None, :]
    if I64:
        blk = pid.to(tl.int64) * K + rows
    else:
        blk = pid * K + rows
    offs = blk * B + cols
    rmask = blk < n_blocks
    mask = rmask & (cols < B) & (offs < n)

    pb = _load_f32_bits(p_ptr, offs, mask, P_SRC)
    if P_SRC != _SRC_FLOAT32:  # emulate.decode: every NaN code of a 16-bit format is 0x7FC00000
        pb = tl.where((pb & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, pb)
    p = _f32(pb)
    g = _f32(_load_f32_bits(g_ptr, offs, mask, G_SRC))
    m = _load_state(mc_ptr, ms_ptr, m_tab, offs, blk, mask, rmask, M_KIND)
    v = _load_state(vc_ptr, vs_ptr, v_tab, offs, blk, mask, rmask, V_KIND)

    # fpsim.replay.optim._adam_step, operation by operation (no contraction: enable_fp_fusion=False)
    if DECAY == _DECOUPLED:
        p = p * _f32(_u32(decay))
    elif DECAY == _L2:
        g = tl.fma(p, _f32(_u32(decay)), g)
    m = tl.fma(_f32(_u32(omb1)), g - m, m)
    v = tl.fma(_f32(_u32(omb2)) * g, g, v * _f32(_u32(beta2)))
    denom = tl.math.div_rn(tl.math.sqrt_rn(v), _f32(_u32(bias2))) + _f32(_u32(eps))
    p = p + tl.math.div_rn(_f32(_u32(neg_step)) * m, denom)

    _store_state(
        m,
        mask,
        rmask,
        mc_out,
        ms_out,
        m_mid,
        offs,
        blk,
        m_m,
        m_emin,
        m_code_max,
        m_ftz_lim,
        m_code_nan,
        m_sign_shift,
        m_fb,
        m_ibits,
        m_imask,
        m_max_int,
        m_lo,
        m_eps_bits,
        m_elem_max_bits,
        M_KIND,
        M_ENC,
    )
    _store_state(
        v,
        mask,
        rmask,
        vc_out,
        vs_out,
        v_mid,
        offs,
        blk,
        v_m,
        v_emin,
        v_code_max,
        v_ftz_lim,
        v_code_nan,
        v_sign_shift,
        v_fb,
        v_ibits,
        v_imask,
        v_max_int,
        v_lo,
        v_eps_bits,
        v_elem_max_bits,
        V_KIND,
        V_ENC,
    )

    # the master copy: one rounding of the FP32 result (nearest-even or stochastic)
    r = _random_words(r_ptr, _u32(seed_lo), _u32(seed_hi), offs, mask, RAND)
    code = _encode_float(
        _bits(p),
        r,
        32,
        tl.full((1, 1), 0xFFFFFFFF, tl.uint32),
        p_m,
        p_emin,
        p_emin + 127,
        23 - p_m,
        _u32(p_code_max),
        _u32(p_code_max),
        tl.full((1, 1), 0, tl.uint32),
        _u32(1 << p_m),
        _u32(p_code_inf),
        _u32(p_code_nan),
        _u32(p_sign_shift),
        P_MODE,
        _IEEE,
        True,
        True,
        False,
        _OVF_ALWAYS,
    )
    if P_SRC == _SRC_FLOAT32:
        tl.store(p_out + offs, code.to(tl.int32, bitcast=True), mask=mask)
    else:
        tl.store(p_out + offs, code.to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)
