"""Portable Triton block quantization: :func:`fpsim.emulate.blocks.encode_blocks` on torch tensors.

:func:`encode_blocks` returns the element codes and the scale codes of a block recipe
(:data:`fpsim.formats.block.RECIPES` or any :class:`~fpsim.formats.block.BlockFormat` with
1-D or 2-D blocks), bit-identical to the emulator: MX (all four scale rules; FP8, FP6, FP4
and INT8 elements), Transformer Engine current scaling per tensor (two passes: an amax
reduction, then the cast), per row, 1x128 blocks and 128x128 tiles (``pow2``), linear
block INT8 / FP8 (ABSMAX), NVFP4 (two passes: the tensor amax, then the blocks) and the
bitsandbytes dynamic codebook (its CUDA kernel's nearest entry: float32 midpoints, ties to the
even entry).

The kernels (``_blocks_portable.py``) compute each block's amax as an integer max of the
magnitude bits, the scale in float32 in the emulator's order with correctly rounded
division (``tl.math.div_rn``), and cast with the integer helpers of ``_portable.py``.
Tensors on the CPU run in Triton's interpreter, tensors on a GPU run compiled kernels (fma
contraction off). Scale NaNs are the canonical 0x7FC00000 (the emulator carries the
payload of an input NaN; equal for numpy's NaN).

Example::

    codes, scales, _ = fpsim.kernels.blocks.encode_blocks(x, "mxfp8_e4m3")
    ref = fpsim.emulate.blocks.encode_blocks(x.numpy(), "mxfp8_e4m3")
    assert (codes.numpy() == ref.codes).all() and (scales.numpy() == ref.scales).all()
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from fpsim.emulate.scale_rules import nearest_thresholds
from fpsim.formats import FORMATS, BlockFormat, Codebook, Format, IntFormat, RoundMode, ScaleRule, get_format

from ._codes import Random, rule_code
from ._loader import is_interpreted, kernel_module, require_torch
from ._loader import launch as _launch_kernel
from .arguments import decode_args, encode_args, i32, stochastic_source

__all__ = ["BlockCodesT", "encode_blocks"]

_CHUNK = 1 << 14  # elements per program of the per-tensor passes


class BlockCodesT(NamedTuple):
    """Torch twin of :class:`fpsim.emulate.blocks.BlockCodes`: element codes (``x``'s shape),
    scale codes (the grid of blocks; torch.uint32 float32 bits or torch.uint8 E8M0 / E4M3
    codes) and NVFP4's float32 tensor scale (else None)."""

    codes: Any
    scales: Any
    tensor_scale: float | None = None


def _bits32(v: float) -> int:
    return int(np.float32(v).view(np.int32))


def _recipe(fmt: Any) -> BlockFormat:
    bf = get_format(fmt)
    if not isinstance(bf, BlockFormat):
        raise TypeError(f"{bf.name} is an element format; use fpsim.kernels.cast for it")
    return bf


def _blocking(shape: tuple, bf: BlockFormat) -> tuple[int, int, int, int, int, tuple]:
    """(P, R, C, BR, BC, grid): the tensor as P matrices R x C in blocks of BR x BC."""
    from fpsim.emulate.blocks import block_geometry

    work, blk = block_geometry(shape, bf)
    grid = tuple(-(-t // b) for t, b in zip(work, blk))
    if bf.flatten:
        return 1, 1, work[0], 1, blk[0], grid
    k = len(bf.block)
    if k > 2:
        raise NotImplementedError(f"{bf.name}: blocks over {k} axes are not supported by the kernels")
    if k == 1:
        return math.prod(work[:-1]), 1, work[-1], 1, blk[-1], grid
    return math.prod(work[:-2]), work[-2], work[-1], blk[-2], blk[-1], grid


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


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
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"encode_blocks: x must be a torch float32 tensor, got {got}")
    n = x.numel()
    if n == 0:
        raise ValueError("encode_blocks: x is empty")
    if n >= 2**31:
        raise ValueError(f"encode_blocks: at most 2**31 - 1 elements (int32 offsets), got {n}")
    el = bf.element
    book = isinstance(el, Codebook)
    if book and el.lut_bins:
        raise NotImplementedError(f"{bf.name}: lookup-table codebooks (lut_bins) have no kernel")
    if book and mode is not RoundMode.NEAREST_EVEN:
        raise ValueError(f"{bf.name}: the codebook kernel takes rounding nearest_even, got {mode.value}")
    x = x.contiguous()
    xv = x.view(torch.int32)
    interp = is_interpreted(x.device)
    rand, rand_kind = xv, Random.NONE
    if mode is RoundMode.STOCHASTIC:
        if not 1 <= stochastic_bits <= 32:
            raise ValueError(f"stochastic_bits must be in [1, 32], got {stochastic_bits}")
        rand, rand_kind, _ = stochastic_source(torch, x, xv, random_bits, None)
    else:
        stochastic_bits = 32
    mod = kernel_module("_blocks_portable", interp)
    extra = {} if interp else {"num_warps": 4, "enable_fp_fusion": False}
    per_tensor = bf.block is None
    tamax = torch.zeros(1, dtype=torch.int32, device=x.device)
    if per_tensor or bf.rule.needs_tensor_amax:
        if tensor_amax is not None:
            tamax[0] = _bits32(tensor_amax)
        else:
            tamax = _tensor_amax(mod, xv, interp, extra, bf.amax_ignores_nan)
    if per_tensor:
        from fpsim.emulate.blocks import block_geometry

        work, _ = block_geometry(tuple(x.shape), bf)
        p, r, c, br, bc, grid = 1, 1, n, 1, min(_pow2(n), _CHUNK), (1,) * len(work)
    else:
        p, r, c, br, bc, grid = _blocking(tuple(x.shape), bf)
    n_r, n_c = -(-r // br), -(-c // bc)
    codes = torch.empty(x.shape, dtype=getattr(torch, el.code_dtype), device=x.device)
    scale8 = bf.scale_format.bits == 8
    scales = torch.empty(math.prod(grid), dtype=torch.uint8 if scale8 else torch.int32, device=x.device)
    rt, ce = _kernel_args(bf, mode, stochastic_bits)
    mids = _midpoints(el, x.device) if book else tamax
    ce.update(
        POW2=bf.pow2,
        TAMAX=per_tensor or bf.rule.needs_tensor_amax,
        ONE_SCALE=per_tensor,
        RAND=int(rand_kind),
        SCALE8=scale8,
        NMID=256,
        NMID_LOG2=8 if book else 0,
        BRP=_pow2(br),
        BCP=_pow2(bc),
    )
    with np.errstate(all="ignore"):  # the interpreter's numpy float ops (inf * 0 and the like)
        _launch_kernel(
            mod.block_kernel,
            (p * n_r * n_c,),
            interp,
            xv,
            rand,
            codes,
            scales,
            tamax,
            mids,
            r,
            c,
            n_r,
            n_c,
            br,
            bc,
            **rt,
            **ce,
            **extra,
        )
    if not scale8:
        scales = scales.view(torch.uint32)
    tensor_scale = None
    if bf.rule is ScaleRule.NVFP4:
        tensor_scale = _nvfp4_tensor_scale(int(tamax[0].item()))
    return BlockCodesT(codes, scales.reshape(grid), tensor_scale)


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
        block = min(_pow2(m), _CHUNK)
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


def _midpoints(book: Codebook, device: Any) -> Any:
    """The nearest-entry thresholds (:func:`fpsim.emulate.scale_rules.nearest_thresholds`: the
    float32 midpoints, one float32 lower where the lower entry is odd) padded with +inf to 256."""
    torch = require_torch()
    c = book.table
    mid = np.full(256, np.inf, np.float32)
    mid[: c.size - 1] = nearest_thresholds(c)
    return torch.from_numpy(mid).to(device)


def _kernel_args(bf: BlockFormat, mode: RoundMode, nbits: int) -> tuple[dict, dict]:
    """Runtime (int32) and constexpr arguments of block_kernel."""
    el = bf.element
    names = ["nbits", "rmask", "m", "emin", "code_max", "inf_lim", "ftz_lim", "mant_one", "code_inf"]
    names += ["code_nan", "sign_shift", "fb", "ibits", "imask", "max_int", "lo", "clamp"]
    if isinstance(el, Codebook):
        ert, ece = encode_args(IntFormat("int8_symmetric", 8, symmetric=True), mode, True, False, nbits)
        ert["max_int"] = len(el.values) - 1
    else:
        ftz = not getattr(el, "subnormals", True)
        ert, ece = encode_args(el, mode, True, ftz, nbits)
    rt = {k: ert[k] for k in names}
    e4m3 = FORMATS["float8_e4m3fn"]
    sr, _ = encode_args(e4m3, RoundMode.NEAREST_EVEN, True, False, 32)
    for k in ["m", "emin", "code_max", "mant_one", "code_nan", "sign_shift"]:
        rt["s_" + k] = sr[k]
    dr, _ = decode_args(e4m3)
    rt.update({k: dr[k] for k in dr if k not in ("d_fb", "d_ibits", "d_imask")})
    emax = math.frexp(bf.elem_max)[1] - 1
    m = el.mantissa_bits if isinstance(el, Format) else (el.bits - 2 if isinstance(el, IntFormat) else 0)
    rt.update(
        elem_max_bits=_bits32(bf.elem_max),
        eps_bits=_bits32(bf.eps),  # codebooks: unused (no clamp of the absmax)
        inv_max_bits=_bits32(1 / bf.elem_max),
        emax=emax,
        even_inc=i32(1 << (22 - m)),
    )
    ce = {k: ece[k] for k in ("IS_INT", "MODE", "ENC", "SIGNED", "HAS_ZERO", "OVF")}
    ce["RULE"] = int(rule_code(bf))
    ce["IGNORE_NAN"] = bf.amax_ignores_nan
    return rt, ce
