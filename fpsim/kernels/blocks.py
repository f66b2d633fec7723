"""Portable Triton block quantization: :func:`fpsim.emulate.blocks.encode_blocks` on torch tensors.

:func:`encode_blocks` returns the element codes and the scale codes of a block recipe
(:data:`fpsim.formats.block.RECIPES` or any :class:`~fpsim.formats.block.BlockFormat` with
1-D or 2-D blocks), bit-identical to the emulator: MX (all four scale rules; FP8, FP6, FP4
and INT8 elements), Transformer Engine current scaling per tensor (two passes: an amax
reduction, then the cast), per row, 1x128 blocks and 128x128 tiles (``pow2``), linear
block INT8 / FP8 (ABSMAX), NVFP4 (two passes: the tensor amax, then the blocks) and the
bitsandbytes dynamic codebook (its CUDA kernel's nearest entry: float32 midpoints, ties to the
even entry).

The kernels (``_blocks_kernel.py``) compute each block's amax as an integer max of the
magnitude bits, the scale in float32 in the emulator's order with correctly rounded
division (``tl.math.div_rn``), and cast with the integer helpers of ``_intcast.py``; the
recipe arrives as typed tuples (:mod:`fpsim.kernels.block_args`).
Tensors on the CPU run in Triton's interpreter, tensors on a GPU run compiled kernels (fma
contraction off). Scale NaNs are the canonical 0x7FC00000 (the emulator carries the
payload of an input NaN; equal for numpy's NaN).

Example::

    codes, scales, _ = fpsim.kernels.blocks.encode_blocks(x, "mxfp8_e4m3")
    ref = fpsim.emulate.blocks.encode_blocks(x.numpy(), "mxfp8_e4m3")
    assert (codes.numpy() == ref.codes).all() and (scales.numpy() == ref.scales).all()
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from fpsim.formats import BlockFormat, Codebook, RoundMode, ScaleRule, get_format

from ._codes import Random
from ._loader import is_interpreted, kernel_module, require_torch
from ._loader import launch as _launch_kernel
from .arguments import i32, stochastic_source
from .block_args import block_args, tiling
from .format_args import f32_bits
from .optim_args import state_tables

__all__ = ["BlockCodesT", "encode_blocks"]

_CHUNK = 1 << 14  # elements per program of the per-tensor passes


class BlockCodesT(NamedTuple):
    """Torch twin of :class:`fpsim.emulate.blocks.BlockCodes`: element codes (``x``'s shape),
    scale codes (the grid of blocks; torch.uint32 float32 bits or torch.uint8 E8M0 / E4M3
    codes) and NVFP4's float32 tensor scale (else None)."""

    codes: Any
    scales: Any
    tensor_scale: float | None = None


def _recipe(fmt: Any) -> BlockFormat:
    bf = get_format(fmt)
    if not isinstance(bf, BlockFormat):
        raise TypeError(f"{bf.name} is an element format; use fpsim.kernels.cast for it")
    return bf


def encode_blocks(
    x: Any,
    recipe: Any,
    *,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    random_bits: Any = None,
    stochastic_bits: int = 32,
    tensor_amax: float | None = None,
) -> BlockCodesT:
    """Codes and scales of ``x`` in ``recipe``, bit-identical to :func:`fpsim.emulate.blocks.encode_blocks`.

    Args:
        x: torch float32 tensor (CPU: Triton interpreter; GPU: compiled kernels).
        recipe: a :class:`~fpsim.formats.block.BlockFormat` or a preset name.
        rounding: rounding of the elements (codebooks: nearest_even only).
        random_bits: stochastic rounding: uint32 words of ``x``'s shape (torch.uint32 /
            torch.int32 bit patterns or a numpy uint32 array), one per element.
        stochastic_bits: random bits one stochastic rounding uses, 1 to 32.
        tensor_amax: per-tensor recipes and NVFP4: the amax of the whole tensor when ``x`` is
            a chunk of it (skips the amax pass).

    Returns:
        :class:`BlockCodesT` ``(codes, scales, tensor_scale)``.

    Raises:
        TypeError: for a non-tensor or non-float32 ``x`` or an element format.
        ValueError: for an empty tensor, a shape the recipe refuses, or bad rounding arguments.
        NotImplementedError: blocks over more than two axes; lookup-table codebooks.
    """
    torch = require_torch()
    bf, mode = _recipe(recipe), RoundMode.parse(rounding)
    _check(torch, x, bf, mode)
    t = tiling(tuple(x.shape), bf, _CHUNK)  # refuses a shape before any work
    x = x.contiguous()
    xv = x.view(torch.int32)
    interp = is_interpreted(x.device)
    rand, rand_kind, nbits = _random_words(torch, x, xv, mode, random_bits, stochastic_bits)
    args = block_args(bf, mode, rand_kind)
    mod = kernel_module("_blocks_kernel", interp)
    extra = {} if interp else {"num_warps": 4, "enable_fp_fusion": False}
    tamax = torch.zeros(1, dtype=torch.int32, device=x.device)
    if args.P.ONE_SCALE or bf.rule.needs_tensor_amax:
        if tensor_amax is not None:
            tamax[0] = f32_bits(tensor_amax)
        else:
            tamax = _tensor_amax(mod, xv, interp, extra, bf.amax_ignores_nan)
    codes = torch.empty(x.shape, dtype=getattr(torch, bf.element.code_dtype), device=x.device)
    scales = torch.empty(t.scales, dtype=torch.uint8 if args.P.SCALE8 else torch.int32, device=x.device)
    mids = tamax  # unread unless a codebook
    if isinstance(bf.element, Codebook):
        mids = torch.from_numpy(state_tables(bf)[1]).to(x.device)
    with np.errstate(all="ignore"):  # the interpreter's numpy float ops (inf * 0 and the like)
        _launch_kernel(
            mod.block_kernel,
            (t.programs,),
            interp,
            xv,
            rand,
            codes,
            scales,
            tamax,
            mids,
            t.grid,
            nbits,
            i32((1 << nbits) - 1),
            **args._asdict(),
            BRP=t.BRP,
            BCP=t.BCP,
            **extra,
        )
    if not args.P.SCALE8:
        scales = scales.view(torch.uint32)
    tensor_scale = None
    if bf.rule is ScaleRule.NVFP4:
        tensor_scale = _nvfp4_tensor_scale(int(tamax[0].item()))
    return BlockCodesT(codes, scales, tensor_scale)


def _check(torch: Any, x: Any, bf: BlockFormat, mode: RoundMode) -> None:
    """Refuse an input or a recipe the kernel has no answer for."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"encode_blocks: x must be a torch float32 tensor, got {got}")
    n = x.numel()
    if n == 0:
        raise ValueError("encode_blocks: x is empty")
    if n >= 2**31:
        raise ValueError(f"encode_blocks: at most 2**31 - 1 elements (int32 offsets), got {n}")
    el = bf.element
    if isinstance(el, Codebook) and el.lut_bins:
        raise NotImplementedError(f"{bf.name}: lookup-table codebooks (lut_bins) have no kernel")
    if isinstance(el, Codebook) and mode is not RoundMode.NEAREST_EVEN:
        raise ValueError(f"{bf.name}: the codebook kernel takes rounding nearest_even, got {mode.value}")


def _random_words(torch: Any, x: Any, xv: Any, mode: RoundMode, random_bits: Any, nbits: int) -> tuple:
    """(words tensor, :class:`~fpsim.kernels._codes.Random` source, bits per rounding) of the
    elements' rounding; ``xv`` stands in for the unread pointer of a deterministic one."""
    if mode is not RoundMode.STOCHASTIC:
        return xv, Random.NONE, 32  # nbits unused: one compiled specialisation for every value
    if not 1 <= nbits <= 32:
        raise ValueError(f"stochastic_bits must be in [1, 32], got {nbits}")
    rand, kind, _ = stochastic_source(torch, x, xv, random_bits, None)
    return rand, kind, nbits


def _tensor_amax(mod: Any, xv: Any, interp: bool, extra: dict, ignore_nan: bool) -> Any:
    """Pass 1: bits of max |x| (int32 tensor of one element), NaN skipped or propagated as the
    recipe's amax does (:attr:`~fpsim.formats.BlockFormat.amax_ignores_nan`).

    Each program reduces a chunk to a partial amax; the partials (non-negative float32
    bits, NaN as 0x7FC00000, above every other) are reduced by the same kernel until one is
    left. The integer max is exact, so the result does not depend on the chunking.
    """
    torch = require_torch()
    cur = xv.reshape(-1)
    while True:
        m = cur.numel()
        block = min(1 << max(0, (m - 1).bit_length()), _CHUNK)
        g = -(-m // block)
        out = torch.empty(g, dtype=torch.int32, device=cur.device)
        _launch_kernel(
            mod.amax_kernel, (g,), interp, cur, out, m, BLOCK=block, IGNORE_NAN=ignore_nan, **extra
        )
        if g == 1:
            return out
        cur = out


def _nvfp4_tensor_scale(amax_bits: int) -> float:
    """``1 / S_enc`` as fpsim.emulate.scale_rules computes it for NVFP4 (host scalar, numpy float32)."""
    f32 = np.float32
    amax_t = np.array([amax_bits], np.int32).view(f32)[0]
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = np.fmin(f32(2688) / amax_t, np.finfo(f32).max)
    s_enc = f32(1) if (amax_t == 0 or s_enc == 0) else f32(s_enc)
    return float(f32(1) / s_enc)
