"""How a configuration stores its optimizer states and its master copy (semantics 3 and 4 of
:mod:`fpsim.replay.engine`): the stored form of a state and its float32 values, and the
rounding of the master copy (nearest-even or stochastic, optionally with Kahan compensation).

On :attr:`fpsim.Backend.COMPILED`, 8-bit block states and torchao's state formats take the
fused step's encoder and decoder where it covers them (:mod:`fpsim.replay.fused`; torchao's
reference rule is :mod:`fpsim.replay.qmap`, on numpy), and the roundings to bfloat16 and
float16 the loops ``bf16_round`` and ``f16_round`` of :mod:`fpsim._compiled.loops` (same bits;
tests/replay/test_compiled.py compares them with the emulator).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from .. import _compiled
from .._compiled import Backend
from ..emulate import decode, encode
from ..emulate import element as emulate
from ..emulate.blocks import encode_decode_blocks
from ..emulate.random import SEED_MULTIPLIER, random_bits_at
from ..formats import BlockFormat, Format, RoundMode, get_format
from . import fused as _fused
from .config import ReplayConfig, StateFormat
from .qmap import QMapBlocks, decode_qmap, encode_qmap

__all__ = ["is_quantized", "load_state", "quantize", "round_master", "store_and_load"]

_F32 = np.float32
_F16 = get_format("float16")
_BF16 = get_format("bfloat16")
_BF16_MODES = (RoundMode.NEAREST_EVEN, RoundMode.STOCHASTIC)


def is_quantized(fmt: StateFormat) -> bool:
    """Whether a state whose storage is ``fmt`` (:meth:`ReplayConfig.state_storage`) is stored
    in a low-precision form (else as float32)."""
    return not (isinstance(fmt, Format) and fmt.name == "float32")


def store_and_load(fmt: StateFormat, x: np.ndarray, backend: Backend) -> tuple[Any, np.ndarray]:
    """The stored form of a state in storage ``fmt`` (:meth:`ReplayConfig.state_storage`) and
    its float32 values, in one pass: block recipes as codes (by the fused step's own encoder
    where it covers the recipe), torchao's formats as codes (:mod:`.qmap`), element formats as
    their float32 values (exact in the format)."""
    if not is_quantized(fmt):
        return x, x
    if isinstance(fmt, QMapBlocks):
        done = _fused.encode_state(fmt, x, backend)
        if done is not None:
            return done
        if backend is Backend.COMPILED and np.size(x):
            _compiled.fallback(
                f"the {fmt.name} state encoder on arrays that are not float32 and C-contiguous"
            )
        enc = encode_qmap(x, fmt)
        return enc, decode_qmap(enc, fmt)
    if isinstance(fmt, BlockFormat):
        return _fused.encode_state(fmt, x, backend) or encode_decode_blocks(x, fmt, backend=backend)
    if isinstance(fmt, Format):
        q = quantize(x, fmt, RoundMode.NEAREST_EVEN, backend)
        return q, q
    stored = encode(x, fmt, backend=backend)
    return stored, decode(stored, fmt, backend=backend)


def load_state(fmt: StateFormat, stored: Any, backend: Backend) -> np.ndarray:
    """The float32 values of a state stored in ``fmt`` (as :func:`store_and_load` stored it)."""
    if isinstance(stored, np.ndarray) and stored.dtype == _F32:
        return stored
    out = _fused.decode_state(fmt, stored, backend)
    if out is not None:
        return out
    return decode_qmap(stored, fmt) if isinstance(fmt, QMapBlocks) else decode(stored, fmt, backend=backend)


def quantize(x: np.ndarray, fmt: Format, mode: RoundMode, backend: Backend, seed: int = 0) -> np.ndarray:
    """``emulate.quantize(x, fmt, rounding=mode)`` (stochastic: ``random_bits=random_bits_at(seed,
    0, n)``). On :attr:`Backend.COMPILED`, bfloat16 (nearest-even or stochastic) and float16
    (nearest-even) take compiled loops, their NaN inputs the emulator."""
    flat = _compiled.flat32(x) if backend is Backend.COMPILED else None
    out = np.empty(x.shape, _F32)
    if flat is not None and _same(fmt, _F16) and mode is RoundMode.NEAREST_EVEN:
        nan = _compiled.load().f16_round(flat[0], out.reshape(-1)) > 0
    elif flat is not None and _same(fmt, _BF16) and mode in _BF16_MODES:
        mix = np.uint64((seed * SEED_MULTIPLIER) % (1 << 64))
        stochastic = mode is RoundMode.STOCHASTIC
        nan = _compiled.load().bf16_round(flat[0], stochastic, mix, 0, out.reshape(-1)) > 0
    else:
        return emulate.quantize(x, fmt, rounding=mode, backend=backend, **_random_bits(x, mode, seed))
    if nan:  # (the stochastic words are drawn for all of x: the NaNs keep their own)
        where = np.isnan(x)
        kw = {k: v[where] for k, v in _random_bits(x, mode, seed).items()}
        out[where] = emulate.quantize(x[where], fmt, rounding=mode, backend=backend, **kw)
    return out


def _same(fmt: Any, ref: Format) -> bool:
    """``fmt == ref``, the names compared first (a format's equality compares every field)."""
    return fmt is ref or (getattr(fmt, "name", None) == ref.name and fmt == ref)


def _random_bits(x: np.ndarray, mode: RoundMode, seed: int) -> dict[str, np.ndarray]:
    """The ``random_bits`` argument of a rounding of ``x`` in ``mode`` (none unless stochastic)."""
    if mode is not RoundMode.STOCHASTIC:
        return {}
    return {"random_bits": random_bits_at(seed, 0, x.size).reshape(x.shape)}


def master_seed(seed: int, step: int, name: str) -> int:
    """The seed of the stochastic master rounding of tensor ``name`` at recorded step ``step``
    under the replay's ``seed``: ``seed ^ crc32("<step>:<name>")``, so each tensor-step draws
    its own words (:func:`fpsim.emulate.random.random_bits_at`) wherever it is computed."""
    return seed ^ zlib.crc32(f"{step}:{name}".encode())


def round_master(
    cfg: ReplayConfig, fmt: Format, p_old, p_f32, comp: np.ndarray | None, seed: int, backend: Backend
) -> tuple[np.ndarray, np.ndarray | None]:
    """The new master copy in ``fmt`` from the FP32 result ``p_f32`` (``cfg.master_rounding``,
    stochastic words from ``seed``), and with ``cfg.kahan`` the new compensation (``comp``:
    the carried rounding error, in ``fmt``)."""
    mode = cfg.master_rounding
    if not cfg.kahan:
        if fmt.name == "float32":  # rounding float32 to float32 is exact in every mode
            return p_f32, comp
        return quantize(p_f32, fmt, mode, backend, seed), comp
    if backend is Backend.COMPILED:
        fast = _kahan_compiled(fmt, mode, p_old, p_f32, comp)
        if fast is not None:
            return fast
    return _kahan(fmt, mode, p_old, p_f32, comp, seed, backend)


def _kahan(fmt: Format, mode: RoundMode, p_old, p_f32, comp, seed: int, backend: Backend):
    """The Kahan-compensated master rounding (the reference): the new master copy and
    compensation in ``fmt``."""
    kw: dict[str, Any] = {"rounding": mode, "backend": backend, **_random_bits(p_f32, mode, seed)}
    # Kahan: y = update + carried error; new = fl(p + y); error = y - (new - p), stored in fmt
    y = (p_f32.astype(np.float64) - p_old) + comp
    new = emulate.quantize(p_old.astype(np.float64) + y, fmt, **kw)
    return new, emulate.quantize(y - (new.astype(np.float64) - p_old), fmt, backend=backend)


def _kahan_compiled(fmt: Format, mode: RoundMode, p_old, p_f32, comp) -> tuple | None:
    """:func:`_kahan` by the loop ``kahan_bf16`` (bfloat16, nearest-even; its NaN elements
    by :func:`_kahan`), or None after saying which case it does not cover."""
    if fmt != _BF16 or mode is not RoundMode.NEAREST_EVEN:
        _compiled.fallback(f"the Kahan-compensated master rounding to {fmt.name} ({mode.value})")
        return None
    flat = _compiled.flat32(p_f32, p_old, comp)
    if flat is None or np.shape(p_old) != np.shape(p_f32) or np.shape(comp) != np.shape(p_f32):
        _compiled.fallback(
            "the Kahan-compensated master rounding on arrays that are not float32, C-contiguous"
        )
        return None
    new, c = np.empty(p_f32.shape, _F32), np.empty(p_f32.shape, _F32)
    if _compiled.load().kahan_bf16(*flat, new.reshape(-1), c.reshape(-1)):
        y = (p_f32.astype(np.float64) - p_old) + comp
        where = np.isnan(p_old.astype(np.float64) + y) | np.isnan(
            y - (new.astype(np.float64) - p_old)
        )  # (a NaN sum, or a NaN compensation left by the loop: both redone)
        new[where], c[where] = _kahan(fmt, mode, p_old[where], p_f32[where], comp[where], 0, Backend.NUMPY)
    return new, c
