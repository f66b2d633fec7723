"""torchao's quantized optimizer states: :class:`QMapBlocks` and the :data:`QMAP_RECIPES`.

``torchao.optim.AdamW8bit`` and ``AdamW4bit`` (torchao 0.18, ``subclass_8bit.OptimState8bit``,
``subclass_4bit.OptimState4bit``) store a state as codes into a table of values (the "qmap")
and one float32 scale per block of the flattened tensor. Their quantizer
(``quant_utils.scale_tensor``, ``quantize_8bit_with_qmap`` / ``quantize_4bit_with_qmap``,
``dequant_with_qmap``), emulated here bit for bit, per block of ``block`` elements:

1. ``scale = max(amax, f32(1e-12))``, ``amax`` the largest ``|x|`` of the block; a NaN in the
   block makes it NaN (``torch.amax``), an inf makes it inf;
2. ``v = f32(x / scale)``: a float32 division;
3. ``lo``: the last entry with ``table[lo] <= v`` (torchao's branchless binary search; 0 where
   ``v`` is below the first entry or NaN);
4. the code is ``lo + 1`` where ``f32(v - table[lo]) >= f32(f32(table[lo + 1] - table[lo]) * 0.5)``
   (half-way values go up), else ``lo``; the last entry stays;

and the value of a code is ``f32(table[code] * scale)``. A ragged last block (torchao never
quantizes one: its optimizers keep such tensors in FP32) is treated as padded with zeros.

This is not fpsim's codebook rule (:class:`fpsim.formats.Codebook`, bitsandbytes' quantizer:
``x * f32(1/absmax)``, an amax that skips NaN, float32 midpoints with half-way values going
down), although the 8-bit tables are the same: over the float32 inputs in [-1, 1] the two
rules differ at one value in most gaps of the table (203 of the 255 gaps of the signed 8-bit
map, all 15 of the unsigned 4-bit map), besides the division. Block recipes of
:data:`fpsim.RECIPES` with a Codebook go through fpsim's compiled loops and Triton kernels,
which implement the bitsandbytes rule; these formats are therefore a separate kind of
optimizer-state storage, taken by :class:`fpsim.replay.ReplayConfig` by object or by name and
encoded here: :func:`encode_qmap` on numpy is the reference; on :attr:`fpsim.Backend.COMPILED`
the fused step and its state encoder (:mod:`fpsim.replay.fused`) run the same rule as
``StateKind.QMAP``, a table lookup by :func:`qmap_buckets` (tests/replay/test_compiled.py compares
the two bit for bit). ``tests/replay/test_presets.py`` compares them with torchao's own subclass
tensors.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from ..emulate.blocks import BlockCodes
from ..emulate.scale_rules import threshold_buckets
from ..formats import Codebook
from ..formats.amax import amax_propagate_nan

__all__ = ["QMAP_RECIPES", "QMapBlocks", "decode_qmap", "encode_qmap", "qmap_buckets", "qmap_thresholds"]

_F32 = np.float32
_CLIP = _F32(1e-12)  # torchao's amax.clip(1e-12), the bound rounded to float32 as torch does


@dataclass(frozen=True)
class QMapBlocks:
    """A torchao optimizer-state format: codes into ``values``, a float32 scale per ``block``
    elements of the flattened tensor, torchao's quantizer (module doc).

    Args:
        name: e.g. ``"torchao_dynamic8_block256"``.
        values: the qmap: 2 to 256 strictly increasing values in [-1, 1], exact in float32.
        block: elements per scale.

    Raises:
        ValueError: values that are not such a table, or a block that is not positive.
    """

    name: str
    values: tuple[float, ...]
    block: int

    def __post_init__(self) -> None:
        v = np.asarray(self.values, np.float64)
        if not 2 <= v.size <= 256 or np.any(np.diff(v) <= 0) or np.any(np.abs(v) > 1):
            raise ValueError(f"QMapBlocks {self.name!r}: need 2..256 strictly increasing values in [-1, 1]")
        if np.any(v.astype(_F32) != v):
            raise ValueError(f"QMapBlocks {self.name!r}: values must be exact in float32")
        if not isinstance(self.block, int) or self.block < 1:
            raise ValueError(
                f"QMapBlocks {self.name!r}: block must be a positive integer, got {self.block!r}"
            )

    @property
    def table(self) -> np.ndarray:
        """The values as a float32 array."""
        return np.asarray(self.values, _F32)

    @property
    def bits(self) -> int:
        """Bits per code (torchao packs two 4-bit codes per byte; fpsim keeps one per uint8)."""
        return max(1, math.ceil(math.log2(len(self.values))))

    @property
    def block_elements(self) -> int:
        return self.block

    @property
    def bits_per_element(self) -> float:
        """Code bits plus the float32 block scale's share."""
        return self.bits + 32 / self.block

    @property
    def bytes_per_element(self) -> float:
        return self.bits_per_element / 8

    def __str__(self) -> str:
        return self.name


def encode_qmap(x: np.ndarray, fmt: QMapBlocks) -> BlockCodes:
    """torchao's quantization of float32 ``x`` (module doc): uint8 codes of ``x``'s shape, one
    scale per block (float32 bit patterns, shape ``(blocks,)``)."""
    flat = np.asarray(x, _F32).reshape(-1)
    n, b = flat.size, fmt.block
    xb = np.pad(flat, (0, (-n) % b)).reshape(-1, b)
    c = fmt.table
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = amax_propagate_nan(xb, axis=1)
        scale = np.where(amax < _CLIP, _CLIP, amax)  # (NaN stays NaN, as torch.clamp)
        v = xb / scale[:, None]
        lo = np.clip(np.searchsorted(c, v, side="right") - 1, 0, c.size - 1)
        up = np.minimum(lo + 1, c.size - 1)
        half = (c[up] - c[lo]) * _F32(0.5)
        code = np.where((v - c[lo]) >= half, up, lo)
    code = np.where(np.isnan(v), 0, code)  # every comparison with NaN fails: code 0
    codes = code.astype(np.uint8).reshape(-1)[:n].reshape(np.shape(x))
    return BlockCodes(codes, scale.astype(_F32).view(np.uint32), None)


def decode_qmap(enc: BlockCodes, fmt: QMapBlocks) -> np.ndarray:
    """The float32 values of ``enc`` (codes and scales from :func:`encode_qmap`):
    ``table[code] * scale``."""
    codes = np.asarray(enc.codes)
    n, b = codes.size, fmt.block
    blocks = -(-n // b)
    if np.shape(enc.scales) != (blocks,):
        raise ValueError(f"{fmt.name}: scales have shape {np.shape(enc.scales)}, the codes need {(blocks,)}")
    scale = np.asarray(enc.scales, np.uint32).view(_F32)
    vals = fmt.table[np.pad(codes.reshape(-1), (0, (-n) % b)).reshape(-1, b)]
    with np.errstate(invalid="ignore", over="ignore"):
        out = vals * scale[:, None]
    return out.reshape(-1)[:n].reshape(codes.shape)


def qmap_thresholds(fmt: QMapBlocks) -> np.ndarray:
    """Steps 3 and 4 of torchao's rule (module doc) as thresholds: the code of a float32 ``v``
    (not NaN) is ``#{i : v > t[i]}``.

    On each gap ``[c[i], c[i+1]]`` of the table the test ``f32(v - c[i]) >= half`` is monotone
    in ``v``, so the code is a step function of ``v``; ``t[i]`` is the float32 just below the
    first ``v`` of the gap that passes it, found by bisection over the float32 values in order
    (the rule's own float32 arithmetic decides each probe)."""
    c = fmt.table
    lo_v, hi_v, half = c[:-1], c[1:], (c[1:] - c[:-1]) * _F32(0.5)

    def passes(o: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return (_of_order(o) - lo_v) >= half

    lo, hi = _order(lo_v), _order(hi_v)  # passes(hi): a whole gap is >= half of itself
    up = passes(lo)  # (a gap whose half rounds to 0: c[i] itself goes up)
    lo, hi = np.where(up, lo - 1, lo), np.where(up, lo, hi)  # passes(hi), not passes(lo)
    while np.any(hi - lo > 1):
        mid = (lo + hi) // 2
        ok = passes(mid) & (hi - lo > 1)
        lo, hi = np.where(ok | (hi - lo <= 1), lo, mid), np.where(ok, mid, hi)
    first = hi
    return _of_order(first - 1)


def _order(v: np.ndarray) -> np.ndarray:
    """float32 values as integers in the same order (-0 and +0 both 0)."""
    b = np.asarray(v, _F32).view(np.uint32).astype(np.int64)
    return np.where(b >> 31, -(b & 0x7FFFFFFF), b)


def _of_order(o: np.ndarray) -> np.ndarray:
    """The float32 values of :func:`_order`'s integers."""
    o = np.asarray(o, np.int64)
    return np.where(o < 0, (-o) | 0x80000000, o).astype(np.uint32).view(_F32)


@functools.cache
def qmap_buckets(fmt: QMapBlocks) -> tuple[np.ndarray, np.ndarray]:
    """The bucket lookup (:func:`fpsim.emulate.scale_rules.threshold_buckets`) of
    :func:`qmap_thresholds`: the compiled encoder's ``base`` and ``thr`` tables."""
    return threshold_buckets(qmap_thresholds(fmt), len(fmt.values))


# torchao 0.18 subclass_4bit.get_qmap_signed(): create_dynamic_map(signed=True,
# max_exponent_bits=3, total_bits=4), as float32 bit patterns (torch.linspace's float32 rounding
# is not reproduced by numpy, so the values are stored; the tests compare them with torchao)
_DYNAMIC4_SIGNED = (
    0xBF633333, 0xBF29999A, 0xBEE00000, 0xBE599999, 0xBD9EB852, 0xBD051EB9, 0xBBB43958, 0x00000000,
    0x3BB43958, 0x3D051EB9, 0x3D9EB852, 0x3E599999, 0x3EE00000, 0x3F29999A, 0x3F633333, 0x3F800000,
)  # fmt: skip


def _words(words: tuple[int, ...]) -> tuple[float, ...]:
    return tuple(np.asarray(words, np.uint32).view(_F32).astype(np.float64).tolist())


def _recipes() -> tuple[QMapBlocks, ...]:
    # the 8-bit maps: torchao's create_dynamic_map(signed) for 8 bits has bitsandbytes' values
    return (
        QMapBlocks("torchao_dynamic8_block256", Codebook.bnb_dynamic(True).values, 256),
        QMapBlocks("torchao_dynamic8u_block256", Codebook.bnb_dynamic(False).values, 256),
        QMapBlocks("torchao_dynamic4_block128", _words(_DYNAMIC4_SIGNED), 128),
        # subclass_4bit.get_qmap_unsigned(): linspace(0, 1, 17)[1:], k/16 for k = 1..16 (no zero)
        QMapBlocks("torchao_linear4u_block128", tuple(k / 16 for k in range(1, 17)), 128),
    )


QMAP_RECIPES: Mapping[str, QMapBlocks] = MappingProxyType({r.name: r for r in _recipes()})
"""torchao's optimizer-state formats by name (read-only): AdamW8bit's first and second moment
(``torchao_dynamic8_block256``, ``torchao_dynamic8u_block256``), AdamW4bit's
(``torchao_dynamic4_block128``, ``torchao_linear4u_block128``)."""
