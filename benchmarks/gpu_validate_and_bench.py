"""GPU check of the Triton kernels: full bit-exact validation on CUDA, then bandwidth.

Run on a machine with an NVIDIA GPU (a few minutes; nothing here runs on the CPU)::

    python benchmarks/gpu_validate_and_bench.py [--peak-gbps 4800] [--json OUT]
        [--quick] [--workers N] [--budget-s 280] [--n 268435456] [--skip-validate] [--skip-bench]

1. Validation: ``fpsim validate-kernels --device cuda`` (every registered kernel x format x
   rounding mode, portable and hardware casts, zero tolerance; see
   :mod:`fpsim.kernels.validate`), split by format over ``--workers`` parallel processes,
   because compiling the ~250 kernel specialisations is the slow part. Their JSON reports
   are merged and printed as one table. The exit status is 1 on any mismatch or error,
   or when validation did not finish inside its share of ``--budget-s``.
2. Bandwidth: each cast kernel on ``--n`` elements (default 2**28: a 1 GiB float32 input),
   timed with CUDA events (median of ``--repeats`` after warm-up), for a few block sizes
   (the best is kept). Achieved bytes/s (bytes read + bytes written, once each) is reported
   as a share of the device's peak memory bandwidth, ``--peak-gbps`` (H200: 4800 GB/s),
   next to a plain ``torch`` copy and torch's own float8 cast. Goal: 80% of peak
   (issue 6). The fused optimizer step is timed too (:func:`optim_cases`, in place, the
   same tensors every repeat). Later kernels add rows to :func:`bench_cases`.

The device name comes from ``torch.cuda.get_device_name()``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

H200_PEAK_GBPS = 4800.0
GOAL = 0.80
# (block, num_warps) tried for each portable kernel
CONFIGS = [(1024, 4), (2048, 4), (4096, 8)]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--peak-gbps",
        type=float,
        default=H200_PEAK_GBPS,
        help=f"the device's peak memory bandwidth in GB/s (default {H200_PEAK_GBPS:g}, H200)",
    )
    ap.add_argument("--json", metavar="OUT", help="write validation and bandwidth results here")
    ap.add_argument("--quick", action="store_true", help="quick validation inputs (fewer cases per format)")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1), help="validation processes")
    ap.add_argument("--budget-s", type=float, default=280.0, help="wall-clock budget for the whole script")
    ap.add_argument("--n", type=int, default=1 << 28, help="elements per bandwidth measurement")
    ap.add_argument("--repeats", type=int, default=20, help="timed runs per bandwidth measurement")
    ap.add_argument("--skip-validate", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--format", action="append", metavar="F", help="validate only these formats (repeatable)")
    ap.add_argument("--rounding", action="append", metavar="M", help="validate only these rounding modes")
    ap.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: a smoke test of the orchestration (validation in Triton's interpreter, no bandwidth)",
    )
    args = ap.parse_args(argv)
    if args.peak_gbps <= 0 or args.n < 1 or args.workers < 1 or args.repeats < 1:
        ap.error("--peak-gbps, --n, --workers and --repeats must be positive")
    return args


# --- validation ------------------------------------------------------------------------------


def split_formats(formats: Sequence[str], workers: int) -> list[list[str]]:
    """Formats dealt round-robin to at most ``workers`` groups (none empty)."""
    groups: list[list[str]] = [[] for _ in range(min(workers, len(formats)))]
    for i, f in enumerate(formats):
        groups[i % len(groups)].append(f)
    return groups


def run_validation(args: argparse.Namespace, timeout_s: float) -> dict[str, Any]:
    """``fpsim validate-kernels --device cuda`` over parallel processes; the merged report."""
    from fpsim import FORMATS, RECIPES

    formats = args.format or list(FORMATS) + list(RECIPES)  # recipes: block and optimizer kernels
    groups = split_formats(formats, args.workers)
    tmp = Path(tempfile.mkdtemp(prefix="fpsim-validate-"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRITON_INTERPRET", None)  # the command sets it for its device
    procs = []
    for i, group in enumerate(groups):
        out = tmp / f"part{i}.json"
        cmd = [
            sys.executable,
            "-m",
            "fpsim.kernels.validate",
            "--device",
            args.device,
            "--quiet",
            "--json",
            str(out),
        ]
        cmd += ["--quick"] if args.quick else []
        for f in group:
            cmd += ["--format", f]
        for m in args.rounding or []:
            cmd += ["--rounding", m]
        log = open(tmp / f"part{i}.log", "w")
        procs.append((group, out, log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)))
    deadline = time.monotonic() + timeout_s
    merged: dict[str, Any] = {"device": args.device, "quick": args.quick, "cases": [], "unfinished": []}
    for group, out, log, p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
        if out.exists():
            merged["cases"] += json.loads(out.read_text())["cases"]
        else:
            tail = Path(log.name).read_text(errors="replace")[-2000:]
            merged["unfinished"].append({"formats": group, "returncode": p.returncode, "log_tail": tail})
    for key in ("compared", "mismatches"):
        merged[key] = sum(r[key] for r in merged["cases"])
    merged["errors"] = sum(len(r["errors"]) for r in merged["cases"])
    merged["skipped"] = sum(r["skipped"] is not None for r in merged["cases"])
    merged["seconds"] = round(timeout_s - max(0.0, deadline - time.monotonic()), 1)
    return merged


# --- bandwidth ---------------------------------------------------------------------------------


@dataclass
class BenchCase:
    """One bandwidth measurement: ``run(launch)`` does the work once; ``nbytes`` is what it
    must read and write at least once."""

    name: str
    run: Callable[[Any], Any]
    nbytes: int
    tunable: bool = True


def bench_cases(n: int) -> list[BenchCase]:
    """The kernels to time on ``n`` elements (add block quantization here when it exists)."""
    import torch

    from fpsim.kernels import cast, hwcast

    dev = "cuda"
    x = torch.randn(n, device=dev, dtype=torch.float32)
    xb = x.to(torch.bfloat16)
    codes8 = cast.encode(x, "float8_e4m3fn")
    bits = torch.randint(-(2**31), 2**31 - 1, (n,), device=dev, dtype=torch.int32)
    cases = [
        BenchCase("torch copy (float32)", lambda _: x.clone(), 8 * n, False),
        BenchCase("torch .to(float8_e4m3fn)", lambda _: x.to(torch.float8_e4m3fn), 5 * n, False),
    ]
    for fmt, out_bytes in [("float8_e4m3fn", 1), ("float8_e5m2", 1), ("bfloat16", 2), ("float16", 2)]:
        cases.append(
            BenchCase(
                f"cast.encode f32->{fmt}", lambda L, f=fmt: cast.encode(x, f, launch=L), (4 + out_bytes) * n
            )
        )
    cases += [
        BenchCase(
            "cast.encode f32->float4_e2m1fn", lambda L: cast.encode(x, "float4_e2m1fn", launch=L), 5 * n
        ),
        BenchCase("cast.encode f32->int8", lambda L: cast.encode(x, "int8", launch=L), 5 * n),
        BenchCase(
            "cast.encode bf16->float8_e4m3fn", lambda L: cast.encode(xb, "float8_e4m3fn", launch=L), 3 * n
        ),
        BenchCase(
            "cast.encode f32->e4m3fn stochastic (seed)",
            lambda L: cast.encode(x, "float8_e4m3fn", rounding="stochastic", seed=1, launch=L),
            5 * n,
        ),
        BenchCase(
            "cast.encode f32->e4m3fn stochastic (bits)",
            lambda L: cast.encode(x, "float8_e4m3fn", rounding="stochastic", random_bits=bits, launch=L),
            9 * n,
        ),
        BenchCase(
            "cast.quantize f32->e4m3fn->f32", lambda L: cast.quantize(x, "float8_e4m3fn", launch=L), 8 * n
        ),
        BenchCase("cast.decode e4m3fn->f32", lambda L: cast.decode(codes8, "float8_e4m3fn", launch=L), 5 * n),
        BenchCase(
            "hwcast.encode f32->float8_e4m3fn", lambda L: hwcast.encode(x, "float8_e4m3fn", launch=L), 5 * n
        ),
        BenchCase("hwcast.encode f32->bfloat16", lambda L: hwcast.encode(x, "bfloat16", launch=L), 6 * n),
    ]
    return cases + optim_cases(n)


def optim_cases(n: int) -> list[BenchCase]:
    """The fused AdamW step (fpsim.kernels.optim), bfloat16 master, 8-bit / FP8 states in 256-blocks.

    Bytes per parameter: p (2 read, 2 written), g (4 read), m and v codes (1 read, 1 written
    each), plus each state's float32 block scale (4 read, 4 written per 256 elements)."""
    import torch

    from fpsim.kernels import blocks, cast, optim

    dev = "cuda"
    p = cast.encode(torch.randn(n, device=dev), "bfloat16")
    g = torch.randn(n, device=dev) * 1e-3
    z = torch.zeros(n, device=dev)
    nbytes = 12 * n + 2 * 8 * (-(-n // 256))
    cases = []
    for m_rec, v_rec, label in [
        ("bnb_dynamic8_block256", "bnb_dynamic8u_block256", "bnb8"),
        ("fp8_e4m3_block256", "fp8_e4m3_block256", "fp8"),
    ]:
        states = [*blocks.encode_blocks(z, m_rec)[:2], *blocks.encode_blocks(z, v_rec)[:2]]
        kw = dict(lr=1e-3, step=10, m_recipe=m_rec, v_recipe=v_rec, inplace=True)
        for extra in [{}, {"rounding": "stochastic", "seed": 1}]:
            name = f"optim.adamw_step {label} bf16 {'SR' if extra else 'RN'}"
            run = lambda _, s=states, kw=kw, extra=extra: optim.adamw_step(p, g, *s, **kw, **extra)  # noqa: E731
            cases.append(BenchCase(name, run, nbytes, False))
    return cases


def time_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` CUDA-event-timed runs, after warm-up."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def run_bandwidth(args: argparse.Namespace, deadline: float) -> list[dict[str, Any]]:
    from fpsim.kernels.cast import Launch

    rows = []
    for case in bench_cases(args.n):
        if time.monotonic() > deadline:
            rows.append({"kernel": case.name, "skipped": "out of time"})
            continue
        best = None
        for block, warps in CONFIGS if case.tunable else [(None, 4)]:
            launch = Launch(block=block, num_warps=warps)
            ms = time_ms(lambda c=case, la=launch: c.run(la), args.repeats)
            if best is None or ms < best[0]:
                best = (ms, block, warps)
        ms, block, warps = best
        gbps = case.nbytes / (ms * 1e-3) / 1e9
        rows.append(
            {
                "kernel": case.name,
                "ms": round(ms, 4),
                "bytes": case.nbytes,
                "gbps": round(gbps, 1),
                "peak_share": round(gbps / args.peak_gbps, 3),
                "block": block,
                "num_warps": warps,
            }
        )
    return rows


def print_bandwidth(rows: list[dict[str, Any]], n: int, peak: float) -> None:
    print(f"\nbandwidth on {n} elements (peak {peak:g} GB/s; goal {GOAL:.0%}):")
    print(f"{'kernel':44s} {'ms':>8s} {'GB/s':>8s} {'of peak':>8s}  block/warps")
    for r in rows:
        if "skipped" in r:
            print(f"{r['kernel']:44s} skipped: {r['skipped']}")
            continue
        mark = "" if r["peak_share"] >= GOAL else "  (below goal)"
        cfg = "-" if r["block"] is None else f"{r['block']}/{r['num_warps']}"
        print(f"{r['kernel']:44s} {r['ms']:8.3f} {r['gbps']:8.1f} {r['peak_share']:8.1%}  {cfg}{mark}")


# --- main ----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    try:
        import torch
    except ImportError:
        print("gpu_validate_and_bench: needs torch (pip install 'fpsim[kernels]')", file=sys.stderr)
        return 2
    if args.device == "cpu":
        args.skip_bench = True
        name, cap = "cpu (Triton interpreter; orchestration smoke test)", (0, 0)
    elif not torch.cuda.is_available():
        print(
            "gpu_validate_and_bench: needs a CUDA device; torch sees none (nothing to do on the CPU)",
            file=sys.stderr,
        )
        return 2
    else:
        name, cap = torch.cuda.get_device_name(), torch.cuda.get_device_capability()
    import triton

    print(f"device: {name} (sm_{cap[0]}{cap[1]}), torch {torch.__version__}, triton {triton.__version__}")
    result: dict[str, Any] = {"device": name, "capability": list(cap), "peak_gbps": args.peak_gbps}
    status = 0
    bench_reserve = 0.0 if args.skip_bench else 75.0
    if not args.skip_validate:
        from fpsim.kernels.validate import print_report

        report = run_validation(args, max(30.0, args.budget_s - bench_reserve - (time.monotonic() - t0)))
        print_report(report)
        for u in report["unfinished"]:
            print(f"validation did not finish for {u['formats']} (exit {u['returncode']}):\n{u['log_tail']}")
        result["validation"] = report
        if report["mismatches"] or report["errors"] or report["unfinished"]:
            status = 1
    if not args.skip_bench:
        rows = run_bandwidth(args, t0 + args.budget_s)
        print_bandwidth(rows, args.n, args.peak_gbps)
        result["bandwidth"] = rows
    result["seconds"] = round(time.monotonic() - t0, 1)
    print(f"\ntotal {result['seconds']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
