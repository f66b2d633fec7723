"""Optimizer replay: recorded gradients through low-precision optimizers, next to FP32.

- :mod:`.config`: :class:`ReplayConfig` (formats resolved when it is made), the presets and
  the memory table.
- :mod:`.engine`: :func:`replay`, step by step.
- :mod:`.stats`: the per-step statistics and their :class:`ReplayResult`.
- :mod:`.storage`: how states and master copies are stored and rounded.
- :mod:`.fused`: the fused compiled Adam step for 8-bit block states (numba), declining
  whatever it does not cover.
- :mod:`.lossscale`: dynamic loss scaling (torch GradScaler semantics).

The update math itself is :mod:`fpsim.optim`.
"""

from __future__ import annotations

from .config import DEFAULT_CONFIGS, PRESETS, ReplayConfig, memory_table, resolve_configs
from .engine import replay, select_steps
from .lossscale import LossScaler, ScalerState
from .stats import ReplayResult

__all__ = [
    "DEFAULT_CONFIGS",
    "PRESETS",
    "LossScaler",
    "ReplayConfig",
    "ReplayResult",
    "ScalerState",
    "memory_table",
    "replay",
    "resolve_configs",
    "select_steps",
]
