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

:func:`quantize_tally` also gives what an operand's statistics take (:class:`Tally`): the
block loop counts the saturated elements from their codes, and one more compiled pass over the
input and the values (:func:`tally`) the amax, underflows, squared errors and each block's
magnitude range; :func:`fpsim.train.opstats.fused_stats` turns it into the numpy tier's
:class:`~fpsim.train.opstats.OperandStats`, field by field (``tests/train/test_operand_stats_fused.py``).

Covered: element formats of at most 16 bits and block formats of such elements with a
non-codebook scale rule whose blocks span at most the last two axes (every preset GEMM recipe's
format); :func:`uncovered` names what is not, and the caller runs the unfused encode and decode
instead, saying so (:func:`fpsim._compiled.fallback`). ``tests/emulate/test_fused.py``
compares every value with the numpy tier's, bit for bit.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from .. import _compiled
from ..formats import AnyFormat, BlockFormat, Codebook, Format, IntFormat, RoundMode
from ..formats.codes import FactorKind
from . import element
from .blocks import block_geometry
from .random import SEED_MULTIPLIER
from .scale_rules import block_factors

__all__ = [
    "Tally",
    "at_max_codes",
    "at_max_table",
    "covers",
    "mean_square",
    "quantize_tally",
    "quantize_values",
    "tally",
    "uncovered",
]

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
    at_max: np.ndarray | None = None  # the (two) element codes of magnitude elem_max (at_max_codes)
    grid: tuple[int, ...] = ()  # the scales' shape (encode_array's BlockCodes.scales)


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
    grid = tuple(-(-t // b) for t, b in zip(work, blk))
    top = at_max_codes(el, fmt.elem_max)
    return _Plan(
        fmt, layout, int(count), params, element.loop_table(el), ignore, pow2, tensor, stable, top, grid
    )


def at_max_table(el: Format | IntFormat, largest: float) -> np.ndarray:
    """Per code of ``el`` (at most 16 bits), 1 where the code's value has magnitude ``largest``,
    as the numpy tier decides it: ``np.abs(element.decode_array(codes, el)) == largest``."""
    codes = np.arange(1 << el.bits, dtype=np.int64)
    return (np.abs(element.decode_array(codes, el)) == largest).astype(np.uint8)


_NO_CODE = np.uint64(0xFFFFFFFFFFFFFFFF)  # above every code of at most 16 bits


def at_max_codes(el: Format | IntFormat, largest: float) -> np.ndarray:
    """The codes :func:`at_max_table` marks, as two uint64 (one repeated, or the value no code
    has, where fewer: the loops compare each code with both).

    Raises:
        ValueError: more than two codes of that magnitude (no float or integer format has them).
    """
    kept = _AT_MAX.get((id(el), largest))
    if kept is not None and kept[0] is el:
        return kept[1]
    codes = np.flatnonzero(at_max_table(el, largest)).astype(np.uint64)
    if codes.size > 2:
        raise ValueError(f"{el.name}: {codes.size} codes of magnitude {largest}, the loops compare two")
    out = np.concatenate([codes, np.full(2 - codes.size, _NO_CODE, np.uint64)])
    if len(_AT_MAX) >= _MAX_PLANS:
        _AT_MAX.clear()
    _AT_MAX[(id(el), largest)] = (el, out)  # (kept per format object, as the plans are)
    return out


_AT_MAX: dict[tuple[int, float], tuple[Format | IntFormat, np.ndarray]] = {}


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
    return _quantize(x, fmt, mode, rand, seed, False)[0]


@dataclass(frozen=True)
class Tally:
    """What the statistics of a quantized operand take from one compiled pass over the input
    ``x`` and its values ``q`` (:func:`quantize_tally`, :func:`tally`), each decided as
    :func:`fpsim.train.opstats.operand_stats` decides it on numpy.

    Attributes:
        amax: the largest ``|x|``, NaN skipped (:func:`fpsim.formats.amax.amax_ignore_nan`).
        underflow: the elements with ``x != 0`` and ``q == 0``.
        saturated: the elements whose code has the format's largest magnitude and ``|x| > |q|``
            (block formats, delayed scaling), or ``|x|`` above the format's largest value
            (element formats).
        numel: the elements.
        mse: :func:`mean_square` of ``(f64(x) - f64(q))**2`` per element (a float64 array of
            ``x``'s shape in C order).
        scale_inv: the decode scales as float64 in the shape of the BlockCodes' scales (NVFP4:
            times the tensor scale); None without scales.
        widest: ``(max, min)`` magnitude of the finite nonzero elements of the first block with
            the largest ``max / min`` (blocks of :func:`fpsim.train.opstats.max_block_dynamic_range`),
            or None where no block has such an element.
    """

    amax: float
    underflow: int
    saturated: int
    numel: int
    mse: float
    scale_inv: np.ndarray | None
    widest: tuple[float, float] | None


def quantize_tally(
    x: np.ndarray,
    fmt: AnyFormat | BlockFormat,
    mode: RoundMode,
    *,
    rand: np.ndarray | None = None,
    seed: int | None = None,
) -> tuple[np.ndarray, Tally]:
    """:func:`quantize_values` (the same values, the same arguments and errors) and its
    :class:`Tally`: the block loop also counts the saturated elements (codes of the element
    format's largest magnitude, :func:`at_max_codes`, whose input is above their value), one
    more compiled pass (:func:`tally`) the rest. ``tests/train/test_operand_stats_fused.py``
    compares the statistics with the numpy tier's."""
    out, sat, ranges, dscale, tensor, plan, xs = _quantize(x, fmt, mode, rand, seed, True)
    if plan.layout is None:
        return out, _tally(xs, out, _NOCODES, _NOTOP, float(fmt.max), None, None, 0)
    s = dscale.astype(np.float64)
    if tensor is not None:
        s = s * tensor
    return out, _tally(xs, out, _NOCODES, _NOTOP, math.nan, ranges, s.reshape(plan.grid), int(sat[0]))


def tally(
    x: np.ndarray,
    q: np.ndarray,
    *,
    codes: np.ndarray | None = None,
    at_max: np.ndarray | None = None,
    limit: float = math.inf,
    scale_inv: np.ndarray | None = None,
) -> Tally:
    """The :class:`Tally` of float32 ``x`` quantized to float32 ``q`` (same shape), the whole
    tensor one block of the dynamic range: saturated where the element code (``codes``,
    unsigned integers of ``x``'s shape) is one of ``at_max`` (:func:`at_max_codes`) and
    ``|x| > |q|``, or without codes where ``|x| > limit``.

    Raises:
        TypeError: ``x`` or ``q`` not float32, of different shapes, or codes that are not
            unsigned integers of that shape, or without ``at_max``.
    """
    if not isinstance(x, np.ndarray) or not isinstance(q, np.ndarray):
        raise TypeError(f"tally takes numpy arrays, got {type(x).__name__}, {type(q).__name__}")
    if x.dtype != _F32 or q.dtype != _F32 or x.shape != q.shape:
        got = f"{x.dtype}{x.shape}, {q.dtype}{q.shape}"
        raise TypeError(f"tally takes float32 arrays of one shape, got {got}")
    if codes is None:
        return _tally(_compiled.frozen(x), q, _NOCODES, _NOTOP, float(limit), None, scale_inv, 0)
    if (
        not isinstance(codes, np.ndarray)
        or codes.dtype.kind != "u"
        or codes.shape != x.shape
        or at_max is None
    ):
        got = f"{getattr(codes, 'dtype', type(codes))}{getattr(codes, 'shape', '')}"
        raise TypeError(f"tally takes unsigned codes of shape {x.shape} and their at_max codes, got {got}")
    top = np.asarray(at_max, np.uint64)
    return _tally(_compiled.frozen(x), q, _compiled.frozen(codes), top, math.nan, None, scale_inv, 0)


def _tally(xs, q, codes, top, limit, ranges, scale_inv, saturated) -> Tally:
    """:func:`tally` of checked arrays (``xs`` flat and read-only, ``q`` in the operand's
    shape): ``ranges`` the blocks' magnitude bits ``(hi, lo)`` block_values found (None: the
    whole tensor one block, found here), ``saturated`` added to the loop's count (NaN
    ``limit``: counted by the caller)."""
    qs = _compiled.frozen(q)
    hi, lo = _fresh_ranges(1) if ranges is None else ranges
    sq, out = _squares(qs.size), np.zeros(4, np.int64)
    if xs.size:
        hf, lf = hi.view(_F32), lo.view(_F32)
        whole = ranges is None
        _compiled.load_operand().tally(
            xs, xs.view(np.uint32), qs, codes, top, limit, whole, sq, hi, lo, hf, lf, out
        )
    k = int(out[3])
    widest = None if k < 0 else (float(hi.view(_F32)[k]), float(lo.view(_F32)[k]))
    amax = float(np.uint32(out[0]).view(_F32))
    mse = mean_square(sq.reshape(q.shape))
    return Tally(amax, int(out[1]), int(out[2]) + saturated, qs.size, mse, scale_inv, widest)


def mean_square(squares: np.ndarray) -> float:
    """The mean of float64 ``squares`` as both tiers' ``mse`` takes it: ``np.mean`` (numpy's
    pairwise summation, in the order of the array's C layout), NaN for none."""
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.mean(squares)) if squares.size else math.nan


_SCRATCH = threading.local()
_SCRATCH_KEPT = 1 << 22  # elements: larger scratch is not kept between calls


def _squares(n: int) -> np.ndarray:
    """A float64 scratch array of ``n`` elements for the squared errors, kept per thread up to
    :data:`_SCRATCH_KEPT` elements: a fresh array of megabytes costs its page faults at each
    call (more than the tally itself). Read before the thread's next tally."""
    if n > _SCRATCH_KEPT:
        return np.empty(n, np.float64)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < n:
        buf = _SCRATCH.buf = np.empty(max(n, 1024), np.float64)
    return buf[:n]


def _fresh_ranges(count: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block the largest and smallest magnitude bits found so far: none (0, 0xFFFFFFFF)."""
    return np.zeros(count, np.uint32), np.full(count, 0xFFFFFFFF, np.uint32)


_NOCODES = _compiled.frozen(np.zeros(0, np.uint8))
_NOSAT = np.zeros(0, np.int64)  # block_values without statistics: nothing counted (never written)
_NORANGE = np.zeros(0, np.uint32)
_NOTOP = np.full(2, _NO_CODE, np.uint64)


def _quantize(x, fmt, mode, rand, seed, track: bool):
    """:func:`quantize_values`; with ``track`` also (block formats) the saturated count (an
    int64 array of one) and the blocks' magnitude ranges (:func:`_tally`), the decode scales
    (float32 per block), the tensor scale, the plan and ``x`` as the loops read it (flat,
    read-only)."""
    if not isinstance(x, np.ndarray) or x.dtype != _F32:
        raise TypeError(f"quantize_values takes a float32 numpy array, got {getattr(x, 'dtype', type(x))}")
    words, mix = _words(x, mode, rand, seed)
    plan = _plan(fmt, x.shape)
    xs = _compiled.frozen(x)
    out = np.empty(xs.size, _F32)
    if xs.size == 0:
        return (
            out.reshape(x.shape),
            np.zeros(1, np.int64),
            _fresh_ranges(0),
            np.zeros(0, _F32),
            None,
            plan,
            xs,
        )
    loops = _compiled.load_operand()
    if plan.layout is None:
        loops.element_values(xs, plan.params, mode.code, 32, mix, words, plan.table, out)
        return out.reshape(x.shape), None, None, None, None, plan, xs
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
    if track:
        sat, (hi, lo), bits = np.zeros(1, np.int64), _fresh_ranges(plan.blocks), xs.view(np.uint32)
    else:
        sat, hi, lo, bits = _NOSAT, _NORANGE, _NORANGE, _NORANGE
    loops.block_values(
        xs, plan.layout, f32, f64, dscale, tscale, plan.params, mode.code, 32, mix, words, plan.table, out,
        plan.at_max, sat, (bits, hi, lo),
    )  # fmt: skip
    return out.reshape(x.shape), sat, (hi, lo), dscale, tensor, plan, xs


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
