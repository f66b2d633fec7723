"""``fpsim accumulate``: how the error of a low-precision sum grows with its length K.

Three sweeps (:mod:`fpsim.accumulate.sweeps`), each a tidy table (one row per setting x K)
that is printed, written as CSV and JSON, and drawn as error-vs-K figures
(:mod:`fpsim.report.accumulate`): random data (default), ``--trace PATH`` (gradient
accumulation over a trace's steps) and ``--deepseek`` (DeepSeek-V3's FP8 GEMMs with a
14-bit accumulator, with and without promotion every 128 products). This module parses the
arguments and prints.
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

from ..accumulate.spec import Compensation, Order
from ..formats import RoundMode

__all__ = ["add_parser", "cmd_accumulate"]


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(t, 0) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"--k values must be >= 1, got {text!r}")
    return ks


def _acc(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``accumulate`` command to an ``argparse`` sub-parser set; returns its parser."""
    p = subparsers.add_parser(
        "accumulate",
        help="error growth of low-precision sums and dot products with K (swamping, promotion)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--k", type=_ks, default=None, help="comma-separated K values (default 16..16384)")
    p.add_argument("--kind", choices=["dot", "sum"], default="dot", help="random data: dot products or sums")
    p.add_argument(
        "--accumulator",
        action="append",
        type=_acc,
        metavar="A",
        help="accumulator (repeatable): a format name or p significant bits, e.g. 14 "
        "(default: float32, bfloat16, float16, 14)",
    )
    modes = [m.value for m in RoundMode]
    p.add_argument("--rounding", action="append", choices=modes, metavar="M", help=", ".join(modes))
    orders = [o.value for o in Order]
    p.add_argument("--order", action="append", choices=orders, metavar="O", help=", ".join(orders))
    p.add_argument("--block", type=int, default=32, help="tree width W for --order blocked (default 32)")
    p.add_argument("--promote-every", action="append", type=int, metavar="N", help="0 = no promotion")
    comps = [c.value for c in Compensation]
    p.add_argument("--compensated", action="append", choices=comps, metavar="C", help=", ".join(comps))
    p.add_argument("--input-format", default=None, help="round inputs first (element format or recipe)")
    p.add_argument("--product-format", default=None, help="round products (default: exact, fused)")
    p.add_argument("--data", choices=["normal", "uniform"], default="normal")
    p.add_argument("--outputs", type=int, default=256, help="independent reductions per K (random data)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", default=None, help="sum the gradient steps of this trace instead")
    p.add_argument("--deepseek", action="store_true", help="DeepSeek-V3 FP8 GEMM preset (14-bit, promotion)")
    p.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    p.add_argument("--out", default="fpsim-accumulate", help="output folder (default: fpsim-accumulate)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=cmd_accumulate)
    return p


def _settings(args: argparse.Namespace, default_acc: list) -> list:
    """The grid of :class:`~fpsim.accumulate.sweeps.Setting` the repeated options ask for."""
    from ..accumulate.sweeps import Setting

    accs = args.accumulator or default_acc
    promos = [p or None for p in (args.promote_every or [0])]
    comps = [{"none": False}.get(c, c) for c in (args.compensated or ["none"])]
    grid = itertools.product(
        accs, args.rounding or ["nearest_even"], args.order or ["sequential"], promos, comps
    )
    return [Setting.make(a, r, o, args.block, p, c) for a, r, o, p, c in grid]


def cmd_accumulate(args: argparse.Namespace) -> int:
    """Run the sweep the arguments ask for, print it, write CSV/JSON/figure; returns 0."""
    from ..report.accumulate import table_text, write_outputs

    if args.deepseek:
        df, title, meta = _deepseek(args)
    elif args.trace:
        df, title, meta = _trace(args)
    else:
        df, title, meta = _random(args)
    paths = write_outputs(df, args.out, title, meta)
    if args.json:
        print(df.to_json(orient="records", indent=1))
    else:
        print(title)
        print(table_text(df))
        print(f"\nwrote {', '.join(str(p) for p in paths.values())}")
    return 0


def _deepseek(args: argparse.Namespace):
    from ..accumulate import sweeps

    ks = args.k or (sweeps.DEEPSEEK_QUICK_K if args.quick else sweeps.DEEPSEEK_K)
    size = 8 if args.quick else 64
    df = sweeps.deepseek_sweep(ks, m=size, n=size, data=args.data, seed=args.seed, quiet=args.quiet)
    title = f"DeepSeek-V3 FP8 GEMM ({size} x K x {size}, {args.data} data): accumulation error vs K"
    meta = {"preset": "deepseek", "m": size, "n": size, "data": args.data, "seed": args.seed}
    return df, title, meta


def _trace(args: argparse.Namespace):
    from ..accumulate import sweeps

    settings = _settings(args, ["bfloat16", "float16", 14, "float32"])
    df = sweeps.trace_sweep(args.trace, settings, args.k, quiet=args.quiet)
    title = f"gradient accumulation of {args.trace}: error vs steps"
    return df, title, {"preset": "trace", "trace": str(args.trace)}


def _random(args: argparse.Namespace):
    from ..accumulate import sweeps

    ks = args.k or (sweeps.QUICK_K if args.quick else sweeps.DEFAULT_K)
    outputs = min(args.outputs, 32) if args.quick else args.outputs
    df = sweeps.random_sweep(
        _settings(args, ["float32", "bfloat16", "float16", 14]),
        ks,
        kind=args.kind,
        outputs=outputs,
        data=args.data,
        input_format=args.input_format,
        product_format=args.product_format,
        seed=args.seed,
        quiet=args.quiet,
    )
    title = f"random {args.kind} ({args.data}, {outputs} outputs): accumulation error vs K"
    meta = {"preset": "random", "kind": args.kind, "data": args.data, "outputs": outputs, "seed": args.seed}
    return df, title, meta
