"""Compiled loops (numba, optional: ``pip install 'fpsim[fast]'``) for the replay's hot paths.

The loops are in :mod:`fpsim._compiled.loops`, which imports numba; this package itself
imports nothing heavy, so ``import fpsim`` stays light. An entry point resolves its ``backend``
argument once with :meth:`Backend.resolve` (the one caller of :func:`available`) and passes the
member down; code that got :attr:`Backend.COMPILED` calls :func:`load` for the loops.
The block loops number the 8-bit state encodings by :class:`fpsim.formats.codes.StateKind`.

No silent fallback: where code running on :attr:`Backend.COMPILED` meets a case its loops do
not cover (an option, a format, an array layout), it says so with :func:`fallback` (a
:class:`FallbackWarning` naming the case, once per case and process) and numpy runs the case,
with the same bits. This holds whether the compiled tier was named or chosen by ``"auto"``:
``"auto"`` chooses the tier quietly, once, before the run (numpy for small runs or without
numba), but a case the chosen tier then cannot run is reported all the same, since the user
cannot otherwise tell why a step is slow.
"""

from __future__ import annotations

import enum
import functools
import importlib
import os
import sys
import threading
import warnings
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "COMPILED_FROM",
    "Backend",
    "FallbackWarning",
    "available",
    "fallback",
    "flat32",
    "load",
    "load_measure",
    "load_operand",
]

COMPILED_FROM = 1 << 18
"""The elements from which ``"auto"`` chooses the compiled loops where an entry point knows the
size of its run (:meth:`Backend.resolve`): below, importing numba and loading its cached loops
takes longer than the numpy loops (``benchmarks/bench_cli.py``); both give the same bits."""


@functools.cache
def available() -> bool:
    """Whether numba can be imported (then the compiled paths are used)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


class Backend(enum.Enum):
    """Where the hot loops run, chosen once at an entry point and passed down.

    ``NUMPY`` is the reference tier; ``COMPILED`` runs the numba loops of
    :mod:`fpsim._compiled.loops`, which give the same bits (tested against the numpy paths).
    """

    NUMPY = "numpy"
    COMPILED = "compiled"

    @classmethod
    def resolve(cls, backend: Backend | str = "auto", elements: int | None = None) -> Backend:
        """A :class:`Backend` from a member or its name; ``"auto"`` is ``COMPILED`` where numba
        is installed, else ``NUMPY``, and ``NUMPY`` too for a run of fewer than
        :data:`COMPILED_FROM` ``elements`` (where the caller knows its size).

        Raises:
            ValueError: an unknown name (the message lists the allowed ones).
            ImportError: ``"compiled"`` without numba (the message says how to install it).
        """
        if isinstance(backend, cls):
            chosen = backend
        elif backend == "auto":
            small = elements is not None and elements < COMPILED_FROM
            return cls.COMPILED if not small and available() else cls.NUMPY
        else:
            try:
                chosen = cls(backend)
            except ValueError:
                raise ValueError(f"backend must be one of auto, numpy, compiled; got {backend!r}") from None
        if chosen is cls.COMPILED and not available():
            raise ImportError("the compiled backend needs numba: pip install 'fpsim[fast]'")
        return chosen


class FallbackWarning(UserWarning):
    """The compiled backend met a case its loops do not cover; numpy runs it (same bits, slower)."""


_warned: set[str] = set()  # the cases said so in this process
_warned_lock = threading.Lock()


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the innermost caller outside fpsim and torch (for the warning's
    location): the line of the user's code that asked for the work (``opt.step()``), not
    fpsim's internals or torch's optimizer wrapper."""
    inside = [_PACKAGE]
    if "torch" in sys.modules and getattr(sys.modules["torch"], "__file__", None):
        inside.append(os.path.dirname(os.path.abspath(sys.modules["torch"].__file__)) + os.sep)
    frame, level = sys._getframe(1), 1  # the frame of the function that calls warnings.warn
    while frame is not None and frame.f_code.co_filename.startswith(tuple(inside)):
        frame, level = frame.f_back, level + 1
    return level


def fallback(case: str, instead: str = "numpy runs it") -> None:
    """Say that the compiled backend does not cover ``case`` (what is not covered: the option,
    format or array layout) and what runs it ``instead``: a :class:`FallbackWarning`, once per
    ``case`` and process (the replay's threads included), pointing at the user's line that led
    to it; the caller then runs that."""
    with _warned_lock:
        if case in _warned:
            return
        _warned.add(case)
    warnings.warn(
        f"fpsim: the compiled backend does not cover {case}; {instead} (the same bits, slower)",
        FallbackWarning,
        stacklevel=_user_stacklevel(),
    )


def _module(name: str) -> ModuleType:
    """Submodule ``name`` of this package, imported once: taken from ``sys.modules`` after
    (the import machinery costs microseconds per call; a module another thread is still
    importing is waited for by the import)."""
    mod = sys.modules.get(f"{__name__}.{name}")
    if mod is None or getattr(mod.__spec__, "_initializing", False):
        mod = importlib.import_module(f"{__name__}.{name}")
    return mod


def load() -> ModuleType:
    """The module of compiled loops (imports numba; compiled code is cached on disk)."""
    return _module("loops")


def load_measure() -> ModuleType:
    """The module of compiled analysis and encode loops, :mod:`fpsim._compiled.measure`."""
    return _module("measure")


def load_operand() -> ModuleType:
    """The module of compiled quantize-dequantize loops, :mod:`fpsim._compiled.operand`."""
    return _module("operand")


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


def frozen(a: Any, dtype: Any = None) -> np.ndarray:
    """``a`` as a flat, C-contiguous, read-only array (of ``dtype`` if given; a view where no
    conversion is needed). numba compiles a loop once per argument type, writability
    included, so the analysis and encode loops take every input array read-only: one compiled
    version per dtype, whether the caller's array (a trace's tensors are read-only) is
    writable or not."""
    v = np.ascontiguousarray(a, dtype).reshape(-1).view()
    v.flags.writeable = False
    return v
