"""Each library preset replayed next to the library's own optimizer, on the same recorded gradients.

Run: ``python benchmarks/presets_vs_libraries.py [--steps 100] [--json OUT]`` (under a minute
on two cores).

A small torch MLP (layers of 4608, 9600 and 1000 weights: a multiple of 256, a multiple of 128
only, and one below 4096; small biases) trains ``--steps`` steps with torch.optim.AdamW on
synthetic classification data, recorded by :class:`fpsim.trace.TorchCapture` (gradients, the
initial parameters, the learning rate). Then, from the recorded initial parameters and zero
states, each library optimizer steps on the recorded gradients (open loop: the gradients do not
follow the parameters), and :func:`fpsim.replay.replay` replays the same trace through its
preset:

====================================  ============================================
bitsandbytes ``optim.Adam8bit``       ``bnb-8bit-cpu`` (and ``bnb-8bit``, the CUDA kernel's rounding)
torchao ``optim.AdamW8bit``           ``torchao-8bit``
torchao ``optim.AdamWFp8``            ``torchao-fp8`` (and ``fp8-states``, every tensor in FP8)
torchao ``optim.AdamW4bit``           ``torchao-4bit``
====================================  ============================================

torchao's optimizers run eagerly (``torch.compile`` replaced by the identity), bitsandbytes on
its CPU kernels. Printed per pair: the distance between the library's final parameters and the
preset's (max abs, ``||lib - preset|| / ||lib - p0||``, median and largest float32 ulps), between their final
states (max abs, relative, share of equal elements), and the distance of each to FP32 (the
library to ``torch.optim`` Adam/AdamW, the preset to the replay's FP32 reference), all over
every tensor. The optimizers' arithmetic differs too: bitsandbytes' CPU Adam updates the
moments with ``mul_``/``add_`` and ``addcdiv_``; torchao updates the second moment with
``lerp`` and takes the bias corrections in float32 from a float32 step count; fpsim follows
``torch.optim`` (:mod:`fpsim.replay.optim`).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from fpsim.replay import replay
from fpsim.replay.optim import Adam, AdamW
from fpsim.trace import TorchCapture, open_trace

F32 = np.float32
PAIRS = [  # library optimizer, fpsim optimizer, presets (the first the library's own)
    ("bitsandbytes Adam8bit", Adam(), ["bnb-8bit-cpu", "bnb-8bit"]),
    ("torchao AdamW8bit", AdamW(weight_decay=0.01), ["torchao-8bit"]),
    ("torchao AdamWFp8", AdamW(weight_decay=0.01), ["torchao-fp8", "fp8-states"]),
    ("torchao AdamW4bit", AdamW(weight_decay=0.01), ["torchao-4bit"]),
]


def record(path: Path, steps: int, seed: int = 0) -> Path:
    """Train the MLP ``steps`` steps with torch.optim.AdamW, every step recorded."""
    torch.manual_seed(seed)
    x = torch.randn(512, 48)
    y = (x[:, :10] + 0.3 * torch.randn(512, 10)).argmax(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(48, 96),
        torch.nn.GELU(),
        torch.nn.Linear(96, 100),
        torch.nn.GELU(),
        torch.nn.Linear(100, 10),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    cap = TorchCapture(model, path, params=True, optimizer=opt)
    for s in range(1, steps + 1):
        idx = torch.randint(0, 512, (64,))
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        cap.step(s, loss=loss)
        opt.step()
    cap.close()
    return path


def library_run(kind: str, trace, steps: list[int]) -> tuple[dict, dict]:
    """The library optimizer from the recorded initial parameters on the recorded gradients:
    final parameters and (dequantized) states by tensor."""
    import bitsandbytes as bnb
    import torchao.optim as tao

    names = [e.name for e in trace.entries(step=steps[0], role="grad")]
    params = {
        n: torch.nn.Parameter(torch.from_numpy(np.array(trace.read(trace.entry(steps[0], n, "param")), F32)))
        for n in names
    }
    group = list(params.values())
    if kind == "bitsandbytes Adam8bit":
        opt = bnb.optim.Adam8bit(group, lr=1e-3)
    elif kind == "torch AdamW":
        opt = torch.optim.AdamW(group, lr=1e-3, weight_decay=0.01)
    elif kind == "torch Adam":
        opt = torch.optim.Adam(group, lr=1e-3)
    else:
        opt = getattr(tao, kind.split()[1])(group, lr=1e-3)
    for s in steps:
        for n, p in params.items():
            p.grad = torch.from_numpy(np.array(trace.read(trace.entry(s, n, "grad")), F32))
        for g in opt.param_groups:
            if isinstance(g["lr"], torch.Tensor):
                g["lr"].fill_(trace.lr(s))
            else:
                g["lr"] = trace.lr(s)
        with mock.patch.object(torch, "compile", lambda fn, **kw: fn):  # torchao: eagerly
            opt.step()
    final = {n: p.detach().numpy().copy() for n, p in params.items()}
    return final, {n: _states(opt, kind, p) for n, p in params.items()}


def _states(opt, kind: str, p) -> dict[str, np.ndarray]:
    import bitsandbytes.functional as F

    st = opt.state[p]
    if kind.startswith("bitsandbytes"):
        if st["state1"].dtype == torch.float32:
            return {"exp_avg": st["state1"].numpy().copy(), "exp_avg_sq": st["state2"].numpy().copy()}
        out = {}
        for key, name, q, a in (
            ("state1", "exp_avg", "qmap1", "absmax1"),
            ("state2", "exp_avg_sq", "qmap2", "absmax2"),
        ):
            deq = F.dequantize_blockwise(st[key], absmax=st[a], code=st[q], blocksize=256)
            out[name] = deq.numpy().copy()
        return out
    get = {k: st[k] for k in ("exp_avg", "exp_avg_sq")}
    return {
        k: (v.dequantize() if hasattr(v, "dequantize") else v).detach().numpy().copy() for k, v in get.items()
    }


def _ordered(a: np.ndarray) -> np.ndarray:
    i = np.asarray(a, F32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def distance(a: dict, b: dict, p0: dict | None = None) -> dict:
    """Over every tensor: max |a - b|, ||a - b|| / ||a - p0|| (or / ||a||), the median and largest
    distance in float32 ulps (counted across zero: a sign change of tiny values is ~2**31 ulps),
    the share of equal elements."""
    x = np.concatenate([np.asarray(a[n], F32).reshape(-1) for n in a])
    y = np.concatenate([np.asarray(b[n], F32).reshape(-1) for n in a])
    base = x - (np.concatenate([p0[n].reshape(-1) for n in a]) if p0 else 0)
    d = x.astype(np.float64) - y
    return {
        "max_abs": float(np.max(np.abs(d))),
        "rel": float(np.linalg.norm(d) / max(np.linalg.norm(base.astype(np.float64)), 1e-300)),
        "max_ulps": int(np.max(np.abs(_ordered(x) - _ordered(y)))),
        "median_ulps": float(np.median(np.abs(_ordered(x) - _ordered(y)))),
        "equal": float(np.mean(x == y)),
    }


def states_of(st: dict, key: str) -> dict:
    return {n: s[key] for n, s in st.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    torch.set_num_threads(2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = open_trace(record(Path(tmp) / "mlp", args.steps))
        steps = list(trace.steps)
        names = [e.name for e in trace.entries(step=steps[0], role="grad")]
        p0 = {n: np.array(trace.read(trace.entry(steps[0], n, "param")), F32) for n in names}
        sizes = ", ".join(f"{n} {p0[n].size}" for n in names)
        print(f"trace: {len(steps)} steps of torch.optim.AdamW on an MLP ({sizes})\n")
        for kind, fp_opt, presets in PAIRS:
            lib_p, lib_s = library_run(kind, trace, steps)
            torch_p, _ = library_run(
                "torch Adam" if kind.startswith("bitsandbytes") else "torch AdamW", trace, steps
            )
            res = replay(trace, presets, optimizer=fp_opt, progress=False, threads=2)
            lib_fp32 = distance(lib_p, torch_p, p0)
            for preset in presets:
                row = {
                    "library": kind,
                    "preset": preset,
                    "params": distance(lib_p, res.final_params[preset], p0),
                    "exp_avg": distance(
                        states_of(lib_s, "exp_avg"), states_of(res.final_states[preset], "exp_avg")
                    ),
                    "exp_avg_sq": distance(
                        states_of(lib_s, "exp_avg_sq"), states_of(res.final_states[preset], "exp_avg_sq")
                    ),
                    "library_to_fp32": lib_fp32,
                    "preset_to_fp32": distance(res.final_params[preset], res.final_params["reference"], p0),
                }
                rows.append(row)
    _print(rows)
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def _print(rows: list[dict]) -> None:
    head = (
        f"{'library':<22} {'preset':<13} | {'params: max abs':>15} {'rel':>9} {'ulps med':>8} {'max':>10} | "
        f"{'m: rel':>9} {'m equal':>8} {'v: rel':>9} {'v equal':>8} | {'lib-fp32':>9} {'preset-fp32':>11}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        p, m, v = r["params"], r["exp_avg"], r["exp_avg_sq"]
        print(
            f"{r['library']:<22} {r['preset']:<13} | {p['max_abs']:>15.3e} {p['rel']:>9.2e} "
            f"{p['median_ulps']:>8.0f} {p['max_ulps']:>10} | "
            f"{m['rel']:>9.2e} {m['equal']:>8.2%} {v['rel']:>9.2e} {v['equal']:>8.2%} | "
            f"{r['library_to_fp32']['rel']:>9.2e} {r['preset_to_fp32']['rel']:>11.2e}"
        )
    print(
        "\nrel: ||a - b|| / ||library - p0|| for parameters (the library's total update), / ||library||"
        " for states;\nlib-fp32: the library's parameters against torch.optim's FP32 run on the same"
        " gradients, preset-fp32: the preset's against the replay's FP32 reference, both relative to"
        " the update."
    )
    assert all(math.isfinite(r["params"]["rel"]) for r in rows)


if __name__ == "__main__":
    main()
