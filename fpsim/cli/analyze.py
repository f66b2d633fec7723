"""``fpsim analyze [TRACE]``: underflow, overflow, swamping and error of a trace under each format.

Runs :func:`fpsim.analysis.analyze` (or, with ``--dask``,
:func:`fpsim.distributed.analyze_distributed` through :mod:`fpsim.cli.distributed`) and
writes the report of :func:`fpsim.report.analysis.write_report`.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..formats import FORMATS, RECIPES, RoundMode
from .distributed import add_dask_argument
from .output import add_backend_argument, emit

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``analyze`` command to an argparse ``subparsers`` object; returns its parser."""
    a = subparsers.add_parser(
        "analyze", help="underflow, overflow, swamping and error of a trace under each format"
    )
    a.add_argument(
        "trace",
        nargs="?",
        default=None,
        help="trace folder, folder of per-step .safetensors/.pt/.npz, or one such file "
        "(default: the bundled sample trace)",
    )
    a.add_argument(
        "--format",
        action="append",
        choices=list(FORMATS),
        metavar="F",
        help="element format (repeatable): " + ", ".join(FORMATS),
    )
    a.add_argument(
        "--recipe",
        action="append",
        choices=list(RECIPES),
        metavar="R",
        help="block recipe (repeatable): " + ", ".join(RECIPES),
    )
    a.add_argument(
        "--rounding",
        action="append",
        choices=[m.value for m in RoundMode],
        metavar="M",
        help="rounding mode (repeatable): " + ", ".join(m.value for m in RoundMode),
    )
    a.add_argument(
        "--role",
        action="append",
        metavar="ROLE",
        help="tensor role to analyse (repeatable; default grad): grad, param, state.exp_avg, ...",
    )
    a.add_argument("--out", default="fpsim-report", help="output folder (default: fpsim-report)")
    a.add_argument("--json", action="store_true", help="print the JSON summary instead of the table")
    a.add_argument("--no-swamping", action="store_true", help="skip the swamping estimate")
    a.add_argument("--quiet", action="store_true", help="no progress bar")
    add_backend_argument(a)
    add_dask_argument(a)
    a.set_defaults(run=run)
    return a


def run(args: argparse.Namespace) -> int:
    """Analyse, write the report and print it; returns the exit status (0)."""
    from ..analysis.run import DEFAULT_FORMATS, analyze
    from ..report.analysis import summary_text, write_report

    formats = [*(args.format or []), *(args.recipe or [])] or list(DEFAULT_FORMATS)
    if args.dask:
        from .distributed import run_analyze

        result = run_analyze(args, formats)
    else:
        result = analyze(
            args.trace,
            formats,
            roundings=args.rounding or ["nearest_even"],
            roles=args.role or ["grad"],
            swamping=not args.no_swamping,
            progress=not args.quiet,
            backend=args.backend,
        )
    paths = write_report(result, args.out)
    return emit(result.summary(), summary_text(result), paths, args.json)
