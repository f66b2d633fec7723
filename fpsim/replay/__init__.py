"""Optimizer replay: recorded gradients through low-precision optimizers, next to FP32.

- :mod:`.config`: :class:`ReplayConfig` (formats resolved when it is made), the presets and
  the memory table.
- :mod:`.schedule`: which updates a replay runs and their update counts (:class:`Mode`).
- :mod:`.engine`: :func:`replay`, step by step.
- :mod:`.interrupt`: Ctrl-C at a step boundary (an ignored SIGINT stays ignored).
- :mod:`.stats`: the per-step statistics and their :class:`ReplayResult`.
- :mod:`.tensorstep`: one configuration's update of one tensor, which :mod:`fpsim.train`'s
  optimizers call too.
- :mod:`.storage`: how states and master copies are stored and rounded.
- :mod:`.fused`: the fused compiled Adam step for 8-bit block states (numba), declining
  whatever it does not cover.
- :mod:`.lossscale`: loss scaling as torch's GradScaler, DeepSpeed's DynamicLossScaler and
  Megatron's DynamicGradScaler do it, and the Protocol one's own scaler meets.

The update math itself is :mod:`fpsim.replay.optim`.
"""

from __future__ import annotations

from .config import DEFAULT_CONFIGS, PRESETS, ReplayConfig, memory_table, resolve_configs
from .engine import replay
from .lossscale import (
    DeepSpeedDynamicLossScaler,
    LossScaler,
    LossScalerPolicy,
    MegatronDynamicGradScaler,
    ScalerState,
)
from .schedule import Mode, select_steps
from .stats import ReplayResult

__all__ = [
    "DEFAULT_CONFIGS",
    "PRESETS",
    "DeepSpeedDynamicLossScaler",
    "LossScaler",
    "LossScalerPolicy",
    "MegatronDynamicGradScaler",
    "Mode",
    "ReplayConfig",
    "ReplayResult",
    "ScalerState",
    "memory_table",
    "replay",
    "resolve_configs",
    "select_steps",
]
