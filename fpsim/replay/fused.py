"""Fused compiled step: Adam/AdamW with both moments in 8-bit blocks.

The replay's update of one tensor with 8-bit block states (module doc of :mod:`fpsim.replay.engine`,
semantics 2 and 3) is, on the generic path, five passes over memory: decode both moments,
:meth:`fpsim.replay.optim.Adam.step`, encode and decode each new moment
(:func:`fpsim.emulate.blocks.encode_decode_blocks`), and the state statistics. :func:`adam_block_step`
does all of it in one compiled loop (:mod:`fpsim._compiled.loops`, numba) that works through the
tensor in cache-sized tiles of whole blocks and gives the generic path's bits: the same
parameters, codes and scales (NaN scales by class), the same zero counts, and the same
float64 error sums up to their summation order (tests/replay/test_compiled.py compares the two paths,
and both with numpy).

It applies on :attr:`fpsim.Backend.COMPILED` (the replay's ``backend``), to
:class:`fpsim.replay.optim.Adam` or ``AdamW`` with the correctly rounded square root
(:attr:`fpsim.replay.optim.Sqrt.IEEE`), where both moments of the tensor are quantized, with blocks
of one size along the flattened tensor, by one of the :class:`fpsim.formats.codes.StateKind`
encodings: a codebook rounded to the nearest entry (the bitsandbytes dynamic maps,
``bnb_dynamic8_block256`` ...) or through bitsandbytes' CPU lookup table (``bnb-8bit-cpu``),
torchao's quantizer into its tables (:mod:`fpsim.replay.qmap`: ``torchao-8bit``,
``torchao-4bit``), or an element with a float32 scale by the rules and elements of
:data:`fpsim._compiled.kinds.SCALED_STATES` (the one table of them): linear absmax INT8
(``int8_block256``, ``int8_block2048``), float8_e4m3fn with an FP32 absmax scale
(``fp8_e4m3_block256``, torchao's AdamWFp8), float8_e4m3fn with Transformer Engine's
per-tensor current scaling (``e4m3_tensor``, ``e4m3_tensor_pow2``: MS-AMP's FP8 first moment;
one block, one piece). Everything else takes
the generic path; :func:`encode_state` and :func:`decode_state` serve it for the recipes above.
The stored codes and scales are updated in place. A large tensor is updated piece by piece
(:func:`pieces`, each piece one task of the replay's thread pool); the split depends on the
tensor's size and block only, so the results do not depend on the number of threads.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from .. import _compiled
from .._compiled import Backend
from .._compiled.kinds import scaled_state
from ..emulate import element as emulate
from ..emulate.blocks import BlockCodes, block_geometry, compiled_codebook, nearest_buckets
from ..emulate.scale_rules import codebook_lut
from ..formats import BlockFormat, Codebook, RoundMode
from ..formats.codes import StateKind
from . import optim
from .qmap import QMapBlocks, qmap_buckets

__all__ = ["FusedStep", "Plan", "adam_block_step", "decode_state", "encode_state", "plan", "run_piece"]

_F32 = np.float32
_MOMENTS = ("exp_avg", "exp_avg_sq")


class FusedStep(NamedTuple):
    """The FP32 result of the step (before the master rounding), the new stored moments, and
    per moment ``(nonzero, zeroed, sum (stored - ref)^2, sum ref^2)`` (the state fields of
    :class:`fpsim.replay.stats.Stats`)."""

    p: np.ndarray
    states: dict[str, BlockCodes]
    stats: dict[str, tuple[int, int, float, float]]


_DUMMY = (np.zeros(1, np.uint8), np.zeros(1, _F32))  # bucket tables of kinds without them
_NONE = np.zeros(0, _F32)  # the reference moments of a step without statistics


class _State(NamedTuple):
    """How the kernel stores one moment (the loops take ``int(kind)``)."""

    kind: StateKind
    block: int
    table: np.ndarray  # float32 value of each code
    base: np.ndarray
    thr: np.ndarray
    eps: np.float32
    elem_max: np.float32


def _moment_args(st: _State) -> tuple:
    """The ``(kind, table, base, thr, eps, elem_max)`` tuple of one moment, as the block loops take it."""
    return int(st.kind), st.table, st.base, st.thr, st.eps, st.elem_max


_KEPT: dict[tuple[int, tuple], tuple[Any, _State | None]] = {}


def _state(bf: Any, shape: tuple) -> _State | None:
    """:func:`_state_of`, kept by the identity of ``bf`` (a recipe's hash is computed field by
    field: a step of a small tensor would spend more on it than on its loop)."""
    key = (id(bf), tuple(shape))
    kept = _KEPT.get(key)
    if kept is not None and kept[0] is bf:
        return kept[1]
    if len(_KEPT) >= 4096:
        _KEPT.clear()
    st = _KEPT[key] = (bf, _state_of(bf, tuple(shape)))  # (bf held: its id is not reused)
    return st[1]


@functools.lru_cache(maxsize=1024)
def _state_of(bf: Any, shape: tuple) -> _State | None:
    """The kernel's description of state format ``bf`` for a tensor of ``shape``, or None where
    the kernel does not cover it (kept per format and shape: the tables are built once)."""
    n = math.prod(shape)
    if isinstance(bf, QMapBlocks) and n:
        return _State(StateKind.QMAP, bf.block, _values(bf), *qmap_buckets(bf), _F32(1e-12), _F32(1))
    if not isinstance(bf, BlockFormat) or not n:
        return None
    per_tensor = bf.block is None and not bf.flatten
    if not per_tensor and len(block_geometry(shape, bf)[0]) != 1:
        return None
    block = bf.block[0] if bf.block is not None else n
    if isinstance(bf.element, Codebook):
        el = bf.element
        nearest = compiled_codebook(
            bf, RoundMode.NEAREST_EVEN, block_geometry(shape, bf)[0], Backend.COMPILED
        )
        if per_tensor or not (el.lut_bins or nearest):
            return None
        if el.lut_bins:  # bitsandbytes' CPU kernel: the lookup table in place of the buckets
            return _State(
                StateKind.CODEBOOK_LUT, block, _values(el), codebook_lut(el), _DUMMY[1], _F32(0), _F32(1)
            )
        return _State(StateKind.CODEBOOK, block, _values(el), *nearest_buckets(el.table), _F32(0), _F32(1))
    kind = scaled_state(bf, per_tensor)  # the loops' scaled kinds: fpsim._compiled.kinds
    if kind is None:
        return None
    return _State(kind, block, _values(bf.element), *_DUMMY, _F32(bf.eps), _F32(bf.elem_max))


@functools.cache
def _values(element: Any) -> np.ndarray:
    """float32 value of each of the element's 256 codes (a writable copy: numba compiles
    read-only arrays as another type); a torchao table of fewer entries padded with NaN (codes
    past it are refused before a loop runs: :func:`_check_codes`)."""
    if isinstance(element, QMapBlocks):
        out = np.full(256, np.nan, _F32)
        out[: len(element.values)] = element.table
        return out
    if isinstance(element, Codebook):
        return np.array(element.table, _F32)
    return np.array(emulate.decode_table(element), _F32)


def _check_codes(bf: Any, codes: np.ndarray) -> None:
    """Codes of a torchao format past its table (which numpy's decoder would refuse too).

    Raises:
        ValueError: a code of ``codes`` has no entry in ``bf``'s table.
    """
    if (
        isinstance(bf, QMapBlocks)
        and len(bf.values) < 256
        and codes.size
        and int(codes.max()) >= len(bf.values)
    ):
        raise ValueError(
            f"{bf.name}: stored code {int(codes.max())} past the table's {len(bf.values)} entries"
        )


def _grid(bf: BlockFormat, shape: tuple, blocks: int) -> tuple:
    """The shape of the scales :func:`fpsim.encode` (:func:`fpsim.replay.qmap.encode_qmap`)
    gives (one per block)."""
    if isinstance(bf, QMapBlocks):
        return (blocks,)
    return (1,) * max(len(shape), 1) if bf.block is None and not bf.flatten else (blocks,)


def encode_state(bf: Any, x: np.ndarray, backend: Backend) -> tuple[BlockCodes, np.ndarray] | None:
    """``encode_blocks(x, bf)`` by the kernel's state encoder (same codes and scales, NaN by
    class) and the decoded values (``decode_blocks`` of them, computed on the way), or None
    where ``backend`` is not :attr:`Backend.COMPILED`, the kernel does not cover ``bf`` or
    ``x`` is not float32."""
    st = _state(bf, np.shape(x)) if backend is Backend.COMPILED else None
    flat = _compiled.flat32(x) if st is not None else None
    if flat is None:
        return None
    n = flat[0].size
    codes, scales, values = np.empty(n, np.uint8), np.empty(-(-n // st.block), _F32), np.empty(n, _F32)
    _compiled.load().encode_blocks8(
        int(st.kind), flat[0], st.block, st.base, st.thr, st.table, st.eps, st.elem_max, codes, scales, values
    )
    grid = _grid(bf, x.shape, scales.size)
    return BlockCodes(codes.reshape(x.shape), scales.view(np.uint32).reshape(grid), None), values.reshape(
        x.shape
    )


def decode_state(bf: Any, enc: Any, backend: Backend) -> np.ndarray | None:
    """``decode_blocks(enc, bf)`` (table[code] * scale) for the recipes :func:`encode_state`
    covers, or None (also where ``backend`` is not :attr:`Backend.COMPILED`)."""
    if not isinstance(enc, BlockCodes) or backend is not Backend.COMPILED:
        return None
    st = _state(bf, enc.codes.shape)
    if st is None or enc.codes.dtype != np.uint8:
        return None
    if enc.scales.shape != _grid(bf, enc.codes.shape, -(-enc.codes.size // st.block)):
        return None
    _check_codes(bf, enc.codes)
    out = np.empty(enc.codes.shape, _F32)
    codes = np.ascontiguousarray(enc.codes).reshape(-1)
    scales = np.ascontiguousarray(enc.scales).view(_F32).reshape(-1)
    _compiled.load().table_decode(codes, st.table, scales, st.block, out.reshape(-1))
    return out


def _writable(a: np.ndarray, dtype) -> bool:
    return a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable


PIECE = 1 << 19
"""Elements per piece: a tensor's update runs piece by piece (each piece one task of the
replay's thread pool), pieces of whole tiles, and the statistics of the pieces are added in
order; the split depends on the tensor's size and blocks only, never on the thread count."""


class Plan(NamedTuple):
    """One tensor's fused update, set up by :func:`plan`, run by :func:`run_piece`."""

    m: _State
    v: _State
    states: dict[str, BlockCodes]  # the stored moments, writable: updated in place
    arrays: tuple  # flat p, g, reference m, reference v (the last two absent: no statistics)
    out: np.ndarray  # the FP32 result, p's shape


def plan(
    optimizer: Any,
    formats: dict[str, Any],
    stored: dict[str, Any],
    p: np.ndarray,
    g: np.ndarray,
    ref_states: dict[str, np.ndarray] | None,
    backend: Backend,
) -> Plan | None:
    """The fused update of one tensor, or None where it does not apply (module doc).

    Args:
        optimizer: the replay's optimizer.
        formats: the state formats by name (``"exp_avg"``, ``"exp_avg_sq"``).
        stored: the stored moments (:class:`fpsim.BlockCodes`).
        p, g: the master values and the (unscaled) gradient, float32 of one shape.
        ref_states: the FP32 reference's new moments, for the statistics (None: none computed,
            the :class:`FusedStep`'s are zeros).
        backend: where the replay runs (the fused step needs :attr:`Backend.COMPILED`).
    """
    blocks = all(isinstance(f, (BlockFormat, QMapBlocks)) for f in formats.values())
    if backend is not Backend.COMPILED or not blocks:
        # element formats (bfloat16, float16 moments) are not the fused step's: their unfused step is
        # the compiled path itself
        return None
    refs = () if ref_states is None else (ref_states["exp_avg"], ref_states["exp_avg_sq"])
    why, m, v, arrays = _refusal(optimizer, formats, stored, p, g, refs)
    if why is not None:
        if p.size:  # (an empty tensor runs nothing)
            _compiled.fallback(
                f"the fused optimizer step with {why}", "the step and the state encoding run apart"
            )
        return None
    enc = [stored[st] for st in _MOMENTS]
    for st, e in zip(_MOMENTS, enc):
        _check_codes(formats[st], e.codes)
    states = {
        st: BlockCodes(
            e.codes if _writable(e.codes, np.uint8) else np.array(e.codes, np.uint8),
            e.scales if _writable(e.scales, np.uint32) else np.array(e.scales, np.uint32),
            None,
        )
        for st, e in zip(_MOMENTS, enc)
    }
    return Plan(m, v, states, tuple(arrays), np.empty(p.shape, _F32))


def _refusal(optimizer: Any, formats: dict, stored: dict, p: np.ndarray, g: np.ndarray, refs: tuple) -> tuple:
    """``(why, m, v, arrays)``: what the fused step does not cover in this update (None: it
    covers it), the two moments' :class:`_State` and the flat arrays."""
    if not _covers(optimizer):
        if isinstance(optimizer, optim.Adam) and optimizer.sqrt is not optim.Sqrt.IEEE:
            return f"{type(optimizer).__name__}(sqrt='{optimizer.sqrt.value}')", None, None, None
        return f"{type(optimizer).__name__} (the fused step is Adam's)", None, None, None
    if set(formats) != set(_MOMENTS):
        return f"states {sorted(formats)}", None, None, None
    m, v = (_state(formats[st], p.shape) for st in _MOMENTS)
    for st, s in zip(_MOMENTS, (m, v)):
        if s is None:
            return (
                f"{st} stored in {getattr(formats[st], 'name', formats[st])}",
                m,
                v,
                None,
            )
    if m.block != v.block:
        return f"moments in blocks of {m.block} and {v.block} elements", m, v, None
    arrays = _compiled.flat32(p, g, *refs)
    if arrays is None or g.shape != p.shape:
        return "arrays that are not float32 and C-contiguous of one shape", m, v, None
    if not all(isinstance(stored[st], BlockCodes) for st in _MOMENTS):
        return "stored moments that are not block codes", m, v, None
    return None, m, v, arrays


def _covers(optimizer: Any) -> bool:
    """Whether the loop computes ``optimizer``'s step: Adam's own, with the IEEE square root."""
    return (
        isinstance(optimizer, optim.Adam)
        and type(optimizer).step is optim.Adam.step
        and optimizer.sqrt is optim.Sqrt.IEEE
    )


def pieces(pl: Plan) -> list[slice]:
    """The pieces of the tensor: whole tiles of whole blocks, about :data:`PIECE` elements."""
    block = pl.m.block
    tile = block * max(1, _compiled.load().TILE // block)
    step = tile * max(1, PIECE // tile)
    n = pl.out.size
    return [slice(a, min(n, a + step)) for a in range(0, n, step)]


def run_piece(pl: Plan, part: slice, optimizer: Any, lr: float, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Update elements ``part`` (one of :func:`pieces`): writes the FP32 result into
    ``pl.out`` and the moments' codes and scales in place; returns the piece's zero counts
    and error sums (per moment: nonzero, zeroed; sum (stored - ref)^2, sum ref^2)."""
    m, v = pl.m, pl.v
    blocks = slice(part.start // m.block, -(-part.stop // m.block))
    p, g, *refs = (a[part] for a in pl.arrays)
    m_ref, v_ref = refs or (_NONE, _NONE)
    (mq, ms), (vq, vs) = (
        (pl.states[st].codes.reshape(-1)[part], pl.states[st].scales.reshape(-1).view(_F32)[blocks])
        for st in _MOMENTS
    )
    counts, sums = np.zeros(4, np.int64), np.zeros(4)
    _compiled.load().adam_blocks(
        p, g, mq, ms, vq, vs, m.block, _moment_args(m), _moment_args(v),
        pl.out.reshape(-1)[part], m_ref, v_ref, bool(refs), counts, sums, tuple(optimizer.scalars(lr, t)),
    )  # fmt: skip
    return counts, sums


def finish(pl: Plan, results: list[tuple[np.ndarray, np.ndarray]]) -> FusedStep:
    """The tensor's :class:`FusedStep` from :func:`run_piece`'s results, in piece order."""
    counts = sum(c for c, _ in results)
    sums = [0.0] * 4
    for _, s in results:  # in order: the same sums for any number of threads
        sums = [a + float(b) for a, b in zip(sums, s)]
    stats = {
        st: (int(counts[2 * i]), int(counts[2 * i + 1]), sums[2 * i], sums[2 * i + 1])
        for i, st in enumerate(_MOMENTS)
    }
    return FusedStep(pl.out, pl.states, stats)


def adam_block_step(
    optimizer: Any,
    formats: dict[str, Any],
    stored: dict[str, Any],
    p: np.ndarray,
    g: np.ndarray,
    lr: float,
    t: int,
    ref_states: dict[str, np.ndarray] | None,
    backend: Backend | str = "auto",
) -> FusedStep | None:
    """One tensor's whole update (:func:`plan`, every piece, :func:`finish`), or None where the
    fused step does not apply; ``lr`` and ``t`` (1-based) are the step's learning rate and
    update count, ``backend`` as :meth:`fpsim.Backend.resolve` takes it, the other arguments
    as :func:`plan` takes them."""
    pl = plan(optimizer, formats, stored, p, g, ref_states, Backend.resolve(backend))
    if pl is None:
        return None
    return finish(pl, [run_piece(pl, part, optimizer, lr, t) for part in pieces(pl)])
