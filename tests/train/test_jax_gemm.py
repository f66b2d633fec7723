"""fpsim.train.jax_gemm: the emulated GEMM recipes for JAX through ``jax.custom_vjp``.

Oracles, computed here: y, dx and dW (jitted ``jax.vjp`` and ``jax.grad``) equal, bit for bit
(int32 views, NaN by class), ``np.matmul`` (the matmul the module runs) of the operands
``fpsim.quantize`` gives on the numpy tier for x, W, dy oriented with each GEMM's contraction
axis last; and the torch path (``fpsim.train.torch.convert``) with its FP32
matmul swapped for that same ``np.matmul`` gives the same bits for the same inputs, layer name
and step, so the two frameworks quantize every operand alike.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import fpsim  # noqa: E402
from fpsim.emulate.random import random_bits_at  # noqa: E402
from fpsim.train import gemm as G  # noqa: E402
from fpsim.train.gemm import GEMM_RECIPES, Gemm, operand_seed  # noqa: E402
from fpsim.train.jax_gemm import init_state, linear  # noqa: E402

F32 = np.float32
STATELESS = ["bf16", "fp8-current", "fp8-block", "mxfp8", "nvfp4"]


def _bits(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a), F32).view(np.int32)


def _same(got, want) -> bool:
    got, want = np.asarray(got, F32), np.asarray(want, F32)
    nan = np.isnan(want)
    return bool(np.array_equal(np.isnan(got), nan) and np.array_equal(_bits(got)[~nan], _bits(want)[~nan]))


def _mm(a, b) -> np.ndarray:
    """The oracle GEMM: ``a @ b^T`` in FP32, numpy's matmul of contiguous operands (the one the
    module runs: another BLAS or summation order can differ in the last bit)."""
    return np.matmul(np.ascontiguousarray(a, F32), np.ascontiguousarray(b, F32).T)


def _wide(rng, shape) -> np.ndarray:
    """Values spread over many binades, so that blocks underflow and saturate differently."""
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-12, 6, shape))).astype(F32)


def _q(recipe, role, gemm, a, name, step) -> np.ndarray:
    """fpsim.quantize of the oriented operand (TE's Hadamard transform of the wgrad operands,
    the words of operand_seed), numpy tier."""
    op = recipe.operand(role)
    a = np.ascontiguousarray(a)
    if op.hadamard and gemm is Gemm.WGRAD:
        a = G.hadamard16(a)
    kw = {}
    if op.stochastic:
        seed = operand_seed(recipe.seed, name, step, gemm, role)
        kw = {"rounding": "stochastic", "random_bits": random_bits_at(seed, 0, a.size).reshape(a.shape)}
    return np.asarray(fpsim.quantize(a, op.format, backend="numpy", **kw))


def _run(name, x, w, dy, step, layer="linear"):
    dense = linear(name, name=layer)
    y, vjp = jax.jit(lambda x, w, s: jax.vjp(lambda x, w: dense(x, w, s), x, w))(x, w, step)
    dx, dw = vjp(jnp.asarray(dy))
    return np.asarray(y), np.asarray(dx), np.asarray(dw)


@pytest.mark.parametrize("name", STATELESS)
@pytest.mark.parametrize("shape", [((2, 16, 64), 32), ((3, 7, 80), 48)], ids=["even", "ragged"])
def test_dense_equals_matmuls_of_quantized_operands(name, shape):
    """y, dx, dW (jitted vjp) are FP32 matmuls of fpsim.quantize's operands, bit for bit; the
    ragged shape (21 tokens, 80 and 48 features) pads partial blocks (nvfp4's Hadamard
    transform needs 16 | tokens: 32 tokens, 72 and 40 features there) and holds a NaN and an
    infinity."""
    (xs, n), recipe = shape, GEMM_RECIPES[name]
    if name == "nvfp4" and xs[0] == 3:
        xs, n = (2, 16, 72), 40
    rng = np.random.default_rng(2)
    x, w, dy = _wide(rng, xs), _wide(rng, (n, xs[-1])), _wide(rng, (*xs[:-1], n))
    if shape[0][0] == 3:  # ragged: a NaN, an infinity and a zero in the last token (by class)
        x[-1, -1, :3] = [np.nan, np.inf, 0.0]
    step, layer = 5, "blocks.0.fc"
    y, dx, dw = _run(name, x, w, dy, step, layer)
    k = xs[-1]
    x2, dy2 = x.reshape(-1, k), dy.reshape(-1, n)
    q = lambda role, gemm, a: _q(recipe, role, gemm, a, layer, step)  # noqa: E731
    assert _same(y.reshape(-1, n), _mm(q("input", Gemm.FPROP, x2), q("weight", Gemm.FPROP, w)))
    assert _same(dx.reshape(-1, k), _mm(q("grad_output", Gemm.DGRAD, dy2), q("weight", Gemm.DGRAD, w.T)))
    assert _same(dw, _mm(q("grad_output", Gemm.WGRAD, dy2.T), q("input", Gemm.WGRAD, x2.T)))
    # the emulation changes the numbers (so the comparison above can fail)
    assert not _same(y.reshape(-1, n), _mm(x2, w))
    # jax.grad of a jitted loss gives the same dW as the vjp
    loss = lambda x, w: jnp.vdot(jnp.asarray(dy), linear(name, name=layer)(x, w, step))  # noqa: E731
    assert _same(jax.jit(jax.grad(loss, argnums=1))(x, w), dw)


def test_stochastic_words_follow_the_step_and_name():
    """nvfp4's gradient is rounded stochastically: another step or layer name draws other words."""
    rng = np.random.default_rng(3)
    x, w, dy = _wide(rng, (32, 64)), _wide(rng, (32, 64)), _wide(rng, (32, 32))
    a = _run("nvfp4", x, w, dy, 1)
    assert all(_same(u, v) for u, v in zip(a, _run("nvfp4", x, w, dy, 1)))
    assert not _same(a[1], _run("nvfp4", x, w, dy, 2)[1])
    # one jitted function, the step traced: each call draws its step's words
    dense = linear("nvfp4")
    dx = jax.jit(jax.grad(lambda x, s: jnp.vdot(jnp.asarray(dy), dense(x, w, s))))
    assert _same(dx(x, 1), a[1])
    assert _same(dx(x, 2), _run("nvfp4", x, w, dy, 2)[1])
    assert not _same(a[1], _run("nvfp4", x, w, dy, 1, "other")[1])


@pytest.mark.parametrize("name", STATELESS)
def test_same_bits_as_the_torch_path(name, monkeypatch):
    """The torch path's layer (same name, step, inputs), its FP32 matmul replaced by the same
    np.matmul, gives JAX's y, dx and dW: every operand is quantized alike."""
    torch = pytest.importorskip("torch")
    from fpsim.train import linear as L
    from fpsim.train.torch import convert

    monkeypatch.setattr(L, "_gemm", lambda a, b, mod: torch.from_numpy(_mm(a, b)))
    rng = np.random.default_rng(4)
    x, w, dy = _wide(rng, (2, 16, 48)), _wide(rng, (40, 48)), _wide(rng, (2, 16, 40))
    model = torch.nn.Sequential(torch.nn.Linear(48, 40, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor(w))
    convert(model, name)
    xt = torch.tensor(x, requires_grad=True)
    for _ in range(2):  # two steps: step 2 draws other stochastic words
        xt.grad = model[0].weight.grad = None
        yt = model(xt)
        yt.backward(torch.tensor(dy))
    y, dx, dw = _run(name, x, w, dy, 2, layer="0")
    assert _same(y, yt.detach().numpy())
    assert _same(dx, xt.grad.numpy())
    assert _same(dw, model[0].weight.grad.numpy())


def test_refusals():
    """Wrong dtypes, shapes, a contraction 16 does not divide under the Hadamard transform and
    states that do not fit the recipe are refused, named."""
    with pytest.raises(ValueError, match="unknown GEMM recipe"):
        linear("fp8")
    dense = linear("mxfp8")
    x, w = np.ones((4, 32), F32), np.ones((8, 32), F32)
    with pytest.raises(ValueError, match="float32"):
        dense(x.astype(np.float64), w, 1)
    with pytest.raises(ValueError, match="features"):
        dense(np.ones((4, 16), F32), w, 1)
    with pytest.raises(ValueError, match="2-D"):
        dense(x, w[None], 1)
    with pytest.raises(ValueError, match=r"linear: grad_output in wgrad \(16, 20\) under .*divisible by 16"):
        linear("nvfp4")(np.ones((20, 32), F32), np.ones((16, 32), F32), 1)
    delayed, state = linear("fp8-delayed"), init_state("fp8-delayed")
    with pytest.raises(ValueError, match=r"delayed scaling: pass dense\(x, w, step, state\).*init_state"):
        delayed(x, w, 1)
    with pytest.raises(ValueError, match="'mxfp8' has no delayed scaling; pass no state"):
        dense(x, w, 1, state)
    with pytest.raises(ValueError, match="has no delayed scaling"):
        init_state("mxfp8")
    short = state._replace(weight=init_state(G.fp8_delayed(history_len=8)).weight)
    with pytest.raises(ValueError, match=r"weight state must be .* history of 1024"):
        delayed(x, w, 1, short)
    with pytest.raises(ValueError, match="grad_output state must be"):
        delayed(x, w, 1, state._replace(grad_output=None))


def test_emulated_accumulator_is_the_torch_paths():
    """With ``accumulate=`` both frameworks run fpsim.train.gemm.gemm on the same operands: the
    torch path as it ships (no matmul swapped) gives JAX's y, dx and dW, and they equal
    fpsim.matmul (accumulator=14, as the preset builds it) of fpsim.quantize's operands."""
    torch = pytest.importorskip("torch")
    import dataclasses

    from fpsim.train.torch import convert

    spec = G.ACCUMULATORS["hopper-fp8"]
    recipe = dataclasses.replace(GEMM_RECIPES["fp8-current"], name="fp8-acc", accumulate=spec)
    rng = np.random.default_rng(6)
    x, w, dy = _wide(rng, (24, 40)), _wide(rng, (8, 40)), _wide(rng, (24, 8))
    lin = torch.nn.Linear(40, 8, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(w))
    lin = convert(lin, recipe)
    xt = torch.tensor(x, requires_grad=True)
    yt = lin(xt)
    yt.backward(torch.tensor(dy))
    dense = linear(recipe)
    y, vjp = jax.jit(lambda x, w: jax.vjp(lambda x, w: dense(x, w, 1), x, w))(x, w)
    dx, dw = vjp(jnp.asarray(dy))
    assert _same(y, yt.detach().numpy()) and _same(dx, xt.grad.numpy()) and _same(dw, lin.weight.grad.numpy())
    q = lambda role, gemm, a: _q(recipe, role, gemm, a, "linear", 1)  # noqa: E731
    want = fpsim.matmul(q("input", Gemm.FPROP, x), q("weight", Gemm.FPROP, w).T, accumulator=14)
    assert _same(y, want)
    assert not _same(y, _mm(q("input", Gemm.FPROP, x), q("weight", Gemm.FPROP, w)))


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_steps_as_the_torch_path(algo, monkeypatch):
    """fp8-delayed, state carried as the gradient of the state argument: over 20 jitted training
    steps (the input's scale moving by powers of two, one step of zero gradient that must not
    roll the history) y, dx, dW, every role's amax history and scale equal the torch path's
    (its matmul swapped for np.matmul) and fpsim.DelayedScaling stepped here on the same
    tensors, bit for bit; y equals the matmul of those hand-stepped casts."""
    torch = pytest.importorskip("torch")
    from fpsim.train import linear as L
    from fpsim.train.torch import convert

    monkeypatch.setattr(L, "_gemm", lambda a, b, mod: torch.from_numpy(_mm(a, b)))
    recipe = G.fp8_delayed(history_len=4, amax_compute_algo=algo, margin=1)
    rng = np.random.default_rng(8)
    w = rng.standard_normal((16, 32)).astype(F32)
    lin = torch.nn.Linear(32, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(w))
    lin = convert(lin, recipe)
    dense, state = linear(recipe), init_state(recipe)
    ref = {r: recipe.operand(r).format.init() for r in G.ROLES}

    @jax.jit
    def step_fn(w, state, x, dy, step):
        y, vjp = jax.vjp(lambda x, w, state: dense(x, w, step, state), x, w, state)
        dx, dw, new_state = vjp(dy)
        return y, dx, dw, new_state

    def cast(role, a):
        pol = recipe.operand(role).format
        enc, ref[role] = pol.step(ref[role], a)
        return (fpsim.decode(enc.codes, pol.element) * enc.scales.view(F32)[0]).astype(F32)

    for step in range(1, 21):
        x = (rng.standard_normal((2, 8, 32)) * 2.0 ** (step % 6 - 3)).astype(F32)
        dy = rng.standard_normal((2, 8, 16)).astype(F32) * F32(step != 9)
        y, dx, dw, state = step_fn(w, state, x, dy, step)
        xt = torch.tensor(x, requires_grad=True)
        yt = lin(xt)
        yt.backward(torch.tensor(dy))
        assert _same(y, yt.detach().numpy()) and _same(dx, xt.grad.numpy()), step
        assert _same(dw, lin.weight.grad.numpy()), step
        qx, qw = cast("input", x.reshape(-1, 32)), cast("weight", w)
        cast("grad_output", dy.reshape(-1, 16))
        assert _same(np.asarray(y).reshape(-1, 16), _mm(qx, qw)), step
        for role, got in zip(G.ROLES, state):
            for want in (lin.delayed[role], ref[role]):
                assert _same(got.history, want.history) and _same(got.scale, F32(want.scale)), (step, role)
        w = w - F32(0.05) * np.asarray(dw)
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(w))
        lin.weight.grad = None
    assert all(float(st.scale) != 1.0 for st in state)  # the scales moved
    assert np.count_nonzero(np.asarray(state.grad_output.history)) >= 2


@pytest.mark.parametrize("name", ["fp8-current", "mxfp8"])
def test_vmap_runs_dense_per_batch_element(name):
    """jax.vmap of a jitted per-example gradient gives, per element, the bits of dense called on
    that element alone (fp8-current: each element its own per-tensor scale); delayed scaling
    is refused under vmap (its batched new states would be summed)."""
    rng = np.random.default_rng(9)
    xs, w = _wide(rng, (3, 8, 32)), _wide(rng, (16, 32))
    xs[1] *= F32(2.0**-20)  # another scale for the second element alone
    dense = linear(name)
    per_example = jax.jit(jax.vmap(jax.grad(lambda w, x: jnp.sum(dense(x, w, 1) ** 2)), in_axes=(None, 0)))
    got = np.asarray(per_example(w, xs))
    one = jax.jit(jax.grad(lambda w, x: jnp.sum(dense(x, w, 1) ** 2)))
    for i in range(3):
        assert _same(got[i], one(w, xs[i])), i
    assert not _same(got[1], got[0])
    delayed, state = linear("fp8-delayed"), init_state("fp8-delayed")
    with pytest.raises(NotImplementedError, match="vmap"):
        jax.vmap(lambda x: delayed(x, w, 1, state))(xs)
