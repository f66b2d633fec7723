"""Emulated matmul throughput of fpsim.accumulate against numpy's float32 matmul.

Run: ``python benchmarks/bench_accumulate.py [--n 1024] [--k 1024] [--repeats 3] [--json OUT]``.

An (n, k) x (k, n) product of bfloat16 inputs, accumulated with one exactly rounded add per
step into float32 and into a 14-bit accumulator (sequential, nearest-even; also 14 bits with
promotion every 128 and toward-zero rounding, the DeepSeek-V3 setting). Throughput is in
multiply-adds per second; numpy's float32 ``a @ b`` (BLAS) is timed in the same run, because
these machines are noisy and only the ratio is meaningful. The emulation runs once per
setting (it takes seconds); numpy is best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import ml_dtypes
import numpy as np

import fpsim.accumulate as fa

SETTINGS = {
    "float32": dict(accumulator="float32"),
    "p14": dict(accumulator=14),
    "p14 RZ +128": dict(accumulator=14, rounding="toward_zero", promote_every=128),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024, help="rows of a and columns of b")
    ap.add_argument("--k", type=int, default=1024, help="reduction length")
    ap.add_argument("--repeats", type=int, default=3, help="numpy matmul repeats (best taken)")
    ap.add_argument("--json", help="write the results here as JSON")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.n, args.k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((args.k, args.n)).astype(ml_dtypes.bfloat16)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    macs = args.n * args.n * args.k

    def numpy_time() -> float:
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            a32 @ b32
            times.append(time.perf_counter() - t)
        return min(times)

    print(f"{args.n}x{args.k} @ {args.k}x{args.n} bfloat16 inputs, {os.cpu_count()} CPUs")
    heads = ("seconds", "M MAC/s", "numpy G MAC/s", "slowdown", "max |diff| vs f32")
    print(f"{'accumulator':12s} " + " ".join(f"{h:>{w}s}" for h, w in zip(heads, (8, 9, 14, 9, 18))))
    rows = []
    for name, kw in SETTINGS.items():
        t_np = numpy_time()
        t = time.perf_counter()
        c = fa.matmul(a, b, **kw)
        t_em = time.perf_counter() - t
        t_np = min(t_np, numpy_time())
        diff = float(np.abs(c - a32 @ b32).max())
        row = {
            "accumulator": name,
            "n": args.n,
            "k": args.k,
            "seconds": t_em,
            "emulated_MMACps": macs / t_em / 1e6,
            "numpy_f32_GMACps": macs / t_np / 1e9,
            "slowdown_vs_numpy": t_em / t_np,
            "max_abs_diff_vs_numpy_f32": diff,
        }
        rows.append(row)
        print(
            f"{name:12s} {t_em:8.2f} {row['emulated_MMACps']:9.0f} {row['numpy_f32_GMACps']:14.1f} "
            f"{row['slowdown_vs_numpy']:8.0f}x {diff:18.3e}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"numpy": np.__version__, "cpus": os.cpu_count(), "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
