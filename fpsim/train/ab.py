"""A/B one model under several optimizer-state configurations: :func:`run_ab`, and the bundled
models of ``fpsim ab`` (:data:`MODELS`).

:func:`run_ab` trains ``model_factory()`` once per configuration with
:class:`fpsim.train.torch.AdamW` (or ``Adam`` / ``SGD``), every run from the same initial
parameters (the first model's, copied into each) and on the same batches (the first ``steps``
items of ``batches``, kept in memory), and returns the loss of every step and per
configuration the final and best loss, the first step whose loss is not finite (the run stops
there) and the bytes of optimizer state per parameter, measured on the tensors the optimizer
holds (codes, scales and FP32 states; the step counters excluded).

The bundled models (``fpsim ab --model NAME``):

- ``tiny-transformer``: the model and data of the bundled sample trace
  (:mod:`fpsim.trace.sample`: 6,076 parameters, sequences of 12 tokens, 4 classes), batches
  of 64 drawn with ``numpy.random.default_rng(seed)``.
- ``digits-mlp``: an MLP 64-128-128-10 on 8x8 images of the digits 0-9. No package the test
  extra installs ships a digits data set (scikit-learn's ``load_digits`` is not installed), so
  the images are synthesized deterministically by :func:`digits`: a 5x7 bitmap glyph per digit,
  shifted (up to one row, up to three columns), stroke intensity and noise drawn from the seed,
  clipped to the UCI digits' 0..16 scale and divided by 16; 2048 images, batches of 64.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..replay.config import ReplayConfig
from ._core import resolve_config

__all__ = ["ABResult", "MODELS", "BundledModel", "digits", "run_ab", "state_bytes"]

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


@dataclass(frozen=True)
class BundledModel:
    """A model of ``fpsim ab``: ``build()`` makes it (call after seeding torch),
    ``batches(seed, steps)`` gives its training batches, ``lr`` its default learning rate."""

    name: str
    description: str
    build: Callable[[], Any]
    batches: Callable[[int, int], list]
    lr: float


def _transformer_batches(seed: int, steps: int) -> list:
    import torch

    from ..trace.sample import BATCH, make_data

    tokens, labels = make_data(seed)
    rng = np.random.default_rng(seed + 1)
    idx = [rng.integers(0, len(labels), BATCH) for _ in range(steps)]
    return [(torch.from_numpy(tokens[i]), torch.from_numpy(labels[i])) for i in idx]


def _build_transformer() -> Any:
    from ..trace.sample import _build_model

    return _build_model()


def _digits_batches(seed: int, steps: int) -> list:
    import torch

    x, y = digits(seed)
    rng = np.random.default_rng(seed + 1)
    idx = [rng.integers(0, len(y), 64) for _ in range(steps)]
    return [(torch.from_numpy(x[i]), torch.from_numpy(y[i])) for i in idx]


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
            _transformer_batches,
            3e-3,
        ),
        BundledModel(
            "digits-mlp",
            "an MLP 64-128-128-10 (26,122 parameters) on synthetic 8x8 digits",
            _build_mlp,
            _digits_batches,
            3e-3,
        ),
    )
}
"""The models ``fpsim ab --model NAME`` trains."""


@dataclass
class ABResult:
    """What :func:`run_ab` measured: ``losses[config]`` the loss of each step run (a run
    stops at its first non-finite loss), ``bytes_per_param[config]`` the measured optimizer
    state, ``parameters`` the model's parameter count."""

    configs: list[str]
    parameters: int
    losses: dict[str, list[float]] = field(default_factory=dict)
    bytes_per_param: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """``{"parameters", "results": [{"config", "final_loss", "best_loss",
        "first_nonfinite_step", "state_bytes_per_param", "steps"}]}`` (non-finite losses as
        None; steps are 1-based)."""
        rows = []
        for c in self.configs:
            ls = self.losses[c]
            finite = [x for x in ls if math.isfinite(x)]
            bad = next((i + 1 for i, x in enumerate(ls) if not math.isfinite(x)), None)
            rows.append(
                {
                    "config": c,
                    "steps": len(ls),
                    "final_loss": ls[-1] if ls and math.isfinite(ls[-1]) else None,
                    "best_loss": min(finite) if finite else None,
                    "first_nonfinite_step": bad,
                    "state_bytes_per_param": self.bytes_per_param[c],
                }
            )
        return {"parameters": self.parameters, "results": rows}

    def frame(self) -> Any:
        """The losses as a pandas DataFrame with columns ``step``, ``config``, ``loss``."""
        import pandas as pd

        rows = [(i + 1, c, x) for c in self.configs for i, x in enumerate(self.losses[c])]
        return pd.DataFrame(rows, columns=["step", "config", "loss"])


def _cross_entropy(model: Any, batch: Any) -> Any:
    import torch

    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def run_ab(
    model_factory: Callable[[], Any],
    batches: Iterable[Any],
    configs: Sequence[ReplayConfig | str],
    *,
    steps: int,
    lr: float = 1e-3,
    optimizer: str = "adamw",
    loss_fn: Callable[[Any, Any], Any] = _cross_entropy,
    seed: int = 0,
    progress: bool = True,
    **optimizer_kwargs: Any,
) -> ABResult:
    """Train ``model_factory()`` under each configuration, from the same start and batches.

    Args:
        model_factory: returns a torch module with float32 parameters.
        batches: the training batches; the first ``steps`` are used by every run.
        configs: preset names or :class:`ReplayConfig` objects (names must be unique).
        steps: optimizer steps per run.
        lr: learning rate.
        optimizer: ``"adamw"``, ``"adam"`` or ``"sgd"`` (:mod:`fpsim.train.torch`).
        loss_fn: ``loss_fn(model, batch)`` -> scalar loss tensor (default: cross-entropy of
            ``model(x)`` against ``y`` for ``batch = (x, y)``).
        seed: seeds torch before the model is built (and the stochastic master rounding).
        progress: show a progress bar (tqdm).
        optimizer_kwargs: further arguments of the optimizer (``weight_decay``, ``sqrt``, ...).

    Raises:
        ValueError: an unknown optimizer or configuration, repeated configuration names, a
            ``steps`` below 1, or fewer than ``steps`` batches.
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
    result = ABResult(names, sum(p.numel() for p in first.parameters()))
    bar = tqdm(total=steps * len(cfgs), disable=not progress, desc="ab", unit="step")
    try:
        for cfg in cfgs:
            torch.manual_seed(seed)
            model = model_factory()
            model.load_state_dict(start)
            opt = table[optimizer](model.named_parameters(), lr=lr, config=cfg, seed=seed, **optimizer_kwargs)
            losses = result.losses[cfg.name] = []
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
            result.bytes_per_param[cfg.name] = state_bytes(opt) / result.parameters
    finally:
        bar.close()
    return result


def state_bytes(optimizer: Any) -> int:
    """Bytes of the tensors an optimizer holds in its state (the step counters excluded)."""
    return sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for k, v in s.items()
        if k != "step" and hasattr(v, "element_size")
    )
