"""Measurement: what a format does to recorded tensors.

- :mod:`.metrics`: mergeable partial sums per (tensor chunk, format): underflow, subnormal,
  overflow, saturation, NaN/inf counts, log2 histograms, error sums, swamping.
- :mod:`.run`: :func:`analyze`, the trace-level job behind ``fpsim analyze`` (its result is
  an :class:`Analysis`, tidy tables of those partials).
- :mod:`.exhaustive`: the opt-in check of every float32 input against ml_dtypes.
"""

from __future__ import annotations

from .run import DEFAULT_FORMATS, Analysis, analyze

__all__ = ["DEFAULT_FORMATS", "Analysis", "analyze"]
