"""Host-side arguments of the Triton kernels, shared by :mod:`.cast`, :mod:`.blocks` and :mod:`.optim`.

A format's runtime (int32) and constexpr parameters as the kernels take them
(:func:`encode_args`, :func:`decode_args`), the random words of stochastic rounding
(:func:`stochastic_source`), int32 bit patterns of uint32 values (:func:`i32`) and the launch
grid (:class:`Launch`, :func:`launch_grid`). Tested through the kernels, which are compared bit
for bit with the emulator (tests/kernels/).

This module imports neither torch nor triton at import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fpsim.formats import AnyFormat, Encoding, IntFormat, RoundMode

from ._codes import Random, overflow_code
from ._loader import is_interpreted

__all__ = ["Launch", "launch_grid", "stochastic_source", "i32", "encode_args", "decode_args"]


@dataclass(frozen=True)
class Launch:
    """Launch settings of a cast kernel.

    Args:
        block: elements per program instance (a power of two). None: 2048 on a GPU; on the
            CPU the next power of two of the size, at most 65536 (the interpreter costs about
            1.4 ms per program instance, so few large blocks are fastest).
        num_warps: warps per program on a GPU (ignored by the interpreter).
    """

    block: int | None = None
    num_warps: int = 4


def stochastic_source(torch, x, xv, random_bits, seed):
    """(random-words tensor, :class:`~fpsim.kernels._codes.Random` source, seed) for
    stochastic rounding; ``xv`` (the input's integer view) stands in for the unused pointer
    in seed mode."""
    if random_bits is not None and seed is not None:
        raise ValueError("stochastic rounding takes random_bits= or seed=, not both")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if not -(1 << 63) <= seed < (1 << 64):
            raise ValueError(f"seed must be in [-2**63, 2**64), got {seed}")
        return xv, Random.PHILOX, seed
    if random_bits is None:
        raise ValueError(
            "stochastic rounding needs random_bits= (uint32 words of x's shape) or seed= (an int)"
        )
    if not isinstance(random_bits, torch.Tensor):
        import numpy as np

        arr = np.asarray(random_bits)
        if arr.dtype != np.uint32:
            raise TypeError(f"random_bits must be uint32, got {arr.dtype}")
        random_bits = torch.from_numpy(arr.view(np.int32).copy()).to(x.device)
    if random_bits.dtype not in (torch.uint32, torch.int32):
        raise TypeError(
            f"random_bits must be torch.uint32 or torch.int32 bit patterns, got {random_bits.dtype}"
        )
    if tuple(random_bits.shape) != tuple(x.shape):
        raise ValueError(f"random_bits has shape {tuple(random_bits.shape)}; x has {tuple(x.shape)}")
    if random_bits.device != x.device:
        raise ValueError(f"random_bits is on {random_bits.device}; x is on {x.device}")
    return random_bits.contiguous().view(torch.int32), Random.LOADED, 0


def launch_grid(n: int, device: Any, launch: Launch) -> tuple[int, tuple[int], dict]:
    interp = is_interpreted(device)
    if launch.block is not None:
        block = launch.block
        if block < 16 or block & (block - 1):
            raise ValueError(f"launch.block must be a power of two >= 16, got {block}")
    elif interp:
        block = min(max(16, 1 << (n - 1).bit_length()), 1 << 16)
    else:
        block = 2048
    grid = ((n + block - 1) // block,)
    # no floating-point math is compiled here, but fix fma contraction off anyway
    return block, grid, ({} if interp else {"num_warps": launch.num_warps, "enable_fp_fusion": False})


def i32(v: int) -> int:
    """A uint32 value as the int32 with its bits (runtime kernel arguments are int32)."""
    v = int(v) & 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def encode_args(
    fmt: AnyFormat, mode: RoundMode, saturate: bool, ftz: bool, nbits: int
) -> tuple[dict[str, int], dict[str, Any]]:
    """Runtime (int32) and constexpr parameters of encode_kernel (see _portable.py).

    Numbers (mantissa width, emin, codes of max/inf/NaN, the saturate and flush flags, ...)
    are runtime arguments, so formats of one structure share a compiled kernel; what
    changes the code path (mode, encoding, sign, zero, integer or float) is constexpr.
    """
    rt = dict.fromkeys(
        ["m", "emin", "emin_b", "d0", "code_max", "inf_lim", "ftz_lim", "mant_one", "code_inf", "code_nan"]
        + ["sign_shift", "fb", "ibits", "imask", "max_int", "lo", "clamp"],
        0,
    )
    rt.update(nbits=nbits, rmask=i32((1 << nbits) - 1), mant_one=1, ibits=8, imask=255)
    ce: dict[str, Any] = {
        "IS_INT": isinstance(fmt, IntFormat),
        "MODE": mode.code,
        "ENC": Encoding.IEEE.code,
        "SIGNED": False,
        "HAS_ZERO": True,
        "EMIN_LOW": False,
        "OVF": 0,
    }
    if isinstance(fmt, IntFormat):
        rt.update(
            fb=fmt.fraction_bits,
            ibits=fmt.bits,
            imask=(1 << fmt.bits) - 1,
            max_int=fmt.max_int,
            lo=-fmt.min_int,
            clamp=int(saturate or fmt.symmetric),
        )
        return {k: i32(v) for k, v in rt.items()}, ce
    m = fmt.mantissa_bits
    rt.update(
        m=m,
        emin=fmt.min_exponent,
        emin_b=fmt.min_exponent + 127,
        d0=23 - m,
        code_max=fmt.code_of_max,
        inf_lim=0xFFFFFFFF if saturate else fmt.code_of_max,
        ftz_lim=(1 << m) if ftz and m > 0 else 0,
        mant_one=1 << m,
        code_inf=fmt.code_of_inf or 0,
        code_nan=fmt.code_of_nan or 0,
        sign_shift=fmt.exponent_bits + m,
    )
    ce.update(
        ENC=fmt.encoding.code,
        SIGNED=fmt.signed,
        HAS_ZERO=fmt.has_zero,
        EMIN_LOW=fmt.min_exponent < -126,
        OVF=int(overflow_code(fmt, mode)),
    )
    return {k: i32(v) for k, v in rt.items()}, ce


def decode_args(fmt: AnyFormat | None) -> tuple[dict[str, int], dict[str, Any]]:
    """Runtime and constexpr parameters of the decode part (see _portable._decode); None
    gives fixed placeholders (encode without the fused decode: one compiled kernel)."""
    rt = dict.fromkeys(
        ["d_m", "d_bias", "d_emin", "d_subn_mask", "d_sign_mask", "d_mag_mask", "d_frac_mask"], 0
    )
    rt.update(d_mant_one=1, d_top_field=0, d_fb=0, d_ibits=8, d_imask=255)
    ce: dict[str, Any] = {
        "D_IS_INT": False,
        "D_BITS32": False,
        "D_ENC": Encoding.IEEE.code,
        "D_SIGNED": False,
        "D_HAS_ZERO": True,
    }
    if fmt is None:
        return rt, ce
    ce.update(D_IS_INT=isinstance(fmt, IntFormat), D_BITS32=fmt.bits == 32, D_SIGNED=fmt.signed)
    if isinstance(fmt, IntFormat):
        rt.update(d_fb=fmt.fraction_bits, d_ibits=fmt.bits, d_imask=(1 << fmt.bits) - 1)
        return {k: i32(v) for k, v in rt.items()}, ce
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    rt.update(
        d_m=m,
        d_bias=fmt.bias,
        d_emin=fmt.min_exponent,
        d_subn_mask=0xFFFFFFFF if fmt.subnormals else 0,
        d_sign_mask=fmt.sign_mask,
        d_mag_mask=i32((1 << (e + m)) - 1),
        d_frac_mask=(1 << m) - 1,
        d_mant_one=1 << m,
        d_top_field=(1 << e) - 1,
    )
    ce.update(D_ENC=fmt.encoding.code, D_HAS_ZERO=fmt.has_zero)
    return {k: i32(v) for k, v in rt.items()}, ce
