"""``fpsim figures [--out DIR]``: regenerate every figure the README shows (:mod:`fpsim.report.figures`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``figures`` command to an argparse ``subparsers`` object; returns its parser."""
    g = subparsers.add_parser("figures", help="regenerate every figure the README shows")
    g.add_argument("--out", default="figures", help="output folder (default: figures)")
    g.set_defaults(run=run)
    return g


def run(args: argparse.Namespace) -> int:
    """Write the figures and print their paths; returns the exit status (0)."""
    from ..report.figures import make_figures

    for path in make_figures(args.out):
        print(path)
    return 0
