"""``fpsim replay [TRACE]``: replay a trace's gradients through low-precision optimizers vs FP32.

Runs :func:`fpsim.replay.replay` (on the ``--backend`` chosen, in the ``--mode`` chosen) on
the preset configurations named by ``--config`` and a custom one built from ``--state``/
``--master``/``--master-rounding``/``--kahan``/``--grad``/``--loss-scale``, writes the report
of :func:`fpsim.report.replay.write_replay_report` and, with ``--save-state DIR``, each
configuration's final parameters and states (:meth:`fpsim.replay.ReplayResult.save_state`).
Every flag value is checked here, and a bad one is an error that names the flag.
"""

from __future__ import annotations

import argparse
import enum
import sys
from typing import Any

from .output import add_backend_argument, add_figures_argument, emit, format_name, non_negative, positive_int

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


def preset_lines() -> list[str]:
    """One line per preset of :data:`fpsim.replay.PRESETS`: its name and the fields in which it
    differs from the FP32 configuration, read from the preset objects."""
    from dataclasses import fields

    from ..replay import PRESETS, ReplayConfig

    width = max(map(len, PRESETS))
    lines = []
    for name, cfg in PRESETS.items():
        base = ReplayConfig(name)
        parts = [
            f"{f.name}={_shown(getattr(cfg, f.name))}"
            for f in fields(cfg)
            if f.name != "name" and getattr(cfg, f.name) != getattr(base, f.name)
        ]
        lines.append(f"  {name:<{width}}  {', '.join(parts) or 'float32 everywhere (the reference)'}")
    return lines


def _variant(value: Any) -> str:
    """For a registered format changed in place (bnb-8bit-cpu's lookup-table codebook): the
    fields that differ from the registered one, e.g. ``" (element.lut_bins=65536)"``."""
    from dataclasses import fields, is_dataclass

    from ..formats import get_format

    try:
        registered = get_format(value.name)
    except (ValueError, TypeError):
        return ""
    if registered == value or not is_dataclass(value):
        return ""

    def changed(a: Any, b: Any, prefix: str) -> list[str]:
        out = []
        for f in fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name, None)
            if x == y:
                continue
            if is_dataclass(x) and type(x) is type(y):
                out += changed(x, y, f"{prefix}{f.name}.")
            elif isinstance(x, (bool, int, float, str)) or x is None:
                out.append(f"{prefix}{f.name}={x}")
            else:
                out.append(f"{prefix}{f.name} changed")
        return out

    return " (" + ", ".join(changed(value, registered, "")) + ")"


def _shown(value: Any) -> str:
    """A preset's field value in a few characters: a format by its name, an object by its type."""
    if isinstance(value, tuple):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    if isinstance(value, (bool, int, float, str)):
        return str(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return name + _variant(value)
    element = getattr(value, "element", None)  # DelayedScaling
    if element is not None:
        return f"{type(value).__name__}({_shown(element)})"
    return type(value).__name__


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``replay`` command to an argparse ``subparsers`` object; returns its parser."""
    r = subparsers.add_parser(
        "replay",
        help="replay a trace's gradients through low-precision optimizers vs FP32",
        description="Replay a trace's gradients through low-precision optimizer configurations "
        "and compare each with the FP32 replay (--config presets, or a custom configuration built "
        "from --state, --master, --master-rounding, --kahan, --grad, --loss-scale).",
        epilog="presets (--config NAME; what each stores differently from FP32):\n"
        + "\n".join(preset_lines())
        + f"\n\ndefault: {', '.join(DEFAULT_CONFIGS)}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("trace", nargs="?", default=None, help="trace (default: the bundled sample trace)")
    r.add_argument(
        "--optimizer", default="adamw", choices=["adam", "adamw", "sgd"], help="the optimizer (default adamw)"
    )
    r.add_argument(
        "--weight-decay",
        type=non_negative,
        default=None,
        help="default: the optimizer's own",
    )
    r.add_argument(
        "--lr", type=non_negative, default=None, help="learning rate (default: the trace's per step)"
    )
    r.add_argument(
        "--betas", type=_betas, default=None, metavar="B1,B2", help="Adam's betas (default 0.9,0.999)"
    )
    r.add_argument("--eps", type=non_negative, default=None, help="Adam's eps (default 1e-8)")
    r.add_argument("--momentum", type=non_negative, default=None, help="SGD's momentum (0.9)")
    r.add_argument(
        "--sqrt",
        choices=["ieee", "torch"],
        default="ieee",
        help="Adam's square root: ieee (correctly rounded, the same on every machine) or torch "
        "(torch's CPU sqrt: the FP32 replay then equals torch.optim on this machine, bit for bit; "
        "torch's result itself depends on the CPU's SIMD width)",
    )
    r.add_argument(
        "--mode",
        choices=["sequence", "each"],
        default="sequence",
        help="sequence: consecutive updates from the first step's recorded values (a trace with "
        "missing updates is refused); each: every recorded step as one update from its own "
        "recorded parameters and states (default: sequence)",
    )
    r.add_argument(
        "--first-update",
        type=positive_int,
        default=None,
        metavar="N",
        help="the optimizer's update count at the first replayed step (default: the trace's "
        "recorded count, else its step number)",
    )
    r.add_argument(
        "--start",
        metavar="CHECKPOINT",
        help="start from the parameters and optimizer states of CHECKPOINT (a Trainer checkpoint-N "
        "folder, a torch checkpoint or a trace: its one step, or the first replayed step) instead of "
        "the first replayed step's recorded ones; its update count must be that step's",
    )
    r.add_argument(
        "--tensors",
        action="append",
        metavar="PATTERN",
        help="replay only the tensors matching this name or fnmatch pattern (repeatable)",
    )
    r.add_argument(
        "--config",
        action="append",
        metavar="NAME",
        help="preset configuration (repeatable): " + ", ".join(_replay_presets()),
    )
    r.add_argument(
        "--state", action="append", metavar="m=F,v=F", help="state formats of a custom configuration"
    )
    r.add_argument(
        "--master", type=format_name, metavar="F", help="master-weight format of the custom configuration"
    )
    r.add_argument(
        "--master-rounding",
        choices=["nearest_even", "stochastic"],
        default=None,
        help="rounding of the custom configuration's master weights (default nearest_even)",
    )
    r.add_argument("--kahan", action="store_true", help="Kahan-compensated master weights")
    r.add_argument(
        "--grad", type=format_name, metavar="F", help="gradient format or recipe of the custom configuration"
    )
    r.add_argument(
        "--master-override",
        action="append",
        metavar="PATTERN=F",
        help="keep the master copy of tensors matching the fnmatch PATTERN in format F (repeatable, "
        "first match wins), e.g. 'embed*=float32'",
    )
    r.add_argument(
        "--state-override",
        action="append",
        metavar="PATTERN[:STATE]=F",
        help="store the states (or one state, e.g. exp_avg_sq) of tensors matching PATTERN in F "
        "(repeatable, first match wins), e.g. 'embed*=float32'",
    )
    r.add_argument(
        "--min-quantized-size",
        type=positive_int,
        default=None,
        metavar="N",
        help="tensors with fewer elements keep FP32 states (bitsandbytes' min_8bit_size)",
    )
    r.add_argument(
        "--loss-scale",
        choices=["none", "static", "dynamic", "deepspeed", "megatron"],
        default="none",
        help="loss scaling of the custom configuration's gradients, with the library's defaults: "
        "static or dynamic (torch GradScaler), deepspeed (DynamicLossScaler), megatron "
        "(DynamicGradScaler)",
    )
    r.add_argument(
        "--steps",
        type=_steps,
        metavar="A:B",
        help="replay the recorded steps from A to B (inclusive), or step A",
    )
    r.add_argument("--out", default="fpsim-replay", help="output folder (default: fpsim-replay)")
    r.add_argument(
        "--save-state",
        metavar="DIR",
        help="write DIR/<config>.safetensors per configuration (and reference): the final float32 "
        "parameters and states under the trace's keys (param:<name>, state.exp_avg:<name>, ...)",
    )
    r.add_argument("--json", action="store_true", help="print the JSON summary instead of the table")
    add_figures_argument(r, "divergence.png, the curves")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    add_backend_argument(r)
    r.set_defaults(run=run)
    return r


def run(args: argparse.Namespace) -> int:
    """Replay, write the report and print it; returns the exit status (0).

    Raises:
        ValueError: a bad ``--state`` or an unknown ``--config``.
    """
    from ..replay import replay
    from ..replay.optim import get_optimizer
    from ..report.replay import replay_text, write_replay_report
    from ..trace import as_trace

    configs = _configs(args)
    opt = get_optimizer(args.optimizer, **_optimizer_fields(args))
    trace = as_trace(args.trace)
    steps = None if args.steps is None else _recorded_in(trace, *args.steps)
    result = replay(
        trace,
        configs,
        optimizer=opt,
        lr=args.lr,
        steps=steps,
        tensors=args.tensors,
        progress=not args.quiet,
        backend=args.backend,
        sqrt=args.sqrt,
        mode=args.mode,
        first_update=args.first_update,
        keep_on_interrupt=True,
        start=args.start,
    )
    paths = write_replay_report(result, args.out, figures=args.figures)
    if args.save_state:
        paths.update({f"state:{k}": p for k, p in result.save_state(args.save_state).items()})
    status = emit(result.summary(), replay_text(result), paths, args.json)
    if result.interrupted:  # Ctrl-C: the report of the steps done is written; say so
        print(f"fpsim replay: {result.interrupted}", file=sys.stderr)
        return 130
    return status


def _optimizer_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The optimizer hyper-parameters the flags set (the others keep the optimizer's defaults)."""
    fields = {"weight_decay": args.weight_decay}
    if args.optimizer == "sgd":
        for flag in ("betas", "eps"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag} is an Adam flag; --optimizer sgd takes --momentum")
        fields["momentum"] = args.momentum
    else:
        if args.momentum is not None:
            raise ValueError("--momentum is an SGD flag; Adam takes --betas")
        fields.update(betas=args.betas, eps=args.eps)
    return {k: v for k, v in fields.items() if v is not None}


def _recorded_in(trace: Any, lo: int, hi: int) -> list[int]:
    """The recorded steps in ``lo..hi``; an error naming ``--steps`` when there is none."""
    steps = [s for s in trace.steps if lo <= s <= hi]
    if not steps:
        shown = f"{trace.steps[0]}..{trace.steps[-1]}" if trace.steps else "none"
        raise ValueError(f"--steps {lo}:{hi}: no recorded step in that range (the trace has steps {shown})")
    return steps


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
    from ..replay import DeepSpeedDynamicLossScaler, LossScaler, MegatronDynamicGradScaler

    custom: dict[str, Any] = {}
    for item in args.state or []:
        for part in item.split(","):
            key, sep, fmt = part.partition("=")
            if not sep or key not in _STATE_KEYS:
                raise ValueError(f"--state takes m=FORMAT,v=FORMAT (or momentum=FORMAT), got {part!r}")
            custom[key] = _checked("--state", part, **{key: fmt})
    if args.master:
        custom["master"] = args.master
    if args.master_rounding:
        custom["master_rounding"] = args.master_rounding
    if args.kahan:
        custom["kahan"] = True
    if args.grad:
        custom["grad"] = args.grad
    scalers = {
        "static": lambda: LossScaler(dynamic=False),
        "dynamic": LossScaler,
        "deepspeed": DeepSpeedDynamicLossScaler,
        "megatron": MegatronDynamicGradScaler,
    }
    if args.loss_scale != "none":
        custom["loss_scaler"] = scalers[args.loss_scale]()
    if args.master_override:
        custom["master_overrides"] = tuple(
            _checked("--master-override", o, master_overrides=(_override("--master-override", o),))[0]
            for o in args.master_override
        )
    if args.state_override:
        custom["state_overrides"] = tuple(
            _checked("--state-override", o, state_overrides=(_state_override(o),))[0]
            for o in args.state_override
        )
    if args.min_quantized_size is not None:
        custom["min_quantized_size"] = args.min_quantized_size
    return custom


def _checked(flag: str, text: str, **fields: Any) -> Any:
    """The one field value given (as given), after a :class:`~fpsim.replay.ReplayConfig` with it
    was built: its error, if any, names ``flag`` and ``text``."""
    from ..replay import ReplayConfig

    try:
        ReplayConfig("custom", **fields)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{flag} {text}: {err}") from None
    (value,) = fields.values()
    return value


def _override(flag: str, text: str) -> tuple[str, str]:
    """``"PATTERN=FORMAT"`` -> (PATTERN, FORMAT)."""
    pattern, sep, fmt = text.rpartition("=")
    if not sep or not pattern or not fmt:
        raise ValueError(f"{flag} takes PATTERN=FORMAT, e.g. 'embed*=float32', got {text!r}")
    return pattern, fmt


def _state_override(text: str) -> tuple[str, str, str]:
    """``"PATTERN[:STATE]=FORMAT"`` -> (PATTERN, STATE or "*", FORMAT)."""
    target, fmt = _override("--state-override", text)
    pattern, _, state = target.partition(":")
    return pattern, state or "*", fmt


def _steps(text: str) -> tuple[int, int]:
    """``"A:B"`` -> (A, B) (the recorded steps from A to B, inclusive); ``"A"`` -> (A, A)."""
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes A:B or A with integer steps, got {text!r}") from None
    if a < 0 or b < a:
        raise argparse.ArgumentTypeError(f"takes A:B with 0 <= A <= B, got {text!r}")
    return a, b


def _betas(text: str) -> tuple[float, float]:
    """``"B1,B2"`` -> (B1, B2), each in [0, 1)."""
    try:
        b1, b2 = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes B1,B2 (two numbers), got {text!r}") from None
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise argparse.ArgumentTypeError(f"betas must lie in [0, 1), got {text!r}")
    return b1, b2
