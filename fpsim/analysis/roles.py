"""Totals per tensor role, and the Transformer Engine view of a trace's GEMM operands.

:func:`role_totals` sums an :class:`~fpsim.analysis.run.Analysis` per (format, rounding,
role): what ``fpsim analyze --by role`` prints.

:func:`te_view` casts the operands as Transformer Engine's FP8 recipes do (the HYBRID
format): forward operands, the GEMM inputs (role ``"input"``) and the weights (role
``"param"``), to E4M3, and the gradients of GEMM outputs (role ``"grad_output"``) to E5M2,
each tensor with its own per-tensor scale:

* ``scaling="delayed"``: :class:`fpsim.emulate.delayed.DelayedScaling` (TE's
  DelayedScaling: the scale comes from the amax history of the earlier steps), stepped
  through the recorded steps of each tensor in order. The history holds the *recorded*
  steps only: with a capture that records every N-th step it is the history of those steps,
  not of the run; the view says so (``every_step``);
* ``scaling="current"``: the scale from the tensor's own amax, the ``e4m3_tensor`` and
  ``e5m2_tensor`` recipes (TE's per-tensor current scaling).

Each cast is measured with the analysis' metrics (a :class:`~fpsim.analysis.partials.Partial`
per tensor and step: underflow, saturation, SQNR, ...). Delayed-scaling casts are decoded
as the replay engine decodes them: the element value times the float32 decode scale.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._compiled import Backend
from ..emulate import element
from ..emulate.delayed import DelayedScaling
from ..formats import RoundMode, get_format
from ..trace import as_trace, json_safe
from .metrics import Partial, measure_tensor, tally_partial
from .run import Analysis

__all__ = ["TE_FORMATS", "TEView", "role_totals", "te_view"]

TE_FORMATS = {"input": "float8_e4m3fn", "param": "float8_e4m3fn", "grad_output": "float8_e5m2"}
"""The element format of each operand role under TE's HYBRID recipe."""

_CURRENT = {"float8_e4m3fn": "e4m3_tensor", "float8_e5m2": "e5m2_tensor"}


def role_totals(analysis: Analysis) -> dict[tuple[str, str, str], Partial]:
    """Partials summed over steps and tensors, per (format, rounding, role)."""
    out: dict[tuple[str, str, str], Partial] = {}
    for (_, role, _, fmt, rnd), p in analysis.results.items():
        key = (fmt, rnd, role)
        out[key] = out[key] + p if key in out else p
    return out


@dataclass
class TEView:
    """The TE cast of every operand of a trace, per (step, role, tensor).

    Attributes:
        trace: the trace's path.
        scaling: ``"delayed"`` or ``"current"``.
        every_step: whether the trace's steps are consecutive (else the delayed history
            skips the steps that were not recorded).
        results: (step, role, tensor) -> Partial.
        formats: role -> the format (recipe) it was cast to.
    """

    trace: str
    scaling: str
    every_step: bool
    results: dict[tuple[int, str, str], Partial] = field(default_factory=dict)
    formats: dict[str, str] = field(default_factory=dict)

    def totals(self) -> dict[str, Partial]:
        """Partials summed over steps and tensors, per role."""
        out: dict[str, Partial] = {}
        for (_, role, _), p in self.results.items():
            out[role] = out[role] + p if role in out else p
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-ready: one entry per role with its format and totals."""
        rows = [
            {"role": role, "format": self.formats[role], **json_safe(p.totals())}
            for role, p in sorted(self.totals().items())
        ]
        return {"trace": self.trace, "scaling": self.scaling, "every_step": self.every_step, "roles": rows}


def te_view(
    trace: Any = None,
    scaling: str = "delayed",
    *,
    history_len: int = 1024,
    amax_compute_algo: str = "max",
    margin: int = 0,
    steps: Iterable[int] | None = None,
    backend: Backend | str = "auto",
) -> TEView:
    """Cast a trace's operands as TE's FP8 recipes do and measure them (module docstring).

    Args:
        trace: a trace (anything :func:`fpsim.trace.as_trace` takes).
        scaling: ``"delayed"`` or ``"current"``.
        history_len, amax_compute_algo, margin: :class:`~fpsim.emulate.delayed.DelayedScaling`'s.
        steps: only these steps (default: all).
        backend: where the current-scaling recipes run.

    Raises:
        ValueError: an unknown scaling, or a trace with no ``input``/``grad_output``/``param``
            float tensors in the selected steps.
    """
    if scaling not in ("delayed", "current"):
        raise ValueError(f"scaling must be 'delayed' or 'current', got {scaling!r}")
    tr = as_trace(trace)
    wanted = None if steps is None else set(steps)
    chosen = [e for e in tr.entries() if e.role in TE_FORMATS and (wanted is None or e.step in wanted)]
    if not any(e.role in ("input", "grad_output") for e in chosen):
        raise ValueError(
            f"{tr.path}: no GEMM operands (roles 'input', 'grad_output') in the selected steps: record them "
            f"with TorchCapture(operands=True); 'stats.*' roles hold statistics only"
        )
    used = sorted({e.step for e in chosen})
    view = TEView(str(tr.path), scaling, used == list(range(used[0], used[-1] + 1)))
    backend = Backend.resolve(backend)
    policies = {r: DelayedScaling(f, history_len, amax_compute_algo, margin) for r, f in TE_FORMATS.items()}
    states: dict[tuple[str, str], Any] = {}
    for e in chosen:  # by step, so each tensor's delayed state moves forward in time
        if not e.is_float:
            raise TypeError(f"{e.file}: tensor {e.key!r} has dtype {e.dtype}, not a float type")
        x = tr.read(e)
        fmt = TE_FORMATS[e.role]
        if scaling == "current":
            recipe = get_format(_CURRENT[fmt])
            view.formats[e.role] = recipe.name
            p = measure_tensor(x, recipe, RoundMode.NEAREST_EVEN, backend)
        else:
            policy = policies[e.role]
            view.formats[e.role] = (
                f"{fmt} delayed (history {history_len}, {amax_compute_algo}, margin {margin})"
            )
            state = states.get((e.role, e.name)) or policy.init()
            enc, states[(e.role, e.name)] = policy.step(state, x)
            el = get_format(fmt)
            xf = element.as_float32(np.asarray(x)).reshape(-1)
            q = (
                element.decode_array(enc.codes, el).astype(np.float32).reshape(-1)
                * enc.scales.view(np.float32)[0]
            )
            p = tally_partial(xf, q, np.asarray(enc.codes).reshape(-1), el, False)
        view.results[(e.step, e.role, e.name)] = p
    return view
