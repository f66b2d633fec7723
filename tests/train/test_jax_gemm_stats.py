"""fpsim.train.jax_gemm with ``stats=True``: the torch layer's GemmStat records, from JAX.

Oracle: the torch path (``fpsim.train.torch.convert(stats=True, what_if=...)``, whose
statistics tests/train/test_gemm.py checks against TE's formulas) run here on the same x, W,
dy, layer names and steps; its ``gemm_stats`` rows must equal those of a jitted ``jax.grad``
step, field by field (NaN by class) and in the same order. Where a model has two layers their
FP32 matmul is swapped for ``np.matmul`` on both sides (the second layer's dy is the first's
output), as tests/train/test_jax_gemm.py does for y, dx and dW.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
import jax.numpy as jnp  # noqa: E402

import fpsim  # noqa: E402
from fpsim.train import gemm as G  # noqa: E402
from fpsim.train import linear as L  # noqa: E402
from fpsim.train.jax_gemm import gemm_stats, init_state, linear  # noqa: E402
from fpsim.train.torch import convert  # noqa: E402

F32 = np.float32
CALLBACK_ERRORS = (ValueError, AssertionError, jax.errors.JaxRuntimeError)
"""What an error raised in a host callback comes back as (jax re-raises its type, or wraps it
with the message in a JaxRuntimeError)."""


def _same_rows(got: list[dict], want: list[dict]) -> bool:
    """Equal lists of equal dicts (same keys in the same order), NaN equal to NaN."""

    def same(u, v) -> bool:
        if isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v):
            return True
        return type(u) is type(v) and u == v

    return len(got) == len(want) and all(
        list(a) == list(b) and all(same(a[k], b[k]) for k in a) for a, b in zip(got, want)
    )


def _wide(rng, shape) -> np.ndarray:
    """Values over many binades: blocks underflow and saturate differently."""
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-14, 8, shape))).astype(F32)


def _mm(a, b) -> torch.Tensor:
    """``a @ b^T`` as the JAX layer computes it: numpy's FP32 matmul of contiguous operands."""
    return torch.from_numpy(np.matmul(np.ascontiguousarray(a, F32), np.ascontiguousarray(b, F32).T))


def _torch_rows(recipe, what_if, ws, xs, dys) -> list[dict]:
    """The torch layers' rows: one nn.Linear per weight (names "0", "1", ...), a step per x."""
    model = torch.nn.Sequential(*(torch.nn.Linear(w.shape[1], w.shape[0], bias=False) for w in ws))
    with torch.no_grad():
        for lin, w in zip(model, ws):
            lin.weight.copy_(torch.tensor(w))
    convert(model, recipe, stats=True, what_if=what_if)
    for x, dy in zip(xs, dys):
        model(torch.tensor(x, requires_grad=True)).backward(torch.tensor(dy))
    return L.gemm_stats(model)


def _jax_layers(recipe, what_if, ws, xs, dys):
    """The same steps in JAX: one jitted value-and-gradient step per x (the delayed states
    carried as the gradient of the state argument)."""
    layers = [linear(recipe, name=str(i), stats=True, what_if=what_if) for i in range(len(ws))]
    delayed = isinstance(G.resolve_recipe(recipe).input.format, fpsim.DelayedScaling)
    states = [init_state(recipe) if delayed else None for _ in ws]

    @jax.jit
    def step_fn(x, ws, states, dy, step):
        def fwd(x, ws, states):
            for d, w, st in zip(layers, ws, states):
                x = d(x, w, step, st)
            return jnp.vdot(dy, x)

        return jax.grad(fwd, argnums=(0, 1, 2))(x, ws, states)

    for step, (x, dy) in enumerate(zip(xs, dys), 1):
        _, _, states = step_fn(x, ws, states, dy, step)
    return layers, step_fn, states


CASES = [
    ("bf16", (), 2),
    ("fp8-current", (), 2),
    ("fp8-delayed", (), 3),
    ("mxfp8", (), 2),
    ("nvfp4", (), 2),
    ("mxfp8", ("nvfp4", "fp8-current"), 1),
    ("fp8-delayed", ("mxfp8",), 2),
]


@pytest.mark.parametrize(("recipe", "what_if", "steps"), CASES, ids=lambda c: str(c))
def test_stats_rows_equal_the_torch_paths(recipe, what_if, steps):
    """Every preset (nvfp4 with its stochastic gradient and Hadamard wgrad operands; fp8-delayed
    over 3 steps, its scales moving), and what-if recipes beside a stateless and a delayed one:
    the rows of a jitted jax.grad step equal the torch layer's for the same inputs, name and
    steps, in the same order; swapping two roles' statistics makes them differ."""
    rng = np.random.default_rng(11)
    ws = [_wide(rng, (32, 48))]
    xs = [_wide(rng, (2, 16, 48)) * F32(2.0 ** (3 * s)) for s in range(steps)]
    dys = [_wide(rng, (2, 16, 32)) for _ in range(steps)]
    want = _torch_rows(recipe, what_if, ws, xs, dys)
    (dense,), _, _ = _jax_layers(recipe, what_if, ws, xs, dys)
    got = dense.gemm_stats()
    assert len(want) == 6 * steps * (1 + len(what_if))
    assert _same_rows(got, want)
    assert _same_rows([r.row() for r in dense.records()], got)
    # the check can fail: the same rows with the statistics of two roles of one GEMM swapped
    i, j = (
        k for k, r in enumerate(want) if r["step"] == 1 and r["gemm"] == "fprop" and r["recipe"] == recipe
    )
    keys = [k for k in want[0] if k not in ("module", "recipe", "step", "gemm", "role")]
    swapped = [dict(r) for r in got]
    for k in keys:
        swapped[i][k], swapped[j][k] = got[j][k], got[i][k]
    assert not _same_rows(swapped, want)


def test_two_layers_in_torch_order(monkeypatch):
    """Two layers (the second's dy the first's output: both sides' matmul is np.matmul),
    fp8-delayed with an nvfp4 what-if, 2 steps: gemm_stats([fc0, fc1]) gives the torch model's
    rows, by step, GEMM, layer and role."""
    monkeypatch.setattr(L, "_gemm", lambda a, b, mod: _mm(a, b))
    rng = np.random.default_rng(12)
    ws = [_wide(rng, (32, 48)), _wide(rng, (16, 32))]
    xs = [_wide(rng, (32, 48)) for _ in range(2)]
    dys = [_wide(rng, (32, 16)) for _ in range(2)]
    want = _torch_rows("fp8-delayed", ("nvfp4",), ws, xs, dys)
    layers, _, _ = _jax_layers("fp8-delayed", ("nvfp4",), ws, xs, dys)
    got = gemm_stats(layers)
    assert len(want) == 2 * 2 * 12 and [r["module"] for r in want[:4]] == ["0", "0", "0", "0"]
    assert _same_rows(got, want)
    assert not _same_rows(gemm_stats(layers[::-1]), want)


def test_recording_again_adds_nothing_other_values_are_refused():
    """The same step run again (the jitted step, then under jax.checkpoint, which runs the
    forward callbacks twice) adds no row; the same step with another x is refused, named, and
    records nothing."""
    rng = np.random.default_rng(13)
    x, w, dy = _wide(rng, (32, 48)), _wide(rng, (32, 48)), _wide(rng, (32, 32))
    dense = linear("nvfp4", name="fc", stats=True, what_if=["mxfp8"])
    loss = lambda w, x, s: jnp.vdot(dy, dense(x, w, s))  # noqa: E731
    grad = jax.jit(jax.grad(loss))
    grad(w, x, 1)
    rows = dense.gemm_stats()
    assert len(rows) == 12
    grad(w, x, 1)
    jax.jit(jax.grad(jax.checkpoint(loss)))(w, x, 1)
    assert _same_rows(dense.gemm_stats(), rows)
    with pytest.raises(
        CALLBACK_ERRORS, match=r"fc: step 1, input in fprop under 'nvfp4' is recorded already"
    ):
        jax.block_until_ready(grad(w, x * F32(2), 1))
    assert _same_rows(dense.gemm_stats(), rows)
    grad(w, x * F32(2), 2)
    assert len(dense.gemm_stats()) == 24


def test_without_stats_nothing_is_computed(monkeypatch):
    """stats=False computes no statistics (the statistics functions are made to raise) and
    has none to give."""

    def boom(*a, **k):
        raise AssertionError("statistics computed without stats")

    monkeypatch.setattr(G, "operand_stats", boom)
    monkeypatch.setattr(G, "fused_stats", boom)
    rng = np.random.default_rng(14)
    x, w = _wide(rng, (32, 48)), _wide(rng, (32, 48))
    for name in ("nvfp4", "fp8-current"):
        dense = linear(name)
        jax.block_until_ready(jax.jit(jax.grad(lambda w, d=dense: jnp.sum(d(x, w, 1))))(w))
        with pytest.raises(ValueError, match=r"linear: made without stats.*stats=True"):
            dense.gemm_stats()
    # the patched functions are the ones stats use: with stats they are called
    with pytest.raises(CALLBACK_ERRORS, match="statistics computed without stats"):
        jax.block_until_ready(linear("nvfp4", stats=True)(x, w, 1))


def test_refusals():
    """vmap of a layer with stats, what-if recipes without stats, with delayed scaling or
    named like the recipe, and a non-bool stats are refused, named."""
    w, xs = np.ones((8, 32), F32), np.ones((3, 4, 32), F32)
    dense = linear("fp8-current", name="fc", stats=True)
    with pytest.raises(ValueError, match=r"fc: jax.vmap of a layer made with stats=True is refused"):
        jax.vmap(lambda x: dense(x, w, 1))(xs)
    with pytest.raises(ValueError, match=r"fc: jax.vmap of a layer made with stats=True"):
        jax.jit(jax.vmap(jax.grad(lambda w, x: jnp.sum(dense(x, w, 1))), in_axes=(None, 0)))(w, xs)
    assert dense.gemm_stats() == []
    assert gemm_stats(dense) == []
    with pytest.raises(TypeError, match=r"takes layers made by linear\(\) \(Dense\), got function"):
        gemm_stats([dense, lambda x: x])
    with pytest.raises(ValueError, match="what_if records statistics only: pass stats=True"):
        linear("mxfp8", what_if=["nvfp4"])
    with pytest.raises(ValueError, match=r"what-if recipe 'fp8-delayed' scales input, weight, grad_output"):
        linear("mxfp8", stats=True, what_if=["fp8-delayed"])
    with pytest.raises(ValueError, match="distinct names, got mxfp8, mxfp8"):
        linear("mxfp8", stats=True, what_if="mxfp8")
    with pytest.raises(TypeError, match="stats must be a bool"):
        linear("mxfp8", stats=1)
    # a what-if recipe's shapes are checked too: nvfp4's Hadamard transform over 20 tokens
    with pytest.raises(ValueError, match=r"fc: grad_output in wgrad \(8, 20\) under .*divisible by 16"):
        linear("mxfp8", name="fc", stats=True, what_if=["nvfp4"])(np.ones((20, 32), F32), w, 1)


def test_clear_drains_the_records():
    """``gemm_stats(clear=True)`` returns the rows and empties the logs: the next read has only
    what ran since, equal to the rows of those steps read without clearing, and the torch
    path drains its modules' lists alike."""
    rng = np.random.default_rng(5)
    xs, w, dy = [_wide(rng, (16, 32)) for _ in range(3)], _wide(rng, (16, 32)), _wide(rng, (16, 16))
    runs = {}
    for clear in (False, True):
        dense = linear("fp8-current", name="fc", stats=True)
        grad = jax.jit(jax.grad(lambda w, x, s: jnp.vdot(dy, dense(x, w, s))))  # noqa: B023
        jax.block_until_ready(grad(w, xs[0], 1))
        first = gemm_stats(dense, clear=clear)
        for step in (2, 3):
            jax.block_until_ready(grad(w, xs[step - 1], step))
        runs[clear] = (first, dense.gemm_stats())
    (first, kept), (drained, rest) = runs[False], runs[True]
    assert len(first) == 6 and _same_rows(drained, first)
    assert len(kept) == 18 and _same_rows(rest, kept[6:])  # steps 2 and 3 only
    model = torch.nn.Sequential(torch.nn.Linear(32, 16, bias=False))
    convert(model, "fp8-current", stats=True)
    model(torch.tensor(xs[0], requires_grad=True)).backward(torch.tensor(dy))
    assert len(L.gemm_stats(model, clear=True)) == 6 and L.gemm_stats(model) == []
