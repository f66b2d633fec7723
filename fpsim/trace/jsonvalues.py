"""Non-finite floats in JSON, which has none: how fpsim writes and reads them.

Two spellings, each for its own files:

- the trace manifest (and a step file's ``__metadata__``) spells a non-finite loss or
  learning rate ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"`` (the trace format of
  :mod:`fpsim.trace`): :func:`json_float` writes one, :func:`parse_float` reads one back;
- summaries (``summary.json`` of ``fpsim analyze`` and ``fpsim replay``, their ``--json``
  output) spell them as Python prints them, ``"inf"`` / ``"-inf"`` / ``"nan"``:
  :func:`json_safe` rewrites a whole result.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import TraceError

__all__ = ["json_float", "json_safe", "parse_float"]


def parse_float(value: Any, where: str) -> float | None:
    """A loss/lr value from JSON: a number, null, or "NaN" / "Infinity" / "-Infinity".

    Raises:
        TraceError: anything else, prefixed with ``where``.
    """
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    raise TraceError(f"{where}: expected a number or null, got {value!r}")


def json_float(value: Any) -> float | str | None:
    """A loss/lr value for JSON (non-finite values as "NaN" / "Infinity" / "-Infinity")."""
    if value is None:
        return None
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by its ``str`` (``"inf"``, ``"-inf"``, ``"nan"``).

    Goes through dicts (keys kept), lists and tuples; every other value is returned as it
    is, so ``json.dumps(json_safe(obj), allow_nan=False)`` succeeds
    wherever ``json.dumps(obj)`` would have written ``Infinity`` or ``NaN``.
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_safe(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(json_safe(v) for v in obj)
    return obj
