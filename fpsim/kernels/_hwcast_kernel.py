"""Hardware-cast Triton kernel: ``.to(tl.float8e4nv / tl.float8e5 / tl.bfloat16 / tl.float16)``.

The rounding itself is the GPU's conversion instruction (round to nearest even). What the
instruction does at the edges differs between conversions and code generators (Triton 3.9
emits ``cvt.rn.satfinite.e4m3x2.f32`` and ``cvt.rn.satfinite.e5m2x2.f32`` for sm_90, so
float8 overflow and infinities give +-max, even for E5M2, which has infinities; see
tests/kernels/test_compile_sm90.py), so the kernel
pins those edges down itself, from the input's float32 bits, to the emulator's convention:

* ``SAT``: values beyond +-max (infinities included) are clamped to +-max *before* the
  conversion; NaN passes through.
* not ``SAT``: inputs whose magnitude rounds past max (above the midpoint between max and
  the next binade step, or on it when max's code is odd) and infinities get the overflow
  code (IEEE: +-inf; FN: NaN) *after* the conversion.
* ``FTZ``: codes with exponent field 0 keep only their sign (flush after rounding).

NaN codes are whatever the hardware gives: compare them by class. Triton's CPU interpreter
implements these casts with numpy: exact for float16, wrong for float8 and bfloat16 (Triton
3.9's interpreter does not round those conversions as the GPU does, so its codes differ from
the emulator's and the GPU's), so only the float16 target is allowed there.

Executed by :func:`fpsim.kernels._loader.kernel_module`; import it through there.
"""

import triton
import triton.language as tl


@triton.jit
def hw_encode_kernel(
    x_ptr,
    out_ptr,
    n,
    TARGET: tl.constexpr,
    SAT: tl.constexpr,
    FTZ: tl.constexpr,
    MAX_BITS: tl.constexpr,
    OVER_BITS: tl.constexpr,
    TIE_UP: tl.constexpr,
    OVER_CODE: tl.constexpr,
    SIGN_SHIFT: tl.constexpr,
    EXP_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
    I64: tl.constexpr,
):
    """Codes of ``n`` elements by the hardware conversion to TARGET (0 float16, 1 bfloat16,
    2 float8e4nv = float8_e4m3fn, 3 float8e5 = float8_e5m2)."""
    pid = tl.program_id(0)
    if I64:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    xb = x.to(tl.uint32, bitcast=True)
    negu = xb >> 31
    mag = xb & 0x7FFFFFFF
    if SAT:  # clamp |x| > max (not NaN) to +-max first, so satfinite or not gives the same
        clamp = ((negu << 31) | MAX_BITS).to(tl.float32, bitcast=True)
        x = tl.where((mag > MAX_BITS) & (mag <= 0x7F800000), clamp, x)
    if TARGET == 0:
        code = x.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
    elif TARGET == 1:
        code = x.to(tl.bfloat16).to(tl.uint16, bitcast=True).to(tl.uint32)
    elif TARGET == 2:
        code = x.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.uint32)
    else:
        code = x.to(tl.float8e5).to(tl.uint8, bitcast=True).to(tl.uint32)
    if not SAT:
        if TIE_UP:  # max's code is odd: the midpoint rounds (to even) past max
            over = (mag >= OVER_BITS) & (mag <= 0x7F800000)
        else:
            over = (mag > OVER_BITS) & (mag <= 0x7F800000)
        code = tl.where(over, OVER_CODE | (negu << SIGN_SHIFT), code)
    if FTZ:
        code = tl.where((code & EXP_MASK) == 0, code & (1 << SIGN_SHIFT), code)
    tl.store(out_ptr + offs, code.to(out_ptr.dtype.element_ty), mask=mask)
