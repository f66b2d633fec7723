"""Command-line helpers for running ``fpsim analyze`` on Dask (``--dask local|ADDRESS``).

:func:`add_dask_argument` adds the options to a parser and :func:`run_analyze` runs the
analysis they ask for with :func:`fpsim.distributed.analyze_distributed`. Importing this
module imports neither dask nor distributed.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .output import positive_int

__all__ = ["add_dask_argument", "run_analyze"]


def add_dask_argument(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--dask local|ADDRESS`` and ``--workers N`` to ``parser`` (returned for chaining).

    ``--dask local`` starts a local cluster of ``--workers`` processes for the run;
    ``--dask tcp://host:8786`` uses a running scheduler (``--workers`` is then ignored).
    Without ``--dask``, ``args.dask`` is None: run in this process as before.
    """
    group = parser.add_argument_group("Dask (scale out over processes or machines)")
    group.add_argument(
        "--dask",
        metavar="local|ADDRESS",
        default=None,
        help="run on Dask: 'local' starts a local cluster of --workers processes; otherwise the "
        "address of a running scheduler, e.g. tcp://host:8786",
    )
    group.add_argument(
        "--workers",
        type=positive_int,
        default=2,
        metavar="N",
        help="worker processes for --dask local (default 2)",
    )
    return parser


def run_analyze(args: argparse.Namespace, formats: Sequence[Any]) -> Any:
    """Run the analysis an ``fpsim analyze`` command line asks for, on Dask.

    Reads ``args.trace``, ``args.rounding``, ``args.role``, ``args.no_swamping``,
    ``args.quiet`` and ``args.backend`` (the ``fpsim analyze`` options; missing ones take their defaults) and
    ``args.dask`` / ``args.workers`` from :func:`add_dask_argument`.

    Args:
        args: the parsed command line.
        formats: the formats and recipes to measure (already resolved from ``--format`` /
            ``--recipe`` or the defaults).

    Returns:
        The :class:`~fpsim.analysis.run.Analysis`, equal to the one ``fpsim.analysis.run.analyze`` gives.

    Raises:
        ValueError: ``args.dask`` is not set.
    """
    from ..distributed import analyze_distributed

    scheduler = getattr(args, "dask", None)
    if not scheduler:
        raise ValueError("run_analyze needs --dask local|ADDRESS")
    return analyze_distributed(
        getattr(args, "trace", None),
        list(formats),
        roundings=getattr(args, "rounding", None) or ["nearest_even"],
        roles=getattr(args, "role", None) or ["grad"],
        swamping=not getattr(args, "no_swamping", False),
        progress=not getattr(args, "quiet", False),
        scheduler=scheduler,
        n_workers=getattr(args, "workers", 2),
        backend=getattr(args, "backend", "auto"),
    )
