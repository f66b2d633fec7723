"""The repository's scripts (``benchmarks/*.py``, not package modules) imported by the tests:
:func:`loaded` imports one from its path for the duration of a ``with`` block."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextmanager
def loaded(name: str) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` as a module, registered in ``sys.modules`` while the block runs
    (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(name, None)
