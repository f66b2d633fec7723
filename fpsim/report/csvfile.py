"""Tidy tables to CSV without pandas: the file ``DataFrame(rows, columns).to_csv(index=False)``
writes, byte for byte (tests/report/test_csvfile.py), without importing pandas, whose import
costs more than a report on a small trace takes.

Each column is typed as pandas types it: integers stay integers unless a float (or a missing
value) is in the column, which makes every number in it a float, written as numpy writes a
float64 (``3.0``, ``1e-05``; NaN and None as the empty string, infinities as ``inf``/``-inf``);
strings are quoted where they hold a comma, a quote or a line break (``csv.QUOTE_MINIMAL``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_csv"]


def write_csv(path: str | Path, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Path:
    """Write ``rows`` (tuples in ``columns`` order) to ``path`` as pandas' ``to_csv(index=False)``
    does; returns the path."""
    cells = [_column(col) for col in zip(*rows)] if rows else [[] for _ in columns]
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(columns)
        out.writerows(zip(*cells))
    return Path(path)


def _column(values: Sequence[Any]) -> list[str]:
    numbers = [v for v in values if v is not None and not isinstance(v, str)]
    if len(numbers) < len(values) - sum(v is None for v in values):  # strings: an object column
        return ["" if v is None else str(v) for v in values]
    if all(isinstance(v, (bool, np.bool_)) for v in values):
        return [str(bool(v)) for v in values]
    as_float = any(v is None or isinstance(v, (float, np.floating)) for v in values)
    if not as_float:
        return [str(int(v)) for v in values]
    return ["" if v is None or math.isnan(v) else str(np.float64(v)) for v in values]
