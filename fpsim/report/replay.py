"""Printing and files for ``fpsim replay``: summary table, CSV/JSON, Markdown with curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..replay import ReplayResult, memory_table

__all__ = ["replay_text", "write_replay_report"]

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
    return head + "\n" + text_table([h for _, h, _ in _COLS], rows)


def write_replay_report(result: ReplayResult, out: str | Path) -> dict[str, Path]:
    """replay.csv (tidy per step x tensor x config), summary.json, memory.csv, report.md, curves."""
    import pandas as pd

    from .style import new_figure, palette, style

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out / "replay.csv",
        "json": out / "summary.json",
        "memory": out / "memory.csv",
        "markdown": out / "report.md",
        "figure": out / "divergence.png",
    }
    result.table().to_csv(paths["csv"], index=False)
    summary = result.summary()
    paths["json"].write_text(json.dumps(summary, indent=2) + "\n")
    mem = pd.DataFrame(memory_table(result.configs, result.sizes))
    mem.to_csv(paths["memory"], index=False)
    with style():
        fig, (a, b) = new_figure(1, 2, figsize=(10, 3.8))
        for i, cfg in enumerate(result.configs):
            per = result.per_step(cfg.name)
            steps = [r["step"] for r in per]
            c = palette()[i % len(palette())]
            a.plot(
                steps, [max(r["param_rel_error"], 1e-12) for r in per], marker=".", color=c, label=cfg.name
            )
            b.plot(steps, [r["update_cosine"] for r in per], marker=".", color=c, label=cfg.name)
        a.set_yscale("log")
        a.set_xlabel("step")
        a.set_ylabel("||p - p_fp32|| / ||p_fp32||")
        a.set_title("Parameter divergence from the FP32 replay")
        b.set_xlabel("step")
        b.set_ylabel("cosine(update, FP32 update)")
        b.set_title("Update direction")
        b.legend(fontsize=7)
        fig.savefig(paths["figure"])
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
        mem.to_markdown(index=False) if _has_tabulate() else mem.to_string(index=False),
        "",
        "## Divergence",
        "",
        f"![divergence]({paths['figure'].name})",
        "",
    ]
    paths["markdown"].write_text("\n".join(lines))
    return paths


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
