"""Fused compiled step: Adam/AdamW with both moments in nearest-entry codebook blocks.

The replay's update of one tensor under the bitsandbytes 8-bit scheme (module doc of
:mod:`fpsim.replay`, semantics 2 and 3) is, on the generic path, five passes over memory:
decode both moments, :meth:`fpsim.optim.Adam.step`, encode and decode each new moment
(:func:`fpsim.scaling.encode_decode_blocks`), and the state statistics. :func:`adam_codebook_step`
does all of it in one compiled loop (:mod:`fpsim._fast`, numba) that works through the
tensor in cache-sized tiles of whole blocks and gives the generic path's bits: the same
parameters, codes and scales, the same zero counts, and the same float64 error sums up to
their summation order (tests/test_fast.py compares the two paths, and both with numpy).

It applies when numba is installed, the optimizer is :class:`fpsim.optim.Adam` or
``AdamW``, and both moments of the tensor are quantized with one-axis codebook recipes of
the same block size rounded to the nearest entry (``bnb_dynamic8_block256`` with
``bnb_dynamic8u_block256``, and their 2048 variants); everything else takes the generic path.
The stored codes and scales are updated in place.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _fast, optim
from .blockformat import BlockFormat, Codebook
from .rounding import RoundMode
from .scaling import BlockCodes, _compiled_codebook, _geometry, _nearest_buckets

__all__ = ["FusedStep", "adam_codebook_step"]

_F32 = np.float32
_MOMENTS = ("exp_avg", "exp_avg_sq")


class FusedStep(NamedTuple):
    """The FP32 result of the step (before the master rounding), the new stored moments, and
    per moment ``(nonzero, zeroed, sum (stored - ref)^2, sum ref^2)`` (see ``replay._Stats``)."""

    p: np.ndarray
    states: dict[str, BlockCodes]
    stats: dict[str, tuple[int, int, float, float]]


def _block(bf: Any, shape: tuple) -> int | None:
    """Block length if ``bf`` is a nearest-entry codebook over one axis of blocks, else None."""
    if not isinstance(bf, BlockFormat) or not isinstance(bf.element, Codebook):
        return None
    work = _geometry(shape, bf)[0]
    if not _compiled_codebook(bf, RoundMode.NEAREST_EVEN, work):
        return None
    return bf.block[0] if bf.block is not None else work[0]


def _writable(a: np.ndarray, dtype) -> bool:
    return a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable


def adam_codebook_step(
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
    blocks = {st: _block(formats[st], p.shape) for st in _MOMENTS}
    if len(set(blocks.values())) != 1 or None in blocks.values():
        return None
    arrays = _fast.flat32(p, g, ref_states["exp_avg"], ref_states["exp_avg_sq"])
    if arrays is None or g.shape != p.shape:
        return None
    enc = [stored[st] for st in _MOMENTS]
    if not all(isinstance(e, BlockCodes) for e in enc):
        return None
    codes = [e.codes if _writable(e.codes, np.uint8) else np.array(e.codes, np.uint8) for e in enc]
    scales = [e.scales if _writable(e.scales, np.uint32) else np.array(e.scales, np.uint32) for e in enc]
    tables = []
    for st in _MOMENTS:
        table = formats[st].element.table
        tables += [table, *_nearest_buckets(table)]
    p_out = np.empty(p.shape, _F32)
    counts, sums = np.zeros(4, np.int64), np.zeros(4)
    flat_p, flat_g, m_ref, v_ref = arrays
    _fast.kernel("adam_codebook")(
        flat_p,
        flat_g,
        codes[0].reshape(-1),
        scales[0].reshape(-1).view(_F32),
        codes[1].reshape(-1),
        scales[1].reshape(-1).view(_F32),
        blocks["exp_avg"],
        *tables,
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
