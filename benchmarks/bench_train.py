"""fpsim.train.torch in a live loop: against the real 8-bit optimizers, step time, state memory.

Run: ``python benchmarks/bench_train.py [--steps 300] [--params 4194304] [--repeats 3]
[--json OUT]``.

1. Closed loop against the libraries (CPU, same run): the digits MLP of ``fpsim ab`` on its
   data (:data:`fpsim.train.ab.MODELS`: the UCI digits with scikit-learn), ``--steps`` steps
   from one start on the same batches, under torchao's ``AdamWFp8`` (eagerly: ``torch.compile``
   replaced by the identity) next to
   ``fpsim.train.torch.AdamW(config="torchao-fp8")`` and ``config="fp8-states"``, and under
   bitsandbytes' ``Adam8bit`` (its CPU kernel) next to ``fpsim.train.torch.Adam(config=
   "bnb-8bit-cpu")``; printed: the largest loss difference over the steps and the final losses.
   (The MLP's largest tensors have 16,384 elements: above torchao's and bitsandbytes' 4096
   minimum, so they are quantized.) torchao's optimizers compute the moments with their own
   operations (lerp, ...), which fpsim's Adam does not copy: the distance is not zero.
2. Step time: ``optimizer.step()`` alone on ``--params`` parameters in four tensors with fixed
   gradients, best of ``--repeats`` interleaved rounds, for ``torch.optim.AdamW`` (default:
   foreach) and ``fpsim.train.torch.AdamW`` with FP32 and 8-bit configurations; printed as
   ratios to torch measured in the same run (goal for 8-bit: <= 3x).
3. Memory: bytes of the tensors each optimizer holds in its state per parameter
   (:func:`fpsim.train.ab.state_bytes`, summed over the real tensors after a step; the step
   counters excluded).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from unittest import mock

import numpy as np
import torch

from fpsim.train import torch as ftorch
from fpsim.train.ab import MODELS, state_bytes


def _train(make, steps: int) -> list[float]:
    m = MODELS["digits-mlp"]
    torch.manual_seed(0)
    model = m.build()
    opt = make(model.named_parameters())
    losses = []
    with mock.patch.object(torch, "compile", lambda fn, **kw: fn):  # torchao: eagerly
        for x, y in m.batches(0, steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            losses.append(float(loss.detach()))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return losses


def closed_loop(steps: int) -> list[dict]:
    import bitsandbytes as bnb
    import torchao.optim as tao

    lr = MODELS["digits-mlp"].lr
    pairs = [
        ("torchao AdamWFp8", lambda p: tao.AdamWFp8([q for _, q in p], lr=lr), "torchao-fp8", ftorch.AdamW),
        ("torchao AdamWFp8", lambda p: tao.AdamWFp8([q for _, q in p], lr=lr), "fp8-states", ftorch.AdamW),
        (
            "bitsandbytes Adam8bit",
            lambda p: bnb.optim.Adam8bit([q for _, q in p], lr=lr),
            "bnb-8bit-cpu",
            ftorch.Adam,
        ),
        ("torch.optim.AdamW", lambda p: torch.optim.AdamW([q for _, q in p], lr=lr), "fp32", ftorch.AdamW),
    ]
    rows, lib_cache = [], {}
    for lib, make_lib, config, cls in pairs:
        if lib not in lib_cache:
            lib_cache[lib] = _train(make_lib, steps)
        ref = lib_cache[lib]
        ours = _train(lambda p, cls=cls, config=config: cls(p, lr=lr, config=config), steps)
        n = min(len(ref), len(ours))
        diff = [abs(a - b) for a, b in zip(ref[:n], ours[:n])]
        rows.append(
            {
                "library": lib,
                "fpsim config": config,
                "steps": n,
                "max |loss diff|": max(diff) if all(map(math.isfinite, diff)) else math.inf,
                "final loss library": ref[-1],
                "final loss fpsim": ours[-1],
            }
        )
    return rows


def step_times(params: int, repeats: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(0)
    shapes = [(params // 4 // 1024, 1024)] * 4
    setups = {
        "torch.optim.AdamW": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        "fpsim fp32": lambda ps: ftorch.AdamW(ps, lr=1e-3),
        "fpsim bnb-8bit": lambda ps: ftorch.AdamW(ps, lr=1e-3, config="bnb-8bit"),
        "fpsim int8-states": lambda ps: ftorch.AdamW(ps, lr=1e-3, config="int8-states"),
        "fpsim fp8-states": lambda ps: ftorch.AdamW(ps, lr=1e-3, config="fp8-states"),
        "fpsim torchao-8bit": lambda ps: ftorch.AdamW(ps, lr=1e-3, config="torchao-8bit"),
    }
    opts, memory = {}, {}
    for name, make in setups.items():
        ps = [torch.nn.Parameter(torch.from_numpy(rng.standard_normal(s).astype(np.float32))) for s in shapes]
        for p in ps:
            p.grad = torch.from_numpy(rng.standard_normal(p.shape).astype(np.float32) * 1e-3)
        opts[name] = make(ps)
        opts[name].step()  # states created, compiled loops warm
        memory[name] = state_bytes(opts[name]) / sum(p.numel() for p in ps)
    times = {k: [] for k in opts}
    for _ in range(repeats):
        for k, opt in opts.items():
            t = time.perf_counter()
            opt.step()
            times[k].append(time.perf_counter() - t)
    return {k: min(v) for k, v in times.items()}, memory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--params", type=int, default=1 << 22)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(1)

    rows = closed_loop(args.steps)
    print(f"closed loop, digits MLP, {args.steps} steps (same start and batches):")
    for r in rows:
        print(
            f"  {r['library']:22s} vs fpsim {r['fpsim config']:13s}: "
            f"max |loss diff| {r['max |loss diff|']:.3g}, "
            f"final loss {r['final loss library']:.4f} vs {r['final loss fpsim']:.4f} ({r['steps']} steps)"
        )
    times, memory = step_times(args.params, args.repeats)
    base = times["torch.optim.AdamW"]
    print(
        f"\noptimizer.step() on {args.params:,} parameters (4 tensors), "
        f"best of {args.repeats}, 1 torch thread:"
    )
    for k, t in times.items():
        print(f"  {k:20s} {t * 1e3:8.1f} ms  {t / base:5.2f}x torch   state {memory[k]:.3f} bytes/param")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"closed_loop": rows, "step_seconds": times, "state_bytes_per_param": memory}, f, indent=2
            )


if __name__ == "__main__":
    main()
