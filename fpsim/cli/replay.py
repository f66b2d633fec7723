"""``fpsim replay [TRACE]``: replay a trace's gradients through low-precision optimizers vs FP32.

Runs :func:`fpsim.replay.replay` (on the ``--backend`` chosen) on the preset configurations
named by ``--config`` and a custom one built from ``--state``/``--master``/
``--master-rounding``/``--kahan``/``--grad``/``--loss-scale``, and writes the report of
:func:`fpsim.report.replay.write_replay_report`.
"""

from __future__ import annotations

import argparse
from typing import Any

from .output import add_backend_argument, emit

__all__ = ["DEFAULT_CONFIGS", "add_parser", "run"]

DEFAULT_CONFIGS = (
    "bf16-master",
    "bf16-master-sr",
    "bf16-master-kahan",
    "bnb-8bit-all",
    "fp8-states",
    "int8-states",
)
"""The presets replayed when the command line names no configuration."""

_STATE_KEYS = ("m", "v", "momentum")


def _replay_presets() -> list[str]:
    from ..replay import PRESETS

    return list(PRESETS)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``replay`` command to an argparse ``subparsers`` object; returns its parser."""
    r = subparsers.add_parser(
        "replay", help="replay a trace's gradients through low-precision optimizers vs FP32"
    )
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
    add_backend_argument(r)
    r.set_defaults(run=run)
    return r


def run(args: argparse.Namespace) -> int:
    """Replay, write the report and print it; returns the exit status (0).

    Raises:
        ValueError: a bad ``--state`` or an unknown ``--config``.
    """
    from ..optim import get_optimizer
    from ..replay import replay
    from ..report.replay import replay_text, write_replay_report

    configs = _configs(args)
    kwargs = {"weight_decay": args.weight_decay} if args.weight_decay is not None else {}
    opt = get_optimizer(args.optimizer, **kwargs)
    steps = _steps(args.steps) if args.steps else None
    result = replay(
        args.trace,
        configs,
        optimizer=opt,
        lr=args.lr,
        steps=steps,
        progress=not args.quiet,
        backend=args.backend,
    )
    paths = write_replay_report(result, args.out)
    return emit(result.summary(), replay_text(result), paths, args.json)


def _configs(args: argparse.Namespace) -> list[Any]:
    """The presets of ``--config``, then the custom configuration if any option asks for one."""
    from ..replay import PRESETS, ReplayConfig

    configs: list[Any] = list(args.config or [])
    custom = _custom_fields(args)
    if custom:
        configs.append(ReplayConfig("custom", **custom))
    if not configs:
        configs = list(DEFAULT_CONFIGS)
    for c in configs:
        if isinstance(c, str) and c not in PRESETS:
            raise ValueError(f"unknown --config {c!r}; presets: {', '.join(PRESETS)}")
    return configs


def _custom_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The fields of the custom :class:`~fpsim.replay.engine.ReplayConfig` the options set."""
    from ..replay import LossScaler

    custom: dict[str, Any] = {}
    for item in args.state or []:
        for part in item.split(","):
            key, sep, fmt = part.partition("=")
            if not sep or key not in _STATE_KEYS:
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
    return custom


def _steps(text: str) -> range | list[int]:
    """``"A:B"`` -> the steps A..B (inclusive); ``"A"`` -> [A]."""
    lo, _, hi = text.partition(":")
    return range(int(lo), int(hi) + 1) if hi else [int(lo)]
