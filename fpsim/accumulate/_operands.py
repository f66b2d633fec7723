"""The operands of a reduction: float32 inputs rounded to ``input_format`` (an element format
or a block recipe), the rounding of products, and the block-scaled operands of
:func:`fpsim.accumulate.scaled_matmul` (definitions: the :mod:`fpsim.accumulate` docstring).
"""

from __future__ import annotations

import numpy as np

from ..emulate import element as emulate
from ..emulate.blocks import block_geometry, decode_blocks, encode_blocks
from ..emulate.random import random_bits_at
from ..formats import AnyFormat, BlockFormat, Codebook, IntFormat, RoundMode
from ._accumulator import Rounder, as_f32, decode64
from .spec import Rounding


def round_to(x: np.ndarray, fmt: AnyFormat, mode: RoundMode, rand, nbits: int = 32) -> np.ndarray:
    """``x`` (float64 or float32) rounded to an element format, as float64 (any width).

    Signed float formats with a zero take the accumulator's exact rounding
    (:class:`~fpsim.accumulate._accumulator._Rounder`); other formats go through
    :func:`fpsim.emulate.element.encode` (or ``quantize`` for integer formats).
    """
    if isinstance(fmt, IntFormat):
        q = emulate.quantize(x, fmt, rounding=mode, random_bits=rand, stochastic_bits=nbits)
        return q.astype(np.float64)
    x64 = np.array(x, np.float64, copy=True).reshape(-1)
    r = None if rand is None else np.asarray(rand).reshape(-1)
    if fmt.signed and fmt.has_zero:
        out = Rounder(fmt, mode, nbits, 0).exact(x64, out=x64, rand=r)
    else:
        codes = emulate.encode(x64, fmt, rounding=mode, random_bits=r, stochastic_bits=nbits)
        out = decode64(codes, fmt)
    return out.reshape(np.shape(x))


def _input_words(rounding: Rounding, stream: int | None, shape: tuple) -> np.ndarray | None:
    """The 32-bit words of a stochastic input rounding (stream checked by the spec)."""
    if rounding.mode is not RoundMode.STOCHASTIC:
        return None
    return random_bits_at(stream, 0, int(np.prod(shape))).reshape(shape)


def round_operand(x, rounding: Rounding | None, stream: int | None, name: str) -> np.ndarray:
    """float32 values of an input after its ``input_format`` (element format or block recipe,
    applied as fake quantization); ``stream`` seeds its stochastic words."""
    v = as_f32(x, name)
    if rounding is None:
        return v
    rand = _input_words(rounding, stream, v.shape)
    if isinstance(rounding.format, BlockFormat):
        enc = encode_blocks(v, rounding.format, rounding=rounding.mode, random_bits=rand)
        return decode_blocks(enc, rounding.format)
    return round_to(v, rounding.format, rounding.mode, rand).astype(np.float32)


def product_rounder(rounding: Rounding | None, seed_stream: int | None, n_out: int, nbits: int):
    """``f(t, k, start)``: the exact products ``t`` of step ``k`` of a tile starting at output
    ``start`` rounded to the product format; None for exact products."""
    if rounding is None:
        return None
    fmt, mode = rounding.format, rounding.mode

    def f(t: np.ndarray, k: int, start: int) -> np.ndarray:
        rand = (
            random_bits_at(seed_stream, k * n_out + start, t.size) if mode is RoundMode.STOCHASTIC else None
        )
        return round_to(t, fmt, mode, rand, nbits)

    return f


def segment_scale(seg_info: tuple[int, np.ndarray], c: int) -> np.ndarray:
    """float32 decode scale of every row of an operand on the K segment holding index ``c``."""
    kblock, per_row = seg_info
    return per_row[:, c // kblock]


def blocked_operand(x: np.ndarray, rounding: Rounding, stream: int | None, name: str):
    """A (R, K) operand encoded with a block recipe blocked along K.

    Returns:
        The element values (R, K) as float32, ``(K block length, per-row decode scales
        (R, K blocks))`` and the tensor scale (None unless the recipe has one).
    """
    bf = rounding.format
    if bf.flatten:
        raise ValueError(f"{name}: recipe {bf.name} blocks the flattened tensor, not along K")
    if bf.block is not None and len(bf.block) > 2:
        raise ValueError(f"{name}: recipe {bf.name} has a {len(bf.block)}-D block; need 1-D or 2-D")
    rows = x.shape[0]
    _, (rblock, kblock) = block_geometry(x.shape, bf)
    rand = _input_words(rounding, stream, x.shape)
    enc = encode_blocks(x, bf, rounding=rounding.mode, random_bits=rand)
    el = bf.element
    vals = el.table[enc.codes] if isinstance(el, Codebook) else emulate.decode(enc.codes, el)
    scales = emulate.decode(enc.scales, bf.scale_format).astype(np.float32).reshape(enc.scales.shape)
    per_row = np.repeat(scales.reshape(-(-rows // rblock), -1), rblock, axis=0)[:rows]
    return vals.astype(np.float32), (kblock, per_row), enc.tensor_scale
