"""``fpsim memory --params N --config NAME ...``: the training memory of replay configurations.

Prints :func:`fpsim.replay.memory_table` for a model of ``--params`` parameters (one tensor of
that many elements: the per-tensor rules for small tensors do not apply) or for the tensors of a
trace (``--trace``, the sizes of its first step's gradients, where they do): bytes per parameter
of the weights, gradients, optimizer states (block scales included), master copy and Kahan
buffer, and the total in GiB. Only what the optimizer keeps per parameter is counted, not
activations.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

__all__ = ["add_parser", "run"]


def _count(text: str) -> int:
    """``"7e9"``, ``"125000000"`` -> a positive integer parameter count."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number of parameters such as 7e9, got {text!r}") from None
    if not math.isfinite(v) or v < 1 or v != int(v):
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(v)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``memory`` command to an argparse ``subparsers`` object; returns its parser."""
    from ..replay import PRESETS

    m = subparsers.add_parser("memory", help="bytes per parameter and GiB of replay configurations")
    where = m.add_mutually_exclusive_group()
    where.add_argument("--params", type=_count, metavar="N", help="parameter count, e.g. 7e9 (default 7e9)")
    where.add_argument("--trace", metavar="PATH", help="take the tensor sizes from a trace")
    m.add_argument(
        "--config",
        action="append",
        metavar="NAME",
        choices=list(PRESETS),
        help="preset configuration (repeatable; default all): " + ", ".join(PRESETS),
    )
    m.add_argument(
        "--optimizer",
        default="adamw",
        choices=["adam", "adamw", "sgd"],
        help="the optimizer, whose states are counted (default adamw)",
    )
    m.set_defaults(run=run)
    return m


def run(args: argparse.Namespace) -> int:
    """Print the memory table; returns the exit status (0)."""
    from ..replay import PRESETS, memory_table
    from ..replay.optim import get_optimizer
    from ..report.style import text_table
    from ..trace import as_trace

    if args.trace is not None:
        tr = as_trace(args.trace)
        sizes = {e.name: e.size for e in tr.entries(step=tr.steps[0], role="grad")}
        what = f"{tr.path}: {sum(sizes.values()):,} parameters in {len(sizes)} tensors"
    else:
        n = args.params or 7_000_000_000
        sizes, what = {"all": n}, f"{n:,} parameters"
    configs = [PRESETS[c] for c in (args.config or PRESETS)]
    rows = memory_table(configs, sizes, get_optimizer(args.optimizer))
    total = sum(sizes.values())
    columns = [k for k in rows[0] if k != "config"]
    body = [
        [r["config"], *(f"{r[k]:.3f}" for k in columns), f"{r['total'] * total / 2**30:.4g}"] for r in rows
    ]
    print(f"{what}, {args.optimizer}: bytes per parameter")
    print(text_table(["config", *columns, "GiB"], body))
    return 0
