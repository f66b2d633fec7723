"""The one exception type of the trace layer, and how a failed write is reported.

A write that fails keeps its own exception (an :class:`OSError` stays an ``OSError`` with its
``errno``, ``strerror`` and ``filename``, so ``except OSError`` and ``e.errno == errno.ENOSPC``
work); what the failure cost (the steps lost, the writer closed) is added to it as a note
(:func:`add_note`, :pep:`678`).
"""

from __future__ import annotations

from collections.abc import Iterable
from os import PathLike

__all__ = ["TraceError", "add_note", "steps_text", "write_failure_note"]


class TraceError(ValueError):
    """A trace file or folder is missing, corrupt, truncated or inconsistent.

    The message always names the file (or folder) and the problem. It subclasses
    :class:`ValueError` so that callers that treat bad input generically still catch it.
    """


def add_note(exc: BaseException, note: str) -> None:
    """Add ``note`` to ``exc`` (:meth:`BaseException.add_note`; on Python 3.10, which has none,
    the note is kept in ``__notes__`` as :pep:`678` specifies, but tracebacks do not show it)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover (Python 3.10)
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]


def steps_text(steps: Iterable[int]) -> str:
    """Step numbers for a message, consecutive runs shortened: ``"0..3, 7, 9..12"``.

    More than 8 runs show the first 4 and the last 2 and the number of steps; no steps give
    ``"none"``.
    """
    steps = sorted(steps)
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    parts = [f"{a}" if a == b else f"{a}..{b}" for a, b in runs]
    if len(parts) > 8:
        parts = [*parts[:4], "...", *parts[-2:], f"({len(steps)} steps)"]
    return ", ".join(parts) or "none"


def write_failure_note(
    path: str | PathLike[str], step: int, kept: Iterable[int], dropped: Iterable[int] = ()
) -> str:
    """The note a failed capture adds to its error: what is lost, what the trace keeps, what to do.

    Args:
        path: the trace folder.
        step: the step whose write failed.
        kept: the steps the trace holds (written before the failure).
        dropped: steps given after the failed one and dropped with it (a background writer's
            queue).
    """
    dropped = list(dropped)
    kept = list(kept)
    also = f", nor steps {steps_text(dropped)} given after it" if dropped else ""
    after = f" (it appends after step {max(kept)})" if kept else ""
    return (
        f"fpsim: step {step} was not written to the trace {path}{also}. The trace keeps its completed "
        f"steps ({steps_text(kept)}); its writer is closed and the folder's writer lock released: fix "
        f"the cause (e.g. free disk space) and open a new writer on the folder (TorchCapture, "
        f"TraceWriter, capture_jax) to record again{after}"
    )
