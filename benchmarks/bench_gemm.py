"""Emulated-GEMM training steps against FP32 steps, as ``fpsim ab --gemm`` runs them.

Run: ``python benchmarks/bench_gemm.py [--steps 3] [--warmup 1] [--tokens 256]
[--models tiny,25m] [--recipes bf16,fp8-current,...] [--threads N] [--json OUT]``.

A step is forward, backward and ``torch.optim.AdamW.step()``. For each model and recipe, the
model converted with ``fpsim.train.torch.convert(model, recipe, stats=...)`` (with the GEMM
statistics, as ``fpsim ab --gemm`` records them, and without) and the unconverted FP32 model
train on the same batch, their steps interleaved (so that load from other processes hits both
alike): ``--warmup`` steps of each (numba compiles on the first), then ``--steps`` timed
rounds (``--threads``: torch's CPU threads, default torch's own; 1 on a loaded machine, where
spinning thread pools make FP32 steps erratic). Printed: the median step times and their ratio
to FP32 (goal: <= 3x). Models:

- ``tiny``: the tiny transformer of ``fpsim ab --model tiny-transformer`` (6,076 parameters,
  its first batch: 64 sequences of 12 tokens).
- ``25m``: six ``Linear(2048, 2048)`` with ReLU and a ``Linear(2048, 16)`` head (25.2M
  parameters), ``--tokens`` random tokens per batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from fpsim.train.ab import MODELS
from fpsim.train.gemm import GEMM_RECIPES
from fpsim.train.torch import convert


def _tiny():
    m = MODELS["tiny-transformer"]
    (x, y) = m.batches(0, 1)[0]
    return m.build, x, y


def _mlp25m(tokens: int):
    def build() -> torch.nn.Module:
        layers = [m for _ in range(6) for m in (torch.nn.Linear(2048, 2048), torch.nn.ReLU())]
        return torch.nn.Sequential(*layers, torch.nn.Linear(2048, 16))

    gen = torch.Generator().manual_seed(1)
    return build, torch.randn(tokens, 2048, generator=gen), torch.randint(0, 16, (tokens,), generator=gen)


class _Loop:
    def __init__(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model, self.x, self.y = model, x, y
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(self) -> float:
        t = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return time.perf_counter() - t


def _fresh(build, x, y, recipe: str | None, stats: bool) -> _Loop:
    torch.manual_seed(0)
    model = build()
    if recipe is not None:
        convert(model, recipe, stats=stats)
    return _Loop(model, x, y)


def measure(name: str, build, x, y, recipes: list[str], steps: int, warmup: int) -> list[dict]:
    rows = []
    for recipe in recipes:
        for stats in (True, False):
            ref, emu = _fresh(build, x, y, None, False), _fresh(build, x, y, recipe, stats)
            for _ in range(warmup):
                ref.step(), emu.step()
            times = [(ref.step(), emu.step()) for _ in range(steps)]
            fp32 = statistics.median(t for t, _ in times)
            mine = statistics.median(t for _, t in times)
            row = {"model": name, "recipe": recipe, "stats": stats, "fp32_ms": 1e3 * fp32}
            row |= {"emulated_ms": 1e3 * mine, "ratio": mine / fp32}
            print(
                f"{name:5s} {recipe:12s} stats={'on ' if stats else 'off'} fp32 {row['fp32_ms']:9.1f} ms  "
                f"emulated {row['emulated_ms']:9.1f} ms  ratio {row['ratio']:7.1f}x",
                flush=True,
            )
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--models", default="tiny,25m")
    ap.add_argument("--recipes", default=",".join(GEMM_RECIPES))
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    recipes = args.recipes.split(",")
    unknown = [r for r in recipes if r not in GEMM_RECIPES]
    if unknown:
        ap.error(f"unknown recipes {unknown}; allowed: {', '.join(GEMM_RECIPES)}")
    makers = {"tiny": _tiny, "25m": lambda: _mlp25m(args.tokens)}
    models = args.models.split(",")
    if not set(models) <= set(makers):
        ap.error(f"--models: allowed {', '.join(makers)}, got {args.models}")
    rows = []
    for name in models:
        build, x, y = makers[name]()
        rows += measure(name, build, x, y, recipes, args.steps, args.warmup)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
