"""``fpsim exhaustive FORMAT``: the opt-in check of all 2**32 float32 inputs against ml_dtypes.

Runs :func:`fpsim.analysis.exhaustive.exhaustive_check`; the exit status is 1 on any mismatch.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..formats import FORMATS, Format

__all__ = ["add_parser", "run"]


def _int(text: str) -> int:
    return int(text, 0)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``exhaustive`` command to an argparse ``subparsers`` object; returns its parser."""
    names = [n for n, f in FORMATS.items() if isinstance(f, Format)]
    e = subparsers.add_parser(
        "exhaustive", help="compare all 2**32 float32 inputs with ml_dtypes (opt-in, minutes per format)"
    )
    e.add_argument("format", choices=names, metavar="FORMAT", help="one of: " + ", ".join(names))
    e.add_argument("--backend", choices=["numpy", "jax"], default="numpy")
    e.add_argument("--start", type=_int, default=0, help="first float32 bit pattern (default 0)")
    e.add_argument("--stop", type=_int, default=1 << 32, help="one past the last pattern (default 2**32)")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(run=run)
    return e


def run(args: argparse.Namespace) -> int:
    """Compare and print the mismatches; returns the exit status (1 on any mismatch)."""
    from ..analysis.exhaustive import exhaustive_check

    res = exhaustive_check(
        args.format, backend=args.backend, start=args.start, stop=args.stop, progress=not args.quiet
    )
    print(
        f"{res.format} ({res.backend}): {res.compared} float32 inputs compared with ml_dtypes, "
        f"{res.mismatches} mismatches (NaN compared by class)"
    )
    for m in res.first:
        print(f"  input {m['input_bits']} ({m['input']!r}): ml_dtypes {m['ml_dtypes']}, fpsim {m['fpsim']}")
    return 1 if res.mismatches else 0
