"""Loss scalers as explicit state machines: torch's GradScaler, DeepSpeed's DynamicLossScaler,
Megatron's DynamicGradScaler, and the Protocol a scaler of one's own meets.

How the replay engine uses a scaler (:class:`LossScalerPolicy`): ``state = scaler.init()``
once; per recorded step the gradients are multiplied by ``float32(state.scale)`` and quantized,
a step whose scaled gradients hold inf/NaN (``found_inf``) is skipped, the others are unscaled
by multiplying with ``state.inv_scale`` (a float32 value); then
``state = scaler.update(state, found_inf)``. States are frozen dataclasses; nothing is mutated.

- :class:`LossScaler` (torch/amp/grad_scaler.py ``GradScaler.update``, the kernel
  ``_amp_update_scale_cpu_kernel`` in aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp and
  ``amp_update_scale_cuda_kernel`` in aten/src/ATen/native/cuda/AmpKernels.cu): the scale is a
  float32 value, the factors are doubles; ``float32(double(scale) * factor)``, rounded once.
  After a step with inf/NaN the scale backs off and the growth tracker resets; after
  ``growth_interval`` consecutive clean steps the scale grows, kept only when the float32
  result is finite, and the tracker resets. ``inv_scale = float32(1 / double(scale))``
  (``GradScaler.unscale_``).
- :class:`DeepSpeedDynamicLossScaler` (deepspeed/runtime/fp16/loss_scaler.py
  ``DynamicLossScaler.update_scale``, used by ZeRO stages 1-3): the scale is a Python float
  (float64) with hysteresis, a floor, an error at the floor, and iteration counters.
- :class:`MegatronDynamicGradScaler` (megatron/core/optimizer/grad_scaler.py
  ``DynamicGradScaler.update``): scale, factors and floor are float32 tensors, so
  ``max(f32(scale * f32(backoff)), f32(min_scale))`` is float32 arithmetic; growth has no
  finite check.

A scaler of one's own is any object with ``init()`` and ``update(state, found_inf)`` whose
states have ``scale`` and ``inv_scale``; e.g. one that halves on overflow and never grows:

>>> from dataclasses import dataclass
>>> import numpy as np
>>> @dataclass(frozen=True)
... class HalvingState:
...     scale: float
...     @property
...     def inv_scale(self) -> np.float32:
...         return np.float32(1 / self.scale)
>>> @dataclass(frozen=True)
... class Halving:
...     init_scale: float = 2.0**15
...     def init(self) -> HalvingState:
...         return HalvingState(self.init_scale)
...     def update(self, state: HalvingState, found_inf: bool) -> HalvingState:
...         return HalvingState(state.scale / 2) if found_inf else state
>>> isinstance(Halving(), LossScalerPolicy)
True
>>> Halving().update(Halving().init(), True).scale
16384.0

``ReplayConfig("fp16-halving", grad="float16", loss_scaler=Halving())`` then replays with it.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

__all__ = [
    "DeepSpeedDynamicLossScaler",
    "DeepSpeedScalerState",
    "LossScaler",
    "LossScalerPolicy",
    "MegatronDynamicGradScaler",
    "MegatronScalerState",
    "ScaleState",
    "ScalerState",
]

_F32 = np.float32


class ScaleState(Protocol):
    """A scaler's state as the engine reads it: the scale the gradients are multiplied by (as
    ``float32(scale)``) and the float32 value unscaling multiplies by."""

    @property
    def scale(self) -> float: ...

    @property
    def inv_scale(self) -> float | np.float32: ...


StateT = TypeVar("StateT", bound=ScaleState)


@runtime_checkable
class LossScalerPolicy(Protocol[StateT]):
    """A loss scaler: its first state, and the state after a step (``found_inf``: that step's
    scaled gradients held inf/NaN, and the step was skipped)."""

    def init(self) -> StateT: ...

    def update(self, state: StateT, found_inf: bool, /) -> StateT: ...


def _inv(scale: float) -> np.float32:
    """``float32(1 / float64(scale))``; inf for a scale of 0, 0 for an infinite one."""
    with np.errstate(divide="ignore", over="ignore"):
        return _F32(np.float64(1.0) / np.float64(scale))


def _f32(x: float) -> np.float32:
    """``x`` rounded to float32 (to inf past FLT_MAX, without a warning)."""
    with np.errstate(over="ignore"):
        return _F32(x)


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < np.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _check_growth(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 1 < value < np.inf:
        raise ValueError(f"{name} must be a finite number > 1, got {value!r}")


def _check_backoff(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


# --- torch.amp.GradScaler --------------------------------------------------------------------


@dataclass(frozen=True)
class ScalerState:
    """GradScaler's ``_scale`` (a float32 value) and ``_growth_tracker`` (clean steps since the
    last change)."""

    scale: float
    growth_tracker: int = 0

    @property
    def inv_scale(self) -> np.float32:
        """``float32(1 / float64(scale))``, what ``GradScaler.unscale_`` multiplies by
        (``self._scale.double().reciprocal().float()``)."""
        return _inv(self.scale)


@dataclass(frozen=True)
class LossScaler:
    """torch.amp.GradScaler, static or dynamic, with GradScaler's defaults
    (torch/amp/grad_scaler.py ``GradScaler.__init__``).

    Args:
        dynamic: False keeps ``init_scale`` for ever (static loss scaling).
        init_scale: first scale, rounded to float32 (GradScaler's ``torch.full(..., float32)``).
        growth_factor: multiplier (a double) after ``growth_interval`` clean steps, > 1.
        backoff_factor: multiplier (a double) after a step with inf/NaN, in (0, 1).
        growth_interval: consecutive clean steps before the scale grows, >= 1.

    Raises:
        ValueError: an argument out of its range (the message names it).
    """

    dynamic: bool = True
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        _check_positive("init_scale", self.init_scale)
        _check_growth("growth_factor", self.growth_factor)
        _check_backoff("backoff_factor", self.backoff_factor)
        _check_count("growth_interval", self.growth_interval)

    def init(self) -> ScalerState:
        return ScalerState(float(_f32(self.init_scale)), 0)

    def update(self, state: ScalerState, found_inf: bool) -> ScalerState:
        """``_amp_update_scale_``: the state after a step; ``found_inf`` says whether that
        step's gradients overflowed."""
        if not self.dynamic:
            return state
        scale = float(_F32(state.scale))  # the float32 value, as the double it widens to
        if found_inf:
            return ScalerState(float(_f32(scale * self.backoff_factor)), 0)
        tracker = state.growth_tracker + 1
        if tracker == self.growth_interval:
            grown = _f32(scale * self.growth_factor)
            return ScalerState(float(grown) if np.isfinite(grown) else scale, 0)
        return ScalerState(scale, tracker)


# --- DeepSpeed DynamicLossScaler -------------------------------------------------------------

# The fields of DeepSpeedFP16Config (deepspeed/runtime/precision_config.py).
_DS_FP16_KEYS = frozenset(
    {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis"}
    | {"consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"}
)


@dataclass(frozen=True)
class DeepSpeedScalerState:
    """DynamicLossScaler's ``cur_scale`` (a float64 value), ``cur_iter`` (update_scale calls so
    far), ``last_overflow_iter`` and ``cur_hysteresis``.

    ``inv_scale`` is what ZeRO's ``unscale_and_clip_grads`` multiplies a clean step's gradients
    by: ``float32(1 / cur_scale)`` of the scale *after* that step's ``update_scale``, which
    ZeRO's ``step`` calls first (so on a step that grows the scale the gradients come out
    divided by the grown scale); the scaler fills it in.
    """

    scale: float
    inv_scale: np.float32
    cur_iter: int = 0
    last_overflow_iter: int = -1
    cur_hysteresis: int = 2


@dataclass(frozen=True)
class DeepSpeedDynamicLossScaler:
    """DeepSpeed's DynamicLossScaler (deepspeed/runtime/fp16/loss_scaler.py), with the defaults
    of DeepSpeed's ``fp16`` config (deepspeed/runtime/precision_config.py
    ``DeepSpeedFP16Config``; deepspeed/runtime/constants.py ``FP16_*_DEFAULT``), as
    ``DeepSpeedFP16Config.dynamic_loss_scale_args`` passes them.

    Rules (``update_scale``), the scale a Python float: on overflow, when ``delayed_shift == 1``
    or ``cur_hysteresis == 1``, raise if the scale already equals ``min_scale`` and
    ``raise_error_at_min_scale``, else ``scale = max(scale / scale_factor, min_scale)``;
    otherwise ``cur_hysteresis -= 1`` and the scale stays; either way
    ``last_overflow_iter = cur_iter``. On a clean step, ``consecutive_hysteresis`` refills
    ``cur_hysteresis``; with ``stable = cur_iter - last_overflow_iter - 1``, when ``stable > 0``
    and ``stable % scale_window == 0`` the scale is multiplied by ``scale_factor`` (and, without
    ``consecutive_hysteresis``, the hysteresis refilled). Then ``cur_iter += 1``. The scale is
    never refilled after a backoff until then, so once the hysteresis is spent every overflow
    backs off. The first growth comes on the ``scale_window + 1``-th clean step after an
    overflow (or the start), later ones every ``scale_window`` clean steps (DeepSpeed >= 0.17.1;
    before, ``(cur_iter - last_overflow_iter) % scale_window == 0``).

    DeepSpeed's non-ZeRO FP16_Optimizer / FP16_UnfusedOptimizer (``_update_scale`` in
    deepspeed/runtime/fp16/fused_optimizer.py, unfused_optimizer.py) follow the same rules
    without hysteresis or the error: ``delayed_shift=1, raise_error_at_min_scale=False``.

    Args:
        init_scale: ``2**initial_scale_power`` (``initial_scale_power`` 16).
        scale_window: ``loss_scale_window`` (1000), >= 1.
        min_scale: ``min_loss_scale`` (1), > 0.
        delayed_shift: ``hysteresis`` (2): overflows before the scale backs off, >= 1.
        consecutive_hysteresis: refill the hysteresis on every clean step (False).
        raise_error_at_min_scale: DynamicLossScaler's default True: an overflow that would
            back off from ``min_scale`` raises RuntimeError (DeepSpeed raises ``Exception``
            with this message and the run ends).
        scale_factor: 2.0, fixed in DynamicLossScaler (an argument before DeepSpeed 0.17.1).

    Raises:
        ValueError: an argument out of its range (the message names it).
    """

    init_scale: float = 2.0**16
    scale_window: int = 1000
    min_scale: float = 1.0
    delayed_shift: int = 2
    consecutive_hysteresis: bool = False
    raise_error_at_min_scale: bool = True
    scale_factor: float = 2.0

    def __post_init__(self) -> None:
        _check_positive("init_scale", self.init_scale)
        _check_count("scale_window", self.scale_window)
        _check_positive("min_scale", self.min_scale)
        _check_count("delayed_shift", self.delayed_shift)
        _check_growth("scale_factor", self.scale_factor)

    @classmethod
    def from_config(cls, fp16: Mapping[str, Any]) -> DeepSpeedDynamicLossScaler:
        """The scaler of a DeepSpeed config's ``"fp16"`` section (``DeepSpeedFP16Config``
        keys; missing ones take DeepSpeed's defaults), mapped as ``dynamic_loss_scale_args``.

        Raises:
            ValueError: a key DeepSpeedFP16Config does not have, or ``loss_scale`` != 0
                (static loss scaling: :class:`LossScaler` with ``dynamic=False``).
        """
        if unknown := sorted(set(fp16) - _DS_FP16_KEYS):
            raise ValueError(f"unknown DeepSpeed fp16 keys {unknown}; known: {sorted(_DS_FP16_KEYS)}")
        if fp16.get("loss_scale", 0) != 0:
            raise ValueError(f"fp16.loss_scale={fp16['loss_scale']!r} is static loss scaling, not dynamic")
        return cls(
            init_scale=2.0 ** fp16.get("initial_scale_power", 16),
            scale_window=fp16.get("loss_scale_window", 1000),
            min_scale=fp16.get("min_loss_scale", 1),
            delayed_shift=fp16.get("hysteresis", 2),
            consecutive_hysteresis=fp16.get("consecutive_hysteresis", False),
        )

    def init(self) -> DeepSpeedScalerState:
        return self._state(float(self.init_scale), 0, -1, self.delayed_shift)

    def update(self, state: DeepSpeedScalerState, found_inf: bool) -> DeepSpeedScalerState:
        """``update_scale(found_inf)``.

        Raises:
            RuntimeError: an overflow at ``min_scale`` with ``raise_error_at_min_scale``.
        """
        scale, hysteresis, last = state.scale, state.cur_hysteresis, state.last_overflow_iter
        if found_inf:
            if self.delayed_shift == 1 or hysteresis == 1:
                if scale == self.min_scale and self.raise_error_at_min_scale:
                    raise RuntimeError(
                        "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
                    )
                scale = float(max(scale / self.scale_factor, self.min_scale))
            else:
                hysteresis -= 1
            last = state.cur_iter
        else:
            if self.consecutive_hysteresis:
                hysteresis = self.delayed_shift
            if self._grows(state.cur_iter, last):
                if not self.consecutive_hysteresis:
                    hysteresis = self.delayed_shift
                scale *= self.scale_factor
        return self._state(scale, state.cur_iter + 1, last, hysteresis)

    def _grows(self, cur_iter: int, last_overflow_iter: int) -> bool:
        """Whether a clean step at ``cur_iter`` multiplies the scale by ``scale_factor``."""
        stable_interval = (cur_iter - last_overflow_iter) - 1
        return stable_interval > 0 and stable_interval % self.scale_window == 0

    def _state(self, scale: float, cur_iter: int, last: int, hysteresis: int) -> DeepSpeedScalerState:
        after_clean = scale * self.scale_factor if self._grows(cur_iter, last) else scale
        return DeepSpeedScalerState(scale, _inv(after_clean), cur_iter, last, hysteresis)


# --- Megatron DynamicGradScaler --------------------------------------------------------------


@dataclass(frozen=True)
class MegatronScalerState:
    """DynamicGradScaler's ``_scale`` (a float32 value, possibly inf), ``_growth_tracker`` and
    ``_hysteresis_tracker``."""

    scale: float
    growth_tracker: int = 0
    hysteresis_tracker: int = 2

    @property
    def inv_scale(self) -> np.float32:
        """``MegatronGradScaler.inv_scale``: ``self._scale.double().reciprocal().float()``."""
        return _inv(self.scale)


@dataclass(frozen=True)
class MegatronDynamicGradScaler:
    """Megatron-LM's DynamicGradScaler (megatron/core/optimizer/grad_scaler.py), with the
    defaults Megatron builds it with for fp16: ``initial_loss_scale``, ``min_loss_scale``,
    ``loss_scale_window`` and ``hysteresis`` of megatron/core/optimizer/optimizer_config.py
    ``OptimizerConfig``, growth 2.0 and backoff 0.5 from ``get_megatron_optimizer``
    (megatron/core/optimizer/__init__.py).

    Rules (``update``): the scale, ``min_scale`` and both factors are float32 tensors. On
    overflow the growth tracker resets and the hysteresis tracker drops by one; once it is
    ``<= 0`` (it is refilled only by a growth) every overflow sets
    ``scale = max(f32(scale * f32(backoff_factor)), f32(min_scale))``. After
    ``growth_interval`` consecutive clean steps ``scale = f32(scale * f32(growth_factor))``
    (inf past FLT_MAX: Megatron does not check; an infinite scale then stays infinite) and
    both trackers reset. Megatron unscales before it updates, with ``inv_scale``.

    Args:
        initial_scale: ``initial_loss_scale`` (2**32), rounded to float32, > 0.
        min_scale: ``min_loss_scale`` (1.0), rounded to float32, in (0, initial_scale].
        growth_factor: 2.0, > 1, rounded to float32.
        backoff_factor: 0.5, in (0, 1), rounded to float32.
        growth_interval: ``loss_scale_window`` (1000), >= 1.
        hysteresis: ``hysteresis`` (2): consecutive-overflow budget before backing off, >= 1.

    Raises:
        ValueError: an argument out of its range (the message names it).
    """

    initial_scale: float = 2.0**32
    min_scale: float = 1.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 1000
    hysteresis: int = 2

    def __post_init__(self) -> None:
        _check_positive("initial_scale", self.initial_scale)
        _check_positive("min_scale", self.min_scale)
        if self.min_scale > self.initial_scale:
            msg = f"min_scale must be <= initial_scale, got {self.min_scale!r} > {self.initial_scale!r}"
            raise ValueError(msg)
        _check_growth("growth_factor", self.growth_factor)
        _check_backoff("backoff_factor", self.backoff_factor)
        _check_count("growth_interval", self.growth_interval)
        _check_count("hysteresis", self.hysteresis)

    def init(self) -> MegatronScalerState:
        return MegatronScalerState(float(_f32(self.initial_scale)), 0, self.hysteresis)

    def update(self, state: MegatronScalerState, found_inf: bool) -> MegatronScalerState:
        """``DynamicGradScaler.update(found_inf)``."""
        scale = _F32(state.scale)
        with np.errstate(over="ignore"):
            if found_inf:
                hysteresis = state.hysteresis_tracker - 1
                if hysteresis <= 0:
                    scale = np.maximum(scale * _f32(self.backoff_factor), _f32(self.min_scale))
                return MegatronScalerState(float(scale), 0, hysteresis)
            tracker = state.growth_tracker + 1
            if tracker == self.growth_interval:
                return MegatronScalerState(float(scale * _f32(self.growth_factor)), 0, self.hysteresis)
        return MegatronScalerState(float(scale), tracker, state.hysteresis_tracker)
