"""fpsim.train.torch in a live loop: against the real 8-bit optimizers, step time, state memory.

Run: ``python benchmarks/bench_train.py [--steps 300] [--params 4194304] [--repeats 3]
[--presets NAME ...] [--json OUT]`` (``--steps 0``: the step times only).

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
2. Step time, per preset: ``optimizer.step()`` alone of ``fpsim.train.torch.AdamW(config=
   preset)`` for every preset the training optimizers take, next to ``torch.optim.AdamW``
   (default: foreach) on the same parameters and gradients, best of ``--repeats`` interleaved
   rounds, printed as the ratio of the two measured in the same run (goal: <= 3x for every
   preset), on a GPT-shaped ~23M-parameter set of tensors (1-D ones below the presets' minimum
   size among them), ``--params`` parameters in four tensors, and the bundled models of
   ``fpsim ab`` (``tiny-transformer``, ``digits-mlp``: small tensors, where the per-tensor
   overhead shows).
   With each ratio: bytes of the tensors the optimizer holds in its state per parameter
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

from fpsim.replay import PRESETS
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


def _transformer_shapes(layers: int = 6, d: int = 512, vocab: int = 8192) -> list[tuple[int, ...]]:
    """The tensors of a GPT-style model (~23M parameters at the defaults): embedding, per layer
    qkv/out/two MLP matrices with their biases and two LayerNorms, a final LayerNorm; 1-D
    tensors below the presets' 4096-element minimum, blocks that do not divide some."""
    layer = [
        (3 * d, d),
        (3 * d,),
        (d, d),
        (d,),
        (4 * d, d),
        (4 * d,),
        (d, 4 * d),
        (d,),
        (d,),
        (d,),
        (d,),
        (d,),
    ]
    return [(vocab, d), *layer * layers, (d,), (d,)]


def _bundled(name: str) -> list[torch.nn.Parameter]:
    """The parameters of a bundled model of ``fpsim ab`` with the gradient of its first batch."""
    m = MODELS[name]
    torch.manual_seed(0)
    model = m.build()
    x, y = m.batches(0, 1)[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p for p in model.parameters() if p.grad is not None]


def _synthetic(shapes: list[tuple[int, ...]]) -> list[torch.nn.Parameter]:
    rng = np.random.default_rng(0)
    ps = [torch.nn.Parameter(torch.from_numpy(rng.standard_normal(s).astype(np.float32))) for s in shapes]
    for p in ps:
        p.grad = torch.from_numpy((rng.standard_normal(p.shape) * 1e-3).astype(np.float32))
    return ps


def models(params: int) -> dict[str, list[torch.nn.Parameter]]:
    """The parameter sets the step is timed on (parameters with their gradients)."""
    shapes = _transformer_shapes()
    return {
        f"transformer {sum(math.prod(s) for s in shapes) / 1e6:.0f}M": _synthetic(shapes),
        f"4 x {params // 4:,}": _synthetic([(params // 4 // 1024, 1024)] * 4),
        "tiny-transformer": _bundled("tiny-transformer"),
        "digits-mlp": _bundled("digits-mlp"),
    }


def live_presets() -> list[str]:
    """The presets the training optimizers take (those without loss or gradient scaling)."""
    return [n for n, c in PRESETS.items() if c.loss_scaler is None and c.grad_delayed is None]


def step_ratios(ps: list[torch.nn.Parameter], presets: list[str], repeats: int) -> dict[str, dict]:
    """Per preset: ``optimizer.step()`` of ``fpsim.train.torch.AdamW(config=preset)`` and of
    ``torch.optim.AdamW`` (default: foreach) on the same parameters and gradients, best of
    ``repeats`` interleaved rounds after a warm-up step (states made, compiled loops loaded);
    the ratio of the two and the state bytes per parameter. torch is timed next to each preset,
    so a ratio compares times of the same moment of a shared machine."""
    n = sum(p.numel() for p in ps)
    out = {}
    for preset in presets:
        opts = {
            "torch": torch.optim.AdamW(ps, lr=1e-3),
            preset: ftorch.AdamW(ps, lr=1e-3, config=preset),
        }
        times: dict[str, list[float]] = {k: [] for k in opts}
        for opt in opts.values():
            opt.step()
        for _ in range(repeats):
            for k, opt in opts.items():
                t = time.perf_counter()
                opt.step()
                times[k].append(time.perf_counter() - t)
        fp, tt = min(times[preset]), min(times["torch"])
        out[preset] = {
            "fpsim_s": fp,
            "torch_s": tt,
            "ratio": fp / tt,
            "state_bytes": state_bytes(opts[preset]) / n,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--params", type=int, default=1 << 22)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--presets", nargs="*", help="presets to time (default: every live one)")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(1)

    rows_loop = closed_loop(args.steps) if args.steps else []
    if rows_loop:
        print(f"closed loop, digits MLP, {args.steps} steps (same start and batches):")
    for r in rows_loop:
        print(
            f"  {r['library']:22s} vs fpsim {r['fpsim config']:13s}: "
            f"max |loss diff| {r['max |loss diff|']:.3g}, "
            f"final loss {r['final loss library']:.4f} vs {r['final loss fpsim']:.4f} ({r['steps']} steps)"
        )
    table = {}
    for name, ps in models(args.params).items():
        n = sum(p.numel() for p in ps)
        table[name] = rows = step_ratios(ps, args.presets or live_presets(), args.repeats)
        print(
            f"\noptimizer.step() of AdamW(config=...) / torch.optim.AdamW's, {name} ({n:,} parameters in "
            f"{len(ps)} tensors), best of {args.repeats}, 1 torch thread:"
        )
        for preset, r in rows.items():
            print(
                f"  {preset:18s} {r['fpsim_s'] * 1e3:8.2f} ms vs {r['torch_s'] * 1e3:7.2f} ms  "
                f"{r['ratio']:6.2f}x torch   state {r['state_bytes']:.3f} bytes/param"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"closed_loop": rows_loop, "step_ratios": table}, f, indent=2)


if __name__ == "__main__":
    main()
