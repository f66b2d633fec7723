"""Analysis throughput against one ml_dtypes cast, and peak memory on a trace larger than allowed.

Run: ``python benchmarks/bench_analyze.py [--elements 16777216] [--trace-gb 2] [--limit-mb 512]
[--json OUT]``; ``--trace`` for the trace comparison of issue 19 only, ``--minilm`` for the
MiniLM-sized trace (both write their traces under /tmp and delete them).

0. Trace (``--trace``): ``fpsim analyze`` (:func:`fpsim.analysis.analyze`, compiled backend) of
   a trace of 4 steps x 2 tensors x 4M float32 gradients with parameters and lr, four element
   formats, all metrics, swamping in both modes, against the plain loop that loads each step
   file with safetensors and, per tensor and format, casts with ml_dtypes, casts back and
   counts zeros, in the same run (goal: <= 2x, ideally <= 1x); each block recipe's analysis
   (no swamping) against one plain element cast (load + e4m3 cast + back + count); the numba
   compile time of a first run (from an empty cache folder) and of a cached one.
0b. MiniLM (``--minilm``): 6 steps of 22.6M parameters shaped like MiniLM-L6 (embeddings and 6
   layers), gradients and parameters of realistic magnitudes, analysed with the defaults of
   ``fpsim analyze`` (:data:`fpsim.analysis.DEFAULT_FORMATS`, swamping); goal: under 30 s on 2
   cores.

1. Throughput: all metrics of :func:`fpsim.analysis.metrics.measure` for one format, and for four
   formats (the tensor read once, measured four times), on the same float32 gradients as one
   ``ml_dtypes`` float8_e4m3fn cast, best of 3, in the same run. Goal (issue 4): one format
   within 3x the time of one ml_dtypes cast.
2. Memory: writes a trace of ``--trace-gb`` GB (several steps of a few large tensors) with
   :class:`fpsim.trace.TraceWriter`, then runs ``fpsim.analysis.run.analyze`` on it in a child
   process whose private memory is capped with ``RLIMIT_DATA = --limit-mb`` (numpy and
   Python allocations count, read-only file mappings do not), sampling its resident memory
   (anonymous and file-backed) from /proc. The trace is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from fpsim.analysis.metrics import measure

FOUR = ["float8_e4m3fn", "float8_e5m2", "bfloat16", "float16"]


def gradients(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n, dtype=np.float32) * np.exp(rng.normal(-8, 3, n)).astype(np.float32)


def best(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def best_cpu(fn, repeats: int = 2) -> tuple[float, float]:
    """(best wall-clock seconds, CPU seconds of this process over all threads in that run)."""
    runs = []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        runs.append((time.perf_counter() - t, time.process_time() - c))
    return min(runs)


def throughput(n: int) -> dict:
    x = gradients(n)
    t_ml = best(lambda: x.astype(ml_dtypes.float8_e4m3fn))
    t_one = best(lambda: measure(x, "float8_e4m3fn"))
    t_four = best(lambda: [measure(x, f) for f in FOUR], repeats=2)
    row = {
        "elements": n,
        "ml_dtypes_cast_s": t_ml,
        "one_format_s": t_one,
        "four_formats_s": t_four,
        "one_format_Mps": n / t_one / 1e6,
        "four_formats_Mps": n / t_four / 1e6,
        "one_format_vs_cast": t_one / t_ml,
        "four_formats_vs_cast": t_four / t_ml,
    }
    print(f"one ml_dtypes e4m3fn cast: {n / t_ml / 1e6:8.1f} M elements/s")
    print(
        f"all metrics, 1 format:     {row['one_format_Mps']:8.1f} M elements/s  "
        f"= {row['one_format_vs_cast']:.2f}x the cast's time (goal <= 3x)"
    )
    print(
        f"all metrics, 4 formats:    {row['four_formats_Mps']:8.1f} M elements/s  "
        f"= {row['four_formats_vs_cast']:.2f}x the cast's time"
    )
    return row


def _plain_loop(path: Path, dtypes: list) -> int:
    """The baseline of issue 19: safetensors load, ml_dtypes cast, cast back, count zeros."""
    from safetensors.numpy import load_file

    zeros = 0
    for f in sorted(path.glob("step_*.safetensors")):
        for key, x in load_file(f).items():
            if key.startswith("grad"):
                for dt in dtypes:
                    zeros += int(np.count_nonzero(x.astype(dt).astype(np.float32) == 0))
    return zeros


def _write_trace(path: Path, shapes: dict[str, tuple[int, ...]], steps: int, seed: int = 0) -> None:
    """A trace of ``steps`` steps: gradients (log-normal magnitudes, a scale per tensor, as
    backpropagated gradients have) and parameters (normal, 0.02-ish, as initialised weights)."""
    from fpsim.trace import TraceWriter

    rng = np.random.default_rng(seed)
    with TraceWriter(path) as w:
        for s in range(steps):
            grads, params = {}, {}
            for i, (name, shape) in enumerate(shapes.items()):
                n = int(np.prod(shape))
                scale = np.float32(10.0 ** rng.uniform(-7, -3))
                grads[name] = (gradients(n, seed * 1000 + s * 100 + i) * scale / np.float32(3e-4)).reshape(
                    shape
                )
                params[name] = (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)).reshape(shape)
            w.write_step(s, {"grad": grads, "param": params}, lr=1e-3)


def _compile_times(trace: Path) -> tuple[float, float]:
    """Seconds of a first analysis of a small trace in a fresh process with an empty numba
    cache folder (NUMBA_CACHE_DIR), and of a second one with that cache."""
    code = (
        "import time, sys; t = time.perf_counter(); from fpsim.analysis import analyze; "
        f"analyze(sys.argv[1], {FOUR + ['mxfp8_e4m3', 'int8_block256']!r}, progress=False, "
        "backend='compiled'); "
        "print(time.perf_counter() - t)"
    )
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        times = []
        for _ in range(2):
            out = subprocess.run(
                [sys.executable, "-c", code, str(trace)], env=env, capture_output=True, text=True
            )
            if out.returncode:
                raise SystemExit(out.stderr)
            times.append(float(out.stdout.split()[-1]))
    return times[0], times[1]


def trace_comparison(tensor_elements: int = 1 << 22, numpy_tier: bool = False) -> dict:
    """Section 0 of the module doc."""
    from fpsim.analysis import analyze
    from fpsim.formats import RECIPES

    dtypes = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.bfloat16, np.float16]
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        small, path = Path(tmp) / "small", Path(tmp) / "trace"
        _write_trace(small, {"w": (1000,), "b": (64, 64)}, 2)
        first, cached = _compile_times(small)
        print(f"first analysis in a fresh process: {first:.1f} s, empty numba cache; {cached:.1f} s cached")
        side = int(tensor_elements**0.5)  # 2-D, so that row and tile recipes apply
        _write_trace(path, {"layer0.weight": (side, side), "layer1.weight": (side, side)}, 4)
        analyze(small, FOUR, progress=False, backend="compiled")  # compiled code loaded
        t_plain, c_plain = best_cpu(lambda: _plain_loop(path, dtypes), 2)
        t_fp, c_fp = best_cpu(lambda: analyze(path, FOUR, progress=False), 2)
        t_fp_np = (
            best(lambda: analyze(path, FOUR, progress=False, backend="numpy"), 1) if numpy_tier else math.nan
        )
        t_one = best(lambda: _plain_loop(path, dtypes[:1]), 2)
        n = 8 * side * side
        print(f"trace: 4 steps x 2 tensors x {tensor_elements:,} float32 gradients + params ({n:,} elements)")
        print(f"plain loop (load + ml_dtypes cast + back + count zeros), 4 formats: {t_plain:6.2f} s")
        print(
            f"fpsim analyze, 4 formats, all metrics, swamping both modes:      {t_fp:6.2f} s "
            f"= {t_fp / t_plain:.2f}x (goal <= 2x, ideally <= 1x); numpy tier {t_fp_np:.2f} s = "
            f"{t_fp_np / t_plain:.2f}x"
        )
        print(
            f"CPU time (all threads): plain loop {c_plain:.2f} s, analyze {c_fp:.2f} s "
            f"= {c_fp / c_plain:.2f}x "
            "(on a shared machine the wall-clock ratio follows the CPU share each run gets)"
        )
        row = {"plain_s": t_plain, "analyze_s": t_fp, "ratio": t_fp / t_plain, "numpy_tier_s": t_fp_np}
        row |= {"plain_cpu_s": c_plain, "analyze_cpu_s": c_fp, "cpu_ratio": c_fp / c_plain}
        row |= {"first_run_s": first, "cached_run_s": cached, "one_cast_s": t_one, "recipes": {}}
        print(f"one plain element cast (load + e4m3 cast + back + count): {t_one:.2f} s")
        for name in RECIPES:
            t = best(lambda name=name: analyze(path, [name], swamping=False, progress=False), 1)
            row["recipes"][name] = t / t_one
            print(f"  {name:24s} {t:6.2f} s = {t / t_one:5.2f}x one plain element cast")
    return row


MINILM_LAYERS = 6


def minilm_shapes() -> dict[str, tuple[int, ...]]:
    """The parameter shapes of MiniLM-L6-H384 (22.6M parameters)."""
    h, f = 384, 1536
    shapes = {
        "embeddings.word": (30522, h),
        "embeddings.position": (512, h),
        "embeddings.token_type": (2, h),
        "embeddings.norm.weight": (h,),
        "embeddings.norm.bias": (h,),
    }
    for i in range(MINILM_LAYERS):
        for m in ("query", "key", "value", "attn_out"):
            shapes[f"layer{i}.{m}.weight"] = (h, h)
            shapes[f"layer{i}.{m}.bias"] = (h,)
        shapes[f"layer{i}.ffn_in.weight"] = (f, h)
        shapes[f"layer{i}.ffn_in.bias"] = (f,)
        shapes[f"layer{i}.ffn_out.weight"] = (h, f)
        shapes[f"layer{i}.ffn_out.bias"] = (h,)
        for ln in ("attn_norm", "ffn_norm"):
            shapes[f"layer{i}.{ln}.weight"] = (h,)
            shapes[f"layer{i}.{ln}.bias"] = (h,)
    shapes["pooler.weight"] = (h, h)
    shapes["pooler.bias"] = (h,)
    return shapes


def minilm() -> dict:
    """Section 0b of the module doc."""
    from fpsim.analysis import analyze

    shapes = minilm_shapes()
    n = sum(int(np.prod(s)) for s in shapes.values())
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        path = Path(tmp) / "minilm"
        _write_trace(path, shapes, 6)
        t0 = time.perf_counter()
        res = analyze(path, progress=False)
        elapsed = time.perf_counter() - t0
    skipped = sum(n for n, _ in res.skipped.values())
    print(
        f"MiniLM-sized trace: {n / 1e6:.1f}M parameters x 6 steps, default formats and recipes "
        f"({len(res.formats)}), swamping: {elapsed:.1f} s on {os.cpu_count()} cores (goal < 30 s); "
        f"{len(res.skipped)} (tensor, recipe) pairs not covered ({skipped:,} elements)"
    )
    return {"parameters": n, "seconds": elapsed}


CHILD = """
import resource, sys, json
limit = int(sys.argv[2]) * 2**20
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
from fpsim.analysis import analyze
res = analyze(sys.argv[1], ["float8_e4m3fn", "bfloat16"], swamping=False, progress=False)
t = res.totals()["float8_e4m3fn", "nearest_even"]
print(json.dumps({"elements": t.elements, "underflow": t.underflow}))
"""


def _status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def memory(trace_gb: float, limit_mb: int) -> dict:
    from fpsim.trace import TraceWriter

    per_tensor = 32 * 2**20  # 128 MB float32 tensors
    tensors = 4
    steps = max(1, round(trace_gb * 2**30 / (per_tensor * 4 * tensors)))
    with tempfile.TemporaryDirectory(dir=os.environ.get("FPSIM_BENCH_DIR")) as tmp:
        path = Path(tmp) / "big"
        t0 = time.perf_counter()
        with TraceWriter(path) as w:
            for s in range(steps):
                w.write_step(
                    s,
                    {
                        "grad": {
                            f"layer{i}.weight": gradients(per_tensor, seed=s * 10 + i) for i in range(tensors)
                        }
                    },
                )
        size = sum(f.stat().st_size for f in path.iterdir())
        print(
            f"wrote a {size / 2**30:.2f} GiB trace ({steps} steps x {tensors} tensors of 128 MiB) "
            f"in {time.perf_counter() - t0:.0f} s"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(limit_mb)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        peak: dict[str, int] = {}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                try:
                    for k, v in _status(proc.pid).items():
                        peak[k] = max(peak.get(k, 0), v)
                except (FileNotFoundError, ProcessLookupError):
                    return
                time.sleep(0.02)

        th = threading.Thread(target=sample)
        t0 = time.perf_counter()
        th.start()
        out, err = proc.communicate()
        stop.set()
        th.join()
        elapsed = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"analysis child failed under RLIMIT_DATA={limit_mb} MB:\n{err}")
    result = json.loads(out)
    row = {
        "trace_bytes": size,
        "limit_mb": limit_mb,
        "seconds": elapsed,
        "peak_rss_anon_mb": peak.get("RssAnon", 0) / 2**20,
        "peak_rss_file_mb": peak.get("RssFile", 0) / 2**20,
        "peak_rss_mb": peak.get("VmRSS", 0) / 2**20,
        "elements": result["elements"],
    }
    print(
        f"analysed {result['elements']:,} elements x 2 formats in {elapsed:.0f} s under RLIMIT_DATA "
        f"{limit_mb} MiB: peak anonymous RSS {row['peak_rss_anon_mb']:.0f} MiB, peak file-backed RSS "
        f"{row['peak_rss_file_mb']:.0f} MiB (page cache, reclaimable), trace {size / 2**20:.0f} MiB "
        f"= {size / 2**20 / limit_mb:.1f}x the limit"
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 24)
    ap.add_argument("--trace-gb", type=float, default=2.0)
    ap.add_argument("--limit-mb", type=int, default=512)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--trace", action="store_true", help="only the trace comparison (issue 19)")
    ap.add_argument("--minilm", action="store_true", help="only the MiniLM-sized trace")
    ap.add_argument("--numpy-tier", action="store_true", help="--trace: also time the numpy tier (slow)")
    ap.add_argument("--json", help="write the results here as JSON")
    args = ap.parse_args()
    if args.trace or args.minilm:
        out = {}
        if args.trace:
            out["trace"] = trace_comparison(numpy_tier=args.numpy_tier)
        if args.minilm:
            out["minilm"] = minilm()
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2))
        return
    out = {"throughput": throughput(args.elements)}
    if not args.skip_memory:
        out["memory"] = memory(args.trace_gb, args.limit_mb)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
