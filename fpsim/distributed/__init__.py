"""The same analysis and replay, across Dask workers (``pip install 'fpsim[dask]'``).

- :mod:`.analyze`: :func:`analyze_distributed`, :func:`fpsim.analysis.analyze` split by
  step x tensor x canonical chunk, with the equality guarantee and the data flow;
- :mod:`.plan`: its task plan and the assembly of the merged partials;
- :mod:`.worker`: what its tasks run on the workers;
- :mod:`.replay`: :func:`replay_distributed`, :func:`fpsim.replay.replay` split by tensor;
- :mod:`.client`: :func:`local_client` and the connection to a scheduler.

Workers read the trace themselves through :mod:`fpsim.trace.remote`. dask is imported only
when one of these functions runs.
"""

from __future__ import annotations

from .analyze import analyze_distributed
from .client import local_client
from .replay import replay_distributed

__all__ = ["analyze_distributed", "local_client", "replay_distributed"]
