"""Quantize-dequantize of one float32 tensor on the compiled backend, in one pass.

:func:`quantize_values` gives the float32 values that ``decode_array(encode_array(x))`` of
:mod:`fpsim.emulate.blocks` (a block format) or :mod:`fpsim.emulate.element` (an element
format) gives, without materializing the element codes: the blocks' amaxes in one compiled
pass (:func:`fpsim._compiled.operand.block_amax`; NVFP4's tensor amax is their largest), their
factors and decode scales by the numpy rules (:func:`fpsim.emulate.scale_rules.block_factors`,
one value per block), then the elements scaled, cast (stochastic words given, or drawn from a
seed inside the loop) and decoded in one compiled pass (:mod:`fpsim._compiled.operand`). What
depends only on the format and the shape (the blocking, the loops' parameters, the scale
table) is worked out once and kept. The emulated GEMMs of :mod:`fpsim.train` read their
operands this way on the compiled backend.

Covered: element formats of at most 16 bits and block formats of such elements with a
non-codebook scale rule whose blocks span at most the last two axes (every preset GEMM recipe's
format); :func:`uncovered` names what is not, and the caller runs the unfused encode and decode
instead, saying so (:func:`fpsim._compiled.fallback`). ``tests/emulate/test_fused.py``
compares every value with the numpy tier's, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _compiled
from ..formats import AnyFormat, BlockFormat, Codebook, Format, IntFormat, RoundMode
from ..formats.codes import FactorKind
from . import element
from .blocks import block_geometry
from .random import SEED_MULTIPLIER
from .scale_rules import block_factors

__all__ = ["covers", "quantize_values", "uncovered"]

_F32 = np.float32
_NONE32 = _compiled.frozen(np.zeros(0, np.float32))
_NONE64 = _compiled.frozen(np.zeros(0, np.float64))
_NOWORDS = np.zeros(0, np.uint32)


def uncovered(fmt: AnyFormat | BlockFormat) -> str | None:
    """What of ``fmt`` (an element or block format) the compiled loops do not cover, or None
    where :func:`quantize_values` runs it."""
    if isinstance(fmt, BlockFormat):
        el = fmt.element
        if isinstance(el, Codebook):
            return f"{fmt.name}: codebook elements in a fused quantize-dequantize"
        if el.bits > 16:
            return f"{fmt.name}: elements of {el.bits} bits in a fused quantize-dequantize"
        sf = fmt.scale_format
        if sf.bits > 16 and sf.name != "float32":
            return f"{fmt.name}: scales in {sf.name} in a fused quantize-dequantize"
        if fmt.block is not None and not fmt.flatten and len(fmt.block) > 2:
            return f"{fmt.name}: blocks over {len(fmt.block)} axes in a fused quantize-dequantize"
        return None
    if isinstance(fmt, (Format, IntFormat)):
        if fmt.bits > 16:
            return f"{fmt.name}: formats of {fmt.bits} bits in a fused quantize-dequantize"
        return None
    return f"{type(fmt).__name__} in a fused quantize-dequantize"


def covers(fmt: AnyFormat | BlockFormat) -> bool:
    """Whether :func:`quantize_values` runs ``fmt``; where not, said so once (a
    :class:`fpsim.FallbackWarning` naming what :func:`uncovered` names), and the caller runs
    the unfused encode and decode."""
    why = uncovered(fmt)
    if why is not None:
        _compiled.fallback(why, "its unfused encode and decode run it")
    return why is None


@dataclass(frozen=True)
class _Plan:
    """What the loops take for one format and shape (see :func:`_plan`)."""

    fmt: AnyFormat | BlockFormat
    layout: tuple[int, ...] | None  # block_ids' (cols, bc, rows, br, kind, dkind); None: element
    blocks: int
    params: tuple[int, ...]
    table: np.ndarray
    ignore_nan: bool = False
    pow2: bool = False
    tensor_amax: bool = False  # the rule takes the tensor's amax: the largest block amax (no NaN)
    scale_table: np.ndarray | None = None  # the scale format's decode_table; None: float32 bits


_PLANS: dict[tuple[int, tuple[int, ...]], _Plan] = {}
_MAX_PLANS = 4096


def _plan(fmt: AnyFormat | BlockFormat, shape: tuple[int, ...]) -> _Plan:
    """:func:`_make_plan`, kept per format object and shape (looked up by the object's id,
    which the kept plan holds on to: hashing a format costs more than a small cast)."""
    plan = _PLANS.get((id(fmt), shape))
    if plan is None or plan.fmt is not fmt:
        why = uncovered(fmt)
        if why is not None:
            raise ValueError(f"quantize_values does not cover {why}")
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[(id(fmt), shape)] = _make_plan(fmt, shape)
    return plan


def _make_plan(fmt: AnyFormat | BlockFormat, shape: tuple[int, ...]) -> _Plan:
    """The blocking of ``shape`` under ``fmt`` (:func:`fpsim.emulate.blocks.block_geometry`,
    whose ValueErrors it raises: a ragged block without padding, too few axes) as the
    compiled loops number blocks, and the element parameters and value table."""
    if not isinstance(fmt, BlockFormat):
        ftz = isinstance(fmt, Format) and not fmt.subnormals
        return _Plan(fmt, None, 0, element.loop_params(fmt, False, ftz), element.loop_table(fmt))
    work, blk = block_geometry(shape, fmt)
    if any(b != 1 for b in blk[:-2]):
        raise ValueError(f"{fmt.name}: blocks over more than the last two axes ({uncovered(fmt)})")
    cols, bc = work[-1], blk[-1]
    rows, br = (work[-2], blk[-2]) if len(work) > 1 else (1, 1)
    rule = fmt.rule
    layout = (cols, bc, rows, br, int(rule.factor), int(rule.decode))
    count = (np.prod(work) // (cols * rows)) * -(-cols // bc) * -(-rows // br)
    el = fmt.element
    params = element.loop_params(el, True, isinstance(el, Format) and not el.subnormals)
    pow2 = rule.factor is FactorKind.POW2
    ignore = fmt.amax_ignores_nan
    tensor = rule.needs_tensor_amax and ignore
    sf = fmt.scale_format
    stable = element.decode_table(sf) if sf.bits <= 16 else None
    return _Plan(fmt, layout, int(count), params, element.loop_table(el), ignore, pow2, tensor, stable)


def quantize_values(
    x: np.ndarray,
    fmt: AnyFormat | BlockFormat,
    mode: RoundMode,
    *,
    rand: np.ndarray | None = None,
    seed: int | None = None,
) -> np.ndarray:
    """``x`` (float32) stored in ``fmt`` and read back, as float32 of ``x``'s shape: the values
    of ``decode_array(encode_array(x, fmt, mode, ...))`` of the numpy tier (block formats:
    elements cast saturating, ragged blocks as the format's ``pad`` says).

    Args:
        x: a float32 numpy array.
        fmt: an element format of at most 16 bits or a block format :func:`uncovered` passes.
        mode: the rounding of the elements.
        rand: the uint32 words of a stochastic rounding, one per element of ``x``.
        seed: instead of ``rand``, the words ``fpsim.emulate.random.random_bits_at(seed, 0,
            x.size)`` (drawn inside the loop, never materialized).

    Raises:
        ValueError: ``fmt`` is not covered, the blocks do not fit ``x``'s shape, or stochastic
            rounding without exactly one of ``rand`` and ``seed`` (or words of another size).
        TypeError: ``x`` is not float32.
    """
    if not isinstance(x, np.ndarray) or x.dtype != _F32:
        raise TypeError(f"quantize_values takes a float32 numpy array, got {getattr(x, 'dtype', type(x))}")
    words, mix = _words(x, mode, rand, seed)
    plan = _plan(fmt, x.shape)
    xs = _compiled.frozen(x)
    out = np.empty(xs.size, _F32)
    if xs.size == 0:
        return out.reshape(x.shape)
    loops = _compiled.load_operand()
    if plan.layout is None:
        loops.element_values(xs, plan.params, mode.code, 32, mix, words, plan.table, out)
        return out.reshape(x.shape)
    amax = np.zeros(plan.blocks, _F32)
    loops.block_amax(xs, plan.layout, plan.ignore_nan, amax)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        # (NVFP4's tensor amax: the NaN-free block amaxes' largest, as block_factors would reduce them)
        tensor_amax = float(amax.max()) if plan.tensor_amax else None
        factor, scales, tensor = block_factors(amax, fmt, tensor_amax, backend=_compiled.Backend.COMPILED)
        # the scales decoded as element.decode_array does it (codes from the rule: in range)
        dscale = scales.view(_F32) if plan.scale_table is None else plan.scale_table[scales]
    dscale = _compiled.frozen(dscale, _F32)
    f32 = _NONE32 if plan.pow2 else _compiled.frozen(factor, _F32)
    f64 = _compiled.frozen(factor, np.float64) if plan.pow2 else _NONE64
    tscale = _F32(tensor if tensor is not None else 1)
    loops.block_values(
        xs, plan.layout, f32, f64, dscale, tscale, plan.params, mode.code, 32, mix, words, plan.table, out
    )
    return out.reshape(x.shape)


def _words(x: np.ndarray, mode: RoundMode, rand: np.ndarray | None, seed: int | None):
    """The loops' words (an empty array where they draw them) and SplitMix64 offset."""
    if mode is not RoundMode.STOCHASTIC:
        if rand is not None or seed is not None:
            raise ValueError(f"random words or a seed are for stochastic rounding, not {mode.value}")
        return _NOWORDS, np.uint64(0)
    if (rand is None) == (seed is None):
        raise ValueError("stochastic rounding takes exactly one of rand (the words) and seed")
    if seed is not None:
        return _NOWORDS, np.uint64((seed * SEED_MULTIPLIER) % (1 << 64))
    if not isinstance(rand, np.ndarray) or rand.dtype != np.uint32 or rand.size != x.size:
        raise ValueError(
            f"rand must be uint32 words, one per element ({x.size}), got "
            f"{getattr(rand, 'dtype', type(rand))} of size {getattr(rand, 'size', '?')}"
        )
    words = np.ascontiguousarray(rand).reshape(-1)
    return (words if words.flags.writeable else words.copy()), np.uint64(0)
