"""What changed between two reports: ``fpsim diff REPORT_A REPORT_B``.

Reads the ``summary.json`` that ``fpsim analyze`` and ``fpsim replay`` write into their
``--out`` folder (the same JSON their ``--json`` prints) and compares them entry by entry: per
format and rounding for analyses, per configuration for replays. Values are compared exactly
as written (the summaries are deterministic, so an unchanged run gives no difference); a
changed number is shown with its relative change. Like everything in :mod:`fpsim.report`, it
computes no metric.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Change", "ReportDiff", "diff_reports", "load_summary"]

_KINDS = {"analysis": ("format", "rounding"), "replay": ("config",)}
"""A report's kind -> the fields that name one of its entries."""

_HEADER = {
    "analysis": ("trace", "steps", "tensors"),
    "replay": ("trace", "parameters", "mode", "trace_skipped_steps"),
}


@dataclass(frozen=True)
class Change:
    """One value that differs: the entry (``"float8_e4m3fn/nearest_even"``, ``"bf16-master"``,
    or ``""`` for the report's header), the metric and the two values (None: absent)."""

    entry: str
    metric: str
    a: Any
    b: Any

    @property
    def relative(self) -> float | None:
        """``b / a - 1`` for two finite numbers with ``a != 0``, else None."""
        if not (_number(self.a) and _number(self.b)) or self.a == 0:
            return None
        return self.b / self.a - 1


@dataclass(frozen=True)
class ReportDiff:
    """The differences between report ``a`` and report ``b`` (both of one :attr:`kind`)."""

    kind: str
    a: str
    b: str
    entries: int
    """Entries present in both reports."""
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not (self.only_a or self.only_b or self.changes)

    def text(self) -> str:
        """The printed comparison: header changes, entries in one report only, then per entry
        each changed metric ``a -> b`` with its relative change."""
        lines = [f"{self.kind} reports\n  A: {self.a}\n  B: {self.b}"]
        if self.same:
            return "\n".join([*lines, f"no differences ({self.entries} entries)"])
        lines += [f"only in A: {e}" for e in self.only_a] + [f"only in B: {e}" for e in self.only_b]
        current = None
        width = max((len(c.metric) for c in self.changes), default=0)
        for c in self.changes:
            if c.entry != current:
                current = c.entry
                lines.append(f"{c.entry or 'report'}:")
            rel = c.relative
            shown = f"  ({rel:+.2%})" if rel is not None else ""
            lines.append(f"  {c.metric:<{width}}  {_shown(c.a)} -> {_shown(c.b)}{shown}")
        changed = len({c.entry for c in self.changes if c.entry})
        lines.append(f"{changed} of {self.entries} entries changed")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: kind, the two reports, entries, only_a, only_b, and the changes."""
        return {
            "kind": self.kind,
            "a": self.a,
            "b": self.b,
            "entries": self.entries,
            "only_a": self.only_a,
            "only_b": self.only_b,
            "changes": [
                {"entry": c.entry, "metric": c.metric, "a": c.a, "b": c.b, "relative": c.relative}
                for c in self.changes
            ],
        }


def load_summary(path: str | Path) -> tuple[str, dict[str, Any]]:
    """The kind (``"analysis"`` or ``"replay"``) and summary of a report folder (its
    ``summary.json``) or of a summary JSON file.

    Raises:
        ValueError: a file that is not such a summary (naming the file and what was expected).
        OSError: a path that cannot be read.
    """
    path = Path(path)
    file = path / "summary.json" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"{path}: no such report (give a report folder or its summary.json)")
    try:
        summary = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{file}: not a JSON summary ({e}); give the summary.json (or the folder) that "
            "fpsim analyze / fpsim replay wrote"
        ) from None
    results = summary.get("results") if isinstance(summary, Mapping) else None
    if not isinstance(results, list) or not all(isinstance(r, Mapping) for r in results):
        raise ValueError(f"{file}: expected a summary with a 'results' list, as fpsim analyze / replay write")
    for kind, keys in _KINDS.items():
        if all(all(k in r for k in keys) for r in results) and results:
            return kind, dict(summary)
    raise ValueError(
        f"{file}: its results name neither a format and rounding (analyze) nor a config (replay)"
    )


def diff_reports(a: str | Path, b: str | Path) -> ReportDiff:
    """Compare two reports of the same kind (see :func:`load_summary`).

    Raises:
        ValueError: reports of different kinds, or an entry named twice in one report.
    """
    kind_a, sa = load_summary(a)
    kind_b, sb = load_summary(b)
    if kind_a != kind_b:
        named = {"analysis": "an analysis", "replay": "a replay"}
        raise ValueError(f"{a} is {named[kind_a]} report and {b} {named[kind_b]} report: nothing to compare")
    changes = [Change("", k, sa.get(k), sb.get(k)) for k in _HEADER[kind_a] if sa.get(k) != sb.get(k)]
    ea, eb = _entries(sa, kind_a, a), _entries(sb, kind_b, b)
    both = [k for k in ea if k in eb]
    for key in both:
        va, vb = _flat(ea[key]), _flat(eb[key])
        for metric in dict.fromkeys([*va, *vb]):
            if not _equal(va.get(metric), vb.get(metric)):
                changes.append(Change(key, metric, va.get(metric), vb.get(metric)))
    return ReportDiff(
        kind_a,
        str(a),
        str(b),
        len(both),
        [k for k in ea if k not in eb],
        [k for k in eb if k not in ea],
        changes,
    )


def _entries(summary: Mapping[str, Any], kind: str, where: Any) -> dict[str, Mapping[str, Any]]:
    keys = _KINDS[kind]
    out: dict[str, Mapping[str, Any]] = {}
    for r in summary["results"]:
        name = "/".join(str(r[k]) for k in keys)
        if name in out:
            raise ValueError(f"{where}: entry {name} appears twice")
        out[name] = {k: v for k, v in r.items() if k not in keys}
    return out


def _flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts (the swamping estimates) as dotted names."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _equal(x: Any, y: Any) -> bool:
    """Equal as written; ``nan`` (written as the string "nan" or a float NaN) equals itself."""
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y and type(x) is type(y) or (_number(x) and _number(y) and x == y)


def _shown(v: Any) -> str:
    if v is None:
        return "(absent)"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:.6g}"
