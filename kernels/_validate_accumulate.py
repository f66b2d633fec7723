"""Moved to :mod:`fpsim.kernels.validate.accumulate`; this name stays for the importers of
``fpsim.kernels._validate_accumulate`` (tests/kernels/test_accumulate_kernel.py)."""

from .validate.accumulate import accumulators, input_pairs, run

__all__ = ["accumulators", "input_pairs", "run"]
