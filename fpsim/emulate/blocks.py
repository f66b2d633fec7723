"""Encode and decode with block formats: scales from block maxima, then element casts.

The scale rules themselves (one function per :class:`~fpsim.formats.block.ScaleRule`, from
their sources) are in :mod:`fpsim.emulate.scale_rules`; this module cuts tensors into blocks,
works through them in chunks and runs the compiled loop of nearest-entry codebooks where the
:class:`~fpsim.Backend` is compiled. Tested against bitsandbytes, torchao and values worked
out from the specs by hand.

Blocks: the recipe's block shape covers the trailing axes (or the flattened tensor); a
ragged last block along an axis is allowed when ``pad`` is set and behaves as if padded
with zeros (zeros never raise an amax); its scale covers only the real elements.

The public verbs (:func:`encode_blocks`, :func:`decode_blocks`, :func:`encode_decode_blocks`)
resolve names once; :func:`encode_array`, :func:`decode_array` and
:func:`encode_decode_array` take the resolved recipe, rounding mode and backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _compiled
from .._compiled import Backend
from ..formats import BlockFormat, Codebook, RoundMode, get_format
from ..formats.amax import amax_ignore_nan, amax_propagate_nan
from ..formats.codes import DecodeKind
from . import element
from .random import stochastic_words
from .scale_rules import codebook_codes, nearest_buckets, prescale

__all__ = [
    "BlockCodes",
    "encode_blocks",
    "decode_blocks",
    "encode_decode_blocks",
    "encode_array",
    "decode_array",
    "encode_decode_array",
    "block_geometry",
    "compiled_codebook",
    "nearest_buckets",
    "recipe",
    "float32_input",
]

_F32 = np.float32
_R = RoundMode


@dataclass(frozen=True)
class BlockCodes:
    """Result of encoding with a block format.

    Attributes:
        codes: element codes, the input's shape.
        scales: one scale code per block in the recipe's ``scale_format`` (uint32 float32
            bit patterns, or uint8 E8M0 / E4M3 codes), shaped as the grid of blocks. The
            scale is the *decode* multiplier: value = element value x scale (x
            ``tensor_scale``).
        tensor_scale: NVFP4's float32 per-tensor decode scale ``1 / S_enc``, else None.
    """

    codes: np.ndarray
    scales: np.ndarray
    tensor_scale: float | None = None

    def __repr__(self) -> str:
        """Shapes and dtypes, not the arrays: ``BlockCodes(codes=uint8[4, 256], ...)``."""
        c, s = np.asarray(self.codes), np.asarray(self.scales)
        return (
            f"BlockCodes(codes={c.dtype}{list(c.shape)}, scales={s.dtype}{list(s.shape)}, "
            f"tensor_scale={self.tensor_scale!r})"
        )


def encode_blocks(
    x: Any,
    fmt: str | BlockFormat,
    *,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    random_bits: Any = None,
    rng: np.random.Generator | int | None = None,
    stochastic_bits: int = 32,
    tensor_amax: float | None = None,
    backend: Backend | str = "auto",
) -> BlockCodes:
    """Scale ``x`` block by block and cast the elements (saturating), see the module doc.

    ``tensor_amax``: for per-tensor recipes (``block=None``) and NVFP4, the amax of the
    whole tensor when ``x`` is one chunk of it (fpsim.analysis.metrics streams tensors this way).

    Inputs are converted to float32 first (exact for float16/bfloat16; float64 is rounded
    to nearest), as the systems emulated here take float32 or narrower tensors. Rounding
    applies to the elements; scales follow their rule. Stochastic rounding takes
    ``random_bits`` of ``x``'s shape (or ``rng``), one word per element. ``backend``: where
    the loops run (:class:`~fpsim.Backend`; the same codes either way).
    """
    bf, mode, backend = recipe(fmt), RoundMode.parse(rounding), Backend.resolve(backend)
    x = float32_input(x)
    rand = stochastic_words(np, mode, random_bits, rng, x.shape, stochastic_bits)
    return encode_array(x, bf, mode, backend, rand=rand, nbits=stochastic_bits, tensor_amax=tensor_amax)


def encode_array(
    x: np.ndarray,
    bf: BlockFormat,
    mode: RoundMode,
    backend: Backend,
    *,
    rand: np.ndarray | None = None,
    nbits: int = 32,
    tensor_amax: float | None = None,
) -> BlockCodes:
    """:func:`encode_blocks` of a float32 array with resolved arguments; ``rand``: the checked
    uint32 words of a stochastic rounding (``x``'s shape), else None."""
    work, blk = block_geometry(x.shape, bf)
    blk = _tight(work, blk)
    given_amax = tensor_amax is not None and bf.block is None  # the loop takes amaxes from x
    if not given_amax and compiled_codebook(bf, mode, work, backend):
        return _encode_codebook_compiled(x, bf)
    xb = _to_blocks(x.reshape(work), blk)
    rb = None if rand is None else _to_blocks(np.asarray(rand).reshape(work), blk)
    grid = tuple(xb.shape[0::2])
    rows = _rows_per_chunk(bf, xb)
    if rows < xb.shape[0]:  # whole rows of blocks are independent of each other
        parts = [
            _encode_rows(bf, xb[i : i + rows], None if rb is None else rb[i : i + rows], mode, nbits, backend)
            for i in range(0, xb.shape[0], rows)
        ]
        codes = np.concatenate([c for c, _, _ in parts])
        scales, tensor = np.concatenate([s for _, s, _ in parts]), None
    else:
        codes, scales, tensor = _encode_rows(bf, xb, rb, mode, nbits, backend, tensor_amax)
    return BlockCodes(_from_blocks(codes, work).reshape(x.shape), scales.reshape(grid), tensor)


def compiled_codebook(bf: BlockFormat, mode: RoundMode, work: tuple, backend: Backend) -> bool:
    """Whether the compiled loop of :mod:`fpsim._compiled.loops` runs this encode or decode:
    ``backend`` is :attr:`Backend.COMPILED` and the recipe is a nearest-entry codebook over one
    axis of blocks (the bitsandbytes optimizer states); same bits as numpy
    (tests/replay/test_compiled.py, tests/emulate/test_block_backend.py)."""
    el = bf.element
    return (
        backend is Backend.COMPILED
        and isinstance(el, Codebook)
        and not el.lut_bins
        and mode is _R.NEAREST_EVEN
        and len(work) == 1
        and work[0] > 0
    )


def _encode_codebook_compiled(x: np.ndarray, bf: BlockFormat, values: bool = False):
    """BlockCodes (and with ``values`` their decoded float32 values) in one compiled pass."""
    flat = np.ascontiguousarray(x).reshape(-1)
    b = bf.block[0] if bf.block is not None else flat.size
    codes = np.empty(flat.size, np.uint8)
    amax = np.empty(-(-flat.size // b), _F32)
    vals = np.empty(flat.size if values else 0, _F32)
    base, thr = nearest_buckets(bf.element.table)
    _compiled.load().codebook_encode(flat, b, base, thr, bf.element.table, codes, amax, vals, values)
    enc = BlockCodes(codes.reshape(x.shape), amax.view(np.uint32), None)
    return (enc, vals.reshape(x.shape)) if values else enc


def encode_decode_blocks(
    x: Any, fmt: str | BlockFormat, *, backend: Backend | str = "auto"
) -> tuple[BlockCodes, np.ndarray]:
    """``(encode_blocks(x, fmt), decode_blocks(...))`` (nearest rounding); one pass where a
    compiled loop exists (nearest-entry codebooks over one axis of blocks)."""
    return encode_decode_array(float32_input(x), recipe(fmt), Backend.resolve(backend))


def encode_decode_array(x: np.ndarray, bf: BlockFormat, backend: Backend) -> tuple[BlockCodes, np.ndarray]:
    """:func:`encode_decode_blocks` of a float32 array with resolved arguments."""
    if compiled_codebook(bf, _R.NEAREST_EVEN, block_geometry(x.shape, bf)[0], backend):
        return _encode_codebook_compiled(x, bf, values=True)
    enc = encode_array(x, bf, _R.NEAREST_EVEN, backend)
    return enc, decode_array(enc, bf, backend)


def _decode_codebook_compiled(codes: np.ndarray, scales: Any, bf: BlockFormat) -> np.ndarray:
    flat = np.ascontiguousarray(codes).reshape(-1)
    b = bf.block[0] if bf.block is not None else flat.size
    nb = -(-flat.size // b)
    if np.shape(scales) != (nb,):
        raise ValueError(f"{bf.name}: scales have shape {np.shape(scales)}, the codes need {(nb,)}")
    s = np.ascontiguousarray(element.decode_array(np.asarray(scales), bf.scale_format), _F32).reshape(-1)
    out = np.empty(flat.size, _F32)
    _compiled.load().table_decode(flat, bf.element.table, s, b, out)
    return out.reshape(codes.shape)


def _rows_per_chunk(bf: BlockFormat, xb: np.ndarray) -> int:
    """Rows of blocks (along the first blocked axis) per chunk: whole-tensor temporaries are
    fresh, page-faulted memory that costs more than the arithmetic, so large tensors go
    through in chunks of whole blocks, about 2^16 elements (fastest for every recipe in
    ``benchmarks/bench_blocks.py``; at 2^18 glibc hands float64 temporaries back to the OS
    between chunks and MX encodes ran 3x slower). Per-tensor scales and NVFP4 (a tensor
    scale from the whole amax) take the tensor in one piece."""
    if bf.block is None or bf.rule.needs_tensor_amax:
        return xb.shape[0]
    return max(1, (1 << 16) // max(1, math.prod(xb.shape[1:])))


def _encode_rows(
    bf: BlockFormat, xb, rand, mode: RoundMode, nbits: int, backend: Backend, tensor_amax: float | None = None
):
    """Element codes, scale codes and tensor scale of blocked ``xb`` (see :func:`encode_blocks`);
    the element cast runs where ``backend`` says (:func:`fpsim.emulate.element.encode_array`:
    the compiled loop gives the numpy tier's codes, tests/emulate/test_block_backend.py)."""
    axes = tuple(range(1, xb.ndim, 2))
    # fmaxf reductions skip NaN, torch.amax propagates it (decided on the bits, whatever the NaN)
    amax = (amax_ignore_nan if bf.amax_ignores_nan else amax_propagate_nan)(xb, axis=axes, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if tensor_amax is not None and bf.block is None:
            amax = np.full_like(amax, tensor_amax)
        if isinstance(bf.element, Codebook):
            return codebook_codes(xb, amax, bf.element, mode, rand, nbits)
        v, scales, tensor = prescale(xb, amax, bf, tensor_amax)
        codes = element.encode_array(
            v, bf.element, mode, saturate=True, rand=rand, nbits=nbits, backend=backend
        )
        return codes, scales, tensor


def decode_blocks(
    encoded: BlockCodes, fmt: str | BlockFormat, *, backend: Backend | str = "auto"
) -> np.ndarray:
    """float32 values of ``encoded`` (codes and scales from :func:`encode_blocks`)."""
    return decode_array(encoded, recipe(fmt), Backend.resolve(backend))


def decode_array(encoded: BlockCodes, bf: BlockFormat, backend: Backend) -> np.ndarray:
    """:func:`decode_blocks` with resolved arguments."""
    if not isinstance(encoded, BlockCodes):
        raise TypeError(
            f"decode with {bf.name} needs the BlockCodes that encode returned, got {type(encoded).__name__}"
        )
    codes = np.asarray(encoded.codes)
    work, blk = block_geometry(codes.shape, bf)
    blk = _tight(work, blk)
    if compiled_codebook(bf, RoundMode.NEAREST_EVEN, work, backend) and codes.dtype == np.uint8:
        return _decode_codebook_compiled(codes, encoded.scales, bf)
    cb = _to_blocks(codes.reshape(work), blk)
    grid = tuple(cb.shape[0::2])
    if tuple(encoded.scales.shape) != grid:
        raise ValueError(f"{bf.name}: scales have shape {encoded.scales.shape}, the codes need {grid}")
    keep = [n for g in grid for n in (g, 1)]
    s = element.decode_array(encoded.scales, bf.scale_format).reshape(keep)
    rows = _rows_per_chunk(bf, cb)
    if rows >= cb.shape[0]:
        out = _decode_rows(bf, cb, s, encoded.tensor_scale)
    else:
        out = np.empty(cb.shape, _F32)
        for i in range(0, cb.shape[0], rows):
            out[i : i + rows] = _decode_rows(bf, cb[i : i + rows], s[i : i + rows], encoded.tensor_scale)
    return _from_blocks(out, work).reshape(codes.shape)


def _decode_rows(bf: BlockFormat, cb: np.ndarray, s: np.ndarray, tensor_scale: float | None) -> np.ndarray:
    el = bf.element
    vb = el.table[cb] if isinstance(el, Codebook) else element.decode_array(cb, el)
    with np.errstate(invalid="ignore", over="ignore"):
        if bf.rule.decode is DecodeKind.POW2:  # exact power-of-two product, one rounding
            return (vb.astype(np.float64) * s.astype(np.float64)).astype(_F32)
        if bf.rule.decode is DecodeKind.TENSOR:
            return (vb * s) * _F32(tensor_scale)
        return vb * s


# --- geometry --------------------------------------------------------------------------


def recipe(fmt: str | BlockFormat) -> BlockFormat:
    """The block format ``fmt`` names (or is); TypeError for an element format."""
    if isinstance(fmt, BlockFormat):
        return fmt
    bf = get_format(fmt)
    if not isinstance(bf, BlockFormat):
        raise TypeError(f"{bf.name} is an element format; use fpsim.encode / fpsim.emulate.element for it")
    return bf


def float32_input(x: Any) -> np.ndarray:
    """``x`` as float32 numpy (:func:`fpsim.emulate.element.as_float32`); JAX arrays are refused,
    as block formats run on numpy arrays."""
    if type(x).__module__.startswith("jax"):
        raise TypeError("block formats run on numpy arrays; convert with np.asarray first")
    return element.as_float32(x)


def block_geometry(shape: tuple, bf: BlockFormat) -> tuple[tuple, tuple]:
    """The shape that is blocked and the block size along each of its axes."""
    if bf.flatten:
        work = (math.prod(shape),)
        blk = bf.block
    elif bf.block is None:
        work = shape or (1,)
        blk = tuple(max(t, 1) for t in work)
    else:
        k = len(bf.block)
        if len(shape) < k:
            raise ValueError(
                f"{bf.name}: blocks {bf.block} span the last {k} axes; got a tensor of shape {shape}"
            )
        work = shape
        tail = tuple(max(t, 1) if b == -1 else b for t, b in zip(shape[-k:], bf.block))
        blk = (1,) * (len(shape) - k) + tail
    if not bf.pad:
        for axis, (t, b) in enumerate(zip(work, blk)):
            if t % b:
                raise ValueError(
                    f"{bf.name}: axis {axis} has length {t}, not a multiple of the "
                    f"block {b}, and padding is off (pad=False)"
                )
    return work, blk


def _tight(work: tuple, blk: tuple) -> tuple:
    """The blocks with an axis shorter than its block cut to that axis: its one block is the
    same block without the zero padding (which never raises an amax), so the same codes and
    scales come out of less work."""
    return tuple(t if 0 < t < b else b for t, b in zip(work, blk))


def _to_blocks(a: np.ndarray, blk: tuple) -> np.ndarray:
    """Pad each axis with zeros to a multiple of its block; axes become (count, block) pairs."""
    padded = tuple(t + (-t) % b for t, b in zip(a.shape, blk))
    if padded != a.shape:  # (np.pad costs more than the copy on small tensors)
        out = np.zeros(padded, a.dtype)
        out[tuple(slice(0, t) for t in a.shape)] = a
        a = out
    return a.reshape([n for t, b in zip(a.shape, blk) for n in (t // b, b)])


def _from_blocks(ab: np.ndarray, work: tuple) -> np.ndarray:
    padded = tuple(ab.shape[i] * ab.shape[i + 1] for i in range(0, ab.ndim, 2))
    return ab.reshape(padded)[tuple(slice(0, t) for t in work)]
