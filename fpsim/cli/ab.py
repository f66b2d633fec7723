"""``fpsim ab [--model NAME] [--config A ...] [--gemm R ...] --steps N --seed S --out DIR``: train a
bundled model in each run (:func:`fpsim.train.ab.run_ab`, emulated AdamW) from the same
initialisation and batches; print the data used (``digits-mlp``: the real UCI digits when
scikit-learn is installed, else synthetic glyphs), final and best loss, held-out accuracy, first
non-finite step and bytes of optimizer state per parameter, and with ``--gemm`` the layers that
underflow most at the end; write ``ab.csv`` and ``ab.png``.

Runs: ``fp32`` is added first to the optimizer-state configurations (``--config``; without
``--config`` and ``--gemm``: ``int8-states``, ``fp8-states``, ``bnb-8bit-all``) and, with
``--gemm``, to the GEMM recipes; then every configuration runs with every recipe (run
``config/recipe``), so the first run is the FP32 reference ``fp32/fp32`` and each
configuration and each recipe is also run alone against FP32.

torch runs on one thread while the command trains (the bundled models are tiny: handing their
small matrices to a thread pool costs more than it saves), its thread count restored after."""

from __future__ import annotations

import argparse
from typing import Any

from .output import emit, non_negative, positive_int

__all__ = ["add_parser", "run"]

DEFAULT_CONFIGS = ("int8-states", "fp8-states", "bnb-8bit-all")
"""The configurations run next to ``fp32`` when neither ``--config`` nor ``--gemm`` is given."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``ab`` command to an argparse ``subparsers`` object; returns its parser."""
    from ..replay import PRESETS
    from ..train.ab import FP32_GEMM
    from ..train.gemm import GEMM_RECIPES

    p = subparsers.add_parser(
        "ab",
        help="train a small model under several optimizer-state configurations and GEMM recipes "
        "and compare losses",
        description="Every run starts from the same initialisation and trains on the same batches. "
        "fp32 is added first to the configurations and (with --gemm) to the GEMM recipes; each "
        "configuration then runs with each recipe (runs named config/recipe, the first fp32/fp32).",
    )
    p.add_argument(
        "--model",
        default="digits-mlp",
        choices=["digits-mlp", "tiny-transformer"],
        help="bundled model (default digits-mlp)",
    )
    p.add_argument(
        "--config",
        action="append",
        metavar="NAME",
        choices=list(PRESETS),
        help="optimizer-state preset (repeatable; fp32 is always run; default without --config "
        f"and --gemm: {', '.join(DEFAULT_CONFIGS)}): " + ", ".join(PRESETS),
    )
    p.add_argument(
        "--gemm",
        action="append",
        metavar="RECIPE",
        choices=[FP32_GEMM, *GEMM_RECIPES],
        help="emulated GEMM recipe of every nn.Linear (repeatable; fp32, the model's own GEMMs, is "
        "always run; each with every configuration): " + ", ".join(GEMM_RECIPES),
    )
    p.add_argument("--steps", type=positive_int, default=300, help="optimizer steps per run (default 300)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, initialisation and rounding")
    p.add_argument("--lr", type=non_negative, help="learning rate (default: the model's)")
    p.add_argument("--out", default="ab_out", help="folder for ab.csv and ab.png (default ab_out)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)
    return p


def runs(configs: list[str] | None, gemm: list[str] | None) -> tuple[list[str], list[str] | None]:
    """The configurations and GEMM recipes (None: no ``--gemm``) of a command line, ``fp32``
    first in each, repeats dropped (module doc)."""
    from ..train.ab import FP32_GEMM

    default = list(DEFAULT_CONFIGS) if gemm is None else []
    names = ["fp32", *(c for c in dict.fromkeys(configs or default) if c != "fp32")]
    if gemm is None:
        return names, None
    return names, [FP32_GEMM, *(g for g in dict.fromkeys(gemm) if g != FP32_GEMM)]


def run(args: argparse.Namespace) -> int:
    """Train, print and write; returns the exit status (0)."""
    import torch

    from ..report.train import ab_text, write_ab_report
    from ..train.ab import MODELS, run_ab

    model = MODELS[args.model]
    data = model.data(args.seed)
    names, gemm = runs(args.config, args.gemm)
    lr = model.lr if args.lr is None else args.lr
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = run_ab(
            model.build, data.batches(args.seed, args.steps, model.batch), names, steps=args.steps,
            gemm=gemm, lr=lr, seed=args.seed, progress=not args.no_progress, held_out=data.held_out(),
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    title = f"fpsim ab: {args.model}, AdamW lr {lr:g}, seed {args.seed}"
    paths = write_ab_report(result.frame(), args.out, title)
    summary = {
        "model": args.model,
        "data": data.source,
        "steps": args.steps,
        "lr": lr,
        "seed": args.seed,
        "configs": names,
        "gemm": gemm,
        **result.summary(),
    }
    return emit(summary, f"{args.model}, data: {data.source}\n" + ab_text(summary), paths, args.json)
