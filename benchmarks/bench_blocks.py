"""Block-quantization throughput as a ratio to the plain element cast of the same data.

Run: ``python benchmarks/bench_blocks.py [--rows 2048] [--cols 2048] [--repeats 5] [--json OUT]``.

For each recipe, ``fpsim.encode(x, recipe)`` (amax per block, scale, scaled cast) is timed
against ``fpsim.encode(x, element)`` (the bare cast to the recipe's element format) and
against ml_dtypes' ``astype`` where ml_dtypes has the element, all in the same run on the
same float32 matrix (best of ``--repeats``). Ratios above 1 mean the recipe is faster.
"""

from __future__ import annotations

import argparse
import json
import time

import ml_dtypes
import numpy as np

import fpsim

RECIPES = [
    "mxfp8_e4m3",
    "mxfp4_e2m1",
    "mxint8",
    "nvfp4",
    "e4m3_block128",
    "e4m3_tile128",
    "e4m3_tensor",
    "int8_block256",
    "bnb_dynamic8_block256",
    "fp8_e4m3_block256",
]


def best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the results here as JSON")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.cols)) * np.exp(rng.normal(0, 2, (args.rows, 1)))
    x = x.astype(np.float32)
    n = x.size
    rows = []
    print(
        f"{'recipe':24s} {'element':16s} {'recipe M/s':>10s} {'element M/s':>11s} {'ratio':>6s} "
        f"{'ml_dtypes M/s':>13s} {'ratio':>6s}"
    )
    for name in RECIPES:
        recipe = fpsim.get_format(name)
        el = recipe.element
        t_rec = best(lambda r=recipe: fpsim.encode(x, r), args.repeats)
        if isinstance(el, fpsim.Codebook):  # no element cast: compare with the int8 cast
            el = fpsim.get_format("int8")
        t_el = best(lambda e=el: fpsim.encode(x, e, saturate=True), args.repeats)
        ml = getattr(ml_dtypes, el.name, None)
        t_ml = best(lambda m=ml: x.astype(m), args.repeats) if ml is not None else float("nan")
        row = {
            "recipe": name,
            "element": el.name,
            "n": n,
            "recipe_Mps": n / t_rec / 1e6,
            "element_Mps": n / t_el / 1e6,
            "ratio_to_element": t_el / t_rec,
            "ml_dtypes_Mps": n / t_ml / 1e6,
            "ratio_to_ml_dtypes": t_ml / t_rec,
        }
        rows.append(row)
        print(
            f"{name:24s} {el.name:16s} {row['recipe_Mps']:10.1f} {row['element_Mps']:11.1f} "
            f"{row['ratio_to_element']:5.2f}x {row['ml_dtypes_Mps']:13.1f} {row['ratio_to_ml_dtypes']:5.2f}x"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
