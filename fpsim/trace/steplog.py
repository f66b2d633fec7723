"""The step log of a version 2 trace folder (``steps.jsonl``): parsing it line by line.

The format is specified in :mod:`fpsim.trace`; :class:`~fpsim.trace.TraceWriter` appends to
the log and :func:`~fpsim.trace.reader.read_manifest` (and :mod:`fpsim.trace.remote`) read it
with these functions.
"""

from __future__ import annotations

import warnings
from typing import Any

from .files import load_json

__all__ = ["attach_step_log", "parse_step_log"]


def parse_step_log(data: bytes, where: str) -> tuple[list[Any], int]:
    """The items of a step log (one JSON object per line), and the length of its torn tail.

    Every line that ends with a newline must be valid (bounded) JSON, else the log is
    corrupt. Bytes after the last newline are a step whose line was being appended when the
    writer stopped: they are not an item, and their count is returned so the caller can
    report the incomplete step (and a writer can cut it off).

    Raises:
        TraceError: ``"<where>: line N: ..."`` for a complete line that is not valid JSON.
    """
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1]
    items = [load_json(line, f"{where}: line {i}", "step log line") for i, line in enumerate(lines, 1)]
    return items, len(data) - end


def attach_step_log(manifest: dict[str, Any], data: bytes, where: str) -> dict[str, Any]:
    """Set a version 2 manifest's ``"steps"`` from its step log's bytes (see :func:`parse_step_log`).

    A torn last line is reported with a :class:`RuntimeWarning` (an incomplete step, left by
    an interrupted write) and left out; every complete step is kept.
    """
    items, torn = parse_step_log(data, where)
    if torn:
        warnings.warn(
            f"{where}: the last line ({torn} bytes without its newline) is an incomplete step, left by an "
            f"interrupted write; it is ignored",
            RuntimeWarning,
            stacklevel=3,
        )
    manifest["steps"] = items
    return manifest
