"""Emulated low-precision GEMMs for JAX: :func:`linear`, ``x @ w.T`` through ``jax.custom_vjp``.

The same three GEMMs as :class:`fpsim.train.linear.EmulatedLinear` (the torch path), with the
same operands: fprop ``y = x W^T`` quantizes ``x`` and ``W``; the backward quantizes ``dy`` and
``W^T`` for dgrad ``dx = dy W`` and ``dy^T`` and ``x^T`` (the token axis as contraction) for
wgrad ``dW = dy^T x``, each from the high-precision tensor along that GEMM's contraction axis,
by :func:`fpsim.train.gemm.quantize_operand` run on the host through ``jax.pure_callback``
(one implementation for both frameworks). The NVFP4 Hadamard transform and the stochastic
rounding words are the torch path's too: the words come from
:func:`fpsim.train.gemm.operand_seed` of the layer's ``name`` and the ``step`` passed in, so a
torch module of that name at that step quantizes to the same bits. Leading batch dimensions of
``x`` are flattened into tokens, as the torch path does.

The GEMM itself runs in the callback too, a real FP32 one: ``np.matmul(a, b.T)`` of the
dequantized float32 operands (numpy's BLAS: the bits of ``np.matmul`` on the same machine;
not XLA's dot, which under ``jax.jit`` gave other last bits than the same dot run alone, on
jaxlib 0.10's CPU backend), or with ``GemmRecipe(accumulate=...)``
:func:`fpsim.train.gemm.gemm` (the emulated accumulator), the torch path's own code. The torch
path's FP32 GEMM is ``torch.matmul`` (torch's BLAS), so y, dx and dW equal the torch path's
where the two BLAS sum alike; the operands are equal always. Tested
(tests/train/test_jax_gemm.py, jitted ``jax.vjp``/``jax.grad``): y, dx and dW equal, bit for
bit, ``np.matmul`` of the operands ``fpsim.quantize`` gives on the numpy tier, and the torch
path with its FP32 matmul swapped for that ``np.matmul`` gives the same bits for the same
inputs, layer name and step.

Delayed scaling (``fp8-delayed``) carries a per-role state stepped at each step; this
stateless function refuses it (use ``fp8-current``, or the torch path, which keeps the state).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._compiled import Backend
from ..emulate.blocks import block_geometry
from ..emulate.delayed import DelayedScaling
from ..formats import BlockFormat
from .gemm import ROLES, Gemm, GemmRecipe, gemm, module_operand, resolve_recipe

__all__ = ["linear"]

_F32 = np.float32

_OPERANDS = (
    ("input", Gemm.FPROP),
    ("weight", Gemm.FPROP),
    ("grad_output", Gemm.DGRAD),
    ("weight", Gemm.DGRAD),
    ("grad_output", Gemm.WGRAD),
    ("input", Gemm.WGRAD),
)
"""The six quantized operands: fprop's two, then the backward's four."""


def _quantize(a: np.ndarray, recipe: GemmRecipe, role: str, g: Gemm, name: str, step: int, backend: Backend):
    """``a`` (oriented: contraction axis last) as GEMM ``g`` reads it: the torch layer's
    :func:`fpsim.train.gemm.module_operand`."""
    return module_operand(np.ascontiguousarray(a, _F32), recipe, role, g, name, step, backend)[0]


def _check(recipe: GemmRecipe, name: str, m: int, n: int, k: int) -> None:
    """Refuse, while tracing, a shape an operand's format or the Hadamard transform cannot
    take (the torch path refuses the same shapes when it runs)."""
    shapes = {
        ("input", Gemm.FPROP): (m, k),
        ("weight", Gemm.FPROP): (n, k),
        ("grad_output", Gemm.DGRAD): (m, n),
        ("weight", Gemm.DGRAD): (k, n),
        ("grad_output", Gemm.WGRAD): (n, m),
        ("input", Gemm.WGRAD): (k, m),
    }
    for (role, g), shape in shapes.items():
        op = recipe.operand(role)
        try:
            if op.hadamard and g is Gemm.WGRAD and shape[-1] % 16:
                raise ValueError(
                    f"the Hadamard transform needs a contraction length divisible by 16, got {shape[-1]}"
                )
            if isinstance(op.format, BlockFormat):
                block_geometry(shape, op.format)
        except ValueError as e:
            raise ValueError(f"{name}: {role} in {g.value} {shape} under {op.name}: {e}") from None


def linear(
    recipe: GemmRecipe | str, *, name: str = "linear", backend: Backend | str = "auto"
) -> Callable[[jax.Array, jax.Array, jax.Array | int], jax.Array]:
    """An emulated ``dense(x, w, step) -> x @ w.T`` whose three GEMMs run in ``recipe`` (module doc).

    ``x``: float32 ``(..., K)``; ``w``: float32 ``(N, K)`` (torch's ``nn.Linear`` layout);
    ``step``: the step (an int or int32 scalar, traced under ``jax.jit``), the torch module's
    ``module.step`` (1 at its first forward): with ``name`` it draws the stochastic rounding
    words. ``jax.grad``/``jax.vjp`` give dx and dW from the emulated dgrad and wgrad; ``step``
    has no gradient. Works under ``jax.jit`` (the quantization runs on the host).

    Args:
        recipe: a preset name of :data:`fpsim.train.gemm.GEMM_RECIPES` or a GemmRecipe without
            delayed scaling.
        name: the layer's name (the torch module's name in the model; ``convert`` of a bare
            ``nn.Linear`` names it ``"linear"``).
        backend: where the emulator's loops run (:class:`fpsim.Backend`).

    Raises:
        ValueError: an unknown recipe, a recipe with delayed scaling (named), or at the call
            (tracing) inputs that are not float32, a ``w`` that is not 2-D, a feature count
            that differs from ``w``'s, a shape an operand's format refuses (named).
    """
    recipe, backend = resolve_recipe(recipe), Backend.resolve(backend)
    delayed = [r for r in ROLES if isinstance(recipe.operand(r).format, DelayedScaling)]
    if delayed:
        raise ValueError(
            f"recipe {recipe.name!r} uses delayed scaling for {', '.join(delayed)}, which needs a "
            "state stepped at every step; fpsim.train.jax_gemm.linear is stateless: use a "
            "current-scaling recipe (fp8-current) or the torch path (fpsim.train.torch.convert)"
        )
    spec = recipe.accumulate

    def host_gemm(a, b):
        a, b = np.ascontiguousarray(a, _F32), np.ascontiguousarray(b, _F32)
        return np.matmul(a, b.T) if spec is None else gemm(a, b, spec)

    def mm(a, b):
        """``a @ b^T`` on the host: numpy's FP32 matmul, or the recipe's accumulator."""
        out = jax.ShapeDtypeStruct((a.shape[0], b.shape[0]), jnp.float32)
        return jax.pure_callback(host_gemm, out, a, b)

    def quantized(keys, *arrays_and_step):
        """The operands ``keys`` of the oriented arrays, quantized on the host."""
        *arrays, step = arrays_and_step

        def host(*args):
            *xs, s = args
            return tuple(_quantize(a, recipe, *k, name, int(s), backend) for k, a in zip(keys, xs))

        out = tuple(jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in arrays)
        return jax.pure_callback(host, out, *arrays, step)

    @jax.custom_vjp
    def dense2(x2, w, step):
        xq, wq = quantized(_OPERANDS[:2], x2, w, step)
        return mm(xq, wq)

    def fwd(x2, w, step):
        return dense2(x2, w, step), (x2, w, step)

    def bwd(res, dy):
        x2, w, step = res
        gq_d, wq_d, gq_w, xq_w = quantized(_OPERANDS[2:], dy, w.T, dy.T, x2.T, step)
        return mm(gq_d, wq_d), mm(gq_w, xq_w), None

    dense2.defvjp(fwd, bwd)

    def dense(x: jax.Array, w: jax.Array, step: jax.Array | int) -> jax.Array:
        dt = [getattr(a, "dtype", type(a).__name__) for a in (x, w)]
        if any(d != np.float32 for d in dt):  # checked before jnp.asarray casts float64 down
            raise ValueError(f"{name}: emulated GEMMs take float32 inputs and weights, got {dt[0]} / {dt[1]}")
        x, w = jnp.asarray(x), jnp.asarray(w)
        if w.ndim != 2 or x.ndim < 1:
            raise ValueError(f"{name}: w must be 2-D (N, K) and x (..., K), got {w.shape} and {x.shape}")
        n, k = w.shape
        if x.shape[-1] != k:
            raise ValueError(f"{name}: input has {x.shape[-1]} features, the weight {k}")
        m = int(np.prod(x.shape[:-1], dtype=np.int64))
        _check(recipe, name, m, n, k)
        step = jnp.asarray(step, jnp.int32)
        if step.shape != ():
            raise ValueError(f"{name}: step must be a scalar, got shape {step.shape}")
        return dense2(x.reshape(m, k), w, step).reshape(*x.shape[:-1], n)

    return dense
