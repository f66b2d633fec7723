"""Generate the bundled sample trace by really training a tiny transformer on the CPU.

Task: sequences of 12 tokens from a vocabulary of 32 (four groups of 8 tokens); the label
is the group that occurs most often (ties go to the lower group). The data set (4096
sequences) is synthesized with ``numpy.random.default_rng(seed)``: each sequence draws half
of its tokens, on average, from one group and the rest uniformly, so the task is learnable
and labels are a fixed function of the input.

Model (6,076 parameters): token embedding + learned positions (d=24), one pre-LayerNorm
transformer block (single-head attention, GELU MLP of width 48), a final LayerNorm, mean
pooling and a linear head over 4 classes. Adam (betas 0.9/0.999, eps 1e-8), batch 64, a
learning rate with 10 steps of linear warm-up to 3e-3 then cosine decay to 3e-4.

Steps are numbered 1..``steps`` (the optimizer update count, which is also Adam's
bias-correction step). Every ``every`` steps (10, 20, ..., 190 by default) and at each of
the last ``window`` steps (191, ..., 200) the trace records,
**before** ``optimizer.step()``: the gradients, the parameters they were computed at, Adam's
``exp_avg``/``exp_avg_sq`` after the previous update, the batch loss and the learning rate
used for this update. So each recorded step holds exactly the inputs of its Adam update.

Run ``python -m fpsim.trace.sample OUT [--overwrite]``; the bundled copy lives in
``fpsim/trace/data/sample_trace`` (see :func:`fpsim.trace.sample_trace_path`). Generation is
deterministic: one thread, deterministic algorithms and fixed seeds give byte-identical
files on the same machine and torch version (other CPUs may differ in the last bits).
torch is needed only to generate, not to read the trace.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .reader import MANIFEST, STEP_FILE_RE, STEP_LOG

__all__ = ["make_sample_trace", "main"]

VOCAB, SEQ, GROUPS, D_MODEL, HIDDEN = 32, 12, 4, 24, 48
N_SAMPLES, BATCH = 4096, 64
PEAK_LR, WARMUP = 3e-3, 10


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The synthetic data set: int64 tokens ``(4096, 12)`` and int64 labels ``(4096,)``."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, GROUPS, N_SAMPLES)
    from_group = rng.random((N_SAMPLES, SEQ)) < 0.5
    biased = group[:, None] * (VOCAB // GROUPS) + rng.integers(0, VOCAB // GROUPS, (N_SAMPLES, SEQ))
    tokens = np.where(from_group, biased, rng.integers(0, VOCAB, (N_SAMPLES, SEQ)))
    counts = np.stack([(tokens // (VOCAB // GROUPS) == g).sum(1) for g in range(GROUPS)], axis=1)
    return tokens.astype(np.int64), counts.argmax(1).astype(np.int64)


def lr_at(step: int, steps: int) -> float:
    """Learning rate of update ``step`` (1-based): linear warm-up, then cosine to a tenth."""
    if step <= WARMUP:
        return PEAK_LR * step / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return PEAK_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def build_model() -> Any:
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
            self.proj = nn.Linear(D_MODEL, D_MODEL)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D_MODEL), dim=-1)
            return self.proj(w @ v)

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(D_MODEL, HIDDEN)
            self.fc2 = nn.Linear(HIDDEN, D_MODEL)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    class TinyTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D_MODEL)
            self.pos = nn.Parameter(0.02 * torch.randn(SEQ, D_MODEL))
            self.ln1 = nn.LayerNorm(D_MODEL)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(D_MODEL)
            self.mlp = MLP()
            self.ln_f = nn.LayerNorm(D_MODEL)
            self.head = nn.Linear(D_MODEL, GROUPS)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            h = self.embed(tokens) + self.pos
            h = h + self.attn(self.ln1(h))
            h = h + self.mlp(self.ln2(h))
            return self.head(self.ln_f(h).mean(dim=1))

    return TinyTransformer()


def make_sample_trace(
    path: str | os.PathLike[str],
    steps: int = 200,
    every: int = 10,
    seed: int = 0,
    overwrite: bool = False,
    window: int = 10,
) -> Path:
    """Train the tiny transformer and record a trace of it (see the module docstring).

    Args:
        path: the trace folder to create.
        steps: optimizer updates to run (numbered 1..steps).
        every: record every ``every`` updates.
        window: also record each of the last ``window`` updates, so the trace ends with a run
            of consecutive steps (what optimizer replay needs to check itself against the
            recorded parameters).
        seed: seeds the data, the initialization and the batch order.
        overwrite: replace an existing trace in ``path`` (its manifest, step log and step files only).

    Returns:
        The trace folder.
    """
    import torch

    from .capture import TorchCapture
    from .writer import TraceWriter

    out = Path(path)
    if out.is_dir() and (out / MANIFEST).exists():
        if not overwrite:
            raise FileExistsError(f"{out} already holds a trace; pass overwrite=True (--overwrite)")
        for p in out.iterdir():
            if p.name in (MANIFEST, STEP_LOG) or STEP_FILE_RE.match(p.name):
                p.unlink()
    tokens_np, labels_np = make_data(seed)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_model()
            n_params = sum(p.numel() for p in model.parameters())
            opt = torch.optim.Adam(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.999), eps=1e-8)
            gen = torch.Generator().manual_seed(seed + 1)
            tokens, labels = torch.from_numpy(tokens_np), torch.from_numpy(labels_np)
            meta = {
                "description": "fpsim sample trace: a tiny transformer really trained on the CPU",
                "generator": "python -m fpsim.trace.sample",
                "model": (
                    f"TinyTransformer: embedding {VOCAB}x{D_MODEL} + learned positions, one pre-LayerNorm "
                    f"block (single-head attention, GELU MLP {D_MODEL}-{HIDDEN}-{D_MODEL}), final LayerNorm, "
                    f"mean pooling, linear head to {GROUPS} classes"
                ),
                "parameters": n_params,
                "data": (
                    f"synthetic, numpy default_rng({seed}): {N_SAMPLES} sequences of {SEQ} tokens (vocab "
                    f"{VOCAB} in {GROUPS} groups); label = most frequent group (ties to the lower)"
                ),
                "seed": seed,
                "train_steps": steps,
                "batch_size": BATCH,
                "optimizer_config": "Adam(betas=(0.9, 0.999), eps=1e-8, weight_decay=0)",
                "lr_schedule": f"linear warm-up over {WARMUP} steps to {PEAK_LR}, cosine to {PEAK_LR / 10:g}",
                "step_numbering": "1-based optimizer update count (= Adam's bias-correction step)",
                "recorded_steps": f"every {every} updates and each of the last {window}",
                "recorded": "before optimizer.step(): grads, params at which they were computed, "
                "Adam state after the previous update, batch loss, lr of this update",
                "dtype": "float32",
            }
            with TorchCapture(model, out, every=1, params=True, optimizer=opt, metadata=meta) as cap:
                for step in range(1, steps + 1):
                    for group in opt.param_groups:
                        group["lr"] = lr_at(step, steps)
                    idx = torch.randint(0, N_SAMPLES, (BATCH,), generator=gen)
                    loss = torch.nn.functional.cross_entropy(model(tokens[idx]), labels[idx])
                    opt.zero_grad()
                    loss.backward()
                    if step % every == 0 or step > steps - window:
                        cap.step(step, loss=loss)
                    opt.step()
            with torch.no_grad():
                logits = model(tokens)
                acc = float((logits.argmax(1) == labels).double().mean())
                final = float(torch.nn.functional.cross_entropy(logits, labels))
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    TraceWriter(out, metadata={"final_train_loss": final, "final_train_accuracy": acc}).close()
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m fpsim.trace.sample OUT [--steps N] [--every K] [--seed S] [--overwrite]``."""
    ap = argparse.ArgumentParser(prog="python -m fpsim.trace.sample", description=__doc__.splitlines()[0])
    ap.add_argument("out", help="trace folder to write")
    ap.add_argument("--steps", type=int, default=200, help="optimizer updates (default 200)")
    ap.add_argument("--every", type=int, default=10, help="record every K updates (default 10)")
    ap.add_argument(
        "--window", type=int, default=10, help="also record each of the last W updates (default 10)"
    )
    ap.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing trace in OUT")
    args = ap.parse_args(argv)
    from .importers import open_trace

    try:
        out = make_sample_trace(
            args.out, args.steps, args.every, args.seed, overwrite=args.overwrite, window=args.window
        )
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    trace = open_trace(out)
    size = sum(p.stat().st_size for p in out.iterdir())
    losses = [trace.loss(s) for s in trace.steps]
    print(f"{out}: {len(trace.steps)} steps, {size / 1e6:.2f} MB, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"final train accuracy {trace.metadata['final_train_accuracy']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
