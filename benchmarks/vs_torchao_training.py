"""fpsim's emulated FP8 / MXFP8 GEMM training next to torchao's emulated float8 and MX training.

Run: ``python benchmarks/vs_torchao_training.py [--steps 200] [--json OUT]`` (under a minute on
one core).

Each pair trains one bundled model of ``fpsim ab`` (:data:`fpsim.train.ab.MODELS`) three ways,
from the same initial parameters on the same batches, with ``torch.optim.AdamW`` (the model's
learning rate) and one thread: its ``nn.Linear`` GEMMs emulated by fpsim
(:func:`fpsim.train.torch.convert`), emulated by torchao, and in FP32 (the model as built).

=================================  ==============================================================
fpsim ``fp8-current``              torchao ``Float8Linear``, ``Float8LinearConfig(emulate=True)``
                                   (tensorwise, E4M3 input and weight, E5M2 gradient)
fpsim ``fp8-current`` with power-  the same with ``round_scales_to_power_of_2=True``
of-two scales (``pow2``)
fpsim ``mxfp8`` (TE's rule,        torchao ``MXFP8Linear(kernel_preference=EMULATED)`` (its
``ScaleRule.MX_RCEIL``)            default ``ScaleCalculationMode.RCEIL``; ``mx_mm``, the function
                                   ``MXFP8TrainingOpConfig`` routes ``nn.Linear`` to)
=================================  ==============================================================

torchao's MX cast asserts a contraction length divisible by 32; the tiny transformer's width
is 24, so its MX pair is refused (the script shows torchao's error). The MX pair runs instead on
the digits MLP's two hidden layers and on the tiny transformer at width 32 (MLP 64:
:func:`tiny_transformer_w32`, the same data) without its head, the heads (10 and 4 outputs: dgrad
contracts over them) in FP32 for all three runs. fpsim pads a ragged block with zeros and would
run every layer.

Printed per pair: the first step whose losses differ (fpsim vs torchao; "none" when all steps
agree bit for bit), the largest |loss difference| fpsim vs torchao and the step where it occurs,
the same for each against FP32, and the final losses. The relation per operand is the module
doc of :mod:`fpsim.train.gemm` (tests/train/test_vs_torchao.py asserts it).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from fpsim.formats import FORMATS, BlockFormat, ScaleRule
from fpsim.train.ab import MODELS, BundledModel
from fpsim.train.gemm import GemmRecipe, OperandRecipe
from fpsim.train.torch import convert


def fp8_current_pow2() -> GemmRecipe:
    """``fp8-current`` with TE's ``pow2`` scales (the power of two at or below ``448 / amax``)."""
    e4m3, e5m2 = (
        OperandRecipe(BlockFormat(f"{f}_tensor_pow2", FORMATS[f], None, ScaleRule.TE, pow2=True))
        for f in ("float8_e4m3fn", "float8_e5m2")
    )
    return GemmRecipe("fp8-current-pow2", e4m3, e4m3, e5m2)


def torchao_float8(model: torch.nn.Module, names: list[str], pow2: bool) -> torch.nn.Module:
    """``names`` converted to torchao Float8Linear, emulated, tensorwise (its default recipe)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    cfg = Float8LinearConfig(emulate=True, round_scales_to_power_of_2=pow2)
    return convert_to_float8_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn in names)


def torchao_mx(model: torch.nn.Module, names: list[str]) -> torch.nn.Module:
    """``names`` replaced by torchao MXFP8Linear (EMULATED, RCEIL) holding the same parameters."""
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    for n in names:
        old = model.get_submodule(n)
        with torch.device("meta"):
            new = MXFP8Linear(
                old.in_features,
                old.out_features,
                bias=False,
                kernel_preference=KernelPreference.EMULATED,
                scale_calculation_mode=ScaleCalculationMode.RCEIL,
            )
        new.weight, new.bias = old.weight, old.bias
        parent, _, leaf = n.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, new)
    return model


def tiny_transformer_w32() -> torch.nn.Module:
    """The bundled tiny transformer (:mod:`fpsim.trace.sample`: embedding and positions, one
    pre-LayerNorm block with single-head attention and a GELU MLP, final LayerNorm, mean pooling,
    a 4-way head) at width 32 and MLP width 64, so that torchao's MX cast takes its block's
    layers (contraction lengths 32 and 64)."""
    from fpsim.trace.sample import GROUPS, SEQ, VOCAB

    d, hidden = 32, 64
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.pos = nn.Embedding(VOCAB, d), nn.Parameter(0.02 * torch.randn(SEQ, d))
            self.ln1, self.ln2, self.ln_f = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2, self.head = nn.Linear(d, hidden), nn.Linear(hidden, d), nn.Linear(d, GROUPS)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            h = self.embed(tokens) + self.pos
            q, k, v = self.qkv(self.ln1(h)).chunk(3, dim=-1)
            h = h + self.proj(torch.softmax(q @ k.transpose(-1, -2) / d**0.5, dim=-1) @ v)
            h = h + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(h))))
            return self.head(self.ln_f(h).mean(dim=1))

    return Block()


_TINY = MODELS["tiny-transformer"]
ALL_MODELS = {
    **MODELS,
    "tiny-transformer-w32": BundledModel(
        "tiny-transformer-w32", "the tiny transformer at width 32", tiny_transformer_w32, _TINY.data, _TINY.lr
    ),
}


@dataclass(frozen=True)
class Pair:
    """A model, the fpsim recipe, the torchao conversion (of the named layers) and which layers
    (None: every ``nn.Linear``)."""

    model: str
    recipe: GemmRecipe | str
    torchao: str
    convert_torchao: Callable[[torch.nn.Module, list[str]], torch.nn.Module]
    layers: Callable[[list[str]], list[str]] = lambda names: names

    @property
    def name(self) -> str:
        recipe = self.recipe if isinstance(self.recipe, str) else self.recipe.name
        return f"{self.model}: fpsim {recipe} vs {self.torchao}"


F8 = "torchao Float8Linear emulate tensorwise"
MX = "torchao MXFP8Linear emulated rceil"
PAIRS = [
    Pair("tiny-transformer", "fp8-current", F8, lambda m, n: torchao_float8(m, n, False)),
    Pair("tiny-transformer", fp8_current_pow2(), F8 + " pow2", lambda m, n: torchao_float8(m, n, True)),
    Pair("digits-mlp", "fp8-current", F8, lambda m, n: torchao_float8(m, n, False)),
    Pair("digits-mlp", fp8_current_pow2(), F8 + " pow2", lambda m, n: torchao_float8(m, n, True)),
    Pair("digits-mlp", "mxfp8", MX, torchao_mx, lambda n: n[:-1]),
    Pair("tiny-transformer-w32", "mxfp8", MX, torchao_mx, lambda n: n[:-1]),
]


def linear_names(model: torch.nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def train(model_name: str, steps: int, seed: int, prepare=None) -> list[float]:
    """The loss of each of ``steps`` AdamW steps of the model from the seed's initial parameters,
    ``prepare(model)`` applied after they are loaded (None: FP32)."""
    bm = ALL_MODELS[model_name]
    torch.manual_seed(seed)
    model = bm.build()
    if prepare is not None:
        model = prepare(model)
    opt = torch.optim.AdamW(model.parameters(), lr=bm.lr)
    losses = []
    for x, y in bm.batches(seed, steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses


def largest_gap(a: list[float], b: list[float]) -> tuple[float, int | None]:
    """The largest |a - b| over the steps and its (1-based) first step; None when all are 0."""
    gaps = [abs(u - v) for u, v in zip(a, b)]
    i = max(range(len(gaps)), key=gaps.__getitem__)
    return gaps[i], (i + 1 if gaps[i] else None)


def compare(pair: Pair, steps: int, seed: int, fp32: list[float]) -> dict:
    bm = ALL_MODELS[pair.model]
    torch.manual_seed(seed)
    names = pair.layers(linear_names(bm.build()))
    fp = train(pair.model, steps, seed, lambda m: convert(m, pair.recipe, modules=names))
    ao = train(pair.model, steps, seed, lambda m: pair.convert_torchao(m, names))
    first = next((i + 1 for i, (u, v) in enumerate(zip(fp, ao)) if u != v), None)
    row = {"pair": pair.name, "layers": names, "first_differing_step": first}
    for key, (a, b) in {
        "fpsim_torchao": (fp, ao),
        "fpsim_fp32": (fp, fp32),
        "torchao_fp32": (ao, fp32),
    }.items():
        row[key] = dict(zip(("max_abs", "step"), largest_gap(a, b)))
    row["final"] = {"fpsim": fp[-1], "torchao": ao[-1], "fp32": fp32[-1]}
    row["losses"] = {"fpsim": fp, "torchao": ao, "fp32": fp32}
    return row


def mx_refusal(seed: int) -> str:
    """torchao's error for the tiny transformer's layers under MXFP8Linear."""
    torch.manual_seed(seed)
    model = MODELS["tiny-transformer"].build()
    model = torchao_mx(model, linear_names(model))
    x, _ = MODELS["tiny-transformer"].batches(seed, 1)[0]
    try:
        model(x)
    except AssertionError as e:
        return str(e)
    raise AssertionError("torchao MX took the tiny transformer (width 24); update the module doc")


def _print(row: dict, steps: int) -> None:
    print(f"{row['pair']}  (layers: {', '.join(row['layers'])})")
    first = row["first_differing_step"]
    print(
        f"  losses identical bit for bit on all {steps} steps"
        if first is None
        else f"  first step whose losses differ: {first}"
    )
    for key, label in (
        ("fpsim_torchao", "fpsim vs torchao"),
        ("fpsim_fp32", "fpsim vs FP32"),
        ("torchao_fp32", "torchao vs FP32"),
    ):
        gap, step = row[key]["max_abs"], row[key]["step"]
        print(f"  largest |loss difference| {label:17s} {gap:.3e}" + (f" at step {step}" if step else ""))
    f = row["final"]
    print(f"  final loss: fpsim {f['fpsim']:.6f}  torchao {f['torchao']:.6f}  FP32 {f['fp32']:.6f}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    fp32 = {m: train(m, args.steps, args.seed) for m in dict.fromkeys(p.model for p in PAIRS)}
    print(f"{args.steps} steps of torch.optim.AdamW from seed {args.seed}, one thread")
    for m in fp32:
        print(f"  {m}: {ALL_MODELS[m].data(args.seed).source}")
    print()
    rows = []
    for pair in PAIRS:
        row = compare(pair, args.steps, args.seed, fp32[pair.model])
        _print(row, args.steps)
        rows.append(row)
    print(f"tiny-transformer: fpsim mxfp8 vs torchao MXFP8Linear: torchao refuses: {mx_refusal(args.seed)}")
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
