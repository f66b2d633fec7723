"""fpsim.train.gemm and fpsim.train.linear: emulated low-precision GEMMs in a live loop.

Oracles are computed here, on the machine at hand: each GEMM output equals ``torch.matmul`` of
the operands that ``fpsim.quantize`` (or ``fpsim.DelayedScaling``) gives for the oriented
high-precision tensors, bit for bit (int32 views, zero tolerance); the delayed-scaling state
equals a transcription of Transformer Engine's update kernel; the presets are checked field by
field against TE's recipe definitions.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpsim  # noqa: E402
from fpsim.emulate.random import random_bits_at  # noqa: E402
from fpsim.train import gemm as G  # noqa: E402
from fpsim.train.gemm import GEMM_RECIPES, Gemm, GemmRecipe, OperandRecipe, operand_seed  # noqa: E402
from fpsim.train.torch import EmulatedLinear, convert, gemm_stats  # noqa: E402

F32 = np.float32


def _bits(t) -> np.ndarray:
    a = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    return np.ascontiguousarray(a, F32).view(np.int32)


def _mm(a: np.ndarray, b: np.ndarray) -> torch.Tensor:
    """The oracle GEMM: FP32 ``a @ b^T`` of two dequantized operands."""
    return torch.matmul(torch.tensor(a), torch.tensor(b).T)


def _wide(rng, shape) -> np.ndarray:
    """Values spread over many binades, so that blocks underflow and saturate differently."""
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-12, 6, shape))).astype(F32)


def _oracle_operand(recipe: GemmRecipe, role: str, gemm: Gemm, a: np.ndarray) -> np.ndarray:
    """fpsim.quantize of the oriented operand ``a`` under the recipe (RHT and words as TE's
    NVFP4 recipe asks, the words from operand_seed of the module "linear" at step 1), on the
    numpy reference tier."""
    op = recipe.operand(role)
    if op.hadamard and gemm is Gemm.WGRAD:
        a = G.hadamard16(a)
    kw = {}
    if op.stochastic:
        seed = operand_seed(recipe.seed, "linear", 1, gemm, role)
        kw = {"rounding": "stochastic", "random_bits": random_bits_at(seed, 0, a.size).reshape(a.shape)}
    return np.asarray(fpsim.quantize(np.ascontiguousarray(a), op.format, backend="numpy", **kw))


def test_presets_follow_transformer_engines_recipes():
    """transformer_engine/common/recipe/__init__.py: Float8CurrentScaling and DelayedScaling
    HYBRID (E4M3 forward, E5M2 backward); Float8BlockScaling E4M3 with 1x128 x / grad and
    128x128 weights, power-of-two scales; MXFP8BlockScaling E4M3 1x32 with E8M0 scales;
    NVFP4BlockScaling: 2-D 16x16 weights, stochastic rounding and RHT of the gradient, RHT of
    the input (wgrad only)."""
    cur = GEMM_RECIPES["fp8-current"]
    assert (cur.input.format.name, cur.weight.format.name, cur.grad_output.format.name) == (
        "e4m3_tensor", "e4m3_tensor", "e5m2_tensor",
    )  # fmt: skip
    d = GEMM_RECIPES["fp8-delayed"]
    assert [d.operand(r).format.element for r in G.ROLES] == ["float8_e4m3fn"] * 2 + ["float8_e5m2"]
    assert all((d.operand(r).format.history_len, d.operand(r).format.margin) == (1024, 0) for r in G.ROLES)
    blk = GEMM_RECIPES["fp8-block"]
    for role, block in (("input", (128,)), ("weight", (128, 128)), ("grad_output", (128,))):
        f = blk.operand(role).format
        assert (f.block, f.pow2, f.element.name, f.rule) == (block, True, "float8_e4m3fn", fpsim.ScaleRule.TE)
    for role in G.ROLES:
        f = GEMM_RECIPES["mxfp8"].operand(role).format
        assert (f.block, f.rule, f.element.name, f.scale_format.name) == (
            (32,), fpsim.ScaleRule.MX_RCEIL, "float8_e4m3fn", "float8_e8m0fnu",
        )  # fmt: skip
    nv = GEMM_RECIPES["nvfp4"]
    assert [nv.operand(r).format.block for r in G.ROLES] == [(16,), (16, 16), (16,)]
    assert [(nv.operand(r).stochastic, nv.operand(r).hadamard) for r in G.ROLES] == [
        (False, True), (False, False), (True, True),
    ]  # fmt: skip
    assert all(nv.operand(r).format.rule is fpsim.ScaleRule.NVFP4 for r in G.ROLES)
    assert GEMM_RECIPES["bf16"].input.format.name == "bfloat16"


def _backends() -> list[str]:
    from fpsim._compiled import available

    return ["numpy", "compiled"] if available() else ["numpy"]


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("name", ["bf16", "fp8-current", "fp8-block", "mxfp8", "nvfp4"])
def test_one_linear_equals_matmuls_of_quantized_operands(name, backend):
    """y, dx and dW equal FP32 matmuls of what fpsim.quantize gives for x, W, dy oriented with
    each GEMM's contraction axis last, bit for bit; the bias and its gradient in FP32."""
    recipe = GEMM_RECIPES[name]
    rng = np.random.default_rng(1)
    x, w, b = _wide(rng, (4, 16, 64)), _wide(rng, (32, 64)), rng.standard_normal(32).astype(F32)
    dy = _wide(rng, (4, 16, 32))
    lin = torch.nn.Linear(64, 32)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(w))
        lin.bias.copy_(torch.tensor(b))
    lin = convert(lin, recipe, backend=backend)
    assert isinstance(lin, EmulatedLinear)
    xt = torch.tensor(x, requires_grad=True)
    y = lin(xt)
    y.backward(torch.tensor(dy))

    x2, dy2 = x.reshape(-1, 64), dy.reshape(-1, 32)
    q = lambda role, gemm, a: _oracle_operand(recipe, role, gemm, a)  # noqa: E731
    y_ref = _mm(q("input", Gemm.FPROP, x2), q("weight", Gemm.FPROP, w)) + torch.tensor(b)
    dx_ref = _mm(q("grad_output", Gemm.DGRAD, dy2), q("weight", Gemm.DGRAD, w.T))
    dw_ref = _mm(q("grad_output", Gemm.WGRAD, dy2.T), q("input", Gemm.WGRAD, x2.T))
    assert np.array_equal(_bits(y).reshape(-1, 32), _bits(y_ref))
    assert np.array_equal(_bits(xt.grad).reshape(-1, 64), _bits(dx_ref))
    assert np.array_equal(_bits(lin.weight.grad), _bits(dw_ref))
    assert np.array_equal(_bits(lin.bias.grad), _bits(torch.tensor(dy2).sum(0)))
    # the emulation changes the numbers (so the comparison above can fail)
    assert not np.array_equal(_bits(y).reshape(-1, 32), _bits(_mm(x2, w) + torch.tensor(b)))


_OPERANDS = [
    (name, role, gemm)
    for name in ("bf16", "fp8-current", "fp8-block", "mxfp8", "nvfp4")
    for role, gemms in (("input", "fw"), ("weight", "fd"), ("grad_output", "dw"))
    for gemm in (g for g in Gemm if g.value[0] in gemms)
]


@pytest.mark.parametrize(("name", "role", "gemm"), _OPERANDS, ids=lambda v: getattr(v, "value", v))
def test_each_operand_on_each_backend_is_fpsim_quantize(name, role, gemm):
    """quantize_operand (the Hadamard transform and the words as EmulatedLinear makes them)
    equals fpsim.quantize on the numpy tier, on ragged shapes holding NaNs of every kind (by
    class), infinities and zeros; the compiled backend included."""
    from oracles import with_nans

    recipe = GEMM_RECIPES[name]
    rng = np.random.default_rng(5)
    for shape in ((37, 80), (130, 48), (3, 16)):
        a = with_nans(_wide(rng, shape).reshape(-1), start=3).reshape(shape)
        a.reshape(-1)[:3] = [np.inf, -np.inf, 0.0]
        want = _oracle_operand(recipe, role, gemm, a)
        lin = convert(torch.nn.Linear(16, 16), recipe)
        for backend in _backends():
            lin.backend = fpsim.Backend(backend)
            got = lin._quantize(a, recipe, role, gemm, 1, False)[0]
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(got), nan), (backend, shape)
            assert np.array_equal(_bits(got)[~nan], _bits(want)[~nan]), (backend, shape)


def test_the_transpose_is_quantized_from_high_precision():
    """Under MXFP8 the wgrad operand x^T is quantized in blocks of tokens from x itself, which
    differs from transposing x's fprop quantization (TE issue 1490)."""
    rng = np.random.default_rng(2)
    x2 = _wide(rng, (64, 64))
    fmt = GEMM_RECIPES["mxfp8"].input.format
    wgrad = np.asarray(fpsim.quantize(np.ascontiguousarray(x2.T), fmt))
    assert not np.array_equal(wgrad, np.asarray(fpsim.quantize(x2, fmt)).T)
    requantized = np.asarray(fpsim.quantize(np.ascontiguousarray(np.asarray(fpsim.quantize(x2, fmt)).T), fmt))
    assert not np.array_equal(wgrad, requantized)


def _te_kernel_bulk(history: np.ndarray, scale: F32, fp8_max: float, margin: int, algo: str):
    """A transcription of ``kernel_bulk`` in transformer_engine/common/recipe/delayed_scaling.cu
    (TE's default amax-and-scale update, one tensor, no reduction buffer): roll the history
    when its newest amax is nonzero, take the window's max (or the newest), rescale."""
    length = history.size
    h = history.copy()
    last_amax = h[0]
    amax = F32(0)
    if last_amax != F32(0):
        out = h.copy()
        for i in range(length):
            a = h[i + 1] if i < length - 1 else last_amax
            amax = np.fmax(amax, a)
            out[i] = a if i > 0 else F32(0)
        h = out
    if algo == "most_recent":
        amax = last_amax
    scaled_max = F32(F32(fp8_max) * F32(2.0**-margin))
    if np.isfinite(amax) and amax > 0:
        scale = F32(scaled_max / amax)
    if np.isinf(scale):
        scale = np.finfo(F32).max
    return h, F32(scale)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_follows_te_for_50_steps(algo):
    """fp8-delayed: after each of 50 steps, each role's amax history and scale equal TE's update
    (the amax of the step max-ed into slot 0, then kernel_bulk) fed with the amaxes computed
    here; a step of zero input exercises the branch that does not roll. Each step's y, dx, dW
    equal matmuls of fpsim.DelayedScaling's casts (stepped here) bit for bit."""
    recipe = G.fp8_delayed(history_len=8, amax_compute_algo=algo, margin=1)
    rng = np.random.default_rng(3)
    lin = convert(torch.nn.Linear(32, 16, bias=False), recipe)
    te = {r: (np.zeros(8, F32), F32(1)) for r in G.ROLES}
    maxes = {"input": 448.0, "weight": 448.0, "grad_output": 57344.0}
    ref = {r: (recipe.operand(r).format, recipe.operand(r).format.init()) for r in G.ROLES}

    def cast(role, a):
        pol, st = ref[role]
        enc, new = pol.step(st, a)
        ref[role] = (pol, new)
        return (fpsim.decode(enc.codes, pol.element) * enc.scales.view(F32)[0]).astype(F32)

    for step in range(50):
        x = (rng.standard_normal((16, 32)) * 2.0 ** (step % 7 - 3)).astype(F32)
        if step == 20:
            x[:] = 0
        dy = (rng.standard_normal((16, 16)) * 2.0 ** -(step % 5)).astype(F32)
        w = lin.weight.detach().numpy().copy()
        xt = torch.tensor(x, requires_grad=True)
        y = lin(xt)
        y.backward(torch.tensor(dy))
        for role, a in (("input", x), ("weight", w), ("grad_output", dy)):
            h, s = te[role]
            h = h.copy()
            h[0] = np.fmax(h[0], np.abs(a).max())
            te[role] = _te_kernel_bulk(h, s, maxes[role], 1, algo)
            got = lin.delayed[role]
            assert np.array_equal(got.history.view(np.int32), te[role][0].view(np.int32)), (step, role)
            assert F32(got.scale).view(np.int32) == te[role][1].view(np.int32), (step, role)
        qx, qw, qg = cast("input", x), cast("weight", w), cast("grad_output", dy)
        assert np.array_equal(_bits(y), _bits(_mm(qx, qw)))
        assert np.array_equal(_bits(xt.grad), _bits(_mm(qg, np.ascontiguousarray(qw.T))))
        assert np.array_equal(_bits(lin.weight.grad), _bits(_mm(np.ascontiguousarray(qg.T), qx.T.copy())))
        with torch.no_grad():
            lin.weight -= 0.05 * lin.weight.grad
        lin.weight.grad = None
    assert all(lin.delayed[r].scale != 1.0 for r in G.ROLES)  # the scales moved


def test_hadamard16_is_tes_random_hadamard_transform():
    """hadamard16 equals v @ (diag(s) H16) / 4 with H16 built by Sylvester's construction and s
    TE's sign vector (reference_nvfp4.py, get_wgrad_sign_vector), on inputs whose float64
    products and sums are exact (so every order gives the same, correctly rounded, result)."""
    signs = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float64)
    h = np.ones((1, 1))
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]])
    t = np.diag(signs) @ h / 4
    rng = np.random.default_rng(4)
    a = (rng.integers(-(2**20), 2**20, (8, 48)) * 2.0 ** rng.integers(-20, 0, (8, 48))).astype(F32)
    want = (a.astype(np.float64).reshape(-1, 16) @ t).astype(F32).reshape(a.shape)
    got = G.hadamard16(a)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    assert not np.array_equal(got, a)
    # orthogonal: the transform of a transform is the input back (up to rounding)
    back = (got.astype(np.float64).reshape(-1, 16) @ t.T).reshape(a.shape)
    assert np.allclose(back, a, rtol=0, atol=1e-6 * np.abs(a).max())
    with pytest.raises(ValueError, match="divisible by 16"):
        G.hadamard16(np.zeros((2, 24), F32))


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def test_module_selection_by_pattern_and_ends():
    m = convert(_mlp(), "fp8-current", modules=["2", "4"])
    assert [type(m[i]).__name__ for i in (0, 2, 4)] == ["Linear", "EmulatedLinear", "EmulatedLinear"]
    m = convert(_mlp(), "mxfp8", keep_first_last=True)
    assert [isinstance(m[i], EmulatedLinear) for i in (0, 2, 4)] == [False, True, False]
    m = convert(_mlp(), "bf16")
    assert all(isinstance(m[i], EmulatedLinear) for i in (0, 2, 4)) and m[2].name == "2"
    # the parameters are the same objects: an optimizer made before still trains them
    plain = _mlp()
    params = list(plain.parameters())
    convert(plain, "fp8-current")
    assert [id(p) for p in plain.parameters()] == [id(p) for p in params]
    assert set(plain.state_dict()) == set(_mlp().state_dict())
    with pytest.raises(ValueError, match="pattern 'head\\*' matches no nn.Linear"):
        convert(_mlp(), "bf16", modules="head*")
    with pytest.raises(ValueError, match="already converted: 0, 2, 4"):
        convert(m, "bf16")


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="unknown GEMM recipe 'fp8'; presets: bf16, fp8-current"):
        convert(_mlp(), "fp8")
    with pytest.raises(ValueError, match="not blocks of the flattened tensor"):
        OperandRecipe(fpsim.RECIPES["int8_block256"])
    with pytest.raises(TypeError, match="must be a Format, BlockFormat or DelayedScaling"):
        OperandRecipe("float8_e4m3fn")
    nv = GEMM_RECIPES["nvfp4"]
    with pytest.raises(ValueError, match="not to the weight"):
        GemmRecipe("x", nv.input, OperandRecipe(nv.input.format, hadamard=True), nv.grad_output)
    with pytest.raises(ValueError, match="stochastic rounding with delayed scaling is not emulated"):
        OperandRecipe(fpsim.DelayedScaling(), stochastic=True)
    strict = fpsim.BlockFormat("mx_strict", fpsim.FORMATS["float8_e4m3fn"], (32,), fpsim.ScaleRule.MX_RCEIL,
                               fpsim.FORMATS["float8_e8m0fnu"], pad=False)  # fmt: skip
    op = OperandRecipe(strict)
    with pytest.raises(
        ValueError, match=r"2: weight in dgrad \(64, 48\).*length 48, not a multiple of the block 32"
    ):
        convert(torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48)),
                GemmRecipe("strict", op, op, op), modules="2")  # fmt: skip
    lin = convert(torch.nn.Linear(32, 16), "nvfp4")
    with pytest.raises(ValueError, match=r"linear: grad_output in wgrad \(16, 24\).*divisible by 16"):
        lin(torch.randn(24, 32)).sum().backward()
    with pytest.raises(ValueError, match="float32 inputs and weights, got torch.float64"):
        lin(torch.randn(16, 32, dtype=torch.float64))


def test_statistics_per_operand_and_step(monkeypatch):
    """stats=True: one record per GEMM operand and step; underflow (-0 as zero), saturation,
    amax, scale-inverse range and MSE recomputed here from fpsim.quantize's output; with
    stats=False the statistics code never runs."""
    mx = fpsim.RECIPES["mxfp8_e4m3"]  # the OCP floor rule saturates block maxima
    op = OperandRecipe(mx)
    recipe = GemmRecipe("mx-floor", op, op, op)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 64)).astype(F32)
    x[0, :4] = [500.0, 1e-9, -0.0, -1e-10]
    lin = convert(torch.nn.Linear(64, 32), recipe, stats=True)
    for _ in range(2):
        lin(torch.tensor(x)).sum().backward()
    rows = gemm_stats(lin)
    assert [(r["step"], r["gemm"], r["role"]) for r in rows[:6]] == [
        (1, "fprop", "input"), (1, "fprop", "weight"), (1, "dgrad", "grad_output"),
        (1, "dgrad", "weight"), (1, "wgrad", "grad_output"), (1, "wgrad", "input"),
    ]  # fmt: skip
    assert len(rows) == 12 and {r["step"] for r in rows} == {1, 2}
    r = rows[0]
    enc = fpsim.encode(x, mx)
    q = np.asarray(fpsim.decode(enc, mx))
    scales = np.asarray(fpsim.decode(enc.scales, "float8_e8m0fnu"), np.float64)
    el = np.abs(np.asarray(fpsim.decode(enc.codes, "float8_e4m3fn")))
    assert r["numel"] == x.size and r["amax"] == 500.0
    assert r["underflow_pct"] == 100 * np.count_nonzero((x != 0) & (q == 0)) / x.size > 0
    sat = np.count_nonzero((el == 448) & (np.abs(x) > np.abs(q)))
    assert r["saturated_pct"] == 100 * sat / x.size > 0
    assert (r["scale_inv_min"], r["scale_inv_max"]) == (scales.min(), scales.max())
    assert r["mse"] == np.mean((x.astype(np.float64) - q) ** 2)

    def boom(*a, **k):
        raise AssertionError("statistics computed with stats=False")

    monkeypatch.setattr(G, "operand_stats", boom)
    for name in ("fp8-current", "fp8-delayed", "nvfp4"):
        quiet = convert(torch.nn.Linear(64, 32), name)
        quiet(torch.tensor(x)).sum().backward()
        assert quiet.gemm_stats == []


@pytest.mark.parametrize("name", list(GEMM_RECIPES))
def test_a_short_training_loop_runs_under_each_recipe(name):
    """30 steps of an MLP with torch.optim.Adam on converted layers: finite losses, and under
    bf16 and fp8-current a loss that falls as FP32's does, by a different path."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 32, generator=g), torch.randint(0, 10, (64,), generator=g)

    def run(model):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(30):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    losses = run(convert(_mlp(), name))
    assert all(math.isfinite(v) for v in losses)
    if name in ("bf16", "fp8-current"):
        fp32 = run(_mlp())
        assert losses[-1] < 0.1 * losses[0] and fp32[-1] < 0.1 * fp32[0]
        assert losses != fp32


def test_what_if_statistics_equal_those_of_training_with_that_recipe():
    """what_if=: on the same operands (fixed weights, given x and dy), the statistics recorded
    for a what-if recipe equal those of a layer trained with it (stochastic rounding, the
    Hadamard transform and delayed states included), step by step; the trained recipe's own
    rows are unchanged by the what-ifs."""
    rng = np.random.default_rng(6)
    lin = torch.nn.Linear(64, 32)
    data = [(_wide(rng, (32, 64)), _wide(rng, (32, 32))) for _ in range(3)]

    def run(recipe, **kw):
        layer = convert(torch.nn.Linear(64, 32), recipe, stats=True, **kw)
        layer.load_state_dict(lin.state_dict())
        for x, dy in data:
            layer(torch.tensor(x)).backward(torch.tensor(dy))
        return gemm_stats(layer)

    both = run("fp8-current", what_if=["nvfp4", "fp8-delayed", "mxfp8"])
    for name in ("fp8-current", "nvfp4", "fp8-delayed", "mxfp8"):
        mine = [r for r in both if r["recipe"] == name]
        alone = run(name)
        assert len(mine) == len(alone) == 18
        key = lambda r: (r["step"], r["gemm"], r["role"])  # noqa: E731
        assert sorted(mine, key=key) == sorted(alone, key=key), name
    with pytest.raises(ValueError, match="what_if records statistics only"):
        convert(torch.nn.Linear(64, 32), "bf16", what_if=["mxfp8"])
    with pytest.raises(ValueError, match="distinct names"):
        convert(torch.nn.Linear(64, 32), "bf16", stats=True, what_if=["bf16"])


def test_emulated_accumulator_is_fpsim_matmul():
    """accumulate=ACCUMULATORS["hopper-fp8-promoted"]: each GEMM equals fpsim.matmul of the
    quantized operands with a 14-bit accumulator promoted to FP32 every 128 products, bit for
    bit, and differs from the FP32 GEMM; stochastic accumulation is refused."""
    import dataclasses

    recipe = dataclasses.replace(
        GEMM_RECIPES["fp8-current"], name="hopper", accumulate=G.ACCUMULATORS["hopper-fp8-promoted"]
    )
    rng = np.random.default_rng(7)
    x, w, dy = _wide(rng, (32, 256)), rng.standard_normal((144, 256)).astype(F32), _wide(rng, (32, 144))
    lin = torch.nn.Linear(256, 144, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(w))
    lin = convert(lin, recipe)
    xt = torch.tensor(x, requires_grad=True)
    y = lin(xt)
    y.backward(torch.tensor(dy))
    q = lambda role, gemm, a: _oracle_operand(recipe, role, gemm, a)  # noqa: E731
    acc = {"accumulator": 14, "promote_every": 128}
    qx, qw = q("input", Gemm.FPROP, x), q("weight", Gemm.FPROP, w)
    y_ref = fpsim.matmul(qx, qw.T, **acc)
    dx_ref = fpsim.matmul(q("grad_output", Gemm.DGRAD, dy), q("weight", Gemm.DGRAD, w.T).T, **acc)
    dw_ref = fpsim.matmul(q("grad_output", Gemm.WGRAD, dy.T), q("input", Gemm.WGRAD, x.T).T, **acc)
    assert np.array_equal(_bits(y), _bits(y_ref))
    assert np.array_equal(_bits(xt.grad), _bits(dx_ref))
    assert np.array_equal(_bits(lin.weight.grad), _bits(dw_ref))
    assert not np.array_equal(_bits(y), _bits(_mm(qx, qw)))
    stochastic = fpsim.accumulate.AccumulatorSpec.build(accumulator=14, rounding="stochastic", seed=1)
    with pytest.raises(ValueError, match="stochastic rounding in the accumulator is not emulated"):
        dataclasses.replace(recipe, accumulate=stochastic)


def _pow2_with_nans(rng, shape) -> np.ndarray:
    """Signed powers of two over 160 binades (float32 subnormals included), zeros of both
    signs, infinities and every signaling/quiet NaN pattern of tests/oracles."""
    from tests.oracles import with_nans

    x = np.ldexp(rng.choice([-1.0, 1.0], shape), rng.integers(-140, 20, shape)).astype(F32)  # exact
    x.reshape(-1)[rng.choice(x.size, x.size // 8, replace=False)] = rng.choice([0.0, -0.0], x.size // 8)
    x.reshape(-1)[[5, 700]] = [np.inf, -np.inf]
    return with_nans(x, start=3, spacing=29)


def _dynamic_range_oracle(x: np.ndarray, block: tuple[int, int]) -> float:
    """Per block, log2(max) - log2(min) over its finite nonzero powers of two (frexp's exact
    exponents, Python floats), the largest over the blocks."""
    best, (br, bc) = 0, block
    for i in range(0, x.shape[0], br):
        for j in range(0, x.shape[1], bc):
            vals = [abs(float(v)) for v in x[i : i + br, j : j + bc].ravel() if math.isfinite(v) and v != 0]
            if vals:
                best = max(best, math.frexp(max(vals))[1] - math.frexp(min(vals))[1])
    return float(best)


def test_block_dynamic_range_and_amax_with_nans_and_infinities():
    """max_block_dynamic_range over each recipe's blocks (1x32 and 1x128 along the contraction
    axis, ragged; 16x16 and 128x128 tiles; the whole tensor for per-tensor, delayed and
    element formats) equals a per-block Python computation on exact powers of two; the amax
    skips every NaN pattern (signaling ones included) and counts infinities."""
    rng = np.random.default_rng(11)
    x = _pow2_with_nans(rng, (48, 80))
    finite = [abs(float(v)) for v in x.ravel() if not math.isnan(v)]
    backend = fpsim.Backend.resolve("auto")
    whole = x.shape
    cases = [
        (GEMM_RECIPES["mxfp8"].input, (1, 32)),
        (GEMM_RECIPES["fp8-block"].input, (1, 128)),
        (GEMM_RECIPES["fp8-block"].weight, (128, 128)),
        (GEMM_RECIPES["nvfp4"].weight, (16, 16)),
        (GEMM_RECIPES["fp8-current"].input, whole),
        (GEMM_RECIPES["bf16"].input, whole),
    ]
    for op, block in cases:
        with np.errstate(all="ignore"):
            _, st = G.quantize_operand(x, op, backend, stats=True)
        assert st.max_block_dynamic_range == _dynamic_range_oracle(x, block) > 0, op.name
        assert st.amax == max(finite) == math.inf, op.name
    policy = GEMM_RECIPES["fp8-delayed"].input.format
    y = np.where(np.isinf(x), F32(3.0), x)  # a finite amax for the delayed history
    with np.errstate(all="ignore"):
        _, _, st = G.delayed_cast(y, policy, policy.init(), stats=True)
    assert st.max_block_dynamic_range == _dynamic_range_oracle(y, whole)
    assert st.amax == max(abs(float(v)) for v in y.ravel() if not math.isnan(v))
    assert G.max_block_dynamic_range(np.zeros((4, 32), F32), GEMM_RECIPES["mxfp8"].input.format) == 0.0
    with pytest.raises(TypeError, match="float32"):
        G.max_block_dynamic_range(np.ones(4))


def test_saturated_is_tes_overflow_count_under_per_tensor_scaling():
    """``saturated_pct`` counts what TE's ``overflows%`` counts: elements above
    ``f32(max * scale_inv)``, the scale ``f32(448 / amax)`` and ``scale_inv = f32(1 / scale)``
    computed here in float32 as TE's current scaling does; the tensor's own amax element among them
    when that product rounds below it (so the count is not always zero on in-range data)."""
    op = G.resolve_recipe("fp8-current").operand("input")
    rng = np.random.default_rng(0)
    amax_counted = 0
    for i in range(64):
        a = (rng.standard_normal((8, 16)) * (1 + i)).astype(np.float32)
        _, st = G.quantize_operand(a, op, fpsim.Backend.NUMPY, stats=True)
        amax = np.float32(np.abs(a).max())
        scale_inv = np.float32(1) / (np.float32(448) / amax)
        expected = np.count_nonzero(np.abs(a) > np.float32(448) * scale_inv)
        assert st.saturated_pct == expected * 100.0 / a.size, (i, st.saturated_pct, expected)
        amax_counted += expected > 0
    assert 0 < amax_counted < 64
