"""Replay throughput against torch.optim.AdamW(foreach=True) on the same CPU, same run.

Run: ``python benchmarks/bench_replay.py [--params 4194304] [--steps 5] [--tensors 4]
[--config NAME ...] [--repeats 3] [--json OUT]``.

A synthetic trace (``--tensors`` equal tensors, ``--params`` parameters in all, ``--steps``
steps, gradients and initial parameters) is written once; then, best of ``--repeats`` rounds
(each round runs every measurement once, interleaved, so that a drift in the machine's speed
hits all of them alike), the time per parameter x step of (a) torch.optim.AdamW(foreach=True)
.step() on the same tensors, (b) the FP32 replay (the reference alone, ``configs=[]``) and (c)
the reference plus one 8-bit configuration (default ``bnb-8bit-all``: dynamic maps, blocks of
256; others with ``--config``, e.g. ``int8-states``, ``fp8-states``), whose own cost is (c) -
(b). Goals (issue 5): FP32 replay within 1.5x of torch, 8-bit within 4x. Trace reading, the
set-up of the states and the divergence metrics are included in fpsim's time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from fpsim.replay import replay
from fpsim.replay.optim import AdamW
from fpsim.trace import TraceWriter


def best(fns: dict, repeats: int = 3) -> dict:
    """Best time of each function over ``repeats`` rounds, the functions interleaved in each
    round (the machine's speed drifts: a ratio of two timings taken minutes apart is noise)."""
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: min(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=1 << 22)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tensors", type=int, default=4, help="equal tensors the parameters are split into")
    ap.add_argument("--threads", type=int, default=None, help="replay threads (default: all CPUs)")
    ap.add_argument(
        "--config",
        action="append",
        help="8-bit configuration to time (repeatable; default bnb-8bit-all)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="rounds; the best time of each counts")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.config = args.config or ["bnb-8bit-all"]
    import torch

    rng = np.random.default_rng(0)
    shapes = {f"layer{i}.weight": (args.params // args.tensors,) for i in range(args.tensors)}
    p0 = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    grads = [
        {k: (rng.standard_normal(s) * 1e-3).astype(np.float32) for k, s in shapes.items()}
        for _ in range(args.steps)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t"
        with TraceWriter(path) as w:
            for s, g in enumerate(grads, 1):
                w.write_step(s, {"grad": g, **({"param": p0} if s == 1 else {})}, lr=1e-3)

        def torch_run():
            ps = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in p0.values()]
            opt = torch.optim.AdamW(ps, lr=1e-3, foreach=True)
            for g in grads:
                for p, v in zip(ps, g.values()):
                    p.grad = torch.from_numpy(v)
                opt.step()

        work = args.params * args.steps
        runs = {
            "torch": torch_run,
            "fp32": lambda: replay(path, [], optimizer=AdamW(), progress=False, threads=args.threads),
        }
        for cfg in args.config:
            runs[cfg] = lambda cfg=cfg: replay(
                path, [cfg], optimizer=AdamW(), progress=False, threads=args.threads
            )
        for fn in runs.values():  # warm up: numba compiles on first use
            fn()
        t = best(runs, args.repeats)
    t_torch, t_fp32 = t["torch"], t["fp32"]
    row = {
        "params": args.params,
        "steps": args.steps,
        "tensors": args.tensors,
        "torch_Mps": work / t_torch / 1e6,
        "fp32_Mps": work / t_fp32 / 1e6,
        "fp32_vs_torch": t_fp32 / t_torch,
        "configs": {},
    }
    print(f"torch AdamW(foreach=True): {row['torch_Mps']:8.1f} M param-steps/s")
    print(
        f"fpsim FP32 replay:         {row['fp32_Mps']:8.1f} M param-steps/s = {row['fp32_vs_torch']:.2f}x "
        "torch's time"
    )
    for cfg in args.config:
        own = t[cfg] - t_fp32
        row["configs"][cfg] = {"own_Mps": work / own / 1e6, "own_vs_torch": own / t_torch}
        print(
            f"{cfg + ' (own cost):':27}{work / own / 1e6:8.1f} M param-steps/s = "
            f"{own / t_torch:.2f}x torch's time"
        )
    print("goals (issue 5): FP32 replay <= 1.5x torch's time; 8-bit configurations' own cost <= 4x")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
