"""``fpsim diff REPORT_A REPORT_B``: what changed between two analysis or two replay reports.

Compares the ``summary.json`` of two ``--out`` folders (or two saved ``--json`` outputs) with
:func:`fpsim.report.diff.diff_reports`, per format and rounding (analyze) or per configuration
(replay). Exit status 0 when they agree, 1 when they differ (as ``diff``), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``diff`` command to an argparse ``subparsers`` object; returns its parser."""
    d = subparsers.add_parser(
        "diff",
        help="what changed between two analyze or two replay reports (per format / configuration)",
        description="Compare two reports of fpsim analyze or fpsim replay: the summary.json in their "
        "--out folders, or saved --json outputs. Exit status 0: no difference; 1: they differ.",
    )
    d.add_argument("report_a", metavar="REPORT_A", help="report folder (or its summary.json): the baseline")
    d.add_argument("report_b", metavar="REPORT_B", help="report folder (or its summary.json) to compare")
    d.add_argument("--json", action="store_true", help="print the differences as JSON")
    d.set_defaults(run=run)
    return d


def run(args: argparse.Namespace) -> int:
    """Print the differences; returns 0 when there is none, 1 otherwise."""
    from ..report.diff import diff_reports

    result = diff_reports(args.report_a, args.report_b)
    print(json.dumps(result.as_dict(), indent=2) if args.json else result.text())
    return 0 if result.same else 1
