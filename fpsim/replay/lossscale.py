"""Loss scaling as ``torch.amp.GradScaler`` does it, as an explicit state machine.

Rules (torch/amp/grad_scaler.py and the CPU kernel ``_amp_update_scale_`` in
aten/src/ATen/native/AmpKernels.cpp): the scale is a float32 value; after a step whose
gradients contain inf/NaN the step is skipped, ``scale *= backoff_factor`` and the growth
tracker resets; after ``growth_interval`` consecutive clean steps ``scale *= growth_factor``
(kept only when the result is finite) and the tracker resets. Unscaling multiplies by
``inv_scale = float32(1 / float64(scale))``. A static scaler never changes its scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LossScaler", "ScalerState"]

_F32 = np.float32


@dataclass(frozen=True)
class ScalerState:
    """Current scale (a float32 value) and the count of clean steps since the last change."""

    scale: float
    growth_tracker: int = 0

    @property
    def inv_scale(self) -> np.float32:
        """``float32(1 / float64(scale))``, what GradScaler.unscale_ multiplies by."""
        return _F32(1.0 / float(self.scale))


@dataclass(frozen=True)
class LossScaler:
    """Static or dynamic loss scaling with GradScaler's defaults.

    Args:
        dynamic: False keeps ``init_scale`` for ever (static loss scaling).
        init_scale, growth_factor, backoff_factor, growth_interval: as GradScaler.
    """

    dynamic: bool = True
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def init(self) -> ScalerState:
        return ScalerState(float(_F32(self.init_scale)), 0)

    def update(self, state: ScalerState, found_inf: bool) -> ScalerState:
        """The state after a step; ``found_inf`` says whether that step's gradients overflowed."""
        if not self.dynamic:
            return state
        scale = _F32(state.scale)
        if found_inf:
            return ScalerState(float(scale * _F32(self.backoff_factor)), 0)
        tracker = state.growth_tracker + 1
        if tracker == self.growth_interval:
            grown = scale * _F32(self.growth_factor)
            return ScalerState(float(grown if np.isfinite(grown) else scale), 0)
        return ScalerState(float(scale), tracker)
