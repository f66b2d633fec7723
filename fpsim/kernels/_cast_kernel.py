"""The cast kernels of :mod:`fpsim.kernels.cast`: encode (optionally fused with its decode)
and decode, integer bit operations only (the helpers of ``_intcast.py``; README, "Triton
kernels").

What changes the code path is ``tl.constexpr`` (rounding mode, overflow rule, the format's
:class:`~fpsim.kernels.format_args.FormatPaths`, input type, random source, fused decode);
the numbers of a format arrive as one runtime
:class:`~fpsim.formats.params.FormatParams` tuple, so formats of one structure share a
compiled kernel up to Triton's value specialisation of the tuple's fields (a field equal to
1 becomes a constant).

Executed once per mode by :func:`fpsim.kernels._loader.kernel_module`; import it there.
"""

import os

import triton
import triton.language as tl

from ._loader import kernel_module

_C = kernel_module("_intcast", os.environ.get("TRITON_INTERPRET") == "1")
decode = _C.decode
encode = _C.encode
load_f32_bits = _C.load_f32_bits
offsets = _C.offsets
random_words = _C.random_words
u32 = _C.u32


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "nbits", "rmask"])
def encode_kernel(
    x_ptr,  # input: float32 as int32 bits, or float16 / bfloat16 as int16 bits
    r_ptr,  # RAND LOADED: uint32 random words as int32 (else any pointer, unread)
    out_ptr,  # codes (uint8 / uint16 / uint32), or with QUANT float32 values as int32 bits
    n,  # number of elements
    seed_lo,  # RAND PHILOX: low 32 bits of the seed (int32 bits)
    seed_hi,  # RAND PHILOX: high 32 bits of the seed
    nbits,  # stochastic rounding: random bits per rounding, 1 to 32
    rmask,  # stochastic rounding: 2**nbits - 1 (int32 bits)
    fmt,  # the format's numbers, a FormatParams tuple
    FMT: tl.constexpr,  # the format's code paths, a FormatPaths tuple
    MODE: tl.constexpr,  # rounding mode, a RoundMode.code
    OVF: tl.constexpr,  # where overflow goes, a _codes.Overflow
    SRC: tl.constexpr,  # input dtype, a _codes.Source
    RAND: tl.constexpr,  # random words, a _codes.Random
    QUANT: tl.constexpr,  # store decode(code) (quantize) instead of the code
    BLOCK: tl.constexpr,  # elements per program, a power of two
    I64: tl.constexpr,  # 64-bit offsets (n + BLOCK >= 2**31)
):
    """Codes of ``n`` elements (``QUANT``: their decoded float32 bits, fused)."""
    offs, mask = offsets(n, BLOCK, I64)
    b = load_f32_bits(x_ptr, offs, mask, SRC)
    r = random_words(r_ptr, u32(seed_lo), u32(seed_hi), offs, mask, RAND)
    code = encode(b, r, nbits=nbits, rmask=u32(rmask), f=fmt, F=FMT, MODE=MODE, OVF=OVF)
    if QUANT:
        bits = decode(code, f=fmt, F=FMT)
        tl.store(out_ptr + offs, bits.to(tl.int32, bitcast=True), mask=mask)
    else:
        tl.store(out_ptr + offs, code.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def decode_kernel(
    c_ptr,  # codes: uint8 / uint16 / uint32 or int8 .. int64 (range-checked on the host)
    out_ptr,  # float32 values as int32 bits
    n,  # number of codes
    fmt,  # the format's numbers, a FormatParams tuple
    FMT: tl.constexpr,  # the format's code paths, a FormatPaths tuple
    BLOCK: tl.constexpr,  # codes per program, a power of two
    I64: tl.constexpr,  # 64-bit offsets (n + BLOCK >= 2**31)
):
    """float32 bits (stored as int32) of ``n`` codes."""
    offs, mask = offsets(n, BLOCK, I64)
    c = tl.load(c_ptr + offs, mask=mask, other=0).to(tl.uint32)
    bits = decode(c, f=fmt, F=FMT)
    tl.store(out_ptr + offs, bits.to(tl.int32, bitcast=True), mask=mask)
