"""The table, figure and files of ``fpsim accumulate``: they consume the tidy tables of
:mod:`fpsim.accumulate.sweeps` (one row per setting x K) and compute nothing."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .style import new_figure, palette, style, text_table

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["error_figure", "table_text", "write_outputs"]

# (column, heading, format) of the printed table
_TABLE = [
    ("setting", "setting", "{}"),
    ("K", "K", "{:d}"),
    ("max_rel_err", "max rel err", "{:.3e}"),
    ("mean_rel_err", "mean rel err", "{:.3e}"),
    ("rel_l2_err", "rel L2 err", "{:.3e}"),
    ("max_scaled_err", "max err/sum|t|", "{:.3e}"),
    ("lost_share", "lost %", "{:.2f}"),
]


def _cell(key: str, fmt: str, v: Any) -> str:
    if key == "lost_share":
        v = 100 * v if v is not None and not math.isnan(v) else None
    return "-" if v is None else fmt.format(int(v) if key == "K" else v)


def table_text(df: pd.DataFrame) -> str:
    """The printed table: one line per setting x K ("-" where a column is missing)."""
    rows = [[_cell(key, fmt, r.get(key)) for key, _, fmt in _TABLE] for r in df.to_dict("records")]
    return text_table([h for _, h, _ in _TABLE], rows)


def error_figure(df: pd.DataFrame, title: str):
    """Max and mean elementwise relative error and the norm-wise (L2) relative error vs K
    (log-log), one line per setting."""
    keys = ("max_rel_err", "mean_rel_err", "rel_l2_err")
    names = ("max relative error", "mean relative error", "relative L2 error (norm-wise)")
    with style():
        fig, axes = new_figure(1, 3, figsize=(13, 4))
        colours = itertools.cycle(palette())
        styles = itertools.cycle(["-", "--", ":", "-."])
        for (label, g), colour in zip(df.groupby("setting", sort=False), colours):
            ls = next(styles) if len(df["setting"].unique()) > len(palette()) else "-"
            g = g.sort_values("K")
            for ax, key in zip(axes, keys):
                y = g[key].where(g[key] > 0)
                ax.plot(g["K"], y, marker="o", ms=3, color=colour, ls=ls, label=label)
        for ax, name in zip(axes, names):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("K (addends per output)")
            ax.set_ylabel(name)
        axes[0].legend(fontsize=7)
        fig.suptitle(title)
    return fig


def write_outputs(df: pd.DataFrame, out: str | Path, title: str, meta: dict[str, Any]) -> dict[str, Path]:
    """Write ``accumulate.csv``, ``accumulate.json`` (title, ``meta`` and rows) and the figure
    ``error_vs_k.png`` into the folder ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "accumulate.csv", "json": out / "accumulate.json", "figure": out / "error_vs_k.png"}
    df.to_csv(paths["csv"], index=False)
    rows = json.loads(df.to_json(orient="records"))
    paths["json"].write_text(json.dumps({"title": title, **meta, "rows": rows}, indent=1))
    error_figure(df, title).savefig(paths["figure"])
    return paths
