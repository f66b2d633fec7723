"""The ``fpsim validate-kernels`` command: :func:`add_parser` wires it into ``fpsim``'s
parser (``fpsim/cli/validate.py``), :func:`main` runs it standalone (``python -m
fpsim.kernels.validate``), :func:`print_report` prints a :func:`validate_all` report.

The command prints each row of its table as soon as that kernel x format x rounding case is
done, and with ``--json OUT`` rewrites OUT (atomically: always a whole JSON report) after every
row, with ``"complete": false`` until the last one; Ctrl-C stops it with exit status 130,
leaving the table and OUT with the rows done so far.

Importing this module imports neither torch nor triton.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from fpsim.formats import RoundMode

from .common import Mismatch, torch_module
from .registry import KERNELS, plan_rows, report_of, run_row

_DESCRIPTION = "Bit-exact validation of the Triton kernels against the emulator."


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``validate-kernels`` subcommand to an argparse ``subparsers`` object.

    The parser's default ``run`` is :func:`run_args` (``args.run(args)`` returns the exit
    status), as the other ``fpsim`` subcommands. In ``fpsim/cli/validate.py``::

        from ..kernels.validate import add_parser as add_validate_kernels

        add_validate_kernels(sub)
    """
    p = subparsers.add_parser(
        "validate-kernels",
        help="compare the Triton kernels with the emulator bit for bit (CPU interpreter or GPU)",
        description="Run every Triton kernel on the inputs where rounding can go wrong and compare "
        "its codes with the emulator's, zero tolerance. Exit status 1 on any mismatch or error.",
    )
    _arguments(p)
    p.set_defaults(run=run_args)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``validate-kernels``."""
    p.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="cpu: Triton's interpreter (default)"
    )
    p.add_argument("--quick", action="store_true", help="fewer inputs per case (minutes on the CPU)")
    p.add_argument(
        "--json",
        metavar="OUT",
        help="also write the report as JSON to OUT (rewritten after every case: an interrupted run "
        'keeps its rows, with "complete": false)',
    )
    p.add_argument(
        "--format", action="append", metavar="F", help="only this format or block recipe (repeatable)"
    )
    p.add_argument(
        "--kernel", action="append", metavar="K", help="only this kernel (repeatable): " + ", ".join(KERNELS)
    )
    p.add_argument(
        "--rounding",
        action="append",
        choices=[m.value for m in RoundMode],
        metavar="M",
        help="only this rounding mode (repeatable)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _prepare_triton_env(device: str) -> None:
    """Select Triton's interpreter for ``--device cpu`` before triton is imported.

    TRITON_INTERPRET is read when a function is decorated with ``@triton.jit``; triton's
    own library functions are decorated when triton is imported. fpsim's kernels do not
    depend on it (see :mod:`fpsim.kernels._loader`), but kernels that call the library do.
    """
    if "triton" in sys.modules:
        return
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    elif os.environ.get("TRITON_INTERPRET") == "1":
        os.environ["TRITON_INTERPRET"] = "0"


def run_args(args: argparse.Namespace) -> int:
    """Run ``validate-kernels`` for parsed arguments, printing each row as it completes (and
    rewriting ``--json OUT``); returns the exit status (1 on a mismatch or error, 130 when
    interrupted)."""
    from tqdm.auto import tqdm

    _prepare_triton_env(args.device)
    if args.device == "cuda":
        torch = torch_module()
        if not torch.cuda.is_available():
            print("validate-kernels: error: --device cuda but torch sees no CUDA device", file=sys.stderr)
            return 2
    plan = plan_rows(args.format, args.kernel, args.rounding)
    widths = _widths([(spec.name, fmt.name, mode.value) for spec, fmt, mode in plan])
    print(_line(_HEADS, widths), flush=True)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    complete = False
    bar = tqdm(plan, disable=args.quiet, desc="validate-kernels", unit="case")
    try:
        for spec, fmt, mode in bar:
            rows.append(run_row(spec, fmt, mode, args.quick, args.device))
            tqdm.write(_line(_cells(rows[-1]), widths), file=sys.stdout)
            sys.stdout.flush()
            if args.json:
                _write_json(args.json, rows, args, time.perf_counter() - t0, len(plan), False)
        complete = True
    except KeyboardInterrupt:
        bar.close()
        print(f"interrupted after {len(rows)} of {len(plan)} cases", file=sys.stderr)
    report = report_of(rows, args.device, args.quick, time.perf_counter() - t0)
    _print_details(report, sys.stdout)
    if args.json:
        _write_json(args.json, rows, args, report["seconds"], len(plan), complete)
        print(f"wrote {args.json}")
    if not complete:
        return 130
    return 1 if report["mismatches"] or report["errors"] else 0


def _write_json(
    path: str, rows: list, args: argparse.Namespace, seconds: float, planned: int, complete: bool
):
    """The report of ``rows`` into ``path``, through a temporary file renamed over it, so that the
    file is a whole JSON document whenever the run stops."""
    report = report_of(rows, args.device, args.quick, seconds)
    report.update(planned=planned, complete=complete)
    tmp = f"{path}.partial"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, default=str)
    os.replace(tmp, path)


_HEADS = ["kernel", "format", "rounding", "compared", "mismatches"]


def _cells(r: dict[str, Any]) -> list[str]:
    status = str(r["mismatches"])
    if r["skipped"]:
        status = "skipped"
    elif r["errors"]:
        status = f"{r['mismatches']} + {len(r['errors'])} errors"
    return [r["kernel"], r["format"], r["rounding"], str(r["compared"]), status]


def _widths(names: list[tuple[str, str, str]]) -> list[int]:
    """Column widths from the planned names (the counts get 10 characters, more when needed)."""
    widths = [max([len(h)] + [len(n[i]) for n in names]) for i, h in enumerate(_HEADS[:3])]
    return widths + [10, 10]


def _line(cells: list[str], widths: list[int]) -> str:
    return "  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(cells, widths)))


def print_report(report: dict[str, Any], file: Any = None) -> None:
    """The table of a :func:`validate_all` report, then the first mismatches with their bits."""
    file = file or sys.stdout
    cells = [_cells(r) for r in report["cases"]]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(_HEADS)]
    print(_line(_HEADS, widths), file=file)
    for c in cells:
        print(_line(c, widths), file=file)
    _print_details(report, file)


def _print_details(report: dict[str, Any], file: Any) -> None:
    """What follows the table: skip reasons, errors, the first mismatches, the totals."""
    skipped = {r["skipped"] for r in report["cases"] if r["skipped"]}
    for reason in sorted(skipped):
        print(f"skipped: {reason}", file=file)
    for r in report["cases"]:
        for e in r["errors"][:2]:
            print(f"\n{r['kernel']} {r['format']} {r['rounding']} {e['options']}: {e['error']}", file=file)
        if r["first"]:
            print(
                f"\n{r['kernel']} {r['format']} {r['rounding']}: {r['mismatches']} mismatches; first:",
                file=file,
            )
            for m in r["first"]:
                mismatch = Mismatch(**{k: m[k] for k in Mismatch.__dataclass_fields__})
                print(f"  {m['options']}\n  {mismatch.describe()}", file=file)
    quick = " (quick)" if report["quick"] else ""
    print(
        f"\n{report['device']}{quick}: {report['compared']} elements compared, "
        f"{report['mismatches']} mismatches, {report['errors']} errors, {report['skipped']} skipped "
        f"in {report['seconds']:.1f} s",
        file=file,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``fpsim validate-kernels [--device cpu|cuda] [--quick] [--json OUT] ...``.

    Prints the table kernel x format x rounding x compared x mismatches and the first
    mismatches with their bits; returns 1 on any mismatch or kernel error, 2 on bad
    arguments, 0 otherwise. With ``--device cpu`` it sets ``TRITON_INTERPRET=1`` before
    triton is imported (when it is not imported yet; see :func:`_prepare_triton_env`).
    """
    p = argparse.ArgumentParser(prog="fpsim validate-kernels", description=_DESCRIPTION)
    _arguments(p)
    args = p.parse_args(argv)
    try:
        return run_args(args)
    except ImportError as err:  # torch or triton missing: the message says how to install them
        print(f"fpsim validate-kernels: error: {err}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError) as err:
        print(f"fpsim validate-kernels: error: {err}", file=sys.stderr)
        return 2
