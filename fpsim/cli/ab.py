"""``fpsim ab [--model NAME] --config A --config B ... --steps N --seed S --out DIR``: train a
bundled model under each configuration (:func:`fpsim.train.ab.run_ab`, emulated AdamW) from the
same initialisation and batches; print the data used (``digits-mlp``: the real UCI digits when
scikit-learn is installed, else synthetic glyphs), final and best loss, held-out accuracy, first
non-finite step and bytes of optimizer state per parameter; write ``ab.csv`` and ``ab.png``.
``fp32`` is always run first, as the reference."""

from __future__ import annotations

import argparse
from typing import Any

from .output import emit, non_negative, positive_int

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``ab`` command to an argparse ``subparsers`` object; returns its parser."""
    from ..replay import PRESETS

    p = subparsers.add_parser(
        "ab", help="train a small model under several configurations and compare losses"
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
        help="preset configuration (repeatable; fp32 is always run): " + ", ".join(PRESETS),
    )
    p.add_argument("--steps", type=positive_int, default=300, help="optimizer steps per run (default 300)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, initialisation and rounding")
    p.add_argument("--lr", type=non_negative, help="learning rate (default: the model's)")
    p.add_argument("--out", default="ab_out", help="folder for ab.csv and ab.png (default ab_out)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Train, print and write; returns the exit status (0)."""
    from ..report.train import ab_text, write_ab_report
    from ..train.ab import MODELS, run_ab

    model = MODELS[args.model]
    data = model.data(args.seed)
    names = [
        "fp32",
        *(
            c
            for c in dict.fromkeys(args.config or ["int8-states", "fp8-states", "bnb-8bit-all"])
            if c != "fp32"
        ),
    ]
    lr = model.lr if args.lr is None else args.lr
    result = run_ab(
        model.build, data.batches(args.seed, args.steps, model.batch), names, steps=args.steps, lr=lr,
        seed=args.seed, progress=not args.no_progress, held_out=data.held_out(),
    )  # fmt: skip
    title = f"fpsim ab: {args.model}, AdamW lr {lr:g}, seed {args.seed}"
    paths = write_ab_report(result.frame(), args.out, title)
    summary = {
        "model": args.model,
        "data": data.source,
        "steps": args.steps,
        "lr": lr,
        "seed": args.seed,
        **result.summary(),
    }
    return emit(summary, f"{args.model}, data: {data.source}\n" + ab_text(summary), paths, args.json)
