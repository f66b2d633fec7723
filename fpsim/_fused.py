"""Fused compiled step: Adam/AdamW with both moments in 8-bit blocks.

The replay's update of one tensor with 8-bit block states (module doc of :mod:`fpsim.replay`,
semantics 2 and 3) is, on the generic path, five passes over memory: decode both moments,
:meth:`fpsim.optim.Adam.step`, encode and decode each new moment
(:func:`fpsim.scaling.encode_decode_blocks`), and the state statistics. :func:`adam_block_step`
does all of it in one compiled loop (:mod:`fpsim._fast`, numba) that works through the
tensor in cache-sized tiles of whole blocks and gives the generic path's bits: the same
parameters, codes and scales (NaN scales by class), the same zero counts, and the same
float64 error sums up to their summation order (tests/test_fast.py compares the two paths,
and both with numpy).

It applies when numba is installed, the optimizer is :class:`fpsim.optim.Adam` or
``AdamW``, and both moments of the tensor are quantized, with blocks of one size along the
flattened tensor, by one of: a codebook rounded to the nearest entry (the bitsandbytes
dynamic maps, ``bnb_dynamic8_block256`` ...), linear absmax INT8 (``int8_block256``,
``int8_block2048``) or float8_e4m3fn with an FP32 absmax scale (``fp8_e4m3_block256``,
torchao's AdamWFp8). Everything else takes the generic path. The stored codes and scales are
updated in place.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from . import _fast, emulate, optim
from .blockformat import RECIPES, BlockFormat, Codebook, ScaleRule
from .formats import get_format
from .rounding import RoundMode
from .scaling import BlockCodes, _compiled_codebook, _geometry, _nearest_buckets

__all__ = ["FusedStep", "adam_block_step", "decode_state", "encode_state"]

_F32 = np.float32
_MOMENTS = ("exp_avg", "exp_avg_sq")


class FusedStep(NamedTuple):
    """The FP32 result of the step (before the master rounding), the new stored moments, and
    per moment ``(nonzero, zeroed, sum (stored - ref)^2, sum ref^2)`` (see ``replay._Stats``)."""

    p: np.ndarray
    states: dict[str, BlockCodes]
    stats: dict[str, tuple[int, int, float, float]]


_E4M3 = get_format("float8_e4m3fn")
_INT8 = RECIPES["int8_block256"].element  # int8, symmetric (-127..127)
_DUMMY = (np.zeros(1, np.uint8), np.zeros(1, _F32))  # bucket tables of kinds without them


class _State(NamedTuple):
    """How the kernel stores one moment: kind 0 codebook, 1 int8 linear, 2 float8_e4m3fn."""

    kind: int
    block: int
    table: np.ndarray  # float32 value of each code
    base: np.ndarray
    thr: np.ndarray
    eps: np.float32
    elem_max: np.float32


def _state(bf: Any, shape: tuple) -> _State | None:
    """The kernel's description of block recipe ``bf`` for a tensor of ``shape``, or None where
    the kernel does not cover it."""
    if not isinstance(bf, BlockFormat) or len(_geometry(shape, bf)[0]) != 1 or not math.prod(shape):
        return None
    block = bf.block[0] if bf.block is not None else math.prod(shape)
    if isinstance(bf.element, Codebook):
        if not _compiled_codebook(bf, RoundMode.NEAREST_EVEN, _geometry(shape, bf)[0]):
            return None
        table = bf.element.table
        return _State(0, block, table, *_nearest_buckets(table), _F32(0), _F32(1))
    if bf.rule is not ScaleRule.ABSMAX or bf.scale_format.name != "float32":
        return None
    kind = 1 if bf.element == _INT8 else 2 if bf.element == _E4M3 else 0
    if not kind:
        return None
    table = emulate.decode(np.arange(256, dtype=np.uint8), bf.element).astype(_F32)
    return _State(kind, block, table, *_DUMMY, _F32(bf.eps), _F32(bf.elem_max))


def encode_state(bf: Any, x: np.ndarray) -> BlockCodes | None:
    """``encode_blocks(x, bf)`` by the kernel's state encoder (same codes and scales, NaN by
    class), or None where the kernel does not cover ``bf`` or ``x`` is not float32."""
    st = _state(bf, np.shape(x)) if _fast.available() else None
    flat = _fast.flat32(x) if st is not None else None
    if flat is None:
        return None
    n = flat[0].size
    codes, scales, values = np.empty(n, np.uint8), np.empty(-(-n // st.block), _F32), np.empty(n, _F32)
    _fast.kernel("encode_blocks8")(
        st.kind, flat[0], st.block, st.base, st.thr, st.table, st.eps, st.elem_max, codes, scales, values
    )
    return BlockCodes(codes.reshape(x.shape), scales.view(np.uint32), None)


def decode_state(bf: Any, enc: Any) -> np.ndarray | None:
    """``decode_blocks(enc, bf)`` (table[code] * scale) for what :func:`encode_state` covers."""
    if not isinstance(enc, BlockCodes) or not _fast.available():
        return None
    st = _state(bf, enc.codes.shape)
    if st is None or enc.codes.dtype != np.uint8 or enc.scales.shape != (-(-enc.codes.size // st.block),):
        return None
    out = np.empty(enc.codes.shape, _F32)
    codes = np.ascontiguousarray(enc.codes).reshape(-1)
    scales = np.ascontiguousarray(enc.scales).view(_F32).reshape(-1)
    _fast.kernel("codebook_decode")(codes, st.table, scales, st.block, out.reshape(-1))
    return out


def _writable(a: np.ndarray, dtype) -> bool:
    return a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable


def adam_block_step(
    optimizer: Any,
    formats: dict[str, Any],
    stored: dict[str, Any],
    p: np.ndarray,
    g: np.ndarray,
    lr: float,
    t: int,
    ref_states: dict[str, np.ndarray],
) -> FusedStep | None:
    """One tensor's update in one compiled pass, or None where it does not apply (module doc).

    Args:
        optimizer: the replay's optimizer.
        formats: the state formats by name (``"exp_avg"``, ``"exp_avg_sq"``).
        stored: the stored moments (:class:`fpsim.BlockCodes`), updated in place.
        p, g: the master values and the (unscaled) gradient, float32 of one shape.
        lr, t: learning rate and 1-based update count.
        ref_states: the FP32 reference's new moments, for the statistics.
    """
    if not (_fast.available() and optim._sqrt is np.sqrt and isinstance(optimizer, optim.Adam)):
        return None
    if type(optimizer).step is not optim.Adam.step:
        return None
    kinds = [_state(formats[st], p.shape) for st in _MOMENTS]
    if None in kinds or kinds[0].block != kinds[1].block:
        return None
    arrays = _fast.flat32(p, g, ref_states["exp_avg"], ref_states["exp_avg_sq"])
    if arrays is None or g.shape != p.shape:
        return None
    enc = [stored[st] for st in _MOMENTS]
    if not all(isinstance(e, BlockCodes) for e in enc):
        return None
    codes = [e.codes if _writable(e.codes, np.uint8) else np.array(e.codes, np.uint8) for e in enc]
    scales = [e.scales if _writable(e.scales, np.uint32) else np.array(e.scales, np.uint32) for e in enc]
    p_out = np.empty(p.shape, _F32)
    counts, sums = np.zeros(4, np.int64), np.zeros(4)
    flat_p, flat_g, m_ref, v_ref = arrays
    m, v = kinds
    _fast.kernel("adam_blocks")(
        flat_p,
        flat_g,
        codes[0].reshape(-1),
        scales[0].reshape(-1).view(_F32),
        codes[1].reshape(-1),
        scales[1].reshape(-1).view(_F32),
        m.block,
        m.kind,
        m.table,
        m.base,
        m.thr,
        m.eps,
        m.elem_max,
        v.kind,
        v.table,
        v.base,
        v.thr,
        v.eps,
        v.elem_max,
        p_out.reshape(-1),
        m_ref,
        v_ref,
        counts,
        sums,
        *optimizer.scalars(lr, t),
    )
    states = {st: BlockCodes(c, s, None) for st, c, s in zip(_MOMENTS, codes, scales)}
    stats = {
        st: (int(counts[2 * i]), int(counts[2 * i + 1]), float(sums[2 * i]), float(sums[2 * i + 1]))
        for i, st in enumerate(_MOMENTS)
    }
    return FusedStep(p_out, states, stats)
