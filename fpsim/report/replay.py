"""Printing and files for ``fpsim replay``: summary table, CSV/JSON, Markdown with curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..replay import ReplayResult, memory_table
from .csvfile import write_csv

__all__ = ["divergence_figure", "replay_text", "write_replay_report"]

_COLS = [
    ("config", "config", "{}"),
    ("steps", "steps", "{}"),
    ("final_param_rel_error", "final param rel err", "{:.3e}"),
    ("mean_update_cosine", "mean update cos", "{:.5f}"),
    ("swamped_share", "swamped", "{:.2%}"),
    ("zero_state_share", "zeroed states", "{:.2%}"),
    ("skipped_steps", "skipped", "{}"),
    ("bytes_per_param", "bytes/param", "{:.3f}"),
]


def _cell(spec: str, v: Any) -> str:
    return v if isinstance(v, str) else "-" if v is None else spec.format(v)


def replay_text(result: ReplayResult) -> str:
    from .style import text_table

    s = result.summary()
    rows = [[_cell(spec, r[k]) for k, _, spec in _COLS] for r in s["results"]]
    head = f"{s['trace']}: {s['parameters']:,} parameters, replayed against an FP32 reference"
    if "interrupted" in s:
        head += f" ({s['interrupted']})"
    return head + "\n" + text_table([h for _, h, _ in _COLS], rows)


def divergence_figure(result: ReplayResult, title: str | None = None):
    """Per configuration and step: the parameters' relative distance from the FP32 replay (log
    scale) and the cosine of the update with the FP32 update; each configuration in its colour
    (:func:`~fpsim.report.style.colour_for`). Call inside :func:`~fpsim.report.style.style`."""
    from .style import colours_for, new_figure

    fig, (a, b) = new_figure(1, 2, figsize=(11, 4))
    colours = colours_for(cfg.name for cfg in result.configs)
    for cfg in result.configs:
        per = result.per_step(cfg.name)
        steps = [r["step"] for r in per]
        c = colours[cfg.name]
        a.plot(steps, [max(r["param_rel_error"], 1e-12) for r in per], marker=".", color=c, label=cfg.name)
        b.plot(steps, [r["update_cosine"] for r in per], marker=".", color=c, label=cfg.name)
    a.set_yscale("log")
    a.set_xlabel("step")
    a.set_ylabel("||p - p_fp32|| / ||p_fp32||")
    a.set_title("Parameter divergence from the FP32 replay")
    b.set_xlabel("step")
    b.set_ylabel("cosine(update, FP32 update)")
    b.set_title("Update direction")
    handles, labels = a.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=9)
    if title:
        fig.suptitle(title)
    return fig


def write_replay_report(result: ReplayResult, out: str | Path, figures: bool = True) -> dict[str, Path]:
    """replay.csv (tidy per step x tensor x config), summary.json, memory.csv, report.md and
    (``figures``) the curves, divergence.png (without, matplotlib is not imported)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out / "replay.csv",
        "json": out / "summary.json",
        "memory": out / "memory.csv",
        "markdown": out / "report.md",
    }
    write_csv(paths["csv"], result.COLUMNS, result.rows())
    summary = result.summary()
    paths["json"].write_text(json.dumps(summary, indent=2) + "\n")
    mem = memory_table(result.configs, result.sizes)
    write_csv(paths["memory"], list(mem[0]), [list(r.values()) for r in mem])
    if figures:
        from .style import style

        paths["figure"] = out / "divergence.png"
        with style():
            divergence_figure(result).savefig(paths["figure"])
    heads = [h for _, h, _ in _COLS]
    lines = [
        "# fpsim replay",
        "",
        f"Trace `{summary['trace']}`, {summary['parameters']:,} parameters.",
        "",
        "| " + " | ".join(heads) + " |",
        "|" + "---|" * len(heads),
    ]
    lines += ["| " + " | ".join(_cell(spec, r[k]) for k, _, spec in _COLS) + " |" for r in summary["results"]]
    lines += [
        "",
        "## Memory (bytes per parameter)",
        "",
        _memory_markdown(mem),
        "",
        "## Divergence",
        "",
        f"![divergence]({paths['figure'].name})" if figures else "(Not drawn: `fpsim replay --figures`.)",
        "",
    ]
    paths["markdown"].write_text("\n".join(lines))
    return paths


def _memory_markdown(mem: list[dict[str, Any]]) -> str:
    """The memory table (one row per configuration) as a Markdown table: numbers to 3 decimals."""
    from .style import markdown_table

    def cell(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    return markdown_table(list(mem[0]), [[cell(v) for v in row.values()] for row in mem])
