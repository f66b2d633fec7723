"""``fpsim analyze [TRACE]``: underflow, overflow, swamping and error of a trace under each format.

Runs :func:`fpsim.analysis.analyze` (or, with ``--dask``,
:func:`fpsim.distributed.analyze_distributed` through :mod:`fpsim.cli.distributed`) and
writes the report of :func:`fpsim.report.analysis.write_report`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..formats import FORMATS, RECIPES, RoundMode
from .distributed import add_dask_argument
from .output import add_backend_argument, add_figures_argument, emit, positive_int

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
    a.add_argument(
        "--by",
        choices=["role"],
        help="also print totals per (format, role); without --role every role the trace holds is "
        "measured (grad, param, state.*, input, grad_output; not the stats.* summaries)",
    )
    a.add_argument(
        "--te",
        choices=["delayed", "current"],
        help="also cast the GEMM operands as Transformer Engine's FP8 recipe does (E4M3 for inputs "
        "and weights, E5M2 for output gradients) with delayed or current per-tensor scaling",
    )
    a.add_argument(
        "--te-history", type=positive_int, default=1024, metavar="N", help="--te delayed: amax history length"
    )
    a.add_argument(
        "--te-margin", type=int, default=0, metavar="M", help="--te delayed: the scale is divided by 2**M"
    )
    a.add_argument("--out", default="fpsim-report", help="output folder (default: fpsim-report)")
    a.add_argument("--json", action="store_true", help="print the JSON summary instead of the table")
    add_figures_argument(a, "magnitudes.png and underflow_by_tensor.png")
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
    if args.by == "role" and not args.role:
        from ..trace import as_trace

        args.role = [r for r in as_trace(args.trace).roles if not r.startswith("stats.")]
    view = None
    if args.te:  # first: a trace without operands is refused before the long analysis
        from ..analysis.roles import te_view

        view = te_view(args.trace, args.te, history_len=args.te_history, margin=args.te_margin)
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
            keep_on_interrupt=True,
        )
    paths = write_report(result, args.out, figures=args.figures)
    summary, text = result.summary(), summary_text(result)
    if args.by or args.te:
        from ..report.roles import by_role_rows, by_role_text, te_text, write_role_reports

        if view is not None:
            summary["te_view"] = view.summary()
            text += "\n\n" + te_text(view)
        if args.by:
            summary["by_role"] = by_role_rows(result)
            text += "\n\n" + by_role_text(result)
        paths.update(write_role_reports(args.out, result if args.by else None, view))
    status = emit(summary, text, paths, args.json)
    if result.interrupted:  # Ctrl-C: the report of the tensors measured is written; say so
        print(f"fpsim analyze: {result.interrupted}", file=sys.stderr)
        return 130
    return status
