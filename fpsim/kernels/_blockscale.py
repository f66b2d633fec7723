"""The block-scale arithmetic shared by the block and optimizer kernels (``_blocks_kernel.py``,
``_optim_kernel.py``): the ABSMAX rule and the bitsandbytes codebook lookup.

Float32 in the emulator's order (:mod:`fpsim.emulate.scale_rules`), every division
``tl.math.div_rn`` (Triton's plain ``/`` is approximate on NVIDIA GPUs; the hosts launch with
fma contraction off). A recipe's numbers arrive as a
:class:`~fpsim.kernels.format_args.ScaleArgs` tuple read through ``_intcast.py``'s ``u32``.
Tested through both kernels against the emulator (tests/kernels/test_block_kernels.py,
tests/kernels/test_optim_kernel.py).

Executed once per mode by :func:`fpsim.kernels._loader.kernel_module`; load it there.
"""

import os

import triton
import triton.language as tl

from ._loader import kernel_module

_C = kernel_module("_intcast", os.environ.get("TRITON_INTERPRET") == "1")
bits = _C.bits
f32 = _C.f32
u32 = _C.u32


@triton.jit
def absmax_scaled(x, amax, sa):
    """ABSMAX: ``s = f32(max(amax, eps) / elem_max)`` (``sa`` the recipe's ScaleArgs, ``amax``
    one per block); (bits of ``f32(x / s)``, bits of ``s``)."""
    one = tl.full((1, 1), 1.0, tl.float32)
    eps = f32(u32(sa.eps_bits))
    a = tl.where(amax < eps, eps, amax)
    s = tl.math.div_rn(a, f32(u32(sa.elem_max_bits)) * one)
    return bits(tl.math.div_rn(x, tl.where(s == 0, one, s))), bits(s)


@triton.jit
def codebook_codes(x, amax, mask, mid_ptr):
    """bitsandbytes' CUDA kernel (kQuantizeBlockwise, dQuantize): ``v = x * f32(1 / amax)``
    (amax 0 gives inf; no clamp), the index ``#{i : t[i] < v}`` (uint32) by binary search over
    the host's 256 thresholds (fpsim.emulate.scale_rules.nearest_thresholds padded with +inf:
    ties to the even entry); NaN: entry 0."""
    one = tl.full((1, 1), 1.0, tl.float32)
    xs = x * tl.math.div_rn(one, amax)
    q = (bits(x) * 0).to(tl.int32)
    for step_log in tl.static_range(8):
        step = 128 >> step_log
        below = tl.load(mid_ptr + (q + step - 1), mask=mask, other=0.0) < xs
        q = q + tl.where(below, step, 0)
    return tl.where(xs != xs, 0, q).to(tl.uint32)
