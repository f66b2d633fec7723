"""Tables of the per-role totals (``fpsim analyze --by role``) and of the TE view (``--te``).

Consumes :func:`fpsim.analysis.roles.role_totals` and :class:`fpsim.analysis.roles.TEView`;
prints and writes, computes no metric.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..analysis.roles import TEView, role_totals
from ..analysis.run import Analysis
from ..trace import json_safe

__all__ = ["by_role_rows", "by_role_text", "te_text", "write_role_reports"]

_HEADS = ["elements", "nonzero", "underflow", "underflow %", "subnormal", "saturated", "overflow", "SQNR dB"]


def _cells(t: dict[str, Any]) -> list[str]:
    pct = 100 * t["underflow"] / t["nonzero"] if t["nonzero"] else 0.0
    counts = [f"{t[k]:,}" for k in ("elements", "nonzero", "underflow")]
    return [
        *counts,
        f"{pct:.3f}",
        *(f"{t[k]:,}" for k in ("subnormal", "saturated", "overflow")),
        f"{t['sqnr_db']:.2f}",
    ]


def by_role_rows(analysis: Analysis) -> list[dict[str, Any]]:
    """One JSON-ready row per (format, rounding, role), in the analysis' format order."""
    totals = role_totals(analysis)
    order = {f: i for i, f in enumerate(analysis.formats)}
    keys = sorted(totals, key=lambda k: (order.get(k[0], len(order)), k[1], k[2]))
    return [
        {"format": f, "rounding": r, "role": role, **json_safe(totals[f, r, role].totals())}
        for f, r, role in keys
    ]


def by_role_text(analysis: Analysis) -> str:
    """The ``--by role`` table: totals per format, rounding and role."""
    from .style import text_table

    rows = [[r["format"], r["rounding"], r["role"], *_cells(r)] for r in by_role_rows(analysis)]
    return "Totals per format and role\n" + text_table(["format", "rounding", "role", *_HEADS], rows, left=3)


def te_text(view: TEView) -> str:
    """The TE view's table: totals per role with its format."""
    from .style import text_table

    s = view.summary()
    rows = [[r["role"], r["format"], *_cells(r)] for r in s["roles"]]
    note = (
        "" if view.every_step else " (the trace skips steps: the amax history holds the recorded steps only)"
    )
    head = f"Transformer Engine FP8 view, {view.scaling} scaling{note}"
    return head + "\n" + text_table(["role", "cast", *_HEADS], rows, left=2)


def write_role_reports(out: str | Path, analysis: Analysis | None, view: TEView | None) -> dict[str, Path]:
    """Write ``by_role.json`` and/or ``te_view.json`` into ``out``; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    if analysis is not None:
        paths["by_role"] = out / "by_role.json"
        paths["by_role"].write_text(json.dumps(by_role_rows(analysis), indent=2) + "\n")
    if view is not None:
        paths["te_view"] = out / "te_view.json"
        paths["te_view"].write_text(json.dumps(view.summary(), indent=2) + "\n")
    return paths
