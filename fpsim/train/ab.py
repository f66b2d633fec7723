"""A/B one model under several optimizer-state configurations and GEMM recipes: :func:`run_ab`,
and the bundled models of ``fpsim ab`` (:data:`MODELS`).

:func:`run_ab` trains ``model_factory()`` once per run with :class:`fpsim.train.torch.AdamW`
(or ``Adam`` / ``SGD``), every run from the same initial parameters (the first model's, copied
into each) and on the same batches (the first ``steps`` items of ``batches``, kept in memory),
and returns the loss of every step and per run the final and best loss, the first step whose
loss is not finite (the run stops there), the bytes of optimizer state per parameter, measured
on the tensors the optimizer holds (codes, scales and FP32 states; the step counters excluded),
and, given ``held_out`` examples, the accuracy of the final model on them.

Runs (:class:`Run`): without ``gemm``, one per optimizer-state configuration, named after it,
the model's GEMMs in FP32. With ``gemm=[...]`` (GEMM recipes of :mod:`fpsim.train.gemm`, or
``"fp32"``: the model as built), one per (configuration, recipe) pair, configuration-major,
named ``config/recipe``: each model's ``nn.Linear`` modules converted to the recipe
(:func:`fpsim.train.linear.convert`, ``stats=True``) after the initial parameters are loaded.
Those runs also keep their GEMM statistics (``ABResult.gemm_stats``) and rank the layers by
underflow at the end (:func:`underflow_ranking`). ``fpsim ab`` adds ``fp32`` to both lists,
first, so its first run is the FP32 reference ``fp32/fp32``.

The bundled models (``fpsim ab --model NAME``), each with its :class:`Data` (training
examples, held-out examples and what they are, ``source``):

- ``tiny-transformer``: the model and data of the bundled sample trace
  (:mod:`fpsim.trace.sample`: 6,076 parameters, sequences of 12 tokens, 4 classes), batches
  of 64 drawn with ``numpy.random.default_rng(seed + 1)``; held out: 512 sequences of the
  data set of ``seed + 1``.
- ``digits-mlp``: an MLP 64-128-128-10 on 8x8 images of the digits 0-9, batches of 64
  (:func:`digits_data`). With scikit-learn installed, the real UCI digits (:func:`uci_digits`:
  ``load_digits``, 1,797 images shipped with scikit-learn, no download), 360 of them (a
  permutation drawn from the seed) held out; without it, images synthesized deterministically
  by :func:`digits`: a 5x7 bitmap glyph per digit, shifted (up to one row, up to three
  columns), stroke intensity and noise drawn from the seed, clipped to the UCI digits' 0..16
  scale and divided by 16; 2048 images, and 512 more from ``seed + 1`` held out.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..replay.config import ReplayConfig
from ._core import resolve_config

__all__ = [
    "ABResult",
    "MODELS",
    "BundledModel",
    "Data",
    "FP32_GEMM",
    "Run",
    "digits",
    "digits_data",
    "run_ab",
    "state_bytes",
    "uci_digits",
    "underflow_ranking",
]

_GLYPHS = (
    "01110 10001 10011 10101 11001 10001 01110",  # 0
    "00100 01100 00100 00100 00100 00100 01110",  # 1
    "01110 10001 00001 00010 00100 01000 11111",  # 2
    "11111 00010 00100 00010 00001 10001 01110",  # 3
    "00010 00110 01010 10010 11111 00010 00010",  # 4
    "11111 10000 11110 00001 00001 10001 01110",  # 5
    "00110 01000 10000 11110 10001 10001 01110",  # 6
    "11111 00001 00010 00100 01000 01000 01000",  # 7
    "01110 10001 10001 01110 10001 10001 01110",  # 8
    "01110 10001 10001 01111 00001 00010 01100",  # 9
)


def digits(seed: int = 0, n: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic 8x8 digits (module doc): float32 images ``(n, 64)`` in [0, 1] and int64 labels
    ``(n,)``, a function of ``seed`` only."""
    rng = np.random.default_rng(seed)
    glyphs = np.array([[[c == "1" for c in row] for row in g.split()] for g in _GLYPHS], np.float32)
    labels = rng.integers(0, 10, n)
    images = np.zeros((n, 8, 8), np.float32)
    dy, dx = rng.integers(0, 2, n), rng.integers(0, 4, n)
    ink = rng.uniform(10, 16, n).astype(np.float32)
    for i in range(n):
        images[i, dy[i] : dy[i] + 7, dx[i] : dx[i] + 5] = glyphs[labels[i]] * ink[i]
    images += rng.normal(0, 2.0, images.shape).astype(np.float32)
    return (np.clip(images, 0, 16) / np.float32(16)).reshape(n, 64), labels.astype(np.int64)


UCI_HELD_OUT = 360
"""The UCI digits held out from training (a fifth of 1,797), chosen by a permutation of the seed."""


def uci_digits() -> tuple[np.ndarray, np.ndarray] | None:
    """The real UCI digits from scikit-learn (``sklearn.datasets.load_digits``: 1,797 images of
    8x8 pixels in 0..16, shipped with the package): float32 images ``(1797, 64)`` divided by 16
    and int64 labels, or None when scikit-learn is not installed."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        return None
    bunch = load_digits()
    return (bunch.data / 16).astype(np.float32), bunch.target.astype(np.int64)


@dataclass(frozen=True)
class Data:
    """A bundled model's examples: training ``(x, y)``, held-out ``(test_x, test_y)`` (numpy),
    and ``source``, what they are (printed by ``fpsim ab``)."""

    source: str
    x: np.ndarray
    y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    def batches(self, seed: int, steps: int, size: int) -> list:
        """``steps`` batches of ``size`` training examples drawn with
        ``numpy.random.default_rng(seed + 1)``, as torch tensors."""
        import torch

        rng = np.random.default_rng(seed + 1)
        idx = [rng.integers(0, len(self.y), size) for _ in range(steps)]
        return [(torch.from_numpy(self.x[i]), torch.from_numpy(self.y[i])) for i in idx]

    def held_out(self) -> tuple[Any, Any]:
        """The held-out examples as torch tensors."""
        import torch

        return torch.from_numpy(self.test_x), torch.from_numpy(self.test_y)


@dataclass(frozen=True)
class BundledModel:
    """A model of ``fpsim ab``: ``build()`` makes it (call after seeding torch), ``data(seed)``
    gives its :class:`Data`, ``lr`` is its default learning rate, ``batch`` its batch size."""

    name: str
    description: str
    build: Callable[[], Any]
    data: Callable[[int], Data]
    lr: float
    batch: int = 64

    def batches(self, seed: int, steps: int) -> list:
        """The first ``steps`` training batches of ``data(seed)``."""
        return self.data(seed).batches(seed, steps, self.batch)


def _transformer_data(seed: int) -> Data:
    from ..trace.sample import make_data

    tokens, labels = make_data(seed)
    test_tokens, test_labels = make_data(seed + 1)
    source = f"the sample trace's synthetic token groups (seed {seed}; 512 of seed {seed + 1} held out)"
    return Data(source, tokens, labels, test_tokens[:512], test_labels[:512])


def _build_transformer() -> Any:
    from ..trace.sample import build_model

    return build_model()


def digits_data(seed: int = 0, uci: bool | None = None) -> Data:
    """The data of ``digits-mlp`` (module docstring): the real UCI digits (``uci=True``), the
    synthetic glyphs of :func:`digits` (``uci=False``), or (None, the default) the UCI digits
    where scikit-learn is installed, else the glyphs. ``source`` says which.

    Raises:
        ImportError: ``uci=True`` without scikit-learn.
    """
    real = uci_digits() if uci is not False else None
    if real is None and uci:
        raise ImportError("the UCI digits come with scikit-learn: pip install scikit-learn", name="sklearn")
    if real is None:
        x, y = digits(seed)
        test_x, test_y = digits(seed + 1, n=512)
        why = "" if uci is False else "; scikit-learn is not installed"
        source = f"synthetic 8x8 glyphs (fpsim.train.ab.digits, seed {seed}{why})"
        return Data(source, x, y, test_x, test_y)
    x, y = real
    order = np.random.default_rng(seed).permutation(len(y))
    test, train = order[:UCI_HELD_OUT], order[UCI_HELD_OUT:]
    source = f"UCI digits (scikit-learn load_digits): {len(train):,} training images, {len(test)} held out"
    return Data(source, x[train], y[train], x[test], y[test])


def _build_mlp() -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


MODELS: dict[str, BundledModel] = {
    m.name: m
    for m in (
        BundledModel(
            "tiny-transformer",
            "the sample trace's tiny transformer (6,076 parameters) on its synthetic token groups",
            _build_transformer,
            _transformer_data,
            3e-3,
        ),
        BundledModel(
            "digits-mlp",
            "an MLP 64-128-128-10 (26,122 parameters) on 8x8 digits (the UCI digits with scikit-learn, "
            "else synthetic glyphs)",
            _build_mlp,
            digits_data,
            3e-3,
        ),
    )
}
"""The models ``fpsim ab --model NAME`` trains."""


FP32_GEMM = "fp32"
"""In ``run_ab(gemm=[...])`` and ``fpsim ab --gemm``: the model's own GEMMs in FP32 (not converted)."""


@dataclass(frozen=True)
class Run:
    """One run of :func:`run_ab`: the optimizer-state configuration ``config``, the GEMM recipe
    ``gemm`` (a recipe's name, or ``"fp32"``: the model's own FP32 GEMMs) and the run's
    ``name`` (``config`` without ``gemm=``, else ``config/gemm``)."""

    config: str
    gemm: str
    name: str


@dataclass
class ABResult:
    """What :func:`run_ab` measured, by run name: ``losses`` the loss of each step run (a run
    stops at its first non-finite loss), ``bytes_per_param`` the measured optimizer state,
    ``accuracy`` the share of the held-out examples the final model classifies right (None for
    a run that stopped at a non-finite loss; empty without held-out examples); for the runs
    with a GEMM recipe, ``gemm_stats`` every recorded operand statistic
    (:func:`fpsim.train.linear.gemm_stats` after the last step, before the held-out examples)
    and ``underflow`` the layers ranked by underflow (:func:`underflow_ranking`) at the last
    step run in full (forward and backward: the last step, or the one before the first
    non-finite loss; empty when there is none). ``parameters``: the model's parameter count."""

    runs: list[Run]
    parameters: int
    losses: dict[str, list[float]] = field(default_factory=dict)
    bytes_per_param: dict[str, float] = field(default_factory=dict)
    accuracy: dict[str, float | None] = field(default_factory=dict)
    gemm_stats: dict[str, list[dict]] = field(default_factory=dict)
    underflow: dict[str, list[dict]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """The run names, in the order run."""
        return [r.name for r in self.runs]

    def summary(self) -> dict[str, Any]:
        """``{"parameters", "results": [{"run", "config", "gemm", "final_loss", "best_loss",
        "first_nonfinite_step", "state_bytes_per_param", "steps"}]}`` (non-finite losses as
        None; steps are 1-based), and in each result ``"accuracy"`` where it was measured and
        ``"underflow_ranking"`` for the runs with a GEMM recipe."""
        rows = []
        for run in self.runs:
            c = run.name
            ls = self.losses[c]
            finite = [x for x in ls if math.isfinite(x)]
            bad = next((i + 1 for i, x in enumerate(ls) if not math.isfinite(x)), None)
            rows.append(
                {
                    "run": c,
                    "config": run.config,
                    "gemm": run.gemm,
                    "steps": len(ls),
                    "final_loss": ls[-1] if ls and math.isfinite(ls[-1]) else None,
                    "best_loss": min(finite) if finite else None,
                    "first_nonfinite_step": bad,
                    "state_bytes_per_param": self.bytes_per_param[c],
                    **({"accuracy": self.accuracy[c]} if c in self.accuracy else {}),
                    **({"underflow_ranking": self.underflow[c]} if c in self.underflow else {}),
                }
            )
        return {"parameters": self.parameters, "results": rows}

    def frame(self) -> Any:
        """The losses as a pandas DataFrame with columns ``step``, ``run``, ``config``, ``gemm``,
        ``loss``."""
        import pandas as pd

        rows = [
            (i + 1, r.name, r.config, r.gemm, x) for r in self.runs for i, x in enumerate(self.losses[r.name])
        ]
        return pd.DataFrame(rows, columns=["step", "run", "config", "gemm", "loss"])


def underflow_ranking(rows: Iterable[Mapping[str, Any]], step: int) -> list[dict]:
    """The layers ranked by underflow at ``step``, from :func:`fpsim.train.linear.gemm_stats`
    rows: per module the operand (GEMM and role) with the largest ``underflow_pct`` (the first,
    in the rows' order, among equals), modules by that share, largest first (module order among
    equals). Returns ``[{"module", "underflow_pct", "gemm", "role"}]``; empty when no row has
    that step.

    Raises:
        ValueError: a row whose underflow is NaN (an empty operand) at that step.
    """
    worst: dict[str, dict] = {}
    for r in rows:
        if r["step"] != step:
            continue
        if math.isnan(r["underflow_pct"]):
            raise ValueError(f"underflow_ranking: {r['module']} {r['gemm']} {r['role']} has no elements")
        best = worst.get(r["module"])
        if best is None or r["underflow_pct"] > best["underflow_pct"]:
            worst[r["module"]] = {k: r[k] for k in ("module", "underflow_pct", "gemm", "role")}
    return sorted(worst.values(), key=lambda w: -w["underflow_pct"])


def _cross_entropy(model: Any, batch: Any) -> Any:
    import torch

    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def _gemm_recipes(gemm: Sequence[Any] | None) -> dict[str, Any] | None:
    """``gemm=`` as {name: GemmRecipe, or None for ``"fp32"``}, checked."""
    from .gemm import GEMM_RECIPES, GemmRecipe

    if gemm is None:
        return None
    if isinstance(gemm, (str, GemmRecipe)):
        raise TypeError(f"run_ab: gemm takes a list of recipes, got the single {gemm!r}: pass [{gemm!r}]")
    allowed = ", ".join([FP32_GEMM, *GEMM_RECIPES])
    out: dict[str, Any] = {}
    for g in gemm:
        if isinstance(g, str):
            if g != FP32_GEMM and g not in GEMM_RECIPES:
                raise ValueError(f"run_ab: unknown GEMM recipe {g!r}; allowed: {allowed}")
            name, recipe = g, (None if g == FP32_GEMM else GEMM_RECIPES[g])
        elif isinstance(g, GemmRecipe):
            if g.name == FP32_GEMM:
                raise ValueError(f"run_ab: a GemmRecipe may not be named {FP32_GEMM!r} (the FP32 GEMMs)")
            name, recipe = g.name, g
        else:
            got = type(g).__name__
            raise TypeError(f"run_ab: a GEMM recipe is a name ({allowed}) or a GemmRecipe, got {got}")
        if name in out:
            raise ValueError(f"run_ab: need GEMM recipes with distinct names, got {name!r} twice")
        out[name] = recipe
    if not out:
        raise ValueError(f"run_ab: gemm needs at least one recipe ({allowed}), or None")
    return out


def run_ab(
    model_factory: Callable[[], Any],
    batches: Iterable[Any],
    configs: Sequence[ReplayConfig | str],
    *,
    steps: int,
    gemm: Sequence[Any] | None = None,
    lr: float = 1e-3,
    optimizer: str = "adamw",
    loss_fn: Callable[[Any, Any], Any] = _cross_entropy,
    seed: int = 0,
    progress: bool = True,
    held_out: tuple[Any, Any] | None = None,
    **optimizer_kwargs: Any,
) -> ABResult:
    """Train ``model_factory()`` in each run, from the same start and batches (module doc).

    Args:
        model_factory: returns a torch module with float32 parameters.
        batches: the training batches; the first ``steps`` are used by every run.
        configs: preset names or :class:`ReplayConfig` objects (names must be unique).
        steps: optimizer steps per run.
        gemm: None (one run per configuration, the model as built), or GEMM recipes: preset
            names of :data:`fpsim.train.gemm.GEMM_RECIPES`, :class:`fpsim.train.gemm.GemmRecipe`
            objects or ``"fp32"`` (not converted), names unique; then one run per configuration
            and recipe, configuration-major, named ``config/recipe``. Stochastic roundings of a
            recipe draw from its own ``GemmRecipe.seed``.
        lr: learning rate.
        optimizer: ``"adamw"``, ``"adam"`` or ``"sgd"`` (:mod:`fpsim.train.torch`).
        loss_fn: ``loss_fn(model, batch)`` -> scalar loss tensor (default: cross-entropy of
            ``model(x)`` against ``y`` for ``batch = (x, y)``).
        seed: seeds torch before the model is built (and the stochastic master rounding).
        progress: show a progress bar (tqdm).
        held_out: ``(x, y)`` tensors: after its last step, each run's model classifies ``x``
            (the argmax of ``model(x)``, in eval mode, without gradients; converted layers run
            their recipe) and its ``accuracy`` is the share equal to ``y``.
        optimizer_kwargs: further arguments of the optimizer (``weight_decay``, ``sqrt``, ...).

    Raises:
        ValueError: an unknown optimizer, configuration or GEMM recipe (the message lists the
            allowed ones), repeated names, an empty ``gemm``, a ``steps`` below 1, or fewer
            than ``steps`` batches.
        TypeError: a ``gemm`` that is a single name or recipe instead of a list.
    """
    import torch
    from tqdm.auto import tqdm

    from . import torch as ftorch

    table = {"adamw": ftorch.AdamW, "adam": ftorch.Adam, "sgd": ftorch.SGD}
    if optimizer not in table:
        raise ValueError(f"run_ab: optimizer must be one of {', '.join(table)}, got {optimizer!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"run_ab: steps must be an integer >= 1, got {steps!r}")
    cfgs = [resolve_config(c) for c in configs]
    names = [c.name for c in cfgs]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"run_ab: need configurations with distinct names, got {names}")
    recipes = _gemm_recipes(gemm)
    if recipes is None:
        runs = [(c, None, Run(c.name, FP32_GEMM, c.name)) for c in cfgs]
    else:
        runs = [(c, r, Run(c.name, g, f"{c.name}/{g}")) for c in cfgs for g, r in recipes.items()]
    data = []
    for b in batches:
        if len(data) == steps:
            break
        data.append(b)
    if len(data) < steps:
        raise ValueError(f"run_ab: batches gave {len(data)} items, steps={steps} needs as many")
    torch.manual_seed(seed)
    first = model_factory()
    start = copy.deepcopy(first.state_dict())
    result = ABResult([r for *_, r in runs], sum(p.numel() for p in first.parameters()))
    bar = tqdm(total=steps * len(runs), disable=not progress, desc="ab", unit="step")
    try:
        for cfg, recipe, run in runs:
            torch.manual_seed(seed)
            model = model_factory()
            model.load_state_dict(start)
            if recipe is not None:
                model = ftorch.convert(model, recipe, stats=True)
            opt = table[optimizer](model.named_parameters(), lr=lr, config=cfg, seed=seed, **optimizer_kwargs)
            losses = result.losses[run.name] = []
            for batch in data:
                loss = loss_fn(model, batch)
                losses.append(float(loss.detach()))
                bar.update(1)
                if not math.isfinite(losses[-1]):
                    break
                opt.zero_grad()
                loss.backward()
                opt.step()
            bar.update(steps - len(losses))
            result.bytes_per_param[run.name] = state_bytes(opt) / result.parameters
            finite = math.isfinite(losses[-1])
            if recipe is not None:
                rows = result.gemm_stats[run.name] = ftorch.gemm_stats(model)
                result.underflow[run.name] = underflow_ranking(rows, len(losses) - (not finite))
            if held_out is not None:
                result.accuracy[run.name] = _accuracy(model, *held_out) if finite else None
    finally:
        bar.close()
    return result


def _accuracy(model: Any, x: Any, y: Any) -> float:
    import torch

    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return float((model(x).argmax(-1) == y).double().mean())
    finally:
        model.train(training)


def state_bytes(optimizer: Any) -> int:
    """Bytes of the tensors an optimizer holds in its state (the step counters excluded)."""
    return sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for k, v in s.items()
        if k != "step" and hasattr(v, "element_size")
    )
