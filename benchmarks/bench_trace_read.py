"""Reading a large trace: the ``pread`` reader against the memory-map reader it replaced, as a ratio.

Run: ``python benchmarks/bench_trace_read.py [--gib 2] [--repeats 3] [--dir /tmp] [--json OUT]``.

Writes a trace of ``--gib`` GiB once (4 steps x 2 float32 tensors, with :class:`TraceWriter`),
then reads every tensor and takes its maximum (what an amax does), with

- ``pread``: :meth:`fpsim.trace.Trace.read`, which reads each tensor into a fresh array with
  ``pread`` (immune to files truncated under it);
- ``mmap``: the reader before (fpsim's ``map_file`` + ``tensor_view``, reproduced here
  line for line): a read-only memory map of the file and an array viewing the tensor's
  bytes, faulted in by the ``max`` (zero-copy, and exposed to ``SIGBUS``);
- ``mmap+copy``: the same view copied into memory first (what a reader that owns its
  arrays must do at least, and what a consumer calling ``np.array(view)`` did).

Both in the same run, alternating (best of ``--repeats``), with the file in the page cache
(``warm``) and evicted before each pass with ``posix_fadvise(DONTNEED)`` (``cold``).

Then the main job, ``fpsim analyze`` (:func:`fpsim.analysis.analyze`, one element format,
float8_e4m3fn, no swamping: the cheapest analysis, where reading weighs most) on the same
trace, with the ``pread`` reader and with the memory-map reader put back in its place
(``SafetensorsSource.read`` returning the view), warm and cold, in the same run. The trace
is deleted at the end. Goal (issue 18): the ``pread`` reader loses no speed on large traces
(ratio >= ~1 for the analysis; a bare read of page-cached data cannot match a zero-copy map,
which copies nothing).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from fpsim.trace import TraceWriter, open_trace
from fpsim.trace.safetensors_io import numpy_dtype, read_header


def make_trace(folder: Path, gib: float) -> None:
    n = int(gib * (1 << 30) / 8 / 4)  # 8 tensors of float32
    base = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    with TraceWriter(folder) as w:
        for step in range(4):
            w.write_step(step, {"grad": {"a": base + step, "b": base - step}})


def evict(folder: Path) -> None:
    for p in folder.glob("*.safetensors"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_pread(folder: Path) -> float:
    t = open_trace(folder)
    return max(float(t.read(e).max()) for e in t.entries())


def read_mmap(folder: Path, copy: bool = False) -> float:
    """The reader before: map each file once, view each tensor's bytes (map_file + tensor_view)."""
    t = open_trace(folder)
    out = -np.inf
    for step in t.steps:
        header = read_header(folder / f"step_{step:06d}.safetensors")
        with open(header.path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        for slot in header.tensors.values():
            a = np.ndarray(slot.shape, dtype=numpy_dtype(slot.dtype), buffer=mm, offset=slot.offset)
            if copy:
                a = np.array(a)
            out = max(out, float(a.max()))
            del a
        mm.close()
    return out


def mmap_source_read(self, entry):
    """The reader before, as ``SafetensorsSource.read``: a view of a read-only map of the file."""
    slot = self.header.tensors[self._key(entry)]
    with open(self.header.path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.ndarray(slot.shape, dtype=numpy_dtype(slot.dtype), buffer=mm, offset=slot.offset)


def analyze_with(folder: Path, reader: str) -> float:
    """Seconds of ``analyze`` (float8_e4m3fn, no swamping) with the ``pread`` or ``mmap`` reader."""
    from fpsim.analysis import analyze
    from fpsim.trace.reader import SafetensorsSource

    real = SafetensorsSource.read
    if reader == "mmap":
        SafetensorsSource.read = mmap_source_read
    try:
        t = time.perf_counter()
        res = analyze(folder, ["float8_e4m3fn"], swamping=False, progress=False)
        elapsed = time.perf_counter() - t
    finally:
        SafetensorsSource.read = real
    assert res.totals()["float8_e4m3fn", "nearest_even"].elements > 0
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fpsim_bench_trace_", dir=args.dir))
    try:
        t0 = time.perf_counter()
        make_trace(folder / "t", args.gib)
        size = sum(p.stat().st_size for p in (folder / "t").iterdir())
        print(f"wrote {size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f} s")
        results = {}
        for cache in ("warm", "cold"):
            methods = (
                ("pread", read_pread),
                ("mmap", read_mmap),
                ("mmap+copy", lambda f: read_mmap(f, True)),
            )
            best = {name: np.inf for name, _ in methods}
            values = {}
            for _ in range(args.repeats):
                for name, fn in methods:
                    if cache == "cold":
                        evict(folder / "t")
                    else:
                        fn(folder / "t")  # warm the page cache
                    t = time.perf_counter()
                    values[name] = fn(folder / "t")
                    best[name] = min(best[name], time.perf_counter() - t)
            assert len(set(values.values())) == 1, values  # the same bytes were read
            gbps = {k: size / v / 1e9 for k, v in best.items()}
            ratios = {f"pread/{k}": best[k] / best["pread"] for k in ("mmap", "mmap+copy")}
            results[cache] = {"seconds": best, "GB/s": gbps, "ratios": ratios}
            print(
                f"{cache:5s}: "
                + ", ".join(f"{k} {v:.2f} GB/s" for k, v in gbps.items())
                + "; throughput ratios "
                + ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items())
            )
        analyze_with(folder / "t", "pread")  # compile and warm up
        for cache in ("warm", "cold"):
            best = {"pread": np.inf, "mmap": np.inf}
            for _ in range(args.repeats):
                for name in best:
                    if cache == "cold":
                        evict(folder / "t")
                    best[name] = min(best[name], analyze_with(folder / "t", name))
            ratio = best["mmap"] / best["pread"]
            results[f"analyze_{cache}"] = {"seconds": best, "ratio mmap/pread": ratio}
            print(
                f"fpsim analyze ({cache}): pread reader {best['pread']:.2f} s, mmap reader "
                f"{best['mmap']:.2f} s; throughput ratio pread/mmap = {ratio:.2f}"
            )
        if args.json:
            Path(args.json).write_text(json.dumps({"bytes": size, **results}, indent=1))
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
