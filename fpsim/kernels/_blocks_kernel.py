"""The Triton kernels of :mod:`fpsim.kernels.blocks`: block quantization (README, "Triton
kernels"); the RULE codes are :class:`fpsim.kernels._codes.Rule`.

Ports :func:`fpsim.emulate.blocks.encode_blocks`: one program instance per block (a tile of up to
``BRP x BCP`` elements of a ``(P, R, C)`` view), amax by an integer max of the magnitude
bits (exact, independent of the device's float max and its NaN convention), the scale in
float32 scalar arithmetic in the emulator's order (``tl.math.div_rn`` for every division:
Triton's plain ``/`` is an approximate division on NVIDIA GPUs; fma contraction is turned
off at launch), and the element cast with the integer helpers of ``_intcast.py``; the ABSMAX and codebook
arithmetic is ``_blockscale.py``'s, shared with the optimizer kernel.

MX scales are applied exactly, without float arithmetic: the shared exponent ``e`` shifts
the element format's ``emin`` (float elements) or its fraction bits (integer elements), so
``x * 2**-e`` is rounded once, as the emulator does in float64.

A recipe arrives as tuples (:mod:`fpsim.kernels.block_args`): the element format and NVFP4's
E4M3 scale format as :class:`~fpsim.formats.params.FormatParams` (runtime) with their
:class:`~fpsim.kernels.format_args.FormatPaths` (constexpr), the scale rule's numbers as a
:class:`~fpsim.kernels.format_args.ScaleArgs`, the tiling as a
:class:`~fpsim.kernels.block_args.BlockGrid` and every code path as one constexpr
:class:`~fpsim.kernels.block_args.BlockPaths`. Fields are read through ``tl.cast``
(``_intcast.py``'s ``i32`` / ``u32``: Triton value-specialises tuple fields).

Triton's library reductions (``tl.max``, ``tl.sum``) are decorated when triton is imported
and cannot be mixed between interpreter and compiler, so the reductions here are
``tl.reduce`` with the combine function of ``_intcast.py``.

Executed once per mode by :func:`fpsim.kernels._loader.kernel_module`; import it there.
"""

import os

import triton
import triton.language as tl

from fpsim.formats import RoundMode

from ._codes import Overflow, Rule
from ._loader import kernel_module

_INTERP = os.environ.get("TRITON_INTERPRET") == "1"
_C = kernel_module("_intcast", _INTERP)
_S = kernel_module("_blockscale", _INTERP)
absmax_scaled = _S.absmax_scaled
codebook_codes = _S.codebook_codes
bits = _C.bits
decode = _C.decode
encode = _C.encode
f32 = _C.f32
i32 = _C.i32
imax = _C.imax
u32 = _C.u32

# The RULE codes (fpsim/kernels/_codes.py Rule) and the cast codes, as tl.constexpr globals.
_TE = tl.constexpr(int(Rule.TE))
_ABSMAX = tl.constexpr(int(Rule.ABSMAX))
_MX_CEIL = tl.constexpr(int(Rule.MX_CEIL))
_MX_EVEN = tl.constexpr(int(Rule.MX_EVEN))
_MX_RCEIL = tl.constexpr(int(Rule.MX_RCEIL))
_NVFP4 = tl.constexpr(int(Rule.NVFP4))
_UE8M0_CEIL = tl.constexpr(int(Rule.UE8M0_CEIL))
_CODEBOOK = tl.constexpr(int(Rule.CODEBOOK))
_NEAREST_EVEN = tl.constexpr(RoundMode.NEAREST_EVEN.code)
_OVF_ALWAYS = tl.constexpr(int(Overflow.ALWAYS))
_FLT_MAX_BITS = tl.constexpr(0x7F7FFFFF)


@triton.jit
def _amax_bits(b, mask, IGNORE_NAN: tl.constexpr):
    """Bits of max |x| (int32, >= 0) over the masked tile: NaN skipped (fmaxf) or a NaN
    result (torch.amax), returned as the canonical 0x7FC00000."""
    mag = (b & 0x7FFFFFFF).to(tl.int32, bitcast=True)
    if IGNORE_NAN:
        mag = tl.where(mag > 0x7F800000, 0, mag)
    mag = tl.where(mask, mag, 0)
    a = tl.reduce(tl.reduce(mag, 1, imax), 0, imax)
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
def _te_scaled(b, amax, sa, POW2: tl.constexpr):
    """Transformer Engine ``compute_scale_from_amax`` (``sa`` the recipe's ScaleArgs): (bits of
    ``x * scale``, bits of the stored ``1 / scale``)."""
    one = tl.full((1, 1), 1.0, tl.float32)
    eps = f32(u32(sa.eps_bits))
    a = tl.where(amax < eps, eps, amax)
    abits = bits(a)
    bad = ((abits & 0x7FFFFFFF) >= 0x7F800000) | (abits == 0)
    scale = tl.where(bad, one, tl.math.div_rn(f32(u32(sa.elem_max_bits)) * one, tl.where(bad, one, a)))
    sb = bits(scale)
    sb = tl.where(sb == 0x7F800000, _FLT_MAX_BITS, sb)
    if POW2:
        sb = sb & 0xFF800000
    scale = f32(sb)
    return bits(f32(b) * scale), bits(tl.math.div_rn(one, scale))


@triton.jit
def _nvfp4_scaled(b, amax, tamax_ptr, s8, S8: tl.constexpr):
    """NVFP4 (Transformer Engine core_nvfp4.cuh): (bits of ``x`` times the block's encode
    factor, the block's float8_e4m3fn scale code). ``s8`` / ``S8``: the E4M3 scale format's
    FormatParams (saturating) and FormatPaths."""
    one = tl.full((1, 1), 1.0, tl.float32)
    flt_max = f32(tl.full((1, 1), _FLT_MAX_BITS, tl.uint32))
    at = f32(tl.load(tamax_ptr).to(tl.uint32, bitcast=True)) * one
    at_safe = tl.where(at == 0, one, at)
    s_enc = tl.math.div_rn(2688.0 * one, at_safe)
    s_enc = tl.where(s_enc > flt_max, flt_max, s_enc)
    s_enc = tl.where((at == 0) | (s_enc == 0), one, s_enc)
    s_dec = tl.math.div_rn(one, s_enc)
    sixth = f32(tl.full((1, 1), 0x3E2AAAAB, tl.uint32))  # f32(1/6)
    sdb = amax * (s_enc * sixth)
    sdb = tl.where(sdb > flt_max, flt_max, sdb)
    zero = bits(sdb) * 0
    rm = ~zero  # nearest-even: the random words are unread
    sc = encode(bits(sdb), zero, 32, rm, f=s8, F=S8, MODE=_NEAREST_EVEN, OVF=_OVF_ALWAYS)
    s8v = f32(decode(sc, f=s8, F=S8))
    den = s8v * s_dec
    c = tl.math.div_rn(one, tl.where(den == 0, one, den))
    c = tl.where(den == 0, flt_max, c)
    c = tl.where(s8v == 0, flt_max, tl.where(c > flt_max, flt_max, c))
    return bits(f32(b) * c), sc


@triton.jit
def _ceil_log2(d):
    """Exact ``ceil(log2 d)`` (int32) of float32 ``d >= 0`` from its bits: a subnormal through
    its integer significand, converted exactly to float32, less 149 (no float arithmetic on it)."""
    db = bits(d) & 0x7FFFFFFF
    sub = db < 0x800000
    b = tl.where(sub, bits(db.to(tl.int32).to(tl.float32)), db)
    e = ((b >> 23) & 0xFF).to(tl.int32) - 127 + ((b & 0x7FFFFF) != 0).to(tl.int32)
    return tl.where(sub, e - 149, e)


@triton.jit
def _mx_scaled(b, amax, ab, sa, RULE: tl.constexpr):
    """E8M0 rules (``sa`` the recipe's ScaleArgs): the block's shared exponent ``e`` by the
    rule; (the input bits, NaN for a NaN scale, the E8M0 scale code, the exponent shift of the
    element cast)."""
    if RULE == _UE8M0_CEIL:  # DeepGEMM: ceil(log2(f32(max(amax, eps) / elem_max)))
        one = tl.full((1, 1), 1.0, tl.float32)
        eps = f32(u32(sa.eps_bits))
        a = tl.where(amax < eps, eps, amax)
        e = _ceil_log2(tl.math.div_rn(a, f32(u32(sa.elem_max_bits)) * one))
    elif RULE == _MX_RCEIL:  # f32(amax * f32(1/elem_max)) rounded up to a power of two
        d = bits(amax * f32(u32(sa.inv_max_bits)))
        biased = (d >> 23).to(tl.int32)
        mant = d & 0x7FFFFF
        up = tl.where(biased == 0, mant > 0x400000, mant != 0)
        e = biased + up.to(tl.int32) - 127
    else:
        ebits = ab
        if RULE == _MX_EVEN:
            ebits = (ab + u32(sa.even_inc)) & 0xFF800000
        e = ((ebits >> 23) & 0xFF).to(tl.int32) - 127 - i32(sa.emax)
        if RULE == _MX_CEIL:
            e = e + ((ebits & 0x7FFFFF) != 0).to(tl.int32)
    nan = (ab >= 0x7F800000) | (e > 127)
    e = tl.maximum(e, -127)
    sc = tl.where(nan, 255, e + 127).to(tl.uint32)
    return tl.where(nan, 0x7FC00000, b), sc, tl.where(nan, 0, e)


@triton.jit
def _tile(grid, BRP: tl.constexpr, BCP: tl.constexpr):
    """Flat offsets and mask of this program's block (``grid`` a BlockGrid; program ``pid`` is
    block ``(p, i, j)`` row-major) in a ``BRP x BCP`` tile."""
    pid = tl.program_id(0)
    n_r = i32(grid.n_r)
    n_c = i32(grid.n_c)
    rows = i32(grid.rows)
    cols = i32(grid.cols)
    br = i32(grid.br)
    bc = i32(grid.bc)
    j = pid % n_c
    t = pid // n_c
    i = t % n_r
    p = t // n_r
    rr = tl.arange(0, BRP)[:, None]
    cc = tl.arange(0, BCP)[None, :]
    row = i * br + rr
    col = j * bc + cc
    mask = (rr < br) & (row < rows) & (cc < bc) & (col < cols)
    return p * rows * cols + row * cols + col, mask


@triton.jit
def _block_codes(b, r, ab, mask, nbits, rm, fmt, scale, s8, tamax_ptr, mid_ptr, P: tl.constexpr):
    """The element codes (uint32) and the scale code of one block by ``P.RULE`` (``ab``: the
    bits of its amax; the other arguments as :func:`block_kernel`'s)."""
    amax = f32(ab)
    shift = (b * 0).to(tl.int32)
    if P.RULE == _TE:
        v, sc = _te_scaled(b, amax, scale, P.POW2)
    elif P.RULE == _ABSMAX:
        v, sc = absmax_scaled(f32(b), amax, scale)
    elif P.RULE == _NVFP4:
        v, sc = _nvfp4_scaled(b, amax, tamax_ptr, s8, P.S8)
    elif P.RULE == _CODEBOOK:
        code = codebook_codes(f32(b), amax, mask, mid_ptr)
        sc = ab
    else:
        v, sc, e = _mx_scaled(b, amax, ab, scale, P.RULE)
        shift = shift + e
    if P.RULE != _CODEBOOK:  # saturating: x * 2**-shift rounded once (MX: emin or fraction bits move)
        code = encode(v, r, nbits, rm, f=fmt, F=P.FMT, MODE=P.MODE, OVF=P.OVF, shift=shift)
    return code, sc


@triton.jit
def _store_scale(scale_ptr, sc, ONE_SCALE: tl.constexpr, SCALE8: tl.constexpr):
    """Store this program's scale code: one per block, or one per tensor (``ONE_SCALE``, written
    by program 0); uint8 codes (``SCALE8``) or float32 bits."""
    pid = tl.program_id(0)
    spos = tl.full((1, 1), 0, tl.int32) + pid
    smask = spos >= 0
    if ONE_SCALE:
        spos = spos * 0
        smask = spos == pid
    if SCALE8:
        tl.store(scale_ptr + spos, sc.to(tl.uint8), mask=smask)
    else:
        tl.store(scale_ptr + spos, sc.to(tl.int32, bitcast=True), mask=smask)


@triton.jit(do_not_specialize=["nbits", "rmask"])
def block_kernel(
    x_ptr,  # input: float32 as int32 bits, a (P, R, C) view
    r_ptr,  # P.RAND LOADED: uint32 random words as int32, x's layout (else any pointer, unread)
    code_ptr,  # element codes (the element's code dtype), x's layout
    scale_ptr,  # scale codes, one per block: uint8 (P.SCALE8) or float32 bits as int32
    tamax_ptr,  # bits of the tensor's amax (int32, one element): per-tensor rules and NVFP4
    mid_ptr,  # codebooks: float32 thresholds padded with +inf to 256 (else any pointer, unread)
    grid,  # the tiling, a BlockGrid tuple
    nbits,  # stochastic rounding: random bits per rounding, 1 to 32
    rmask,  # stochastic rounding: 2**nbits - 1 (int32 bits)
    fmt,  # the element format's numbers, a FormatParams tuple (saturating)
    scale,  # the scale rule's numbers, a ScaleArgs tuple
    s8,  # NVFP4: the E4M3 block-scale format's numbers, a FormatParams tuple (saturating)
    P: tl.constexpr,  # the code paths (rule, rounding, formats, ...), a BlockPaths tuple
    BRP: tl.constexpr,  # rows of the tile: grid.br rounded up to a power of two
    BCP: tl.constexpr,  # columns of the tile: grid.bc rounded up to a power of two
):
    """Codes and the scale of one block (program ``pid`` = block ``(p, i, j)`` row-major)."""
    offs, mask = _tile(grid, BRP, BCP)
    b = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    if P.RAND:
        r = tl.load(r_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    else:
        r = b * 0
    if P.ONE_SCALE:  # per-tensor: the amax of pass 1 (a program holds one chunk of the tensor)
        ab = tl.load(tamax_ptr).to(tl.uint32, bitcast=True)
    else:  # IGNORE_NAN: fmaxf skips NaN (BlockFormat.amax_ignores_nan), else torch.amax
        ab = _amax_bits(b, mask, P.IGNORE_NAN).to(tl.uint32, bitcast=True)
    code, sc = _block_codes(b, r, ab, mask, nbits, u32(rmask), fmt, scale, s8, tamax_ptr, mid_ptr, P)
    tl.store(code_ptr + offs, code.to(code_ptr.dtype.element_ty), mask=mask)
    _store_scale(scale_ptr, sc, P.ONE_SCALE, P.SCALE8)
