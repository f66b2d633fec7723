"""The Triton kernel of :mod:`fpsim.kernels.optim`: one Adam / AdamW step with block-quantized
states.

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
   arrive as float32 runtime arguments (an :class:`~fpsim.kernels.optim_args.AdamArgs`
   tuple, floats are never value-specialised) computed on the host as
   :mod:`fpsim.replay.optim` computes them;
3. the new moments re-encoded with their recipe's ABSMAX rule, nearest-even, as
   ``_blocks_kernel.block_kernel`` does (the ABSMAX rule for integer and float elements, the
   CODEBOOK rule for the bitsandbytes codebooks): the block amax is an integer max of the
   magnitude bits, elements are cast with the integer helpers of ``_intcast.py``;
4. the FP32 parameter rounded once to the master format, nearest-even or stochastic (random
   words loaded, or Philox of the flat index as ``tl.randint``).

One program handles ``K`` whole state blocks of ``B`` elements (a ``K x BP`` tile, ``BP``
the next power of two of ``B``); every element and every block scale is read and written
by the same program, so the outputs may alias the inputs (in-place update).

Each state's tensors, numbers and code paths arrive as tuples
(:mod:`fpsim.kernels.optim_args`), its element format as the
:class:`~fpsim.formats.params.FormatParams` / ``FormatPaths`` pair of the cast kernels.

Executed once per mode by :func:`fpsim.kernels._loader.kernel_module`; import it there.
"""

import os

import triton
import triton.language as tl

from fpsim.formats import RoundMode

from ._codes import Decay, Overflow, Source, StateKind
from ._loader import kernel_module

_INTERP = os.environ.get("TRITON_INTERPRET") == "1"
_C = kernel_module("_intcast", _INTERP)
_S = kernel_module("_blockscale", _INTERP)
absmax_scaled = _S.absmax_scaled
codebook_codes = _S.codebook_codes
bits = _C.bits
encode = _C.encode
encode_float = _C.encode_float
f32 = _C.f32
imax = _C.imax
load_f32_bits = _C.load_f32_bits
random_words = _C.random_words
u32 = _C.u32

# The KIND, DECAY and source codes (fpsim/kernels/_codes.py) and the cast codes, as tl.constexpr globals.
_FP32 = tl.constexpr(int(StateKind.FP32))
_CODEBOOK = tl.constexpr(int(StateKind.CODEBOOK))
_INT = tl.constexpr(int(StateKind.INT))
_DECOUPLED = tl.constexpr(int(Decay.DECOUPLED))
_L2 = tl.constexpr(int(Decay.L2))
_SRC_FLOAT32 = tl.constexpr(int(Source.FLOAT32))
_NEAREST_EVEN = tl.constexpr(RoundMode.NEAREST_EVEN.code)
_OVF_NOWHERE = tl.constexpr(int(Overflow.NOWHERE))


@triton.jit
def _fp32(v):
    """A float runtime argument (a tuple field: a Python float in the interpreter) as float32."""
    return tl.cast(v, tl.float32)


@triton.jit
def _row_amax_bits(b, mask, IGNORE_NAN: tl.constexpr):
    """Bits (uint32, ``K x 1``) of each row's max |x| over the masked tile: NaN skipped
    (fmaxf, codebooks) or a NaN result (torch.amax), returned as 0x7FC00000."""
    mag = (b & 0x7FFFFFFF).to(tl.int32, bitcast=True)
    if IGNORE_NAN:
        mag = tl.where(mag > 0x7F800000, 0, mag)
    mag = tl.where(mask, mag, 0)
    a = tl.reduce(mag, 1, imax, keep_dims=True)
    return tl.where(a > 0x7F800000, 0x7FC00000, a).to(tl.uint32, bitcast=True)


@triton.jit
def _load_state(io, offs, blk, mask, rmask, KIND: tl.constexpr):
    """float32 values of a state (``io`` its StateTensors): FP32 as stored, else
    ``table[code] * scale``."""
    if KIND == _FP32:
        x = f32(tl.load(io.codes + offs, mask=mask, other=0))
    else:
        code = tl.load(io.codes + offs, mask=mask, other=0).to(tl.int32)
        val = tl.load(io.table + code, mask=mask, other=0.0)
        s = f32(tl.load(io.scales + blk, mask=rmask, other=0))
        x = val * s
    return x


@triton.jit
def _store_state(x, io, args, offs, blk, mask, rmask, S: tl.constexpr):
    """Store a state (``io`` its StateTensors, ``args`` its StateArgs, ``S`` its StatePaths):
    FP32 as is, else codes and one float32 scale per row (block), as
    fpsim.emulate.blocks.encode_blocks with the ABSMAX rule and nearest-even rounding."""
    b = bits(x)
    if S.KIND == _FP32:
        tl.store(io.codes_out + offs, b.to(tl.int32, bitcast=True), mask=mask)
    else:
        if S.KIND == _CODEBOOK:  # bitsandbytes' CUDA kernel: the nearest entry of x / amax
            ab = _row_amax_bits(b, mask, True)
            code = codebook_codes(x, f32(ab), mask, io.mids)
            sc = ab
        else:  # ABSMAX: s = f32(max(amax, eps) / elem_max); cast(f32(x / s)), saturating
            v, sc = absmax_scaled(x, f32(_row_amax_bits(b, mask, False)), args.scale)
            rm = tl.full((1, 1), 0xFFFFFFFF, tl.uint32)
            # saturating (args.fmt.inf_lim = 0xFFFFFFFF, integers clamp): no overflow to inf/NaN
            code = encode(v, b * 0, 32, rm, f=args.fmt, F=S.FMT, MODE=_NEAREST_EVEN, OVF=_OVF_NOWHERE)
        tl.store(io.codes_out + offs, code.to(tl.uint8), mask=mask)
        tl.store(io.scales_out + blk, sc.to(tl.int32, bitcast=True), mask=rmask)


@triton.jit(do_not_specialize=["n", "seed_lo", "seed_hi"])
def adam_kernel(
    g_ptr,  # gradient: float32 as int32 bits, or float16 / bfloat16 as int16 bits (G_SRC)
    p_io,  # the master copy's tensors, a MasterTensors tuple (out may alias in: in place)
    m_io,  # the first moment's tensors, a StateTensors tuple
    v_io,  # the second moment's tensors, a StateTensors tuple
    n,  # number of elements
    seed_lo,  # P.RAND PHILOX: low 32 bits of the seed (int32 bits)
    seed_hi,  # P.RAND PHILOX: high 32 bits of the seed
    step,  # the step's float32 scalars, an AdamArgs tuple
    p_fmt,  # the master format's numbers, a FormatParams tuple
    m_args,  # the first moment's numbers, a StateArgs tuple (element format, scale)
    v_args,  # the second moment's numbers, a StateArgs tuple
    P: tl.constexpr,  # the master copy's code paths, a MasterPaths tuple
    M: tl.constexpr,  # the first moment's code paths, a StatePaths tuple
    V: tl.constexpr,  # the second moment's code paths, a StatePaths tuple
    G_SRC: tl.constexpr,  # gradient dtype, a _codes.Source
    DECAY: tl.constexpr,  # weight decay, a formats.codes.Decay
    B: tl.constexpr,  # elements per state block (one row of the tile)
    BP: tl.constexpr,  # B rounded up to a power of two (the tile's width)
    K: tl.constexpr,  # blocks per program (the tile's height), a power of two
    I64: tl.constexpr,  # 64-bit offsets (n + BP * K >= 2**31)
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
    rmask = blk < (n - 1) // B + 1  # the number of blocks (n >= 1)
    mask = rmask & (cols < B) & (offs < n)

    pb = load_f32_bits(p_io.codes, offs, mask, P.SRC)
    if P.SRC != _SRC_FLOAT32:  # emulate.decode: every NaN code of a 16-bit format is 0x7FC00000
        pb = tl.where((pb & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, pb)
    p = f32(pb)
    g = f32(load_f32_bits(g_ptr, offs, mask, G_SRC))
    m = _load_state(m_io, offs, blk, mask, rmask, M.KIND)
    v = _load_state(v_io, offs, blk, mask, rmask, V.KIND)

    # fpsim.replay.optim._adam_step, operation by operation (no contraction: enable_fp_fusion=False)
    if DECAY == _DECOUPLED:
        p = p * _fp32(step.decay)
    elif DECAY == _L2:
        g = tl.fma(p, _fp32(step.decay), g)
    m = tl.fma(_fp32(step.omb1), g - m, m)
    v = tl.fma(_fp32(step.omb2) * g, g, v * _fp32(step.beta2))
    denom = tl.math.div_rn(tl.math.sqrt_rn(v), _fp32(step.bias2)) + _fp32(step.eps)
    p = p + tl.math.div_rn(_fp32(step.neg_step) * m, denom)

    _store_state(m, m_io, m_args, offs, blk, mask, rmask, M)
    _store_state(v, v_io, v_args, offs, blk, mask, rmask, V)

    # the master copy: one rounding of the FP32 result (nearest-even or stochastic)
    r = random_words(p_io.random, u32(seed_lo), u32(seed_hi), offs, mask, P.RAND)
    rm = tl.full((1, 1), 0xFFFFFFFF, tl.uint32)
    code = encode_float(bits(p), r, 32, rm, f=p_fmt, F=P.FMT, MODE=P.MODE, OVF=P.OVF)
    if P.SRC == _SRC_FLOAT32:
        tl.store(p_io.codes_out + offs, code.to(tl.int32, bitcast=True), mask=mask)
    else:
        tl.store(p_io.codes_out + offs, code.to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)
