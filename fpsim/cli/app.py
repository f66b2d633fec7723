"""The ``fpsim`` command line.

``fpsim formats [--json]`` prints every registered format with its derived properties;
``fpsim exhaustive FORMAT`` runs the opt-in check of all 2**32 float32 inputs against
ml_dtypes.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..formats import FORMATS, RECIPES, AnyFormat, BlockFormat, Format, RoundMode

__all__ = ["main", "format_rows"]


def format_rows() -> list[dict[str, Any]]:
    """One dict per registered format and block recipe: the rows of ``fpsim formats --json``."""
    return [_row(f) for f in FORMATS.values()] + [_recipe_row(r) for r in RECIPES.values()]


def _recipe_row(r: BlockFormat) -> dict[str, Any]:
    return {
        "name": r.name,
        "kind": "block",
        "element": r.element.name,
        "block": None if r.block is None else list(r.block),
        "flatten": r.flatten,
        "rule": r.rule.value,
        "scale_format": r.scale_format.name,
        "pow2": r.pow2,
        "eps": r.eps,
        "bits_per_element": r.bits_per_element,
        "bytes_per_element": r.bytes_per_element,
    }


def _row(f: AnyFormat) -> dict[str, Any]:
    if not isinstance(f, Format):
        return {
            "name": f.name,
            "kind": "int",
            "bits": f.bits,
            "signed": f.signed,
            "max": float(f.max),
            "min": float(f.min),
            "bytes_per_element": f.bytes_per_element,
            "code_of_max": f.code_of_max,
        }
    return {
        "name": f.name,
        "kind": "float",
        "bits": f.bits,
        "exponent_bits": f.exponent_bits,
        "mantissa_bits": f.mantissa_bits,
        "bias": f.bias,
        "signed": f.signed,
        "encoding": f.encoding.value,
        "subnormals": f.subnormals,
        "max": f.max,
        "min_normal": f.min_normal,
        "min_subnormal": f.min_subnormal,
        "eps": f.eps,
        "dynamic_range_binades": f.dynamic_range,
        "code_of_max": f.code_of_max,
        "code_of_nan": f.code_of_nan,
        "code_of_inf": f.code_of_inf,
        "bytes_per_element": f.bytes_per_element,
    }


_COLUMNS = [
    ("name", "format"),
    ("bits", "bits"),
    ("exponent_bits", "E"),
    ("mantissa_bits", "M"),
    ("bias", "bias"),
    ("encoding", "special"),
    ("max", "max"),
    ("min_normal", "min normal"),
    ("min_subnormal", "min subnormal"),
    ("eps", "eps"),
    ("dynamic_range_binades", "binades"),
    ("code_of_max", "max code"),
    ("code_of_nan", "NaN code"),
    ("code_of_inf", "inf code"),
]


def _cell(key: str, value: Any, bits: int) -> str:
    if value is None:
        return "-"
    if key.startswith("code_of"):
        return f"0x{value:0{(bits + 3) // 4}x}"
    if isinstance(value, float):
        return f"{value:.1f}" if key == "dynamic_range_binades" else f"{value:.6g}"
    return str(value)


_BLOCK_COLUMNS = [
    ("name", "recipe"),
    ("element", "element"),
    ("block", "block"),
    ("rule", "scale rule"),
    ("scale_format", "scale format"),
    ("bits_per_element", "bits/element"),
]


def _block_cell(key: str, value: Any, row: dict[str, Any]) -> str:
    if key == "block":
        shape = "tensor" if value is None else "x".join("all" if b == -1 else str(b) for b in value)
        return shape + (" (flat)" if row["flatten"] else "")
    if key == "rule" and row["pow2"]:
        return f"{value}, pow2"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _print_table(rows: list[dict[str, Any]]) -> None:
    _print_cells(
        [[_cell(k, r.get(k), r["bits"]) for k, _ in _COLUMNS] for r in rows if r["kind"] != "block"],
        [h for _, h in _COLUMNS],
    )
    print()
    _print_cells(
        [[_block_cell(k, r[k], r) for k, _ in _BLOCK_COLUMNS] for r in rows if r["kind"] == "block"],
        [h for _, h in _BLOCK_COLUMNS],
    )


def _print_cells(cells: list[list[str]], heads: list[str]) -> None:
    from ..report.style import text_table

    print(text_table(heads, cells))


def _emit(summary: dict[str, Any], text: str, paths: dict[str, Any], as_json: bool) -> int:
    """Print a command's JSON summary or its table and the files it wrote."""
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print(text)
        print(f"\nwrote {', '.join(str(p) for p in paths.values())}")
    return 0


def _cmd_formats(args: argparse.Namespace) -> int:
    rows = format_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows)
    return 0


def _cmd_exhaustive(args: argparse.Namespace) -> int:
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


def _cmd_analyze(args: argparse.Namespace) -> int:
    from ..analysis.run import DEFAULT_FORMATS, analyze
    from ..report.analysis import summary_text, write_report

    formats = [*(args.format or []), *(args.recipe or [])] or list(DEFAULT_FORMATS)
    if args.dask:
        from .distributed import run_analyze

        result = run_analyze(args, formats)
        return _emit(result.summary(), summary_text(result), write_report(result, args.out), args.json)
    result = analyze(
        args.trace,
        formats,
        roundings=args.rounding or ["nearest_even"],
        roles=args.role or ["grad"],
        swamping=not args.no_swamping,
        progress=not args.quiet,
    )
    paths = write_report(result, args.out)
    return _emit(result.summary(), summary_text(result), paths, args.json)


def _cmd_replay(args: argparse.Namespace) -> int:
    from ..optim import get_optimizer
    from ..replay.engine import PRESETS, ReplayConfig, replay
    from ..replay.lossscale import LossScaler
    from ..report.replay import replay_text, write_replay_report

    configs: list = list(args.config or [])
    custom = {}
    for item in args.state or []:
        for part in item.split(","):
            key, sep, fmt = part.partition("=")
            if not sep or key not in ("m", "v", "momentum"):
                raise ValueError(f"--state takes m=FORMAT,v=FORMAT (or momentum=FORMAT), got {part!r}")
            custom[key] = fmt
    if args.master:
        custom["master"] = args.master
    if args.master_rounding:
        custom["master_rounding"] = args.master_rounding
    if args.kahan:
        custom["kahan"] = True
    if args.grad:
        custom["grad"] = args.grad
    if args.loss_scale != "none":
        custom["loss_scaler"] = LossScaler(dynamic=args.loss_scale == "dynamic")
    if custom:
        configs.append(ReplayConfig("custom", **custom))
    if not configs:
        configs = [
            "bf16-master",
            "bf16-master-sr",
            "bf16-master-kahan",
            "bnb-8bit-all",
            "fp8-states",
            "int8-states",
        ]
    kwargs = {"weight_decay": args.weight_decay} if args.weight_decay is not None else {}
    opt = get_optimizer(args.optimizer, **kwargs)
    steps = None
    if args.steps:
        lo, _, hi = args.steps.partition(":")
        steps = range(int(lo), int(hi) + 1) if hi else [int(lo)]
    for c in configs:
        if isinstance(c, str) and c not in PRESETS:
            raise ValueError(f"unknown --config {c!r}; presets: {', '.join(PRESETS)}")
    result = replay(args.trace, configs, optimizer=opt, lr=args.lr, steps=steps, progress=not args.quiet)
    paths = write_replay_report(result, args.out)
    return _emit(result.summary(), replay_text(result), paths, args.json)


def _cmd_figures(args: argparse.Namespace) -> int:
    from ..report.figures import make_figures

    for path in make_figures(args.out):
        print(path)
    return 0


def _int(text: str) -> int:
    return int(text, 0)


def _replay_presets() -> list[str]:
    from ..replay.engine import PRESETS

    return list(PRESETS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fpsim", description="See what low-precision number formats do to your tensors."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    f = sub.add_parser("formats", help="table of every registered format and its derived properties")
    f.add_argument("--json", action="store_true", help="print the same as JSON")
    f.set_defaults(run=_cmd_formats)

    a = sub.add_parser("analyze", help="underflow, overflow, swamping and error of a trace under each format")
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
    from .distributed import add_dask_argument

    add_dask_argument(a)
    a.set_defaults(run=_cmd_analyze)

    r = sub.add_parser("replay", help="replay a trace's gradients through low-precision optimizers vs FP32")
    r.add_argument("trace", nargs="?", default=None, help="trace (default: the bundled sample trace)")
    r.add_argument("--optimizer", default="adamw", choices=["adam", "adamw", "sgd"])
    r.add_argument("--weight-decay", type=float, default=None, help="default: the optimizer's own")
    r.add_argument("--lr", type=float, default=None, help="learning rate (default: the trace's per step)")
    r.add_argument(
        "--config",
        action="append",
        metavar="NAME",
        help="preset configuration (repeatable): " + ", ".join(_replay_presets()),
    )
    r.add_argument(
        "--state", action="append", metavar="m=F,v=F", help="state formats of a custom configuration"
    )
    r.add_argument("--master", metavar="F", help="master-weight format of the custom configuration")
    r.add_argument("--master-rounding", choices=["nearest_even", "stochastic"], default=None)
    r.add_argument("--kahan", action="store_true", help="Kahan-compensated master weights")
    r.add_argument("--grad", metavar="F", help="gradient format or recipe of the custom configuration")
    r.add_argument("--loss-scale", choices=["none", "static", "dynamic"], default="none")
    r.add_argument("--steps", metavar="A:B", help="replay the recorded steps A..B (inclusive)")
    r.add_argument("--out", default="fpsim-replay", help="output folder (default: fpsim-replay)")
    r.add_argument("--json", action="store_true", help="print the JSON summary instead of the table")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(run=_cmd_replay)

    from ..kernels.validate import add_parser as add_validate_kernels  # imports neither torch nor triton
    from .accumulate import add_parser as add_accumulate

    add_accumulate(sub)
    add_validate_kernels(sub)

    g = sub.add_parser("figures", help="regenerate every figure the README shows")
    g.add_argument("--out", default="figures", help="output folder (default: figures)")
    g.set_defaults(run=_cmd_figures)

    names = [n for n, f in FORMATS.items() if isinstance(f, Format)]
    e = sub.add_parser("exhaustive", help="compare all 2**32 float32 inputs with ml_dtypes (opt-in, ~1 min)")
    e.add_argument("format", choices=names, metavar="FORMAT", help="one of: " + ", ".join(names))
    e.add_argument("--backend", choices=["numpy", "jax"], default="numpy")
    e.add_argument("--start", type=_int, default=0, help="first float32 bit pattern (default 0)")
    e.add_argument("--stop", type=_int, default=1 << 32, help="one past the last pattern (default 2**32)")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(run=_cmd_exhaustive)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, OSError) as err:  # bad input: say what and where, exit 2
        print(f"fpsim {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
