"""One configuration's tensor-step: the gradient it sees and its update of one tensor.

The replay (:mod:`fpsim.replay.engine`) and the training optimizers (:mod:`fpsim.train`) both
call these two functions, so an emulated optimizer in a live loop and a replay of the same
gradients give the same bits (one implementation; tests/train compares them):

- :func:`seen_grad`: the gradient a configuration's optimizer sees (semantics 1 of
  :mod:`fpsim.replay.engine`): quantized to ``cfg.grad`` (with the loss scale), or through
  FP8 delayed scaling, and whether it holds inf/NaN where a loss scaler acts on it.
- :func:`tensor_step`: update number ``t`` of one tensor (semantics 2 to 4): the optimizer's
  FP32 step on the decoded states and the master value (the fused compiled step where it
  covers the configuration), the states re-encoded in their storage
  (:meth:`ReplayConfig.state_storage`) and the master copy rounded once to its format
  (``master_rounding``, Kahan compensation).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._compiled import Backend
from ..emulate import decode, encode
from ..emulate import element as emulate
from ..formats import BlockFormat, Format
from . import fused as _fused
from .config import ReplayConfig
from .lossscale import ScalerState
from .optim import Optimizer
from .qmap import QMapBlocks
from .stats import Stats, state_stats
from .storage import load_state, round_master, store_and_load

__all__ = ["TensorStep", "load_states", "seen_grad", "tensor_step"]

_F32 = np.float32


class TensorStep(NamedTuple):
    """The result of :func:`tensor_step`: the FP32 parameter before the master rounding, the
    new master copy (float32 values exact in its format), the new Kahan compensation (None
    without Kahan), the new stored states and their float32 values (None: not decoded, the
    fused step left only the codes; :func:`load_states` decodes them)."""

    p_f32: np.ndarray
    master: np.ndarray
    comp: np.ndarray | None
    states: dict[str, Any]
    loaded: dict[str, np.ndarray] | None


def seen_grad(
    cfg: ReplayConfig, g: np.ndarray, scaler: ScalerState | None, delayed: Any, backend: Backend
) -> tuple[np.ndarray, bool, Any]:
    """The gradient the optimizer of ``cfg`` sees for the recorded gradient ``g`` (float32):
    ``quantize(f32(g * S), cfg.grad) * f32(1/S)`` with the scaler's scale ``S``, a block
    recipe's decoded codes, or FP8 delayed scaling from ``delayed`` (its per-tensor state);
    whether it holds inf/NaN (looked at only where ``scaler`` will act on it); and the new
    delayed-scaling state."""
    if cfg.grad_delayed is not None:
        enc, delayed = cfg.grad_delayed.step(delayed, g)
        q = emulate.decode(enc.codes, cfg.grad_delayed.element) * _F32(enc.scales.view(_F32)[0])
        return q, False, delayed
    fmt = cfg.grad
    if isinstance(fmt, BlockFormat):
        q = decode(encode(g, fmt, backend=backend), fmt, backend=backend)
    elif fmt.name == "float32" and scaler is None:
        q = g
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # (a float64 scale may pass FLT_MAX: inf)
            scale = _F32(scaler.scale) if scaler is not None else _F32(1)
            q = emulate.quantize(g * scale, fmt, backend=backend)
            if scaler is not None:
                inf = not bool(np.isfinite(q).all())
                return q * scaler.inv_scale, inf, delayed
    return q, scaler is not None and not bool(np.isfinite(q).all()), delayed


def load_states(
    cfg: ReplayConfig, name: str, size: int, stored: dict[str, Any], backend: Backend
) -> dict[str, np.ndarray]:
    """The float32 values of the stored states of tensor ``name`` (``size`` elements; its
    storage by :meth:`ReplayConfig.state_storage`)."""
    return {st: load_state(cfg.state_storage(st, name, size), enc, backend) for st, enc in stored.items()}


def tensor_step(
    cfg: ReplayConfig,
    optimizer: Optimizer,
    name: str,
    master: np.ndarray,
    stored: dict[str, Any],
    g: np.ndarray,
    lr: float,
    t: int,
    *,
    seed: int,
    backend: Backend,
    master_format: Format | None = None,
    comp: np.ndarray | None = None,
    loaded: dict[str, np.ndarray] | None = None,
    fused: _fused.FusedStep | None = None,
    try_fused: bool = True,
    ref_states: dict[str, np.ndarray] | None = None,
    stats: Stats | None = None,
    storage: dict[str, Any] | None = None,
) -> TensorStep:
    """Update number ``t`` (1-based) of tensor ``name`` under ``cfg`` (module doc).

    Args:
        cfg: the configuration (state storage, master format and rounding, Kahan).
        optimizer: the update rule (:mod:`fpsim.replay.optim`).
        name: the tensor's name (per-tensor overrides match it).
        master: the master copy (float32 values exact in its format).
        stored: the stored states by name (as :func:`fpsim.replay.storage.store_and_load`
            stored them; the fused step updates block codes in place where they are writable).
        g: the gradient the optimizer sees (:func:`seen_grad`), float32 of ``master``'s shape.
        lr: the learning rate of this update.
        t: the update count (Adam's bias correction).
        seed: seed of the stochastic master rounding
            (:func:`fpsim.replay.storage.master_seed` of the replay's seed, step and name).
        backend: where the loops run.
        master_format: the master copy's format (default ``cfg.master_format(name)``).
        comp: the Kahan compensation (with ``cfg.kahan``).
        loaded: the float32 values of ``stored`` where known (else decoded here).
        fused: this update already done by the fused step (the replay runs it piece by piece
            in its thread pool); ``try_fused``: otherwise try the fused step here.
        ref_states: the reference's new states, for the statistics (zeros where not given).
        stats: a :class:`Stats` to add the state statistics to (None: none computed).
        storage: each state's :meth:`ReplayConfig.state_storage` for this tensor where known
            (the training optimizers keep it per tensor), else resolved here.
    """
    fmt = master_format if master_format is not None else cfg.master_format(name)
    if fused is None and try_fused:
        formats = {st: storage[st] if storage else cfg.state_storage(st, name, g.size) for st in stored}
        # (the fused step is for block recipes and torchao's formats: :func:`_fused.plan`)
        if formats and all(isinstance(f, (BlockFormat, QMapBlocks)) for f in formats.values()):
            ref = (
                ref_states
                if ref_states is not None or stats is None
                else {st: np.zeros(g.shape, _F32) for st in stored}
            )
            fused = _fused.adam_block_step(optimizer, formats, stored, master, g, lr, t, ref, backend)
    if fused is not None:
        p_f32, new_states, new_loaded = fused.p, fused.states, None
        if stats is not None:
            for st, (nonzero, zeroed, err, tot) in fused.stats.items():
                stats.state_nonzero += nonzero
                stats.state_zeroed += zeroed
                stats.state_err_sq[st], stats.state_ref_sq[st] = err, tot
    else:
        if loaded is None:
            loaded = (
                {st: load_state(storage[st], enc, backend) for st, enc in stored.items()}
                if storage
                else load_states(cfg, name, g.size, stored, backend)
            )
        p_f32, exact = optimizer.step(master, g, loaded, lr, t, backend=backend)
        if not storage:
            storage = {st: cfg.state_storage(st, name, v.size) for st, v in exact.items()}
        done = {st: store_and_load(storage[st], v, backend) for st, v in exact.items()}
        new_states = {st: enc for st, (enc, _) in done.items()}
        new_loaded = {st: val for st, (_, val) in done.items()}
        if stats is not None:
            for st, v in new_loaded.items():
                rounded = v is not exact[st]  # stored as float32: nothing was rounded
                ref = ref_states[st] if ref_states is not None else v
                state_stats(stats, st, exact[st] if rounded else None, v, ref, backend)
    p_new, comp = round_master(cfg, fmt, master, p_f32, comp, seed, backend)
    return TensorStep(p_f32, p_new, comp, new_states, new_loaded)
