"""Encode throughput of fpsim's numpy and JAX paths as a ratio to ml_dtypes' astype.

Run: ``python benchmarks/bench_encode.py [--n 4194304] [--repeats 7] [--json OUT]``.

All three are measured in the same run on the same inputs (best of ``--repeats``), because
these machines are noisy; only the ratios are meaningful. Two input sets: ``normal``
(standard normal float32, like activations and weights) and ``bits`` (uniform float32 bit
patterns: every exponent, subnormals, inf and NaN equally likely per binade).
Goals (issue 2): JAX >= 1.5x ml_dtypes, numpy >= 0.3x.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import fpsim

FORMATS = {
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
}


def best(fn, repeats: int) -> float:
    out = fn()
    if hasattr(out, "block_until_ready"):
        out.block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        if hasattr(out, "block_until_ready"):
            out.block_until_ready()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 22, help="elements per input set")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="write the results here as JSON")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    inputs = {
        "normal": rng.standard_normal(args.n, dtype=np.float32),
        "bits": rng.integers(0, 1 << 32, args.n, dtype=np.uint32).view(np.float32),
    }
    rows = []
    print(
        f"{'format':15s} {'input':6s} {'ml_dtypes M/s':>13s} {'numpy M/s':>10s} {'ratio':>6s} "
        f"{'jax M/s':>9s} {'ratio':>6s}  same codes"
    )
    for name, dtype in FORMATS.items():
        jitted = jax.jit(lambda a, name=name: fpsim.encode(a, name))
        for kind, x in inputs.items():
            xj = jnp.asarray(x)
            t_ml = best(lambda x=x, dtype=dtype: x.astype(dtype), args.repeats)
            t_np = best(lambda x=x, name=name: fpsim.encode(x, name), args.repeats)
            t_jx = best(lambda f=jitted, xj=xj: f(xj), args.repeats)
            same = bool(np.array_equal(np.asarray(jitted(xj)), fpsim.encode(x, name)))
            row = {
                "format": name,
                "input": kind,
                "n": args.n,
                "ml_dtypes_Mps": args.n / t_ml / 1e6,
                "numpy_Mps": args.n / t_np / 1e6,
                "jax_Mps": args.n / t_jx / 1e6,
                "numpy_ratio": t_ml / t_np,
                "jax_ratio": t_ml / t_jx,
                "jax_equals_numpy": same,
            }
            rows.append(row)
            print(
                f"{name:15s} {kind:6s} {row['ml_dtypes_Mps']:13.0f} {row['numpy_Mps']:10.0f} "
                f"{row['numpy_ratio']:5.2f}x {row['jax_Mps']:9.0f} {row['jax_ratio']:5.2f}x  {same}"
            )
    if args.json:
        with open(args.json, "w") as fh:
            meta = {"jax": jax.__version__, "ml_dtypes": ml_dtypes.__version__}
            json.dump({**meta, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
