"""Optimizer replay: recorded gradients through low-precision optimizers, next to FP32.

- :mod:`.engine`: :class:`ReplayConfig` and the presets, :func:`replay` and its
  :class:`ReplayResult`, the per-step statistics and the memory table.
- :mod:`.fused`: the fused compiled Adam step for 8-bit block states (numba), declining
  whatever it does not cover.
- :mod:`.lossscale`: dynamic loss scaling (torch GradScaler semantics).

The update math itself is :mod:`fpsim.optim`.
"""

from __future__ import annotations

from .engine import PRESETS, ReplayConfig, ReplayResult, memory_table, replay
from .lossscale import LossScaler, ScalerState

__all__ = ["PRESETS", "LossScaler", "ReplayConfig", "ReplayResult", "ScalerState", "memory_table", "replay"]
