"""Host-side arguments of the Triton kernels, shared by :mod:`.cast`, :mod:`.blocks` and :mod:`.optim`.

The random words of stochastic rounding (:func:`stochastic_source`), int32 bit patterns of
uint32 values (:func:`i32`) and the launch grid (:class:`Launch`, :func:`launch_grid`); a
format's numbers are the typed tuples of :mod:`.format_args`. Tested through the kernels,
which are compared bit for bit with the emulator (tests/kernels/).

This module imports neither torch nor triton at import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._codes import Random
from ._loader import is_interpreted

__all__ = ["Launch", "launch_grid", "stochastic_source", "i32"]


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
