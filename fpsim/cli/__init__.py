"""The ``fpsim`` command line: :mod:`.app` holds the top-level parser and :func:`main`, and
each command is a module of its own: :mod:`.formats`, :mod:`.analyze` (with the ``--dask``
options of :mod:`.distributed`), :mod:`.replay`, :mod:`.accumulate` (its sweeps are in
:mod:`fpsim.accumulate.sweeps`), :mod:`.validate` (``validate-kernels``), :mod:`.figures` and
:mod:`.exhaustive`; :mod:`.output` prints what the report commands write."""

from __future__ import annotations

from .app import main

__all__ = ["main"]
