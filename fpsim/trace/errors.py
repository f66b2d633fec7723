"""The one exception type of the trace layer."""

from __future__ import annotations

__all__ = ["TraceError"]


class TraceError(ValueError):
    """A trace file or folder is missing, corrupt, truncated or inconsistent.

    The message always names the file (or folder) and the problem. It subclasses
    :class:`ValueError` so that callers that treat bad input generically still catch it.
    """
