"""Operand statistics on the compiled backend (one fused quantize pass and one tally pass,
fpsim.train.opstats.fused_stats) against the numpy tier (the unfused encode and decode and
numpy's operand_stats, themselves tested against TE's formulas in test_gemm.py): every field
equal (NaN by class), the values equal bit for bit (NaN by class).

Every operand of every preset recipe, nearest and (where the recipe rounds so) stochastic
with given words and with words drawn inside the loop, the wgrad Hadamard transform where the
recipe has it, fp8-delayed over two steps; odd shapes with ragged blocks and tiles; inputs
holding zeros, -0, subnormals, values beyond every format's range, infinities and every NaN
pattern of tests/oracles. Then a converted model records the same gemm_stats on both.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fpsim import Backend
from fpsim.emulate import fused
from fpsim.emulate.delayed import DelayedScaling
from fpsim.formats import RoundMode
from fpsim.train import gemm as G
from fpsim.train.opstats import OperandStats, _scale_summary, fused_stats
from tests.oracles import with_nans

pytest.importorskip("numba")
torch = pytest.importorskip("torch")

from fpsim.train.torch import convert, gemm_stats  # noqa: E402

SHAPES = [(1, 1), (3, 37), (33, 65), (128, 96)]
H_SHAPES = [(1, 16), (3, 48), (33, 80), (128, 96)]  # the Hadamard transform takes 16 | columns


def _inputs(shape: tuple[int, int], seed: int, finite: bool = False) -> np.ndarray:
    """Normal draws times exact powers of two over 40 binades, with zeros, -0, subnormals,
    values beyond every format's range (float32's largest, 2**100) and, unless ``finite``,
    infinities and the NaN patterns of tests/oracles spread over the blocks."""
    rng = np.random.default_rng(seed)
    x = np.ldexp(rng.standard_normal(shape).astype(np.float32), rng.integers(-20, 20, shape)).astype(
        np.float32
    )
    flat = x.reshape(-1)
    special = [0.0, -0.0, 1e-45, -3e-42, 1.1754942e-38, 3.4028235e38, -(2.0**100), 448.0, -6.0]
    special += [] if finite else [np.inf, -np.inf]
    k = min(len(special), -(-flat.size // 29))
    flat[::29][:k] = np.array(special, np.float32)[:k]
    if shape[0] > 4 and shape[1] > 8:
        x[1, :] = -0.0  # a block of zeros: zero scales
        x[2, :] = np.float32(1e-40) * np.arange(shape[1], dtype=np.float32)  # subnormal results
    return x if finite else with_nans(x, start=5, spacing=31)


def _same_values(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32, what
    nan = np.isnan(got)
    assert np.array_equal(nan, np.isnan(want)), f"{what}: NaN positions differ"
    bad = np.flatnonzero(got[~nan].view(np.uint32) != want[~nan].view(np.uint32))
    assert bad.size == 0, f"{what}: {bad.size} values differ"


def _same_stats(got: OperandStats, want: OperandStats, what: str) -> None:
    """Every field equal with ==, or both NaN."""
    assert type(got.numel) is int and got.numel == want.numel, what
    for f in dataclasses.fields(OperandStats):
        g, w = getattr(got, f.name), getattr(want, f.name)
        assert g == w or (math.isnan(g) and math.isnan(w)), f"{what}: {f.name} {g!r} != {w!r}"


def _both(what: str, fn, *args, **kwargs) -> OperandStats:
    """``fn(*args, backend=..., stats=True, **kwargs)`` on numpy and compiled: values and
    statistics compared; numpy's statistics returned."""
    with np.errstate(all="ignore"):
        (qn, sn), (qc, sc) = (
            fn(*args, backend=b, stats=True, **kwargs) for b in (Backend.NUMPY, Backend.COMPILED)
        )
    _same_values(qc, qn, what)
    _same_stats(sc, sn, what)
    return sn


@pytest.mark.parametrize("name", [n for n in G.GEMM_RECIPES if n != "fp8-delayed"])
def test_compiled_statistics_equal_the_numpy_tiers(name: str) -> None:
    recipe, seen = G.GEMM_RECIPES[name], []
    for role in G.ROLES:
        op = recipe.operand(role)
        plain = dataclasses.replace(op, stochastic=False, hadamard=False)
        for shape in SHAPES:
            what = f"{name} {role} {shape}"
            for finite in (False, True):
                x = _inputs(shape, shape[0] + len(role), finite)
                seen.append(_both(what, G.quantize_operand, x, plain))
            if op.stochastic:  # given words
                words = np.random.default_rng(3).integers(0, 1 << 32, shape, dtype=np.uint32)
                seen.append(_both(what, G.quantize_operand, x, op, random_bits=words))
            for g in G.ROLE_GEMMS[role]:  # the layer's path: Hadamard, words drawn from the operand seed
                s = H_SHAPES[SHAPES.index(shape)] if op.hadamard and g is G.Gemm.WGRAD else shape
                y = _inputs(s, s[1])
                seen.append(_both(f"{what} {g.value} {s}", G.module_operand, y, recipe, role, g, "fc", 7))
    # the data exercise every count (a comparison of zeros would prove little); MX_RCEIL takes
    # the power of two at or above amax / 448, so no finite element of an MXFP8 block saturates
    assert max(s.saturated_pct for s in seen) > 0 or name == "mxfp8"
    assert max(s.underflow_pct for s in seen) > 0
    assert max(s.max_block_dynamic_range for s in seen) > 0
    assert any(math.isfinite(s.mse) and s.mse > 0 for s in seen)


def test_compiled_delayed_statistics_equal_the_numpy_tiers() -> None:
    for role in G.ROLES:
        policy = G.GEMM_RECIPES["fp8-delayed"].operand(role).format
        assert isinstance(policy, DelayedScaling)
        for shape in SHAPES:
            states = {b: policy.init() for b in Backend}
            for step in range(3):  # scale 1, then scales from the history
                x = _inputs(shape, step, finite=step < 2)
                what = f"fp8-delayed {role} {shape} step {step}"
                with np.errstate(all="ignore"):
                    out = {b: G.delayed_cast(x, policy, states[b], stats=True, backend=b) for b in Backend}
                (qn, states[Backend.NUMPY], sn), (qc, states[Backend.COMPILED], sc) = out.values()
                _same_values(qc, qn, what)
                _same_stats(sc, sn, what)
                assert states[Backend.NUMPY].scale == states[Backend.COMPILED].scale, what


def test_an_empty_operand_has_the_same_statistics_on_both_backends() -> None:
    """No elements: numel 0, the dynamic range 0, the other fields NaN, on either backend."""
    a = np.zeros((0, 32), np.float32)
    for name, recipe in G.GEMM_RECIPES.items():
        for role in G.ROLES:
            op = recipe.operand(role)
            if isinstance(op.format, DelayedScaling):
                out = [G.delayed_cast(a, op.format, op.format.init(), stats=True, backend=b) for b in Backend]
                (qn, _, sn), (qc, _, sc) = out
                _same_values(qc, qn, f"{name} {role}")
                _same_stats(sc, sn, f"{name} {role}")
            else:  # _both compares the two backends' values and statistics
                sn = _both(name, G.module_operand, a, recipe, role, G.Gemm.FPROP, "fc", 1)
            assert sn.numel == 0 and sn.max_block_dynamic_range == 0.0 and math.isnan(sn.mse), name


def test_the_comparison_sees_a_wrong_count_and_a_wrong_at_max_mark(monkeypatch) -> None:
    """One saturated element more, or the at-max marks of the element codes lost, is seen."""
    op = G.GEMM_RECIPES["nvfp4"].weight
    x = _inputs((33, 65), 1)
    with np.errstate(all="ignore"):
        _, want = G.quantize_operand(x, op, Backend.NUMPY, stats=True)
        q, tally = fused.quantize_tally(x, op.format, RoundMode.NEAREST_EVEN)
    assert want.saturated_pct > 0
    _same_stats(fused_stats(tally), want, "as computed")
    wrong = fused_stats(dataclasses.replace(tally, saturated=tally.saturated + 1))
    with pytest.raises(AssertionError, match="saturated_pct"):
        _same_stats(wrong, want, "one more")
    monkeypatch.setattr(fused, "at_max_codes", lambda el, largest: np.full(2, 2**64 - 1, np.uint64))
    fused._PLANS.clear()
    try:
        with np.errstate(all="ignore"):
            _, lost = G.quantize_operand(x, op, Backend.COMPILED, stats=True)
    finally:
        fused._PLANS.clear()
    assert lost.saturated_pct == 0 and want.saturated_pct > 0


def test_a_converted_model_records_the_same_statistics_on_both_backends() -> None:
    def rows(recipe: str, backend: Backend) -> list[dict]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(48, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
        model = convert(net, recipe, stats=True, backend=backend)
        x = torch.tensor(_inputs((32, 48), 5, finite=True)) * 1e-3
        x[0, 0] = 300.0
        for _ in range(2):
            model(x).square().sum().backward()
        return gemm_stats(model)

    for name in G.GEMM_RECIPES:
        want, got = rows(name, Backend.NUMPY), rows(name, Backend.COMPILED)
        assert len(got) == len(want) == 24, name
        for g, w in zip(got, want):
            assert g.keys() == w.keys(), name
            for k in g:
                same = g[k] == w[k] or (isinstance(g[k], float) and math.isnan(g[k]) and math.isnan(w[k]))
                assert same, f"{name} {g['module']} {g['gemm']} {g['role']} {k}: {g[k]!r} != {w[k]!r}"


def test_one_scale_is_summarized_as_numpy_summarizes_it() -> None:
    """Per-tensor scaling's single scale is read off directly; numpy's min (over the nonzero
    ones), max and std of that one-element array give the same numbers."""
    values = [0.0, -0.0, 5e-324, 1.5, 3.4028234663852886e38, 1e308, math.inf, math.nan]
    for v in values:
        s = np.array([v])
        with np.errstate(invalid="ignore"):
            nz = s[s != 0]
            want = (float(nz.min()) if nz.size else 0.0, float(s.max()), float(s.std()))
        got = _scale_summary(s)
        for g, w in zip(got, want):
            assert (g == w and math.copysign(1, g) == math.copysign(1, w)) or (
                math.isnan(g) and math.isnan(w)
            ), v


def test_tally_refuses_what_it_cannot_count() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match="float32 arrays of one shape"):
        fused.tally(x, np.zeros((3, 2), np.float32))
    with pytest.raises(TypeError, match="float32 arrays of one shape"):
        fused.tally(x.astype(np.float64), x)
    with pytest.raises(TypeError, match="unsigned codes of shape"):
        fused.tally(x, x, codes=np.zeros((2, 3), np.int8), at_max=np.zeros(2, np.uint64))
    with pytest.raises(TypeError, match="unsigned codes of shape"):
        fused.tally(x, x, codes=np.zeros((2, 3), np.uint8))
