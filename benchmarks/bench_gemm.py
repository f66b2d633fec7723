"""Emulated-GEMM training speed on the CPU: one step under each GEMM recipe / one FP32 step.

Run: ``python benchmarks/bench_gemm.py [--steps 5] [--warmup 2] [--tokens 256]
[--models tiny,25m] [--recipes bf16,...] [--backend auto] [--stats] [--threads 1]
[--clock wall] [--profile RECIPE] [--json OUT]``.

A step is forward, backward and ``torch.optim.Adam.step()`` of a model converted with
``fpsim.train.torch.convert(model, recipe)`` (``--stats``: also with ``stats=True``, the
per-GEMM statistics that ``fpsim ab --gemm`` records, as a second row); the baseline is the
same step of the unconverted model (FP32) on the same batch, its steps interleaved with the
emulated ones (so that load from other processes hits both alike). Each recipe runs
``--warmup`` steps of both, then ``--steps`` timed pairs; printed: the median step times and
their ratio (goal: <= 3x). torch runs on ``--threads`` threads (default 1: on a machine shared
with other jobs, a parallel FP32 step of a few milliseconds waits on descheduled threads and
the ratios become noise); fpsim's compiled
loops use their own pool either way. ``--clock cpu`` times the steps in this process's CPU time
(``time.process_time``: all its threads) instead of wall time: on a machine other jobs load, a
step of a few milliseconds is often descheduled, and the CPU time of single-threaded steps
(torch on one thread, the compiled loops on one for small tensors) is the steadier measure. Models:

- ``tiny``: the tiny transformer of :mod:`fpsim.trace.sample` (6,076 parameters, batch 64 of
  12 tokens, the same data).
- ``25m``: six residual MLP blocks of width 1024 with hidden width 2048 (two linears each,
  25.2M parameters in the linears), ``--tokens`` tokens per batch.

``--profile RECIPE`` runs cProfile over the timed steps of that recipe on each model (with
``--stats``, of its ``+stats`` row) and prints the top functions by cumulative and own time.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time

import torch

from fpsim.train.gemm import GEMM_RECIPES
from fpsim.train.torch import convert


class _Block(torch.nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def _mlp25m(tokens: int):
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[_Block(1024, 2048) for _ in range(6)], torch.nn.Linear(1024, 16))

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, 1024, generator=gen)
    y = torch.randint(0, 16, (tokens,), generator=gen)
    return build, x, y


def _tiny():
    from fpsim.trace import sample

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return sample.build_model()

    tokens, labels = sample.make_data(0)
    return build, torch.from_numpy(tokens[: sample.BATCH]), torch.from_numpy(labels[: sample.BATCH])


class Loop:
    """A model, its Adam and the batch: :meth:`step` times one training step."""

    def __init__(
        self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, clock=time.perf_counter
    ) -> None:
        self.model, self.x, self.y, self.clock = model, x, y, clock
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(self) -> float:
        t = self.clock()
        loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return self.clock() - t


def compare(base: Loop, emulated: Loop, warmup: int, steps: int, profile=None) -> tuple[float, float]:
    """Median FP32 and emulated step times, the steps interleaved (load from other processes
    hits both alike)."""
    for _ in range(warmup):
        base.step(), emulated.step()
    tb, te = [], []
    for _ in range(steps):
        tb.append(base.step())
        if profile is not None:
            profile.enable()
        te.append(emulated.step())
        if profile is not None:
            profile.disable()
    return statistics.median(tb), statistics.median(te)


def run(args) -> list[dict]:
    rows = []
    for name in args.models:
        build, x, y = _tiny() if name == "tiny" else _mlp25m(args.tokens)
        print(f"{name}:")
        for recipe in args.recipes:
            for stats in (False, True) if args.stats else (False,):
                prof = cProfile.Profile() if recipe == args.profile and stats == args.stats else None
                clock = time.process_time if args.clock == "cpu" else time.perf_counter
                base = Loop(build(), x, y, clock)  # fresh: both models take the same steps from one start
                emulated = Loop(convert(build(), recipe, backend=args.backend, stats=stats), x, y, clock)
                tb, te = compare(base, emulated, args.warmup, args.steps, prof)
                row = {"model": name, "recipe": recipe, "stats": stats, "ms": te * 1e3, "fp32_ms": tb * 1e3}
                row["ratio"] = te / tb
                rows.append(row)
                label = f"{recipe}{'+stats' if stats else ''}"
                print(f"  {label:18s} {te * 1e3:9.1f} ms  (FP32 {tb * 1e3:7.1f} ms)  {te / tb:6.2f}x")
                if prof is not None:
                    st = pstats.Stats(prof)
                    st.sort_stats("cumulative").print_stats(25)
                    st.sort_stats("tottime").print_stats(25)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--models", default="tiny,25m")
    p.add_argument("--recipes", default=",".join(GEMM_RECIPES))
    p.add_argument("--backend", default="auto")
    p.add_argument("--stats", action="store_true", help="also time each recipe with stats=True")
    p.add_argument("--profile", default=None)
    p.add_argument("--threads", type=int, default=1, help="torch's CPU threads (default 1, see the doc)")
    p.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall", help="what a step's time is (see the doc)"
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    args.models = args.models.split(",")
    args.recipes = args.recipes.split(",")
    for m in args.models:
        if m not in ("tiny", "25m"):
            p.error(f"--models: unknown model {m!r}; allowed: tiny, 25m")
    for r in args.recipes:
        if r not in GEMM_RECIPES:
            p.error(f"--recipes: unknown recipe {r!r}; allowed: {', '.join(GEMM_RECIPES)}")
    torch.set_num_threads(args.threads)
    rows = run(args)
    print("\nmodel  recipe             ratio")
    for r in rows:
        label = f"{r['recipe']}{'+stats' if r['stats'] else ''}"
        print(f"{r['model']:6s} {label:18s} {r['ratio']:6.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
