"""Encode throughput of fpsim's numpy-facing verbs (compiled and numpy tiers) and JAX path as
a ratio to ml_dtypes' astype and to a plain memory copy of the input.

Run: ``python benchmarks/bench_encode.py [--n 4194304] [--repeats 7] [--json OUT]``.

All are measured in the same run on the same inputs (best of ``--repeats``), because these
machines are noisy; only the ratios are meaningful. Two input sets: ``normal`` (standard
normal float32, like activations and weights) and ``bits`` (uniform float32 bit patterns:
every exponent, subnormals, inf and NaN equally likely per binade). ``compiled`` is
``fpsim.encode(x, fmt)`` with the default backend where numba is installed (the loop of
:mod:`fpsim._compiled.measure` on all cores); ``copy`` is ``np.copyto`` of the input into a
preallocated array (how close to the memory limit). Goals: issue 2: JAX >= 1.5x ml_dtypes,
numpy >= 0.3x; issue 19: compiled >= 2x ml_dtypes for the FP8 formats.
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
        f"{'format':15s} {'input':6s} {'ml_dtypes M/s':>13s} {'compiled M/s':>12s} {'ratio':>6s} "
        f"{'vs copy':>7s} {'numpy M/s':>10s} {'ratio':>6s} {'jax M/s':>9s} {'ratio':>6s}  same codes"
    )
    for name, dtype in FORMATS.items():
        jitted = jax.jit(lambda a, name=name: fpsim.encode(a, name))
        for kind, x in inputs.items():
            xj = jnp.asarray(x)
            t_ml = best(lambda x=x, dtype=dtype: x.astype(dtype), args.repeats)
            t_np = best(lambda x=x, name=name: fpsim.encode(x, name, backend="numpy"), args.repeats)
            t_c = best(lambda x=x, name=name: fpsim.encode(x, name, backend="compiled"), args.repeats)
            dst = np.empty_like(x)
            t_cp = best(lambda x=x, dst=dst: np.copyto(dst, x), args.repeats)
            t_jx = best(lambda f=jitted, xj=xj: f(xj), args.repeats)
            ref = fpsim.encode(x, name, backend="numpy")
            same = bool(np.array_equal(np.asarray(jitted(xj)), ref)) and bool(
                np.array_equal(fpsim.encode(x, name, backend="compiled"), ref)
            )
            row = {
                "format": name,
                "input": kind,
                "n": args.n,
                "ml_dtypes_Mps": args.n / t_ml / 1e6,
                "numpy_Mps": args.n / t_np / 1e6,
                "compiled_Mps": args.n / t_c / 1e6,
                "compiled_ratio": t_ml / t_c,
                "compiled_vs_copy": t_cp / t_c,
                "jax_Mps": args.n / t_jx / 1e6,
                "numpy_ratio": t_ml / t_np,
                "jax_ratio": t_ml / t_jx,
                "all_equal": same,
            }
            rows.append(row)
            print(
                f"{name:15s} {kind:6s} {row['ml_dtypes_Mps']:13.0f} {row['compiled_Mps']:12.0f} "
                f"{row['compiled_ratio']:5.2f}x {row['compiled_vs_copy']:6.2f}x {row['numpy_Mps']:10.0f} "
                f"{row['numpy_ratio']:5.2f}x {row['jax_Mps']:9.0f} {row['jax_ratio']:5.2f}x  {same}"
            )
    if args.json:
        with open(args.json, "w") as fh:
            meta = {"jax": jax.__version__, "ml_dtypes": ml_dtypes.__version__}
            json.dump({**meta, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
