"""The ``fpsim`` command line: :mod:`.app` holds the parser and the commands,
:mod:`.accumulate` the ``accumulate`` command and its sweeps, :mod:`.distributed` the
``--dask`` options."""

from __future__ import annotations

from .app import main

__all__ = ["main"]
