"""fpsim.train.optax against optax itself (the oracle, run in the test on this machine)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy

from fpsim.train import optax as fo  # noqa: E402

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.standard_normal((256, 8)), jnp.float32)
Y = jnp.asarray(RNG.standard_normal((256, 1)), jnp.float32)
P0 = {
    "w1": jnp.asarray(RNG.standard_normal((8, 16)) * 0.3, jnp.float32),
    "b1": jnp.zeros(16, jnp.float32),
    "w2": jnp.asarray(RNG.standard_normal((16, 1)) * 0.3, jnp.float32),
}


def _loss(p, x, y):
    return jnp.mean((jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] - y) ** 2)


_VG = jax.jit(jax.value_and_grad(_loss))


def _train(tx, steps: int):
    """A loop whose optimizer runs eagerly (not jitted): optax's operations one by one."""
    p, s, losses = P0, tx.init(P0), []
    for k in range(steps):
        i = (k * 32) % 224
        loss, g = _VG(p, X[i : i + 32], Y[i : i + 32])
        u, s = tx.update(g, s, p)
        p = optax.apply_updates(p, u)
        losses.append(float(loss))
    return p, s, losses


def _equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(a[k]).view(np.uint32), np.asarray(b[k]).view(np.uint32)) for k in a)


@pytest.mark.parametrize(
    "ref, ours",
    [
        (lambda: optax.adamw(3e-3, weight_decay=1e-2), lambda: fo.adamw(3e-3, weight_decay=1e-2)),
        (
            lambda: optax.adam(optax.cosine_decay_schedule(1e-2, 15), eps_root=1e-12),
            lambda: fo.adam(optax.cosine_decay_schedule(1e-2, 15), eps_root=1e-12),
        ),
        (
            lambda: optax.sgd(1e-2, momentum=0.9, nesterov=True),
            lambda: fo.sgd(1e-2, momentum=0.9, nesterov=True),
        ),
    ],
    ids=["adamw", "adam-schedule-eps-root", "sgd-nesterov"],
)
def test_fp32_equals_optax_run_op_by_op(ref, ours):
    pa, sa, la = _train(ref(), 15)
    pb, sb, lb = _train(ours(), 15)
    assert la == lb and _equal(pa, pb)
    if hasattr(sa[0], "mu"):
        assert _equal(sa[0].mu, {k: v["exp_avg"] for k, v in sb.packed.items()})
        assert _equal(sa[0].nu, {k: v["exp_avg_sq"] for k, v in sb.packed.items()})
    assert int(sb.count) == 15


def test_jitted_moments_equal_jitted_optax_with_xla():
    """Under jax.jit, with gradients that do not depend on the parameters: optax's moments and
    fpsim's (``xla=True``) stay equal bit for bit; the parameters differ at most where XLA fuses
    the final addition (module doc), and only in the last bit."""
    grads = [
        {k: jnp.asarray(RNG.standard_normal(v.shape) * 1e-2, jnp.float32) for k, v in P0.items()}
        for _ in range(20)
    ]
    out = []
    for tx in (optax.adamw(3e-3, weight_decay=1e-2), fo.adamw(3e-3, weight_decay=1e-2, xla=True)):
        step = jax.jit(lambda g, s, p, tx=tx: tx.update(g, s, p))
        p, s = P0, tx.init(P0)
        for g in grads:
            u, s = step(g, s, p)
            p = optax.apply_updates(p, u)
        out.append((p, s))
    (pa, sa), (pb, sb) = out
    assert _equal(sa[0].mu, {k: v["exp_avg"] for k, v in sb.packed.items()})
    assert _equal(sa[0].nu, {k: v["exp_avg_sq"] for k, v in sb.packed.items()})
    for k in pa:
        ulps = np.abs(np.asarray(pa[k]).view(np.int32).astype(np.int64) - np.asarray(pb[k]).view(np.int32))
        assert ulps.max() <= 20  # rounding-level drift of the parameters only


def test_states_are_codes_and_it_trains():
    tx = fo.adamw(3e-3, config="int8-states")
    p, s, losses = _train(tx, 10)
    packed = s.packed["w1"]
    assert packed["exp_avg.codes"].dtype == jnp.uint8 and packed["exp_avg.scales"].dtype == jnp.uint32
    assert np.isfinite(losses).all()


def test_refusals():
    with pytest.raises(ValueError, match="FP32 masters only"):
        fo.adamw(1e-3, config="bf16-master")
    with pytest.raises(ValueError, match="mu_dtype"):
        fo.adamw(1e-3, mu_dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="unknown config"):
        fo.sgd(1e-3, config="nope")
