"""Train with emulated low-precision optimizers: the replay's tensor-step in a live loop.

- :mod:`fpsim.train.torch`: ``AdamW``, ``Adam``, ``SGD``, drop-in ``torch.optim`` optimizers
  taking a replay configuration (``config=``).
- :mod:`fpsim.train.optax`: ``adamw``, ``adam``, ``sgd`` as ``optax.GradientTransformation``.
- :mod:`fpsim.train.ab`: :func:`~fpsim.train.ab.run_ab`, one model trained under several
  configurations and GEMM recipes from the same start and batches, and the bundled models of
  ``fpsim ab``.
- :mod:`fpsim.train.gemm` (recipes, on numpy) and :mod:`fpsim.train.linear` (torch layers,
  :func:`~fpsim.train.linear.convert`, re-exported by :mod:`fpsim.train.torch`): emulated
  low-precision GEMMs, Transformer Engine's FP8, MX and NVFP4 recipes in the forward and
  backward passes.
- :mod:`fpsim.train.jax_gemm`: :func:`~fpsim.train.jax_gemm.linear`, the same GEMMs for JAX
  (``x @ w.T`` through ``jax.custom_vjp``, the operands quantized by the same code).
- :mod:`fpsim.train.opstats` (one operand's statistics, as TE's debug tools log them) and
  :mod:`fpsim.train.gemmstat` (the per-step records both layers keep).

Each update of one tensor is :func:`fpsim.replay.tensorstep.tensor_step`, the replay's own
(one implementation: a live loop and a replay of its recorded gradients give the same bits).
torch, jax and optax are imported by the submodules that use them, never by this package.
"""

from __future__ import annotations

from ._core import StepStats, resolve_config

__all__ = ["StepStats", "resolve_config"]
