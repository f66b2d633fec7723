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
from .output import format_name, non_negative_int, positive_int

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
    """A format name or a count of significant bits, checked as the accumulator's."""
    from ..accumulate.spec import accumulator_format

    value: int | str = int(text) if text.isdigit() else text
    try:
        accumulator_format(value)
    except (ValueError, TypeError) as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


_DESCRIPTION = (
    "How the error of a low-precision sum or dot product grows with its length K. Three sweeps, "
    "each printed as a table (one row per setting x K) and written as CSV, JSON and an "
    "error-vs-K figure into --out: random data (default; the repeatable --accumulator, "
    "--rounding, --order, --promote-every and --compensated options make the grid of settings), "
    "--trace PATH (gradient accumulation over a trace's steps) and --deepseek (DeepSeek-V3's FP8 "
    "GEMMs with a 14-bit accumulator, with and without promotion every 128 products)."
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``accumulate`` command to an ``argparse`` sub-parser set; returns its parser."""
    p = subparsers.add_parser(
        "accumulate",
        help="error growth of low-precision sums and dot products with K (swamping, promotion)",
        description=_DESCRIPTION,
    )
    from ..accumulate import sweeps

    def ks(values: tuple[int, ...]) -> str:
        return ",".join(map(str, values))

    p.add_argument(
        "--k",
        type=_ks,
        default=None,
        help=f"comma-separated K values (default {ks(sweeps.DEFAULT_K)}; --quick {ks(sweeps.QUICK_K)}; "
        f"--deepseek {ks(sweeps.DEEPSEEK_K)}, with --quick {ks(sweeps.DEEPSEEK_QUICK_K)})",
    )
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
    p.add_argument(
        "--rounding",
        action="append",
        choices=modes,
        metavar="M",
        help="the accumulator's rounding mode (repeatable; default nearest_even): " + ", ".join(modes),
    )
    orders = [o.value for o in Order]
    p.add_argument(
        "--order",
        action="append",
        choices=orders,
        metavar="O",
        help="order of the additions (repeatable; default sequential): " + ", ".join(orders),
    )
    p.add_argument(
        "--block",
        type=positive_int,
        default=32,
        metavar="W",
        help="tree width W for --order blocked (default 32)",
    )
    p.add_argument(
        "--promote-every",
        action="append",
        type=non_negative_int,
        metavar="N",
        help="add the low-precision partial sum into a float32 one every N products (repeatable; "
        "0 = no promotion, the default)",
    )
    comps = [c.value for c in Compensation]
    p.add_argument(
        "--compensated",
        action="append",
        choices=comps,
        metavar="C",
        help="compensated summation (repeatable; default none): " + ", ".join(comps),
    )
    p.add_argument(
        "--input-format",
        type=format_name,
        default=None,
        metavar="F",
        help="round the inputs to this element format or recipe first (random data; default: exact)",
    )
    p.add_argument(
        "--product-format",
        type=format_name,
        default=None,
        metavar="F",
        help="round each product to this format (random data; default: exact products, a fused multiply-add)",
    )
    p.add_argument(
        "--data", choices=["normal", "uniform"], default="normal", help="random data's distribution"
    )
    p.add_argument(
        "--outputs",
        type=positive_int,
        default=256,
        metavar="N",
        help="independent reductions per K (random data; default 256, --quick: at most 32)",
    )
    p.add_argument("--seed", type=non_negative_int, default=0, help="random data's seed (default 0)")
    p.add_argument(
        "--trace", default=None, metavar="PATH", help="sum the gradient steps of this trace instead"
    )
    p.add_argument(
        "--deepseek",
        action="store_true",
        help="DeepSeek-V3's FP8 GEMMs: 14-bit accumulator, with and without promotion every 128",
    )
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
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
