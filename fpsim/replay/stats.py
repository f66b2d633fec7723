"""The replay's statistics: per (step, tensor, config) sums, the metrics formed from them, and
the :class:`ReplayResult` that holds them.

Every statistic is a mergeable partial (counts and float64 sums, the conventions of the README's
Architecture section), so the metrics over steps, tensors or workers are formed exactly from
the sums. :func:`tensor_stats` and :func:`state_stats` compute them on numpy, or on
:attr:`fpsim.Backend.COMPILED` by the loops ``tensor_stats`` and ``state_stats`` of
:mod:`fpsim._compiled.loops` (the same counts; the float64 sums in another order).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import _compiled
from .._compiled import Backend
from ..formats.amax import amax_propagate_nan
from ..trace import json_safe
from .config import ReplayConfig, memory_table

__all__ = ["REPR_ROWS", "ReplayResult", "Stats", "state_stats", "sum_sq", "tensor_stats"]

REPR_ROWS = 12
"""The most configurations the repr of a :class:`ReplayResult` shows (the rest as ``...``)."""

_COUNTS = (
    "n",
    "p_err_sq",
    "p_ref_sq",
    "upd_dot",
    "upd_sq",
    "upd_ref_sq",
    "updates",
    "swamped",
    "state_nonzero",
    "state_zeroed",
)


@dataclass
class Stats:
    """Per step x tensor x config sums, so that global metrics can be formed exactly.

    ``n`` elements; ``p_err_sq`` = sum (p - p_ref)^2 and ``p_ref_sq`` = sum p_ref^2 after the
    step; ``upd_dot``, ``upd_sq``, ``upd_ref_sq``: the dot products of the update and the
    reference's update; ``updates``: elements the optimizer changed, ``swamped``: those of them
    the master rounding swallowed; ``state_nonzero`` / ``state_zeroed``: nonzero rounded state
    elements and those of them stored as zero; per state, ``state_err_sq`` = sum (s - s_ref)^2
    and ``state_ref_sq`` = sum s_ref^2.
    """

    n: int = 0
    p_err_sq: float = 0.0
    p_ref_sq: float = 0.0
    upd_dot: float = 0.0
    upd_sq: float = 0.0
    upd_ref_sq: float = 0.0
    updates: int = 0
    swamped: int = 0
    state_nonzero: int = 0
    state_zeroed: int = 0
    state_err_sq: dict[str, float] = field(default_factory=dict)
    state_ref_sq: dict[str, float] = field(default_factory=dict)


@dataclass
class ReplayResult:
    """Per (step, tensor, config) statistics plus per (step, config) loss scale and skips.

    ``final_params[config][tensor]`` and ``final_states[config][tensor][state]`` hold the
    values after the last replayed step (float32, dequantized); config ``"reference"`` is the
    FP32 reference. ``mode``: ``"sequence"`` or ``"each"`` (:class:`fpsim.replay.Mode`; in
    ``each`` every step's statistics are those of one update from the recorded values, and the
    final values are those of the last step's update). ``trace_skipped``: the steps the recorded
    run skipped (no update there, for the reference nor any configuration).
    """

    trace: str
    configs: list[ReplayConfig]
    steps: list[int]
    mode: str = "sequence"
    trace_skipped: list[int] = field(default_factory=list)
    grad_sq: dict[tuple[int, str], float] = field(default_factory=dict)
    """Per (step, tensor): the sum of squares of the recorded gradient (float64)."""
    stats: dict[tuple[int, str, str], Stats] = field(default_factory=dict)
    scale: dict[tuple[int, str], float] = field(default_factory=dict)
    skipped: dict[tuple[int, str], bool] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    final_params: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    final_states: dict[str, dict[str, dict[str, np.ndarray]]] = field(default_factory=dict)
    interrupted: str | None = None
    """Set when Ctrl-C ended the replay early (``keep_on_interrupt``): the steps done."""

    def final_state(self, config: str) -> dict[str, np.ndarray]:
        """The final float32 parameters and states of ``config`` (or ``"reference"``) under the
        trace's keys: ``param:<name>``, ``state.exp_avg:<name>``, ...

        Raises:
            ValueError: a configuration this replay did not run.
        """
        if config not in self.final_params:
            raise ValueError(
                f"no configuration {config!r} in this replay (it has {', '.join(self.final_params)})"
            )
        out = {
            f"param:{n}": np.ascontiguousarray(p, np.float32) for n, p in self.final_params[config].items()
        }
        for name, states in self.final_states[config].items():
            for st, v in states.items():
                out[f"state.{st}:{name}"] = np.ascontiguousarray(v, np.float32)
        return out

    def save_state(self, folder: str | os.PathLike[str]) -> dict[str, Path]:
        """Write :meth:`final_state` of the reference and of every configuration to
        ``folder/<config>.safetensors`` (the folder is created); returns the files by config.

        Raises:
            ValueError: a configuration name that is not a plain file name.
        """
        from ..trace.safetensors_io import write_safetensors

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = {}
        for config in self.final_params:
            if Path(config).name != config or config in ("", ".", ".."):
                raise ValueError(f"configuration name {config!r} cannot name a file in {folder}")
            meta = {"fpsim_replay_config": config, "trace": self.trace, "mode": self.mode}
            meta["last_step"] = str(self.steps[-1]) if self.steps else ""
            paths[config] = folder / f"{config}.safetensors"
            write_safetensors(paths[config], self.final_state(config), meta)
        return paths

    COLUMNS = ("step", "tensor", "config", "metric", "value")
    """The columns of :meth:`rows` and :meth:`table`."""

    def table(self):
        """Tidy DataFrame of :meth:`rows`: step, tensor, config, metric, value."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=list(self.COLUMNS))

    def rows(self) -> list[tuple]:
        """The tidy rows, one per step x tensor x configuration x metric, in :attr:`COLUMNS`
        order (replay.csv, without pandas)."""
        rows = []
        for (step, tensor), sq in sorted(self.grad_sq.items()):
            rows.append((step, tensor, "reference", "grad_norm", math.sqrt(sq)))
            some = next((self.stats[step, tensor, c.name] for c in self.configs), None)
            if some is not None:
                rows.append(
                    (step, tensor, "reference", "update_param_ratio", _ratio(some.upd_ref_sq, some.p_ref_sq))
                )
        for (step, tensor, cfg), s in sorted(self.stats.items()):
            for metric, value in _metrics(s).items():
                rows.append((step, tensor, cfg, metric, value))
        for (step, cfg), scale in sorted(self.scale.items()):
            rows.append((step, "*", cfg, "loss_scale", scale))
            rows.append((step, "*", cfg, "skipped", float(self.skipped[step, cfg])))
        return rows

    def per_step(self, config: str) -> list[dict[str, float]]:
        """Metrics over all tensors, one dict per step."""
        out = []
        for step in self.steps:
            total = _sum(s for (st, _, c), s in self.stats.items() if st == step and c == config)
            out.append(
                {
                    "step": step,
                    **_metrics(total),
                    "loss_scale": self.scale.get((step, config), 1.0),
                    "skipped": float(self.skipped.get((step, config), False)),
                }
            )
        return out

    def summary(self) -> dict[str, Any]:
        """One entry per configuration under ``results``, after the FP32 reference's (JSON-ready)."""
        mem = {r["config"]: r for r in memory_table(self.configs, self.sizes)}
        fp32 = memory_table([ReplayConfig("reference")], self.sizes)[0]["total"]
        reference = {
            "config": "reference",
            "steps": len(self.steps),
            "final_param_rel_error": 0.0,
            "max_param_rel_error": 0.0,
            "mean_update_cosine": 1.0,
            "swamped_share": None,  # (the reference's own float32 rounding is not measured)
            "zero_state_share": 0.0,
            "skipped_steps": len(self.trace_skipped),
            "final_loss_scale": 1.0,
            "bytes_per_param": fp32,
        }
        results = [reference] + [self._summary_row(cfg.name, mem[cfg.name]["total"]) for cfg in self.configs]
        return {
            "trace": self.trace,
            "parameters": sum(self.sizes.values()),
            "mode": self.mode,
            "trace_skipped_steps": list(self.trace_skipped),
            "results": json_safe(results),
            **({"interrupted": self.interrupted} if self.interrupted else {}),
        }

    def summary_table(self):
        """:meth:`summary`'s ``results`` as a pandas DataFrame: one row per configuration, after
        the FP32 reference's (non-finite values as floats)."""
        import pandas as pd

        df = pd.DataFrame(self.summary()["results"])
        for col in df.columns.drop("config"):
            df[col] = pd.to_numeric(df[col])  # json_safe's "inf" / "nan" back to floats
        return df

    def _headline(self) -> str:
        tensors = len({t for _, t in self.grad_sq}) or len(self.sizes)
        return (
            f"ReplayResult of {self.trace!r} ({self.mode}): {len(self.steps)} step(s), {tensors} tensor(s), "
            f"{sum(self.sizes.values()):,} parameters; {len(self.configs)} configurations vs the FP32 "
            "reference"
        )

    def _brief(self):
        keep = ["config", "final_param_rel_error", "mean_update_cosine", "swamped_share"]
        keep += ["zero_state_share", "skipped_steps", "bytes_per_param"]
        return self.summary_table()[keep]

    def __repr__(self) -> str:
        """The headline and one line per configuration (at most :data:`REPR_ROWS`): a few lines,
        not the final parameters and per-step statistics it holds."""
        table = self._brief().to_string(index=False, max_rows=REPR_ROWS, float_format="{:.4g}".format)
        return f"{self._headline()}\n{table}"

    def _repr_html_(self) -> str:
        """The headline and one row per configuration as an HTML table (Jupyter)."""
        from html import escape

        table = self._brief().to_html(index=False, max_rows=REPR_ROWS, float_format="{:.4g}".format)
        return f"<p><b>{escape(self._headline())}</b></p>{table}"

    def _summary_row(self, config: str, bytes_per_param: float) -> dict[str, Any]:
        per_step = self.per_step(config)
        total = _sum(s for (_, _, c), s in self.stats.items() if c == config)
        cos = [r["update_cosine"] for r in per_step if not math.isnan(r["update_cosine"])]
        return {
            "config": config,
            "steps": len(self.steps),
            "final_param_rel_error": per_step[-1]["param_rel_error"] if per_step else 0.0,
            "max_param_rel_error": _max_error([r["param_rel_error"] for r in per_step]),
            "mean_update_cosine": float(np.mean(cos)) if cos else float("nan"),
            "swamped_share": total.swamped / total.updates if total.updates else 0.0,
            "zero_state_share": total.state_zeroed / total.state_nonzero if total.state_nonzero else 0.0,
            "skipped_steps": sum(self.skipped.get((s, config), False) for s in self.steps),
            "final_loss_scale": per_step[-1]["loss_scale"] if per_step else 1.0,
            "bytes_per_param": bytes_per_param,
        }


def _sum(stats: Iterable[Stats]) -> Stats:
    out = Stats()
    for s in stats:
        for name in _COUNTS:
            setattr(out, name, getattr(out, name) + getattr(s, name))
        for name in ("state_err_sq", "state_ref_sq"):
            d = getattr(out, name)
            for k, v in getattr(s, name).items():
                d[k] = d.get(k, 0.0) + v
    return out


def _metrics(s: Stats) -> dict[str, float]:
    out = {
        "param_rel_error": math.sqrt(s.p_err_sq / s.p_ref_sq) if s.p_ref_sq else math.sqrt(s.p_err_sq),
        "update_cosine": s.upd_dot / math.sqrt(s.upd_sq * s.upd_ref_sq)
        if s.upd_sq and s.upd_ref_sq
        else float("nan"),
        "swamped_share": s.swamped / s.updates if s.updates else 0.0,
        "zero_state_share": s.state_zeroed / s.state_nonzero if s.state_nonzero else 0.0,
        "update_param_ratio": _ratio(s.upd_sq, s.p_ref_sq),
    }
    for k, err in s.state_err_sq.items():
        ref = s.state_ref_sq.get(k, 0.0)
        out[f"{k}_rel_error"] = math.sqrt(err / ref) if ref else math.sqrt(err)
    return out


def _max_error(errors: list[float]) -> float:
    """The largest of relative errors (>= 0), NaN if any is NaN (a diverged step is not
    skipped, wherever it lies), 0 for none."""
    return float(amax_propagate_nan(np.array(errors, np.float64)))


def _ratio(sq: float, ref_sq: float) -> float:
    """sqrt(sq / ref_sq): a norm relative to another (nan when the other is 0)."""
    return math.sqrt(sq / ref_sq) if ref_sq else float("nan")


# --- the statistics of one tensor ---------------------------------------------------------


def sum_sq(x: np.ndarray) -> float:
    """The sum of squares of a float32 array in float64, chunk by chunk (as the other sums);
    NaN where it holds a NaN."""
    total = 0.0
    for (c,) in _chunks(x):
        with np.errstate(invalid="ignore"):  # (signaling NaNs raise the flag in the cast)
            c = c.astype(np.float64)
        total += _dot(c, c)
    return total


def tensor_stats(s: Stats, p_f32, p_old, p_new, p_ref, p_ref_old, backend: Backend) -> None:
    """Update counts (changed by the optimizer; of those, swallowed by the master rounding) and
    the float64 sums of the parameter error and of the two updates, into ``s``."""
    flat = _compiled.flat32(p_f32, p_old, p_new, p_ref, p_ref_old) if backend is Backend.COMPILED else None
    if flat is not None:
        sums = np.zeros(5)
        s.updates, s.swamped = _compiled.load().tensor_stats(*flat, sums)
    else:
        s.updates, s.swamped = _update_counts(p_f32, p_old, p_new)
        sums = _param_sums(p_new, p_ref, p_old, p_ref_old)
    s.p_err_sq, s.p_ref_sq, s.upd_dot, s.upd_sq, s.upd_ref_sq = (float(x) for x in sums)


def state_stats(s: Stats, st: str, exact, stored, ref, backend: Backend) -> None:
    """Zero counts (``exact`` given: the state was rounded) and the float64 error sums of state
    ``st``, into ``s``."""
    flat = None
    if backend is Backend.COMPILED:
        flat = _compiled.flat32(stored if exact is None else exact, stored, ref)
    if flat is not None:
        sums = np.zeros(2)
        nonzero, zeroed = _compiled.load().state_stats(*flat, sums)
        err, tot = float(sums[0]), float(sums[1])
    else:
        nonzero, zeroed = _zero_counts(exact, stored) if exact is not None else (0, 0)
        err, tot = _state_sums(stored, ref)
    if exact is not None:
        s.state_nonzero += nonzero
        s.state_zeroed += zeroed
    s.state_err_sq[st], s.state_ref_sq[st] = err, tot


# Per-tensor statistics in cache-sized chunks (float64 temporaries of a whole tensor would be
# fresh memory, page-faulted in, costing more than the arithmetic); chunk sums are added in
# order, so the result depends on the tensor's size only.
_CHUNK = 1 << 15


def _chunks(*arrays: np.ndarray):
    flat = [a.reshape(-1) for a in arrays]
    for i in range(0, flat[0].size, _CHUNK):
        yield [a[i : i + _CHUNK] for a in flat]


def _update_counts(p_f32, p_old, p_new) -> tuple[int, int]:
    """Elements the optimizer changed, and those of them the master rounding swallowed."""
    updates = swamped = 0
    for f, o, n in _chunks(p_f32, p_old, p_new):
        intended = f != o
        updates += int(np.count_nonzero(intended))
        swamped += int(np.count_nonzero(intended & (n == o)))
    return updates, swamped


def _zero_counts(exact, stored) -> tuple[int, int]:
    """Nonzero state elements, and those of them stored as zero."""
    nonzero = zeroed = 0
    for v, q in _chunks(exact, stored):
        nz = v != 0
        nonzero += int(np.count_nonzero(nz))
        zeroed += int(np.count_nonzero(nz & (q == 0)))
    return nonzero, zeroed


def _param_sums(p_new, p_ref, p_old, p_ref_old) -> tuple[float, ...]:
    """sum (new - ref)^2, sum ref^2, and the dot products of the two updates (float64)."""
    out = np.zeros(5)
    for n, r, o, ro in _chunks(p_new, p_ref, p_old, p_ref_old):
        n, r = n.astype(np.float64), r.astype(np.float64)
        d = n - r
        u, ur = n - o, r - ro
        out += [_dot(d, d), _dot(r, r), _dot(u, ur), _dot(u, u), _dot(ur, ur)]
    return tuple(float(x) for x in out)


def _state_sums(v, ref) -> tuple[float, float]:
    """sum (v - ref)^2 and sum ref^2 (float64)."""
    err = tot = 0.0
    for a, r in _chunks(v, ref):
        r = r.astype(np.float64)
        e = a - r
        err += _dot(e, e)
        tot += _dot(r, r)
    return err, tot


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """Dot product in numpy's own loop: BLAS would start its own threads inside replay's, and
    its result can depend on how many it starts."""
    return float(np.einsum("i,i->", a, b))
