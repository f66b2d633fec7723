"""Reports of an :class:`~fpsim.analysis.run.Analysis`: a printed table, CSV, JSON, Markdown, figures.

Consumes only the analysis tables: as everything in :mod:`fpsim.report`, it prints and plots
results and computes no metric (the README's Architecture section: report comes last).
Figures are drawn on ``matplotlib.figure.Figure`` objects (no global pyplot state, no
display needed) in the shared style of :mod:`fpsim.report.style`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.run import Analysis
from ..formats import get_format
from .csvfile import write_csv

__all__ = ["summary_text", "write_report"]

_COLUMNS = [
    ("format", "format", "{}"),
    ("rounding", "rounding", "{}"),
    ("elements", "elements", "{:,}"),
    ("underflow", "underflow", "{:,}"),
    ("underflow_pct", "underflow %", "{:.3f}"),
    ("subnormal", "subnormal", "{:,}"),
    ("overflow", "overflow", "{:,}"),
    ("saturated", "saturated", "{:,}"),
    ("nan_in", "NaN in", "{:,}"),
    ("inf_in", "inf in", "{:,}"),
    ("sqnr_db", "SQNR dB", "{:.2f}"),
    ("rel_l2_error", "rel L2 err", "{:.3e}"),
    ("underflow_energy_share", "underflow energy", "{:.2e}"),
    ("swamped_pct", "swamped % (RNE)", "{}"),
]


def _rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r in summary["results"]:
        row = dict(r)
        row["underflow_pct"] = 100 * r["underflow"] / r["nonzero"] if r["nonzero"] else 0.0
        sw = r.get("swamping_nearest_even")
        row["swamped_pct"] = f"{100 * sw['swamped_share']:.2f}" if sw else "-"
        rows.append(row)
    return rows


def summary_text(analysis: Analysis) -> str:
    """The readable summary table that ``fpsim analyze`` prints."""
    from .style import text_table

    s = analysis.summary()
    cells = [[_fmt(spec, r.get(key)) for key, _, spec in _COLUMNS] for r in _rows(s)]
    header = f"{s['trace']}: {s['steps']} steps, {s['tensors']} tensors"
    if "interrupted" in s:
        header += f" ({s['interrupted']})"
    text = header + "\n" + text_table([h for _, h, _ in _COLUMNS], cells, left=2)
    skipped: dict[tuple[str, str, str], list[int]] = {}  # recipes that do not fit a tensor
    for d in s["not_covered"]:
        skipped.setdefault((d["format"], d["role"], d["tensor"]), []).append(d["elements"])
    for (fmt, role, tensor), ns in skipped.items():
        steps = f"{len(ns)} steps" if len(ns) > 1 else "1 step"
        text += (
            f"\n  not covered by {fmt}: {role} {tensor!r} ({sum(ns):,} elements, {steps}; see summary.json)"
        )
    return text


def _fmt(spec: str, v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return spec.format(v)


def write_report(analysis: Analysis, out: str | Path, figures: bool = True) -> dict[str, Path]:
    """Write metrics.csv, summary.json, report.md and (``figures``) the figures into ``out``
    (without figures, matplotlib is not imported and report.md says how to draw them)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "metrics.csv", "json": out / "summary.json", "markdown": out / "report.md"}
    write_csv(paths["csv"], analysis.COLUMNS, analysis.rows())
    summary = analysis.summary()
    paths["json"].write_text(json.dumps(summary, indent=2) + "\n")
    figs: dict[str, Path] = {}
    if figures:
        from .style import style

        figs = {"histogram": out / "magnitudes.png", "underflow": out / "underflow_by_tensor.png"}
        with style():
            _save(magnitude_figure(analysis), figs["histogram"])
            _save(underflow_figure(analysis), figs["underflow"])
    paths.update(figs)
    paths["markdown"].write_text(_markdown(analysis, summary, figs))
    return paths


def _markdown(analysis: Analysis, summary: dict[str, Any], figs: dict[str, Path]) -> str:
    rows = _rows(summary)
    heads = [h for _, h, _ in _COLUMNS]
    lines = [
        "# fpsim analysis",
        "",
        f"Trace `{summary['trace']}`: {summary['steps']} steps, {summary['tensors']} tensors.",
        "",
        "Totals over the whole trace (counts over elements; SQNR and errors over elements whose "
        "result is finite; overflow counted separately).",
        "",
        "| " + " | ".join(heads) + " |",
        "|" + "---|" * len(heads),
    ]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(spec, r.get(key)) for key, _, spec in _COLUMNS) + " |")
    if not figs:
        return "\n".join([*lines, "", "(Figures not drawn: `fpsim analyze --figures` draws them.)", ""])
    lines += [
        "",
        "## Magnitudes against each format's range",
        "",
        f"![magnitude histogram]({figs['histogram'].name})",
        "",
        "## Underflow per tensor and step",
        "",
        f"![underflow]({figs['underflow'].name})",
        "",
    ]
    return "\n".join(lines)


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=110)


def magnitude_figure(analysis: Analysis):
    """log2-magnitude histogram of all tensors, with each format's range marked."""
    from .style import colour_for, new_figure

    fig, ax = new_figure(figsize=(9, 4.5))
    total = sum(analysis.hist.values(), np.zeros(256, np.int64))
    e = np.arange(256) - 127
    nz = np.nonzero(total)[0]
    lo, hi = (e[nz[0]] - 4, e[nz[-1]] + 4) if nz.size else (-30, 10)
    ax.bar(e, total, width=1.0, color="0.55", label="elements per binade")
    for name in analysis.formats:
        el = _element(name)
        if el is None:
            continue
        c = colour_for(name)
        ax.axvline(math.log2(el.min_subnormal), color=c, ls=":", lw=1.2)
        ax.axvline(math.log2(el.min_normal), color=c, ls="--", lw=1.2)
        ax.axvline(math.log2(el.max), color=c, ls="-", lw=1.2, label=f"{name}: min sub / min normal / max")
        lo, hi = min(lo, math.log2(el.min_subnormal) - 2), max(hi, math.log2(el.max) + 2)
    ax.set_xlim(max(lo, -150), min(hi, 130))
    ax.set_yscale("log")
    ax.set_xlabel("log2 |x|")
    ax.set_ylabel("elements")
    ax.set_title("Magnitudes in the trace against each element format's range (unscaled)")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def _element(name: str):
    from ..formats import Format

    f = get_format(name)
    return f if isinstance(f, Format) else None


def _runs(steps: list[int]) -> list[tuple[int, int, int]]:
    """Runs of equally spaced steps: (first index, last index, spacing), in order."""
    runs: list[tuple[int, int, int]] = []
    for i in range(1, len(steps)):
        d = steps[i] - steps[i - 1]
        if runs and runs[-1][2] == d and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i, d)
        else:
            runs.append((i - 1, i, d))
    return runs


def _step_ticks(steps: list[int]) -> tuple[list[int], str]:
    """Column ticks (run ends, and multiples of 50 inside long runs) and a sentence saying how
    the recorded steps are spaced, so that equal-width columns do not hide uneven spacing."""
    runs = _runs(steps)
    marks = {0, len(steps) - 1} | {i for a, b, _ in runs for i in (a, b)}
    marks |= {i for i, s in enumerate(steps) if s % 50 == 0}
    ticks: list[int] = []
    for i in sorted(marks):
        if not ticks or i - ticks[-1] >= 3 or i == len(steps) - 1:
            if ticks and i - ticks[-1] < 3:
                ticks.pop()
            ticks.append(i)
    parts = [
        f"{'each step' if d == 1 else f'every {d}th step'} from {steps[a]} to {steps[b]}" for a, b, d in runs
    ]
    return ticks, "columns: recorded steps, " + ", then ".join(parts) if parts else "step"


def underflow_figure(analysis: Analysis):
    """Share of nonzero elements that underflow, per tensor (rows) and step (columns).

    Columns are the recorded steps, equally wide; where their spacing changes (the bundled
    trace records every tenth step, then each one) a dashed line marks it and the axis label
    says it.
    """
    from .style import new_figure

    keys = sorted({(k[1], k[2]) for k in analysis.results})
    steps = sorted({k[0] for k in analysis.results})
    fmts = analysis.formats
    rnd = analysis.roundings[0]
    ncol = min(4, len(fmts))
    nrow = math.ceil(len(fmts) / ncol)
    fig, axes = new_figure(
        nrows=nrow,
        ncols=ncol,
        figsize=(3.4 * ncol + 1.5, 0.22 * len(keys) * nrow + 1.8 * nrow),
        squeeze=False,
        sharey=True,
    )
    ticks, spacing = _step_ticks(steps)
    breaks = [b + 0.5 for _, b, _ in _runs(steps)[:-1]]
    for i, fmt in enumerate(fmts):
        ax = axes[i // ncol][i % ncol]
        grid = np.full((len(keys), len(steps)), np.nan)
        for r, (role, name) in enumerate(keys):
            for c, step in enumerate(steps):
                p = analysis.results.get((step, role, name, fmt, rnd))
                if p is not None and p.nonzero:
                    grid[r, c] = p.underflow / p.nonzero
        im = ax.imshow(grid, aspect="auto", vmin=0, vmax=1, cmap="magma_r", interpolation="nearest")
        ax.grid(False)
        for x in breaks:
            ax.axvline(x, color="#1f77b4", ls="--", lw=1.2)
        ax.set_title(fmt, fontsize=10)
        ax.set_xticks(ticks, [str(steps[t]) for t in ticks], fontsize=8)
        ax.set_yticks(range(len(keys)), [n for _, n in keys], fontsize=8)
    for j in range(len(fmts), nrow * ncol):
        axes[j // ncol][j % ncol].set_visible(False)
    fig.colorbar(im, ax=axes, shrink=0.6, label="share of nonzero elements that underflow")
    fig.supxlabel(spacing + (" (dashed line: the spacing changes)" if breaks else ""), fontsize=9)
    fig.suptitle(f"Underflow (nonzero -> 0) per tensor and step, {rnd}")
    return fig
