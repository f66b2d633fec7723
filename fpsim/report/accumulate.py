"""The table, figure and files of ``fpsim accumulate``: they consume the tidy tables of
:mod:`fpsim.accumulate.sweeps` (one row per setting x K) and compute nothing."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .style import colours_for, new_figure, style, text_table

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["deepseek_note", "error_figure", "table_text", "write_outputs"]

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


DEEPSEEK_K = 4096
"""The K of DeepSeek-V3's figure (arXiv 2412.19437, section 3.3.2): with about 14 accumulator
bits and no promotion, a maximum relative error near 2% for GEMMs of random matrices with K = 4096."""

_MARK = "<- DeepSeek ~2%"


def _deepseek_rows(df: pd.DataFrame) -> pd.Series:
    """The rows of DeepSeek-V3's setting: a ``--deepseek`` sweep's per-tensor E4M3 GEMM with a
    14-bit accumulator and no promotion, at K = 4096 (one row per rounding)."""
    if not {"kind", "accumulator", "promote_every", "recipe_a"} <= set(df.columns):
        return df["K"] != df["K"]  # not a --deepseek sweep: no row
    return (
        (df["kind"] == "deepseek")
        & (df["accumulator"] == "14")
        & df["promote_every"].isna()
        & (df["recipe_a"] == "e4m3_tensor")
        & (df["K"] == DEEPSEEK_K)
    )


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def table_text(df: pd.DataFrame) -> str:
    """The printed table: one line per setting x K ("-" where a column is missing); in a
    ``--deepseek`` sweep the rows of DeepSeek-V3's ~2% setting are marked, and
    :func:`deepseek_note` follows the table."""
    marked = list(_deepseek_rows(df))
    extra = any(marked)
    rows = [
        [_cell(key, fmt, r.get(key)) for key, _, fmt in _TABLE] + ([_MARK if m else ""] if extra else [])
        for r, m in zip(df.to_dict("records"), marked)
    ]
    heads = [h for _, h, _ in _TABLE] + ([""] if extra else [])
    text = "\n".join(line.rstrip() for line in text_table(heads, rows).splitlines())
    note = deepseek_note(df)
    return text + ("\n\n" + note if note else "")


def deepseek_note(df: pd.DataFrame) -> str:
    """Which rows of a ``--deepseek`` sweep are DeepSeek-V3's ~2% figure, and what this run
    measures there ("" for other sweeps)."""
    if "kind" not in df or not (df["kind"] == "deepseek").any():
        return ""
    rows = df[_deepseek_rows(df)]
    head = (
        "DeepSeek-V3 (arXiv 2412.19437, 3.3.2) reports a maximum relative error near 2% for "
        f"K = {DEEPSEEK_K} with about 14 accumulator bits and no promotion"
    )
    if rows.empty:
        return textwrap.fill(head + f"; K = {DEEPSEEK_K} is not in this run (--k).", 100)
    found = ", ".join(
        f"{r['rel_l2_err']:.2%} ({'nearest_even' if _missing(r['rounding']) else r['rounding']})"
        for _, r in rows.iterrows()
    )
    return textwrap.fill(
        f"{head}: the rows marked '{_MARK}'. Their norm-wise (rel L2) error here: {found}; the "
        "element-wise max relative error is dominated by outputs near zero. The 'promote 128' rows "
        "are DeepSeek's fix (partial sums promoted to FP32 every 128 products).",
        100,
    )


def error_figure(df: pd.DataFrame, title: str):
    """The norm-wise (L2) relative error and the largest error relative to the sum of the terms'
    magnitudes against K (log-log), one line per setting, one legend for both panels.

    The element-wise relative error is not drawn: outputs near zero make its maximum noise. In
    a ``--deepseek`` sweep a dotted line marks K = 4096, DeepSeek-V3's figure.
    """
    keys = ("rel_l2_err", "max_scaled_err")
    names = ("relative L2 error  ||err|| / ||exact||", "max |err| / sum |terms|  (worst output)")
    labels = list(dict.fromkeys(df["setting"]))
    colours = colours_for(labels)
    with style():
        fig, axes = new_figure(1, 2, figsize=(12, 4.8))
        markers = "os^Dvx"  # lines that coincide stay apart by their markers
        for i, label in enumerate(labels):
            g = df[df["setting"] == label].sort_values("K")
            for ax, key in zip(axes, keys):
                y = g[key].where(g[key] > 0)
                style_ = dict(marker=markers[i % len(markers)], ms=5, mfc="none", lw=1.6)
                ax.plot(g["K"], y, color=colours[label], label=label, **style_)
        for ax, name in zip(axes, names):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("K (products summed per output)")
            ax.set_title(name)
            if "kind" in df and (df["kind"] == "deepseek").any() and (df["K"] == DEEPSEEK_K).any():
                ax.axvline(DEEPSEEK_K, color="0.4", ls=":", lw=1.2)
        if "kind" in df and (df["kind"] == "deepseek").any() and (df["K"] == DEEPSEEK_K).any():
            axes[0].axhline(0.02, color="0.4", ls=":", lw=1.2)
            axes[0].annotate(
                "DeepSeek-V3: ~2% at K = 4096\n(14 bits, no promotion)",
                (DEEPSEEK_K, 0.02),
                xytext=(-8, 8),
                textcoords="offset points",
                ha="right",
                fontsize=8,
                color="0.3",
            )
        handles, texts = axes[0].get_legend_handles_labels()
        fig.legend(handles, texts, loc="outside lower center", ncol=min(3, len(labels)), fontsize=9)
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
