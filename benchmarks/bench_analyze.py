"""Analysis throughput against one ml_dtypes cast, and peak memory on a trace larger than allowed.

Run: ``python benchmarks/bench_analyze.py [--elements 16777216] [--trace-gb 2] [--limit-mb 512]
[--json OUT]``.

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
    ap.add_argument("--json", help="write the results here as JSON")
    args = ap.parse_args()
    out = {"throughput": throughput(args.elements)}
    if not args.skip_memory:
        out["memory"] = memory(args.trace_gb, args.limit_mb)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
