"""Compiled loops (numba, optional: ``pip install 'fpsim[fast]'``) for the replay's hot paths.

The loops are in :mod:`fpsim._compiled.loops`, which imports numba; this package itself
imports nothing heavy, so ``import fpsim`` stays light. Call :func:`load` for that module once
:func:`available` says numba is there.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["available", "flat32", "load"]


@functools.cache
def available() -> bool:
    """Whether numba can be imported (then the compiled paths are used)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def load() -> ModuleType:
    """The module of compiled loops (imports numba; compiled code is cached on disk)."""
    from . import loops as mod

    return mod


def flat32(*arrays: Any) -> list[np.ndarray] | None:
    """1-D views of float32 C-contiguous arrays of one size, or None (then use numpy)."""
    out = []
    for a in arrays:
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
            return None
        out.append(a.reshape(-1))
    if len({a.size for a in out}) > 1:
        return None
    return out
