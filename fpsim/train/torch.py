"""Emulated low-precision optimizers to train with: :class:`AdamW`, :class:`Adam`, :class:`SGD`.

Drop-in ``torch.optim.Optimizer`` subclasses taking torch's arguments plus ``config=`` (a
preset name of :data:`fpsim.replay.PRESETS` or a :class:`fpsim.replay.ReplayConfig`: state
formats and recipes, master format and rounding, Kahan, per-tensor overrides, min sizes) and
``sqrt=`` (``"ieee"``: correctly rounded; ``"torch"``: torch's own CPU sqrt, with which
``config="fp32"`` gives ``torch.optim.AdamW``'s parameters bit for bit on the machine at hand).

Each tensor-step is the replay's (:func:`fpsim.replay.tensorstep.tensor_step`): the same bits
as :func:`fpsim.replay.replay` of the same gradients (tests/train records a loop and replays
it). ``self.state[p]`` holds ``step`` and the states packed (:func:`fpsim.train._core.pack`):
uint8 codes and their scales (int32 bit patterns) for block recipes, so the memory a format
saves is saved; ``state_dict()`` / ``load_state_dict()`` keep them bit for bit.

Tensors are named ``param_names`` where the group has them (``named_parameters()`` passed to
the optimizer), else ``"<group>.<index>"``; per-tensor overrides match those names. The
update count of each tensor is its own ``step`` (a step ``torch.amp.GradScaler`` skips calls
no ``step()``, as in torch). CPU tensors take the numpy / compiled path; CUDA tensors the
Triton kernel :func:`fpsim.kernels.optim.adamw_step` where it covers the configuration
(Adam/AdamW, sqrt ieee, FP32 gradients, 8-bit ABSMAX block or FP32 states, bfloat16 / float16
/ float32 master without Kahan), else the CPU path after a one-time warning. (The CUDA path is
not exercised by the CPU test suite.)

Emulated low-precision GEMMs (TE's FP8, MX and NVFP4 recipes in the forward and backward
passes) are :func:`convert` (:mod:`fpsim.train.linear`), re-exported here.

Statistics: ``stats=True`` collects a :class:`fpsim.train.StepStats` per ``step()`` in
``last_stats`` (zero share of the states, update/parameter ratio, swamped share); without it
nothing is computed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

import numpy as np
import torch

from .._compiled import Backend
from ..replay import optim as rules
from ..replay.config import ReplayConfig
from ..replay.storage import master_seed
from ._core import Layout, StepStats, init_tensor, layout, resolve_config, step_tensor
from .linear import EmulatedLinear, convert, gemm_stats

__all__ = ["SGD", "Adam", "AdamW", "EmulatedLinear", "convert", "gemm_stats"]

_UNSIGNED = {np.dtype(np.uint32): np.int32, np.dtype(np.uint16): np.int16}  # as torch stores them
_SIGNED_BACK = {torch.int32: np.uint32, torch.int16: np.uint16}
_COPIED = 1 << 16
"""Bytes of new codes or scales copied into a state tensor (cheaper than a new tensor and its
view for small tensors); larger ones become the state tensor as they are."""


class _Slot:
    """What the optimizer keeps per parameter between steps besides its state: the tensor's
    name, shape, the rule's states and :class:`fpsim.train._core.Layout`, and numpy views of
    its state tensors on the CPU (each checked to be the state's tensor still before it is
    used)."""

    __slots__ = ("layout", "name", "own", "shape", "states", "views")

    def __init__(self, name: str, shape: torch.Size, states: tuple[str, ...], lay: Layout) -> None:
        self.name, self.shape, self.states, self.layout = name, shape, states, lay
        self.views: dict[str, tuple[torch.Tensor, np.ndarray, int]] = {}  # tensor, view, address
        self.own: dict[str, tuple[torch.Tensor, int, np.ndarray]] = {}

    def numpy(self, key: str, t: torch.Tensor) -> np.ndarray:
        """:func:`_numpy` of the parameter (``key``: the role), the view kept while ``t`` is the
        same contiguous CPU tensor on the same memory (a ``.data`` swap moves it). (Not for
        gradients: a kept view would keep a gradient set to None alive.)"""
        kept = self.own.get(key)
        if kept is not None and kept[0] is t and kept[1] == t.data_ptr() and t.is_contiguous():
            return kept[2]
        a = _numpy(t)
        if t.device.type == "cpu" and t.is_contiguous():
            self.own[key] = (t, t.data_ptr(), a)
        return a

    def array(self, state: dict, key: str) -> np.ndarray:
        """``state[key]`` as numpy (:func:`_as_numpy`; the view kept while the tensor is the
        same on the same memory: a ``.data`` swap or a resize moves it)."""
        t = state[key]
        kept = self.views.get(key)
        if kept is not None and kept[0] is t and _same_memory(t, kept):
            return kept[1]
        a = _as_numpy(t)
        if t.device.type == "cpu":
            self.views[key] = (t, a, t.data_ptr())
        return a

    def put(self, state: dict, packed: dict[str, np.ndarray], device) -> None:
        """:func:`_put`, and the views of the new tensors kept (none of a replaced tensor: it
        would stay alive until the next step)."""
        _put(state, packed, device)
        for k in packed:
            t = state[k]
            self.views.pop(k, None)
            if t.device.type == "cpu":
                self.views[k] = (t, _as_numpy(t), t.data_ptr())

    def keeps(self, state: dict, key: str, a: np.ndarray) -> bool:
        """Whether ``state[key]`` holds ``a`` now: ``a`` is its kept view (updated in place), or
        codes or scales of at most :data:`_COPIED` bytes copied into it (of the same dtype and
        shape: the state tensor updated in place, as torch updates its states; the codes and
        scales of each state have their own memory: :func:`fpsim.train._core.pack` encodes
        each anew)."""
        kept = self.views.get(key)
        if kept is None or kept[0] is not state.get(key) or not _same_memory(kept[0], kept):
            return False
        if kept[1] is a:
            return True
        same = a.dtype == kept[1].dtype and a.shape == kept[1].shape
        if same and a.nbytes <= _COPIED and key.endswith((".codes", ".scales")):
            np.copyto(kept[1], a)
            return True
        return False


def _same_memory(t: torch.Tensor, kept: tuple[torch.Tensor, np.ndarray, int]) -> bool:
    """Whether the kept view ``kept[1]`` of CPU tensor ``t`` (made at address ``kept[2]``)
    still shows all of ``t``'s memory."""
    return t.data_ptr() == kept[2] and t.nbytes == kept[1].nbytes


class _Emulated(torch.optim.Optimizer):
    """The loop shared by the emulated optimizers: per tensor, :func:`step_tensor`."""

    def __init__(self, params, defaults: dict, config, sqrt, backend, seed, stats) -> None:
        super().__init__(params, defaults)
        self.config: ReplayConfig = resolve_config(config)
        self.sqrt = rules.Sqrt.resolve(sqrt)
        self.backend = Backend.resolve(backend)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self.seed = seed
        self.stats = bool(stats)
        self.last_stats: StepStats | None = None
        self._warned = False
        self._slots: dict[torch.Tensor, _Slot] = {}
        for group in self.param_groups:
            self._rule(group)  # bad hyper-parameters fail here, not at the first step

    def __getstate__(self) -> dict:
        """torch's state (defaults, per-parameter state, groups) and the emulation's settings,
        which torch's would drop (``copy.deepcopy`` and pickle then give a working copy); not
        the per-parameter bookkeeping, which holds views of this object's tensors and is made
        again at the next step."""
        state = super().__getstate__()
        state.update(config=self.config, sqrt=self.sqrt, backend=self.backend, seed=self.seed)
        state["stats"] = self.stats
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.last_stats, self._warned, self._slots = None, False, {}

    def _rule(self, group: dict) -> rules.Optimizer:
        raise NotImplementedError

    def _names(self) -> Iterable[tuple[dict, str, torch.Tensor]]:
        for gi, group in enumerate(self.param_groups):
            names = group.get("param_names") or [f"{gi}.{i}" for i in range(len(group["params"]))]
            for name, p in zip(names, group["params"]):
                yield group, name, p

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter with a gradient (``closure``: re-evaluates the loss)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stats = StepStats() if self.stats else None
        for gi, group in enumerate(self.param_groups):
            rule, lr = None, 0.0  # (once per group and step: every tensor of it takes the same)
            names = group.get("param_names") or [f"{gi}.{i}" for i in range(len(group["params"]))]
            for name, p in zip(names, group["params"]):
                if p.grad is None:
                    continue
                if p.dtype != torch.float32 or p.grad.dtype != torch.float32 or p.grad.is_sparse:
                    raise ValueError(
                        f"{name}: the emulated optimizers take float32 parameters and dense float32 "
                        f"gradients, got {p.dtype} / {p.grad.dtype}{' sparse' if p.grad.is_sparse else ''}"
                    )
                if rule is None:
                    lr = float(group["lr"])
                    if not math.isfinite(lr) or lr < 0:
                        raise ValueError(f"{name}: lr must be a finite number >= 0, got {group['lr']!r}")
                    rule = self._rule(group)
                state = self.state[p]
                if not state:
                    self._init(state, name, p, rule)
                slot = self._slot(name, p, rule, state)
                t = int(state["step"]) + 1
                if not (p.is_cuda and self._cuda_step(state, name, p, rule, lr, t)):
                    self._cpu_step(state, slot, name, p, rule, lr, t, stats)
                state["step"] = torch.scalar_tensor(float(t))  # (torch.tensor's, faster)
        self.last_stats = stats
        return loss

    def _slot(self, name: str, p: torch.Tensor, rule: rules.Optimizer, state: dict) -> _Slot:
        """The tensor's bookkeeping (kept per parameter, outside the state dict: checkpoints
        hold only ``state``), made again where its name, shape or the rule's states changed
        (what its :class:`fpsim.train._core.Layout` depends on)."""
        slot = self._slots.get(p)
        if slot is None or slot.name != name or slot.shape != p.shape or slot.states != rule.states:
            lay = layout(self.config, rule, name, p.numel())
            slot = self._slots[p] = _Slot(name, p.shape, rule.states, lay)
        return slot

    def _init(self, state: dict, name: str, p: torch.Tensor, rule: rules.Optimizer) -> None:
        master, packed, comp = init_tensor(self.config, rule, name, _numpy(p), self.backend)
        if master is not None:
            p.copy_(torch.from_numpy(master))
        state["step"] = torch.tensor(0.0)
        _put(state, packed, p.device)
        if comp is not None:
            state["kahan_comp"] = torch.from_numpy(comp).to(p.device)

    def _cpu_step(self, state, slot: _Slot, name, p, rule, lr: float, t: int, stats) -> None:
        packed = {k: slot.array(state, k) for k in state if k not in ("step", "kahan_comp")}
        comp = _as_numpy(state["kahan_comp"]) if "kahan_comp" in state else None
        master, packed, comp = step_tensor(
            self.config, rule, name, slot.numpy("param", p), packed, comp, _numpy(p.grad), lr, t,
            seed=self.seed, backend=self.backend, stats=stats, known=slot.layout,
        )  # fmt: skip
        p.copy_(torch.from_numpy(master))
        slot.put(state, {k: a for k, a in packed.items() if not slot.keeps(state, k, a)}, p.device)
        if comp is not None:
            state["kahan_comp"] = torch.from_numpy(comp).to(p.device)

    def _cuda_step(self, state, name, p, rule, lr: float, t: int) -> bool:
        """The Triton kernel's step where it covers the configuration (True), else False after
        a one-time warning."""
        from .cuda import kernel_step

        if kernel_step(self.config, rule, name, state, p, lr, t, master_seed(self.seed, t, name)):
            return True
        if not self._warned:
            warnings.warn(
                f"fpsim.train: the Triton kernel does not cover config {self.config.name!r} (or this "
                "optimizer); CUDA tensors take the CPU path (copied to the host each step)",
                stacklevel=3,
            )
            self._warned = True
        return False

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, keeping the packed codes and scales in their dtypes (torch would cast every
        tensor of a floating-point parameter's state to the parameter's dtype)."""
        saved = [pid for g in state_dict["param_groups"] for pid in g["params"]]
        mine = [p for g in self.param_groups for p in g["params"]]
        if len(saved) != len(mine):
            raise ValueError(
                f"load_state_dict: the state holds {len(saved)} parameters, the optimizer {len(mine)}"
            )
        kept = {pid: dict(s) for pid, s in state_dict["state"].items()}
        stripped = {pid: {"step": s["step"]} for pid, s in kept.items() if "step" in s}
        super().load_state_dict({"state": stripped, "param_groups": state_dict["param_groups"]})
        names = {id(p): (group, name) for group, name, p in self._names()}
        for pid, p in zip(saved, mine):
            if pid in kept:
                group, name = names[id(p)]
                _, packed, comp = init_tensor(
                    self.config, self._rule(group), name, np.zeros(p.shape, np.float32), Backend.NUMPY
                )
                want = {"step", *packed, *(["kahan_comp"] if comp is not None else [])}
                if set(kept[pid]) != want:
                    raise ValueError(
                        f"load_state_dict: {name} has state {sorted(kept[pid])}, config {self.config.name!r} "
                        f"stores {sorted(want)}: load a state saved under the same config"
                    )
                for k, v in kept[pid].items():
                    if k != "step":
                        self.state[p][k] = v.detach().clone().to(p.device)


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A float32 CPU tensor's memory as numpy (a CUDA tensor's host copy)."""
    t = t.detach()
    return (t if t.device.type == "cpu" else t.cpu()).contiguous().numpy()


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    a = t.detach().cpu().numpy()
    back = _SIGNED_BACK.get(t.dtype)
    return a.view(back) if back is not None else a


def _put(state: dict, packed: dict[str, np.ndarray], device) -> None:
    """The packed arrays into ``state`` as tensors (unsigned 16/32-bit as their signed views)."""
    for k, a in packed.items():
        a = np.ascontiguousarray(a)
        signed = _UNSIGNED.get(a.dtype)
        old = state.get(k)
        ptr = a.__array_interface__["data"][0]
        if old is not None and old.device.type == "cpu" and old.data_ptr() == ptr and old.nbytes == a.nbytes:
            continue  # updated in place (the same memory)
        state[k] = torch.from_numpy(a.view(signed) if signed is not None else a).to(device)


class _Adam(_Emulated):
    _decoupled: bool

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        amsgrad: bool = False,
        maximize: bool = False,
        config: ReplayConfig | str = "fp32",
        sqrt: rules.Sqrt | str = "ieee",
        backend: Backend | str = "auto",
        seed: int = 0,
        stats: bool = False,
    ) -> None:
        if amsgrad or maximize:
            raise ValueError(f"{type(self).__name__}: amsgrad and maximize are not emulated")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults, config, sqrt, backend, seed, stats)

    def _rule(self, group: dict) -> rules.Optimizer:
        cls = rules.AdamW if self._decoupled else rules.Adam
        return cls(
            betas=tuple(group["betas"]), eps=group["eps"], weight_decay=group["weight_decay"], sqrt=self.sqrt
        )


class AdamW(_Adam):
    """``torch.optim.AdamW`` (decoupled weight decay, default 1e-2) with emulated storage: the
    update of :class:`fpsim.replay.optim.AdamW` (module doc for ``config``, ``sqrt``,
    ``backend``, ``seed`` of stochastic master rounding and ``stats``).

    Raises:
        ValueError: an unknown config or sqrt, bad hyper-parameters, ``amsgrad`` or
            ``maximize``; at ``step()``, parameters or gradients that are not float32.
    """

    _decoupled = True

    def __init__(
        self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay=1e-2, **kw
    ):
        super().__init__(params, lr, betas, eps, weight_decay, **kw)


class Adam(_Adam):
    """``torch.optim.Adam`` (L2 weight decay) with emulated storage; as :class:`AdamW`."""

    _decoupled = False


class SGD(_Emulated):
    """``torch.optim.SGD`` (momentum, nesterov, L2 weight decay; dampening 0) with emulated
    storage of the momentum buffer (:class:`fpsim.replay.optim.SGD`, which keeps the buffer
    also with momentum 0); as :class:`AdamW`.

    Raises:
        ValueError: as :class:`AdamW`; ``dampening`` other than 0, ``maximize``, or nesterov
            without momentum.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        config: ReplayConfig | str = "fp32",
        backend: Backend | str = "auto",
        seed: int = 0,
        stats: bool = False,
    ) -> None:
        if dampening or maximize:
            raise ValueError("SGD: dampening and maximize are not emulated")
        if nesterov and not momentum:
            raise ValueError("SGD: nesterov needs a momentum > 0 (as torch.optim.SGD)")
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "nesterov": nesterov}
        super().__init__(params, defaults, config, "ieee", backend, seed, stats)

    def _rule(self, group: dict) -> rules.Optimizer:
        return rules.SGD(
            momentum=group["momentum"], weight_decay=group["weight_decay"], nesterov=group["nesterov"]
        )
