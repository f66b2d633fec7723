"""What recording costs a training loop: time against the same loop without capture, and disk.

1. ``mlp``: a 3-layer MLP of 8.4M parameters (1024-2048-2048-1024, AdamW, batch 256) runs
   the same steps without capture, with ``TorchCapture(every=5, params=True, optimizer=opt)``
   written asynchronously (the default) and the same written synchronously; the loops
   alternate ``--repeats`` times and the medians are compared: the ratio is capture / plain.
2. ``minilm``: a plain torch transformer of MiniLM's size (22.6M parameters: vocabulary
   30522, width 384, 6 layers, FFN 1536), AdamW, with ``when=50, states="first"``: the time
   ratio and the bytes on disk per recorded step (with and without the Adam states).
3. ``roles``: a small transformer trained a few steps with ``operands=True``, then
   ``fpsim analyze --by role --te delayed`` on its trace.

Run: ``python benchmarks/bench_capture.py [--part mlp|minilm|roles|all] [--threads 2]``.
The trace folders go to a temporary folder that is deleted afterwards.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fpsim.trace import TorchCapture, open_trace

BLOCKED: list[float] = []  # seconds the training thread spent in cap.step() on recorded steps


def mlp_loop(steps: int, folder: Path | None, asynchronous: bool = True) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048), torch.nn.GELU(),
        torch.nn.Linear(2048, 1024),
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 1024), torch.randn(256, 1024)
    cap = None
    if folder is not None:
        cap = TorchCapture(model, folder, every=5, params=True, optimizer=opt, asynchronous=asynchronous)
    start = time.perf_counter()
    for step in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if cap is not None:
            t0 = time.perf_counter()
            if cap.step(step, loss=loss):
                BLOCKED.append(time.perf_counter() - t0)
        opt.step()
    if cap is not None:
        cap.close()  # the loop's time includes waiting for the last writes
    return (time.perf_counter() - start) / steps


class MiniLM(torch.nn.Module):
    def __init__(self, vocab=30522, width=384, layers=6, ffn=1536, heads=12, seq=128):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Embedding(seq, width)
        layer = torch.nn.TransformerEncoderLayer(width, heads, ffn, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, 2)

    def forward(self, ids):
        h = self.embed(ids) + self.pos.weight[: ids.shape[1]]
        return self.head(self.encoder(h).mean(1))


def minilm_loop(steps: int, folder: Path | None, seq: int, batch: int) -> float:
    torch.manual_seed(0)
    model = MiniLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, y = torch.randint(0, 30522, (batch, seq)), torch.randint(0, 2, (batch,))
    cap = None
    if folder is not None:
        cap = TorchCapture(model, folder, when=50, states="first", params=True, optimizer=opt)
    start = time.perf_counter()
    for step in range(steps):
        loss = torch.nn.functional.cross_entropy(model(ids), y)
        opt.zero_grad()
        loss.backward()
        if cap is not None:
            cap.step(step, loss=loss)
        opt.step()
    if cap is not None:
        cap.close()
    return (time.perf_counter() - start) / steps


def bench_mlp(tmp: Path, steps: int, repeats: int) -> None:
    params = 1024 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 1024 + 1024
    times: dict[str, list[float]] = {"plain": [], "async": [], "sync": []}
    mlp_loop(3, None)  # warm-up
    blocked: dict[str, list[float]] = {"async": [], "sync": []}
    for r in range(repeats):
        times["plain"].append(mlp_loop(steps, None))
        for mode in ("async", "sync"):
            BLOCKED.clear()
            times[mode].append(mlp_loop(steps, tmp / f"mlp_{mode}{r}", asynchronous=mode == "async"))
            blocked[mode] += BLOCKED
    med = {k: statistics.median(v) for k, v in times.items()}
    trace = open_trace(tmp / "mlp_async0")
    per_step = sum(f.stat().st_size for f in (tmp / "mlp_async0").glob("step_*.safetensors")) / len(
        trace.steps
    )
    print(
        f"MLP {params / 1e6:.1f}M params, AdamW, batch 256, {torch.get_num_threads()} threads, {steps} steps"
    )
    print("  capture every=5, grads + params + Adam states; median of", repeats, "alternating runs")
    print(f"  plain loop            {1e3 * med['plain']:8.1f} ms/step")
    for k in ("async", "sync"):
        print(
            f"  capture ({k:5s})       {1e3 * med[k]:8.1f} ms/step  ratio {med[k] / med['plain']:.3f}x; "
            f"cap.step() blocks {1e3 * statistics.median(blocked[k]):.0f} ms per recorded step (median)"
        )
    print(f"  disk per recorded step: {per_step / 1e6:.1f} MB")


def bench_minilm(tmp: Path, steps: int, seq: int, batch: int) -> None:
    n = sum(p.numel() for p in MiniLM().parameters())
    minilm_loop(2, None, seq, batch)  # warm-up
    plain = minilm_loop(steps, None, seq, batch)
    folder = tmp / "minilm"
    captured = minilm_loop(steps, folder, seq, batch)
    trace = open_trace(folder)
    print(f"MiniLM-sized transformer: {n / 1e6:.1f}M params, batch {batch} x {seq} tokens, {steps} steps")
    print(f"  plain {plain * 1e3:.0f} ms/step, capture when=50 states='first' {captured * 1e3:.0f} ms/step, "
          f"ratio {captured / plain:.3f}x")  # fmt: skip
    for step in trace.steps:
        size = (folder / f"step_{step:06d}.safetensors").stat().st_size
        roles = ", ".join(trace.roles if trace.entries(step, "state.exp_avg") else ("grad", "param"))
        print(f"  step {step}: {size / 1e6:.1f} MB on disk ({roles})")


def bench_roles(tmp: Path) -> None:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.TransformerEncoder(layer, 2), torch.nn.Linear(64, 16)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randn(32, 24, 16)
    y = torch.roll(x, 1, dims=1)
    folder = tmp / "roles"
    with TorchCapture(model, folder, operands=True, params=True) as cap:
        for step in range(6):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            cap.step(step, loss=loss)
            opt.step()
    print(f"small transformer, 6 steps with operands=True (loss {loss.item():.4f})")
    cmd = [sys.executable, "-m", "fpsim.cli.app", "analyze", str(folder), "--by", "role", "--te", "delayed"]
    cmd += [
        "--format",
        "float16",
        "--format",
        "bfloat16",
        "--format",
        "float8_e4m3fn",
        "--format",
        "float8_e5m2",
    ]
    cmd += ["--recipe", "e4m3_tensor", "--no-swamping", "--quiet", "--out", str(tmp / "report")]
    print("$ fpsim analyze TRACE --by role --te delayed --format float16 --format bfloat16 "
          "--format float8_e4m3fn --format float8_e5m2 --recipe e4m3_tensor --no-swamping")  # fmt: skip
    print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["mlp", "minilm", "roles", "all"], default="all")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30, help="MLP steps per timed loop")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--minilm-steps", type=int, default=101)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.part in ("mlp", "all"):
            bench_mlp(tmp, args.steps, args.repeats)
        if args.part in ("minilm", "all"):
            bench_minilm(tmp, args.minilm_steps, args.seq, args.batch)
        if args.part in ("roles", "all"):
            bench_roles(tmp)


if __name__ == "__main__":
    main()
