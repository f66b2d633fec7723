"""``fpsim exhaustive FORMAT``: the opt-in check of all 2**32 float32 inputs against ml_dtypes.

Runs :func:`fpsim.analysis.exhaustive.exhaustive_check` slice by slice (2**28 patterns each), so
that Ctrl-C prints what the slices done so far found (exit status 130); otherwise the exit status
is 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..formats import FORMATS, Format

__all__ = ["add_parser", "run"]


def _int(text: str) -> int:
    """A float32 bit pattern: an integer in 0..2**32, decimal or 0x hexadecimal."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes an integer such as 0x3f800000, got {text!r}") from None
    if not 0 <= value <= 1 << 32:
        raise argparse.ArgumentTypeError(f"must lie in 0..2**32, got {text!r}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``exhaustive`` command to an argparse ``subparsers`` object; returns its parser."""
    names = [n for n, f in FORMATS.items() if isinstance(f, Format)]
    e = subparsers.add_parser(
        "exhaustive", help="compare all 2**32 float32 inputs with ml_dtypes (opt-in; minutes per format)"
    )
    e.add_argument("format", choices=names, metavar="FORMAT", help="one of: " + ", ".join(names))
    e.add_argument(
        "--backend", choices=["numpy", "jax"], default="numpy", help="fpsim's tier to check (default numpy)"
    )
    e.add_argument("--start", type=_int, default=0, help="first float32 bit pattern (default 0)")
    e.add_argument("--stop", type=_int, default=1 << 32, help="one past the last pattern (default 2**32)")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(run=run)
    return e


_SHOWN = 10  # mismatches printed
_SLICE = 1 << 28
"""Bit patterns per call of the check: Ctrl-C keeps the slices done (16 for all 2**32)."""


def run(args: argparse.Namespace) -> int:
    """Compare and print the mismatches; returns the exit status (1 on any mismatch, 130 when
    interrupted, after printing what the slices done so far found)."""
    from tqdm.auto import tqdm

    from ..analysis.exhaustive import ExhaustiveResult, exhaustive_check

    if args.start >= args.stop:
        raise ValueError(f"--start {args.start:#x} must be below --stop {args.stop:#x}")
    res = ExhaustiveResult(args.format, args.backend, 0, 0)
    bar = tqdm(total=args.stop - args.start, unit="B", unit_scale=True, disable=args.quiet, desc=args.format)
    try:
        for lo in range(args.start, args.stop, _SLICE):
            part = exhaustive_check(
                args.format, backend=args.backend, start=lo, stop=min(lo + _SLICE, args.stop), progress=False
            )
            res.compared += part.compared
            res.mismatches += part.mismatches
            res.first += part.first[: max(0, _SHOWN - len(res.first))]
            bar.update(part.compared)
    except KeyboardInterrupt:
        bar.close()
        print(f"interrupted: {res.compared} of {args.stop - args.start} inputs done", file=sys.stderr)
        _print(res)
        return 130
    bar.close()
    _print(res)
    return 1 if res.mismatches else 0


def _print(res) -> None:
    print(
        f"{res.format} ({res.backend}): {res.compared} float32 inputs compared with ml_dtypes, "
        f"{res.mismatches} mismatches (NaN compared by class)"
    )
    for m in res.first:
        print(f"  input {m['input_bits']} ({m['input']!r}): ml_dtypes {m['ml_dtypes']}, fpsim {m['fpsim']}")
