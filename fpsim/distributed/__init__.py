"""The same analysis and replay, across Dask workers (``pip install 'fpsim[dask]'``).

:mod:`.executor` splits a trace into tasks whose partials reduce to exactly what a single
process computes. dask is imported only when one of these functions runs.
"""

from __future__ import annotations

from .executor import analyze_distributed, local_client, replay_distributed

__all__ = ["analyze_distributed", "local_client", "replay_distributed"]
