"""Printing and files for ``fpsim ab``: the summary table, ``ab.csv`` and ``ab.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["ab_text", "plot_ab", "write_ab_report"]

REFERENCE = "fp32"
"""The configuration and GEMM recipe of the run drawn highlighted (black, thicker), where it was
run: FP32 optimizer states and FP32 GEMMs."""

TOP_LAYERS = 3
"""The layers of each run's underflow ranking the table lists."""


def ab_text(summary: dict[str, Any]) -> str:
    """The table of :meth:`fpsim.train.ab.ABResult.summary`: per run final and best loss, held-out
    accuracy (where measured), first non-finite step, bytes of optimizer state per parameter;
    then, for the runs with a GEMM recipe, the :data:`TOP_LAYERS` layers that underflow most at
    the end (the operand and its underflow %)."""
    from .style import text_table

    def loss(v: Any) -> str:
        return "-" if v is None else f"{v:.4g}"

    accuracy = any("accuracy" in r for r in summary["results"])
    rows = [
        [
            r["run"],
            loss(r["final_loss"]),
            loss(r["best_loss"]),
            *([_percent(r.get("accuracy"))] if accuracy else []),
            "-" if r["first_nonfinite_step"] is None else str(r["first_nonfinite_step"]),
            f"{r['state_bytes_per_param']:.3f}",
        ]
        for r in summary["results"]
    ]
    heads = ["run", "final loss", "best loss", *(["held-out accuracy"] if accuracy else [])]
    heads += ["first non-finite step", "state bytes/param"]
    lines = [f"{summary['parameters']:,} parameters", text_table(heads, rows)]
    ranked = [r for r in summary["results"] if "underflow_ranking" in r]
    if ranked:
        lines.append(f"\nlayers that underflow most at the end (worst operand; top {TOP_LAYERS}):")
        for r in ranked:
            top = r["underflow_ranking"][:TOP_LAYERS]
            worst = ", ".join(_operand(u) for u in top)
            lines.append(f"  {r['run']}: {worst or '-'}")
    return "\n".join(lines)


def _operand(u: dict[str, Any]) -> str:
    return f"{u['module']} {u['underflow_pct']:.3g}% ({u['gemm']} {u['role']})"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def plot_ab(frame: Any, title: str = "") -> Any:
    """Loss curves from a DataFrame with columns ``step``, ``run``, ``config``, ``gemm``,
    ``loss`` (:meth:`fpsim.train.ab.ABResult.frame`): one colour per run, the run of FP32
    states and FP32 GEMMs (:data:`REFERENCE`) black and thicker. The loss axis (log) ends at three times the
    largest first-step loss; a run that leaves it is drawn up to there and its legend entry says
    from which step it is off scale, and, where its loss became non-finite, at which step.
    Returns the matplotlib Figure."""
    import numpy as np

    from .style import colours_for, new_figure, style

    first = frame.sort_values("step").groupby("run", sort=False)["loss"].first()
    top = 3 * float(np.nanmax(first.to_numpy(float))) if len(first) else 1.0
    with style():
        fig, ax = new_figure(figsize=(6.5, 4))
        is_ref = (frame["config"] == REFERENCE) & (frame["gemm"] == REFERENCE)
        colours = colours_for(list(frame.loc[~is_ref, "run"].unique()))
        for run, part in frame.groupby("run", sort=False):
            steps, loss = part["step"].to_numpy(), part["loss"].to_numpy(float)
            ref = bool(is_ref[part.index].all())
            kw = {"color": "black", "lw": 2.2, "zorder": 3} if ref else {"color": colours[run], "lw": 1.3}
            ok = np.isfinite(loss)
            label = str(run)
            off = np.flatnonzero(~ok | (loss > top))
            if off.size:
                label += f" (off scale from step {steps[off[0]]}"
                label += f", non-finite at {steps[~ok][0]})" if not ok.all() else ")"
            ax.plot(steps[ok], np.minimum(loss[ok], top * 1.5), label=label, **kw)
        ax.set_yscale("log")
        ax.set_ylim(top=top)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (batch)")
        ax.set_title(title or "A/B: the same model, start and batches in each run")
        ax.legend()
    return fig


def write_ab_report(frame: Any, out: str | Path, title: str = "") -> dict[str, Path]:
    """Write ``ab.csv`` (step, run, config, gemm, loss) and ``ab.png`` into folder ``out`` (created)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"csv": folder / "ab.csv", "png": folder / "ab.png"}
    frame.to_csv(paths["csv"], index=False)
    plot_ab(frame, title).savefig(paths["png"])
    return paths
