"""The arguments of the block kernel (``_blocks_kernel.py``) as typed tuples.

:func:`fpsim.kernels.blocks.encode_blocks` launches ``block_kernel`` with the tiling of the
tensor (:class:`BlockGrid`), the element format and NVFP4's E4M3 scale format as
:class:`~fpsim.formats.params.FormatParams` (built by
:func:`~fpsim.kernels.format_args.element_args` and
:func:`~fpsim.kernels.format_args.format_args`, as the optimizer kernel's states), the scale
rule's numbers (:func:`~fpsim.kernels.format_args.scale_args`) and every code path as one
constexpr :class:`BlockPaths`. The tiling follows :func:`fpsim.emulate.blocks.block_geometry`;
tested through the kernel, which is compared bit for bit with
:func:`fpsim.emulate.blocks.encode_blocks` (tests/kernels/test_block_kernels.py).

This module imports neither torch nor triton.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from fpsim.emulate.blocks import block_geometry
from fpsim.formats import BlockFormat, RoundMode, ScaleRule, get_format
from fpsim.formats.params import FormatParams

from ._codes import Random, rule_code
from .format_args import (
    FormatPaths,
    ScaleArgs,
    element_args,
    format_args,
    rounding_codes,
    scale_args,
)

__all__ = ["BlockArgs", "BlockGrid", "BlockPaths", "Tiling", "block_args", "tiling"]


class BlockGrid(NamedTuple):
    """The tensor as ``P`` matrices of ``rows x cols`` elements in blocks of ``br x bc``
    (runtime ints; the block count along each axis beside them).

    Attributes:
        rows, cols: each matrix's shape.
        n_r, n_c: blocks along the rows and the columns (``ceil(rows / br)``, ``ceil(cols / bc)``).
        br, bc: the block's shape.
    """

    rows: int
    cols: int
    n_r: int
    n_c: int
    br: int
    bc: int


class Tiling(NamedTuple):
    """A launch of the block kernel over a tensor.

    Attributes:
        grid: the :class:`BlockGrid`.
        programs: program instances (one per block).
        scales: the shape of the scale codes (the emulator's grid of blocks).
        BRP, BCP: the tile, the block's shape rounded up to powers of two (constexprs).
    """

    grid: BlockGrid
    programs: int
    scales: tuple[int, ...]
    BRP: int
    BCP: int


class BlockPaths(NamedTuple):
    """The block kernel's code paths (a ``tl.constexpr`` tuple).

    Attributes:
        RULE: the scale rule, a :class:`~fpsim.kernels._codes.Rule` (CODEBOOK for codebooks).
        IGNORE_NAN: the block amax skips NaN (:attr:`~fpsim.formats.BlockFormat.amax_ignores_nan`).
        POW2: Transformer Engine scales rounded down to a power of two.
        ONE_SCALE: one scale for the whole tensor (the amax of a first pass).
        SCALE8: the scales are 8-bit codes (else float32 bits).
        RAND: the source of stochastic rounding's words, a :class:`~fpsim.kernels._codes.Random`
            (NONE or LOADED).
        MODE: the elements' rounding, a :attr:`~fpsim.formats.RoundMode.code`.
        OVF: where the elements' overflow goes, an :class:`~fpsim.kernels._codes.Overflow`.
        FMT: the element format's :class:`~fpsim.kernels.format_args.FormatPaths`.
        S8: NVFP4's E4M3 scale format's :class:`~fpsim.kernels.format_args.FormatPaths`.
    """

    RULE: int
    IGNORE_NAN: bool
    POW2: bool
    ONE_SCALE: bool
    SCALE8: bool
    RAND: int
    MODE: int
    OVF: int
    FMT: FormatPaths
    S8: FormatPaths


class BlockArgs(NamedTuple):
    """The recipe's arguments of ``block_kernel``, named as its parameters.

    Attributes:
        fmt: the element format's numbers (saturating; placeholders for codebooks).
        scale: the scale rule's numbers.
        s8: NVFP4's E4M3 scale format's numbers (saturating; passed for every rule).
        P: the code paths.
    """

    fmt: FormatParams
    scale: ScaleArgs
    s8: FormatParams
    P: BlockPaths


_E4M3 = get_format(ScaleRule.NVFP4.traits.scale_format)


def block_args(bf: BlockFormat, mode: RoundMode, rand: Random) -> BlockArgs:
    """The tuples of recipe ``bf`` with its elements rounded in ``mode``.

    E8M0 rules shift the element's ``emin`` by the block exponent, which may take it below
    float32's normal range: their element paths take ``EMIN_LOW``
    (:func:`fpsim.kernels._intcast.encode_float`).
    """
    rule = rule_code(bf)
    fa, fp = element_args(bf)
    if bf.rule.traits.scale_format == "float8_e8m0fnu":
        fp = fp._replace(EMIN_LOW=True)
    mode_code, ovf = rounding_codes(bf.element, mode)  # codebooks: nearest-even, unread
    s8, s8_paths = format_args(_E4M3, saturate=True)
    paths = BlockPaths(
        RULE=int(rule),
        IGNORE_NAN=bf.amax_ignores_nan,
        POW2=bf.pow2,
        ONE_SCALE=bf.block is None,
        SCALE8=bf.scale_format.bits == 8,
        RAND=int(rand),
        MODE=mode_code,
        OVF=ovf,
        FMT=fp,
        S8=s8_paths,
    )
    return BlockArgs(fa, scale_args(bf), s8, paths)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def tiling(shape: tuple[int, ...], bf: BlockFormat, chunk: int) -> Tiling:
    """The launch of ``bf``'s block kernel over a tensor of ``shape``: blocks of the last one
    or two axes (:func:`fpsim.emulate.blocks.block_geometry`), flattened blocks, or one scale
    per tensor in programs of ``chunk`` elements (a power of two).

    Raises:
        NotImplementedError: blocks over more than two axes.
    """
    work, blk = block_geometry(shape, bf)
    grid = tuple(-(-t // b) for t, b in zip(work, blk))
    if bf.block is None:
        n = math.prod(shape)
        p, r, c, br, bc, grid = 1, 1, n, 1, min(_pow2(n), chunk), (1,) * len(work)
    elif bf.flatten:
        p, r, c, br, bc = 1, 1, work[0], 1, blk[0]
    elif len(bf.block) == 1:
        p, r, c, br, bc = math.prod(work[:-1]), 1, work[-1], 1, blk[-1]
    elif len(bf.block) == 2:
        p, r, c, br, bc = math.prod(work[:-2]), work[-2], work[-1], blk[-2], blk[-1]
    else:
        k = len(bf.block)
        raise NotImplementedError(f"{bf.name}: blocks over {k} axes are not supported by the kernels")
    n_r, n_c = -(-r // br), -(-c // bc)
    return Tiling(BlockGrid(r, c, n_r, n_c, br, bc), p * n_r * n_c, grid, _pow2(br), _pow2(bc))
