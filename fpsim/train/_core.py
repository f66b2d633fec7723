"""What the torch and optax optimizers of :mod:`fpsim.train` share, on numpy arrays.

A tensor's emulated optimizer state is its master copy (the parameter, float32 values exact in
the master format), its stored states *packed* as plain arrays (:func:`pack`: block recipes as
uint8 codes and uint32 scale bits, element formats of up to 16 bits as their codes, FP32 states
as float32), and with Kahan its compensation. One update is :func:`step_tensor`: unpack, the
replay's tensor-step (:func:`fpsim.replay.tensorstep.tensor_step`, the one implementation),
pack. Nothing decoded is kept between steps, so the memory a format saves is saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .. import _compiled
from .._compiled import Backend
from ..emulate import element as emulate
from ..emulate.blocks import BlockCodes
from ..formats import Format, IntFormat, RoundMode
from ..replay.config import PRESETS, ReplayConfig, StateFormat
from ..replay.optim import Optimizer
from ..replay.stats import Stats, tensor_stats
from ..replay.storage import is_quantized, master_seed, quantize, store_and_load
from ..replay.tensorstep import seen_grad, tensor_step

__all__ = ["Layout", "StepStats", "init_tensor", "layout", "pack", "resolve_config", "step_tensor", "unpack"]

_F32 = np.float32


def resolve_config(config: ReplayConfig | str) -> ReplayConfig:
    """A :class:`ReplayConfig` from itself or a preset name.

    Raises:
        ValueError: an unknown preset (the message lists them), or a configuration with a
            loss scaler or FP8 delayed gradient scaling (a live loop scales its loss itself:
            ``torch.amp.GradScaler``, whose skipped steps the optimizers follow).
    """
    if isinstance(config, str):
        if config not in PRESETS:
            raise ValueError(f"unknown config {config!r}; presets: {', '.join(PRESETS)} (or a ReplayConfig)")
        config = PRESETS[config]
    if not isinstance(config, ReplayConfig):
        raise ValueError(f"config must be a preset name or a ReplayConfig, got {type(config).__name__}")
    if config.loss_scaler is not None or config.grad_delayed is not None:
        raise ValueError(
            f"config {config.name!r} scales gradients (loss_scaler / grad_delayed), which the training "
            "optimizers do not emulate: scale the loss in the loop (torch.amp.GradScaler) instead"
        )
    return config


class Layout(NamedTuple):
    """What the update of one tensor takes from the configuration and depends only on its
    name and size (an optimizer keeps it per tensor instead of resolving it every step):
    ``storage``, each state's :meth:`ReplayConfig.state_storage`; ``master``, the master
    copy's format (:meth:`ReplayConfig.master_format`)."""

    storage: dict[str, StateFormat]
    master: Format


def layout(cfg: ReplayConfig, optimizer: Optimizer, name: str, size: int) -> Layout:
    """The :class:`Layout` of tensor ``name`` with ``size`` elements under ``cfg``."""
    storage = {st: cfg.state_storage(st, name, size) for st in optimizer.states}
    return Layout(storage, cfg.master_format(name))


def pack(
    cfg: ReplayConfig,
    name: str,
    size: int,
    stored: dict[str, Any],
    backend: Backend = Backend.NUMPY,
    storage: dict[str, StateFormat] | None = None,
) -> dict[str, np.ndarray]:
    """The stored states of a tensor as plain arrays under their keys: ``<state>`` (float32),
    ``<state>.codes`` (element codes; block recipes uint8) and ``<state>.scales`` (uint32 bits of
    the float32 block scales, or uint8 scale codes). The element codes are encoded on
    ``backend`` (the values are exact in the format: every backend gives the same codes);
    ``storage``: the states' storage where known (:class:`Layout`)."""
    out = {}
    for st, enc in stored.items():
        fmt = storage[st] if storage is not None else cfg.state_storage(st, name, size)
        if isinstance(enc, BlockCodes):
            if enc.tensor_scale is not None:
                raise ValueError(
                    f"{name}: state {st} in {fmt.name} has a per-tensor scale, not stored by training"
                )
            out[f"{st}.codes"], out[f"{st}.scales"] = enc.codes, enc.scales
        elif not is_quantized(fmt):
            out[st] = enc
        elif isinstance(fmt, Format) and fmt.bits <= 16:
            flt = enc if isinstance(enc, np.ndarray) and enc.dtype == _F32 else emulate.as_float_array(enc)[1]
            out[f"{st}.codes"] = emulate.encode_array(flt, fmt, RoundMode.NEAREST_EVEN, backend=backend)
        elif isinstance(fmt, IntFormat):
            out[f"{st}.codes"] = np.asarray(enc)
        else:  # wider element formats: their float32 values
            out[st] = enc
    return out


def unpack(
    cfg: ReplayConfig,
    name: str,
    size: int,
    packed: dict[str, np.ndarray],
    states,
    backend: Backend = Backend.NUMPY,
    storage: dict[str, StateFormat] | None = None,
) -> dict[str, Any]:
    """The stored states (as the replay's storage holds them) from :func:`pack`'s arrays (element
    codes of up to 16 bits decoded by a compiled table lookup on :attr:`Backend.COMPILED`: the
    same table, the same values); ``storage`` as :func:`pack` takes it."""
    out: dict[str, Any] = {}
    for st in states:
        fmt = storage[st] if storage is not None else cfg.state_storage(st, name, size)
        if st in packed:
            out[st] = packed[st]
        elif f"{st}.scales" in packed:
            out[st] = BlockCodes(packed[f"{st}.codes"], packed[f"{st}.scales"], None)
        elif isinstance(fmt, Format):
            out[st] = _decode(packed[f"{st}.codes"], fmt, backend)
        else:
            out[st] = packed[f"{st}.codes"]
    return out


def _decode(codes: np.ndarray, fmt: Format, backend: Backend) -> np.ndarray:
    """``emulate.decode_array(codes, fmt)``; on :attr:`Backend.COMPILED` by the loop
    ``table_gather`` where the codes fit the format's table (unsigned, at most its bits)."""
    fits = codes.dtype.kind == "u" and codes.dtype.itemsize * 8 <= fmt.bits <= 16 and codes.flags.c_contiguous
    if backend is not Backend.COMPILED or not fits:
        return emulate.decode_array(codes, fmt)
    out = np.empty(codes.shape, _F32)
    _compiled.load().table_gather(codes.reshape(-1), _loop_table(fmt), out.reshape(-1))
    return out


_TABLES: dict[int, tuple[Format, np.ndarray]] = {}


def _loop_table(fmt: Format) -> np.ndarray:
    """``emulate.loop_table(fmt)`` (a copy of up to 65,536 values), kept per format object."""
    kept = _TABLES.get(id(fmt))
    if kept is None or kept[0] is not fmt:
        if len(_TABLES) >= 64:
            _TABLES.clear()
        kept = _TABLES[id(fmt)] = (fmt, emulate.loop_table(fmt))  # (fmt held: its id is not reused)
    return kept[1]


def init_tensor(
    cfg: ReplayConfig, optimizer: Optimizer, name: str, p: np.ndarray, backend: Backend
) -> tuple[np.ndarray | None, dict[str, np.ndarray], np.ndarray | None]:
    """A tensor's start, as the replay's: the master copy rounded (nearest-even) to its format
    (None where the float32 parameter is already exact), zero states stored, a zero
    compensation with ``cfg.kahan``."""
    fmt = cfg.master_format(name)
    master = None if fmt.name == "float32" else quantize(p, fmt, RoundMode.NEAREST_EVEN, backend)
    zeros = np.zeros(p.shape, _F32)
    stored = {
        st: store_and_load(cfg.state_storage(st, name, p.size), zeros, backend)[0] for st in optimizer.states
    }
    comp = np.zeros(p.shape, _F32) if cfg.kahan else None
    return master, pack(cfg, name, p.size, stored, backend), comp


@dataclass
class StepStats:
    """Statistics of one ``step()`` over every tensor (when asked for): ``states`` state
    elements the step rounded and ``zeroed`` those of them stored as zero (nonzero before);
    ``updates`` parameter elements the optimizer changed and ``swamped`` those the master
    rounding left unchanged; ``update_sq`` and ``param_sq``: sums of squares (float64) of the
    master update and of the new parameters."""

    states: int = 0
    zeroed: int = 0
    updates: int = 0
    swamped: int = 0
    update_sq: float = 0.0
    param_sq: float = 0.0
    per_tensor: dict[str, Stats] = field(default_factory=dict)

    @property
    def zero_share(self) -> float:
        """Share of the rounded nonzero states stored as zero (NaN: none rounded)."""
        return self.zeroed / self.states if self.states else math.nan

    @property
    def swamped_share(self) -> float:
        """Share of the changed parameters the master rounding swallowed (NaN: none changed)."""
        return self.swamped / self.updates if self.updates else math.nan

    @property
    def update_ratio(self) -> float:
        """``||update|| / ||param||`` over every tensor."""
        return math.sqrt(self.update_sq / self.param_sq) if self.param_sq else math.nan

    def add(self, name: str, s: Stats) -> None:
        self.per_tensor[name] = s
        self.states += s.state_nonzero
        self.zeroed += s.state_zeroed
        self.updates += s.updates
        self.swamped += s.swamped
        self.update_sq += s.upd_sq
        self.param_sq += s.p_ref_sq


def step_tensor(
    cfg: ReplayConfig,
    optimizer: Optimizer,
    name: str,
    master: np.ndarray,
    packed: dict[str, np.ndarray],
    comp: np.ndarray | None,
    g: np.ndarray,
    lr: float,
    t: int,
    *,
    seed: int,
    backend: Backend,
    stats: StepStats | None = None,
    known: Layout | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
    """Update ``t`` of one tensor: the gradient as ``cfg`` sees it, the replay's tensor-step
    (stochastic master rounding seeded by ``master_seed(seed, t, name)``, as a replay of a trace
    whose steps are the update counts), and the new master copy, packed states and compensation.
    ``known``: the tensor's :func:`layout` where kept (else resolved here)."""
    g = np.asarray(g, _F32)
    q = seen_grad(cfg, g, None, None, backend)[0]
    lay = known if known is not None else layout(cfg, optimizer, name, g.size)
    stored = unpack(cfg, name, g.size, packed, optimizer.states, backend, lay.storage)
    s = Stats(n=g.size) if stats is not None else None
    # the seed is drawn from only by a stochastic rounding: not computed for the others
    drawn = cfg.master_rounding is RoundMode.STOCHASTIC
    out = tensor_step(
        cfg, optimizer, name, master, stored, q, lr, t,
        seed=master_seed(seed, t, name) if drawn else 0, backend=backend, master_format=lay.master,
        comp=comp, stats=s, storage=lay.storage,
    )  # fmt: skip
    if s is not None:
        tensor_stats(s, out.p_f32, master, out.master, out.master, master, backend)
        stats.add(name, s)
    return out.master, pack(cfg, name, g.size, out.states, backend, lay.storage), out.comp
