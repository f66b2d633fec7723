"""Emulated low-precision optimizers for JAX: :func:`adamw`, :func:`adam`, :func:`sgd` as
``optax.GradientTransformation``.

The update rule is optax's, in its order of float32 operations (:class:`OptaxAdam`:
``optax.scale_by_adam`` with ``eps_root``, ``add_decayed_weights``, ``scale_by_learning_rate``;
``sgd``: ``optax.trace`` then the learning rate), and each tensor-step is the replay's
(:func:`fpsim.replay.tensorstep.tensor_step`): the moments are stored in the configuration's
formats. The state is :class:`FpsimState`: optax's ``count`` and, per leaf, the packed states
(uint8 codes and uint32 scale bits for block recipes, float32 for FP32 states), so the memory a
format saves is saved. ``mu_dtype`` is float32 only (store the moments with ``config=``).
``xla=False`` follows optax run op by op (eagerly); ``xla=True`` optax's moments under
``jax.jit`` on the CPU (XLA fuses the arithmetic, :class:`OptaxAdam`).

The rules return optax's updates (``-lr * u``) where the replay's rules return the new
parameter: the parameters are the caller's, ``optax.apply_updates`` adds the updates, and the
tensor-step's master copy (FP32 only: a low-precision master is refused) passes them through
unrounded. Bits: with ``xla=False`` the parameters, ``mu`` and ``nu`` equal optax's run op by op
(not jitted); with ``xla=True`` under ``jax.jit``, ``mu`` and ``nu`` equal jitted optax's for
the same gradients, and the parameters differ where XLA fuses ``params + (-lr) * u`` into one
fma across ``apply_updates`` (fpsim's update is rounded before it is added): one rounding of
that addition per step, on some elements, and through the gradients the runs then drift apart
at rounding level. ``update`` is jit-able: the step runs on the host through
``jax.pure_callback`` (``init`` takes concrete parameters: it encodes the zero states on the
host). tests/train/test_optax.py checks both statements against optax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._compiled import Backend
from ..replay import optim as rules
from ..replay.config import ReplayConfig
from ._core import init_tensor, resolve_config, step_tensor

__all__ = ["FpsimState", "OptaxAdam", "OptaxSGD", "adam", "adamw", "sgd"]

_F32 = np.float32


def _axpy(a, x, y, fused: bool):
    """``a*x + y`` in float32: one rounding (fma) where ``fused``, else two."""
    return rules.fma32(a, x, y) if fused else a * x + y


@dataclass(frozen=True)
class OptaxAdam(rules.Optimizer):
    """optax's Adam(W) update in float32, in optax 0.2's order: ``mu = f32(1-b1)*g + f32(b1)*mu``;
    ``nu = f32(1-b2)*(g*g) + f32(b2)*nu``; ``bc = 1 - f32(b)**f32(t)``;
    ``u = (mu/bc1) / (sqrt(nu/bc2 + eps_root) + eps)``; ``u = u + f32(wd)*p``; returns optax's
    update ``f32(-lr)*u`` *in the parameter's place* (``optax.apply_updates`` adds it to the
    parameters; module doc). With ``xla`` as XLA's CPU compiler fuses it under ``jax.jit``: the
    multiply-adds of the moments and the decay contracted to fmas and ``mu/bc1``, ``nu/bc2``
    computed as ``mu * f32(1/bc1)``, ``nu * f32(1/bc2)`` (found on jaxlib 0.9's CPU backend and
    checked against it by tests/train; another XLA may fuse otherwise)."""

    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    eps_root: float = 0.0
    xla: bool = False
    name = "optax-adam"
    states = ("exp_avg", "exp_avg_sq")
    other_names = {"mu": "exp_avg", "nu": "exp_avg_sq"}
    elementwise = True

    def step(self, p, g, states, lr, t, *, out=None, backend="auto"):
        f = _F32
        x = self.xla
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            m = _axpy(f(1 - self.b1), g, f(self.b1) * states["exp_avg"], x)
            v = _axpy(f(1 - self.b2), g * g, f(self.b2) * states["exp_avg_sq"], x)
            bc1, bc2 = (f(1) - f(b) ** f(t) for b in (self.b1, self.b2))
            m_hat, v_hat = (m * (f(1) / bc1), v * (f(1) / bc2)) if x else (m / bc1, v / bc2)
            u = m_hat / (np.sqrt(v_hat + f(self.eps_root)) + f(self.eps))
            if self.weight_decay:
                u = _axpy(f(self.weight_decay), p, u, x)
            return f(-lr) * u, {"exp_avg": m, "exp_avg_sq": v}


@dataclass(frozen=True)
class OptaxSGD(rules.Optimizer):
    """optax's SGD with momentum (``optax.trace``, ``nesterov``): ``tr = g + f32(mu)*tr``;
    ``u = g + f32(mu)*tr`` (nesterov) or ``tr``; returns ``f32(-lr)*u`` in the parameter's
    place (as :class:`OptaxAdam`); with ``xla`` each multiply-add one fma."""

    momentum: float = 0.0
    nesterov: bool = False
    xla: bool = False
    name = "optax-sgd"
    states = ("momentum_buffer",)
    other_names = {"trace": "momentum_buffer"}
    elementwise = True

    def step(self, p, g, states, lr, t, *, out=None, backend="auto"):
        f, x = _F32, self.xla
        tr = _axpy(f(self.momentum), states["momentum_buffer"], g, x)
        u = _axpy(f(self.momentum), tr, g, x) if self.nesterov else tr
        return f(-lr) * u, {"momentum_buffer": tr}


class FpsimState(NamedTuple):
    """The transformation's state: optax's update ``count`` (int32) and the packed states of
    each leaf (a pytree of the params' structure, each leaf a dict of arrays)."""

    count: Any
    packed: Any


def _transformation(rule: rules.Optimizer, learning_rate, config, backend) -> Any:
    import optax

    cfg = resolve_config(config)
    masters = {cfg.master.name, *(f.name for _, f in cfg.master_overrides)}
    if masters != {"float32"} or cfg.kahan:
        raise ValueError(
            f"fpsim.train.optax: config {cfg.name!r} keeps a low-precision master copy; the optax "
            "transformations take FP32 masters only (the parameters are the caller's)"
        )
    be = Backend.resolve(backend)
    schedule = learning_rate if callable(learning_rate) else (lambda count: learning_rate)

    def names(params):
        return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]

    def init_fn(params):
        leaves, tree = jax.tree_util.tree_flatten(params)
        packed = []
        for name, p in zip(names(params), leaves):
            _, pk, _ = init_tensor(cfg, rule, name, np.asarray(p, _F32), be)
            packed.append({k: jnp.asarray(v) for k, v in pk.items()})
        return FpsimState(jnp.zeros([], jnp.int32), jax.tree_util.tree_unflatten(tree, packed))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("fpsim.train.optax: update needs params (update(grads, state, params))")
        count = state.count + 1
        lr = jnp.asarray(schedule(state.count), jnp.float32)
        g_leaves, tree = jax.tree_util.tree_flatten(updates)
        p_leaves = tree.flatten_up_to(params)
        s_leaves = tree.flatten_up_to(state.packed)
        out_u, out_s = [], []
        for name, g, p, packed in zip(names(params), g_leaves, p_leaves, s_leaves):
            keys = sorted(packed)
            shapes = (
                jax.ShapeDtypeStruct(p.shape, jnp.float32),
                *(jax.ShapeDtypeStruct(packed[k].shape, packed[k].dtype) for k in keys),
            )

            def host(g, p, lr, t, *arrays, name=name, keys=keys):
                pk = {k: np.array(a) for k, a in zip(keys, arrays)}
                p = np.asarray(p, _F32)
                new, pk, _ = step_tensor(
                    cfg, rule, name, p, pk, None, np.asarray(g, _F32), float(lr), int(t), seed=0, backend=be
                )
                return (np.asarray(new, _F32), *(np.asarray(pk[k]) for k in keys))

            res = jax.pure_callback(host, shapes, g, p, lr, count, *(packed[k] for k in keys))
            out_u.append(res[0])
            out_s.append(dict(zip(keys, res[1:])))
        return tree.unflatten(out_u), FpsimState(count, tree.unflatten(out_s))

    return optax.GradientTransformation(init_fn, update_fn)


def _with_mu_dtype(config: ReplayConfig | str, mu_dtype: Any) -> ReplayConfig:
    """The config; ``mu_dtype`` must be None or float32 (optax's bfloat16 ``mu`` multiplies
    ``b1 * mu`` in bfloat16, which the replay's storage rule does not do: store the moment in
    ``config`` instead, e.g. ``m="bfloat16"``)."""
    if mu_dtype is not None and jnp.dtype(mu_dtype) != jnp.float32:
        raise ValueError(
            f"mu_dtype: None or float32 only, got {mu_dtype!r}; store the first moment in a format with "
            "config= (a ReplayConfig with m='bfloat16', ...)"
        )
    return resolve_config(config)


def adamw(
    learning_rate: Any,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any = None,
    weight_decay: float = 1e-4,
    *,
    config: ReplayConfig | str = "fp32",
    xla: bool = False,
    backend: Backend | str = "auto",
) -> Any:
    """``optax.adamw`` (its defaults; ``learning_rate`` a float or an optax schedule) with the
    moments stored as ``config`` says; ``xla``: optax's bits under ``jax.jit`` (module doc).

    Raises:
        ValueError: an unknown config, one with a low-precision master, or an unsupported
            ``mu_dtype``.
    """
    rule = OptaxAdam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay, xla=xla)
    return _transformation(rule, learning_rate, _with_mu_dtype(config, mu_dtype), backend)


def adam(learning_rate: Any, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, mu_dtype=None, **kw) -> Any:
    """``optax.adam``: :func:`adamw` without weight decay."""
    return adamw(learning_rate, b1, b2, eps, eps_root, mu_dtype, weight_decay=0.0, **kw)


def sgd(
    learning_rate: Any,
    momentum: float = 0.0,
    nesterov: bool = False,
    *,
    config: ReplayConfig | str = "fp32",
    xla: bool = False,
    backend: Backend | str = "auto",
) -> Any:
    """``optax.sgd`` (momentum via ``optax.trace``, ``nesterov``) with the momentum stored as
    ``config`` says."""
    rule = OptaxSGD(momentum=momentum, nesterov=nesterov, xla=xla)
    return _transformation(rule, learning_rate, config, backend)
