"""Tests of fpsim.accumulate: hand-worked cases, every setting against an independent exact
reference (tests/oracles/accumulate.py), consistency of sum / dot / matmul, block-scaled GEMMs
computed by hand, lost-addend counts, metrics and errors."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from oracles.accumulate import reduce_ref, round_frac

import fpsim.accumulate as fa
from fpsim import FORMATS, BlockFormat, RoundMode, ScaleRule, decode, get_format
from fpsim.accumulate import _accumulator, verbs
from fpsim.emulate.blocks import encode_blocks
from fpsim.emulate.reference import decode_scalar

MODES = [m.value for m in RoundMode]
F32, F16, BF16 = FORMATS["float32"], FORMATS["float16"], FORMATS["bfloat16"]
P14 = replace(F32, name="float32_p14", mantissa_bits=13)
P16 = replace(F32, name="float32_p16", mantissa_bits=15)


def frac(x) -> Fraction:
    return Fraction(float(x))


def spread_f32(rng, shape, lo=-8, hi=8) -> np.ndarray:
    """float32 values with full 24-bit significands and exponents in [lo, hi)."""
    sig = rng.integers(1 << 23, 1 << 24, size=shape).astype(np.float64)
    e = rng.integers(lo, hi, size=shape) - 23
    return (rng.choice([-1.0, 1.0], size=shape) * np.ldexp(sig, e)).astype(np.float32)


# --- hand-worked cases (each worked out from the format's spacing in its comments) --------------


def test_bf16_sum_of_uniforms_stalls_at_256():
    x = np.random.default_rng(0).random(10_000).astype(np.float32)
    assert float(fa.sum(x, accumulator="bfloat16")) == 256.0
    s, info = fa.sum(x, accumulator="bfloat16", return_info=True)
    assert info.lost_share > 0.9  # once at 256 every addend < 1 is below half an ulp (1)
    assert abs(float(fa.sum(x, accumulator="bfloat16", order="pairwise")) - x.sum()) / x.sum() < 0.01


def test_fp16_2048_plus_1_and_kahan():
    assert float(fa.sum(np.array([2048, 1], np.float32), accumulator="float16")) == 2048.0
    ones = np.array([2048] + [1] * 1000, np.float32)
    assert float(fa.sum(ones, accumulator="float16")) == 2048.0
    assert float(fa.sum(ones, accumulator="float16", compensated="kahan")) == 3048.0
    assert float(fa.sum(ones, accumulator="float16", compensated="neumaier")) == 3048.0
    # 100 + 0.001 == 100 in FP16 (spacing 0.0625 at 100)
    assert float(fa.sum(np.array([100, 0.001], np.float32), accumulator="float16")) == 100.0


def test_lost_addends_by_hand():
    # bf16 spacing at 256 is 2: 256.5 and 256.25 round back; 257 is a tie, even -> 256
    _, info = fa.sum(
        np.array([256, 0.5, 0.25, 1, 0, 2], np.float32), accumulator="bfloat16", return_info=True
    )
    assert int(info.lost) == 3 and int(info.nonzero_adds) == 4 and info.lost_share == 0.75
    _, info = fa.sum(np.array([2048, 1, 1, 1], np.float32), accumulator="float16", return_info=True)
    assert int(info.lost) == 3
    _, info = fa.sum(np.array([2048, 1, 1, 1], np.float32), accumulator="float32", return_info=True)
    assert int(info.lost) == 0


def test_round_to_odd_needed_for_exact_sums():
    """1 + x*y with x*y = 2**-24 (1 + eps), eps ~ 2**-33.7: float64 rounds the sum to the
    float32 tie 1 + 2**-24, where nearest-even alone would give 1; the exact sum lies above
    the tie, so the correctly rounded float32 result is 1 + 2**-23."""
    x = np.float32(1 + 2047 * 2.0**-23)
    y = np.float32(2.0**-24 * (1 - 4093 * 2.0**-24))
    exact = 1 + frac(x) * frac(y)
    assert float(exact) == 1 + 2.0**-24 and exact > 1 + Fraction(2) ** -24
    out = fa.dot(np.array([1, x], np.float32), np.array([1, y], np.float32))
    assert float(out) == 1 + 2.0**-23 == float(round_frac(exact, F32, "nearest_even"))
    down = fa.dot(np.array([1, x], np.float32), np.array([1, y], np.float32), rounding="toward_zero")
    assert float(down) == 1.0


# --- the rounding primitive against the reference -------------------------------------------


def _pairs(rng, fmt, n):
    """Operand pairs (float32 value, exact product) including ties, cancellation, overflow."""
    e_lo, e_hi = max(math.log2(fmt.min_subnormal) - 3, -149), min(math.log2(fmt.max) + 1.5, 127.9)
    eu = rng.uniform(e_lo, e_hi, n)
    u = (rng.choice([-1, 1], n) * 2.0**eu).astype(np.float32).astype(np.float64)
    m1 = rng.integers(1 << 23, 1 << 24, n).astype(np.float64)
    m2 = rng.integers(1 << 23, 1 << 24, n).astype(np.float64)
    v = (
        rng.choice([-1, 1], n)
        * m1
        * m2
        * np.ldexp(1.0, (np.floor(eu) - 46 + rng.integers(-60, 60, n)).astype(int))
    )
    ulp = np.ldexp(1.0, (np.floor(np.log2(np.abs(u))) - fmt.mantissa_bits).astype(int))
    near = ulp * rng.choice([0.5, 1.5, 0.25, 0.5 + 2.0**-40, 0.5 - 2.0**-45, 2.0**-60], n)
    kind = rng.random(n)
    v = np.where(kind < 0.25, rng.choice([-1, 1], n) * near, v)
    return u, np.where(kind > 0.95, -u, v)


FORMAT_CASES = [BF16, F16, P14, F32, FORMATS["float8_e4m3fn"], FORMATS["float8_e5m2"]]
FORMAT_CASES += [replace(F16, name="f16_ftz", subnormals=False), replace(F32, name="p3", mantissa_bits=2)]


@pytest.mark.parametrize("fmt", FORMAT_CASES, ids=lambda f: f.name)
def test_rounded_add_matches_reference(fmt):
    rng = np.random.default_rng(hash(fmt.name) % 2**32)
    nb = min(32, 51 - fmt.mantissa_bits)
    for mode in MODES:
        u, v = _pairs(rng, fmt, 400)
        r = rng.integers(0, 1 << 32, u.size, dtype=np.uint32)
        with np.errstate(all="ignore"):
            got = _accumulator.Rounder(fmt, RoundMode(mode), nb, u.size).add(u, v, rand=r)
        for i in range(u.size):
            want = float(round_frac(frac(u[i]) + frac(v[i]), fmt, mode, int(r[i]), nb))
            assert got[i] == want or (math.isnan(want) and math.isnan(got[i])), (fmt.name, mode, u[i], v[i])


def test_decode_of_wide_formats_matches_scalar_reference():
    codes = np.random.default_rng(1).integers(0, 1 << P14.bits, 3000).astype(np.uint32)
    codes[:4] = [0, 1, P14.code_of_max, P14.code_of_inf]
    got = _accumulator.decode64(codes, P14)
    want = np.array([decode_scalar(int(c), P14) for c in codes])
    assert np.array_equal(got, want, equal_nan=True)


# --- every accumulation setting against the reference ---------------------------------------

SETTINGS = list(
    itertools.product(["sequential", "pairwise", "blocked"], [None, "kahan", "neumaier"], [None, 4], MODES)
)


@pytest.mark.parametrize("order,comp,promote,mode", SETTINGS, ids=lambda v: str(v))
def test_every_setting_matches_reference(order, comp, promote, mode):
    rng = np.random.default_rng(abs(hash((order, comp, promote, mode))) % 2**32)
    width = {"sequential": None, "pairwise": 2}.get(order, 3)
    cases = [(BF16, 1, 8), (BF16, 7, 8), (BF16, 29, 8), (P14, 13, 8), (F32, 9, 8), (F16, 5, 3), (F16, 6, -10)]
    for acc, k, hi in cases:  # exponents of the inputs in [-8, hi); F16 -10: subnormal sums
        a, b = spread_f32(rng, (3, k), hi - 8, hi), spread_f32(rng, (3, k), hi - 8, hi)
        kw = dict(accumulator=acc, rounding=mode, order=order, compensated=comp or False)
        if order == "blocked":
            kw["block"] = 3
        if promote:
            kw.update(promote_every=promote, promote_to=P16, promote_rounding=mode)
        count = fa.rounding_count(
            k, order=order, block=kw.get("block"), promote_every=promote, compensated=kw["compensated"]
        )
        bits = rng.integers(0, 1 << 32, (count, 3), dtype=np.uint32)
        nbits = min(32, 51 - max(acc.mantissa_bits, P16.mantissa_bits if promote else 0))
        got, info = fa.dot(a, b, random_bits=bits, return_info=True, **kw)
        for o in range(3):
            terms = [frac(a[o, i]) * frac(b[o, i]) for i in range(k)]
            lost = [0, 0]
            ref = dict(acc=acc, mode=mode, width=width, comp=comp, bits=bits[:, o].tolist(), nbits=nbits)
            if promote:
                ref.update(chunk=promote, promote=P16, pmode=mode)
            want, used = reduce_ref(terms, lost=lost, **ref)
            assert used == count
            assert Fraction(float(got[o])) == want, (acc.name, k, o)
            assert [int(info.lost[o]), int(info.nonzero_adds[o])] == lost
        # the same schedule in a matrix product, bit for bit
        got_mm = fa.matmul(
            a, b.T, random_bits=bits.reshape(count, 3, 1) * np.ones((1, 1, 3), np.uint32), **kw
        )
        assert np.array_equal(np.diagonal(got_mm), got)


def test_stochastic_seed_bits_and_product_rounding_match_reference():
    rng = np.random.default_rng(7)
    a, b = spread_f32(rng, (2, 6)), spread_f32(rng, (2, 6))
    kw = dict(
        accumulator=P14, rounding="stochastic", product_format="bfloat16", product_rounding="stochastic"
    )
    got = fa.dot(a, b, seed=11, **kw)
    from fpsim.emulate.random import random_bits_at

    for o in range(2):
        terms = []
        for k in range(6):
            r = int(random_bits_at(4 * 11 + 1, k * 2 + o, 1)[0])
            terms.append(round_frac(frac(a[o, k]) * frac(b[o, k]), BF16, "stochastic", r, 32))
        bits = [int(random_bits_at(44, j * 2 + o, 1)[0]) for j in range(6)]
        want, _ = reduce_ref(terms, acc=P14, mode="stochastic", bits=bits)
        assert Fraction(float(got[o])) == want


def test_tiles_do_not_change_results():
    rng = np.random.default_rng(3)
    a, b = spread_f32(rng, (5, 9)), spread_f32(rng, (9, 7))
    kw = dict(accumulator=14, rounding="stochastic", seed=5, order="blocked", block=2, promote_every=4)
    whole = fa.matmul(a, b, **kw)
    spec = fa.AccumulatorSpec.build(**kw)
    for tile in (4, 14):  # rows of 7 cut into parts; two whole rows per tile
        assert np.array_equal(verbs._matmul(spec, a, b, None, False, tile=tile), whole)


# --- consistency and oracles ----------------------------------------------------------------


def test_sum_dot_matmul_agree():
    rng = np.random.default_rng(4)
    x = spread_f32(rng, (4, 3, 10))
    kw = dict(accumulator="bfloat16", order="blocked", block=4, compensated="kahan")
    s = fa.sum(x, axis=-1, **kw)
    assert np.array_equal(s, fa.dot(x, np.ones(10, np.float32), **kw))
    assert np.array_equal(fa.sum(x, axis=(1, 2), **kw), fa.sum(x.reshape(4, 30), axis=1, **kw))
    assert np.array_equal(fa.sum(np.moveaxis(x, 2, 0), axis=0, **kw), s)
    a, b = spread_f32(rng, (2, 3, 10)), spread_f32(rng, (10, 5))
    mm = fa.matmul(a, b, **kw)
    assert mm.shape == (2, 3, 5)
    assert np.array_equal(mm[1, 2], fa.dot(a[1, 2], b.T, **kw))
    assert np.array_equal(fa.matmul(a[0, 0], b, **kw), mm[0, 0])  # 1-D promotion
    assert fa.sum(np.float32(3)).shape == () and float(fa.sum(np.zeros((0,), np.float32))) == 0.0


def test_float16_and_unfused_float32_match_numpy_arithmetic():
    """numpy's float16 and float32 additions are correctly rounded (float16 via float32,
    innocuous double rounding since 24 >= 2 * 11 + 2): an independent oracle."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(500) * 30).astype(np.float16)
    acc = np.float16(0)
    for t in x:
        acc = np.float16(acc + t)
    assert float(fa.sum(x, accumulator="float16")) == float(acc)
    a, b = spread_f32(rng, 300), spread_f32(rng, 300)
    acc32 = np.float32(0)
    for p, q in zip(a, b):
        acc32 = np.float32(acc32 + np.float32(p * q))
    assert float(fa.dot(a, b, product_format="float32")) == float(acc32)


def test_input_formats_and_block_recipes():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((64, 3)).astype(np.float32)
    q = fa.matmul(a, b, input_format="bfloat16")
    import ml_dtypes

    ab, bb = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    assert np.array_equal(q, fa.matmul(ab, bb))
    got = fa.matmul(a, b, input_format=("mxfp8_e4m3", "float8_e5m2"))
    from fpsim.emulate.blocks import decode_blocks

    qa = decode_blocks(encode_blocks(a, "mxfp8_e4m3"), "mxfp8_e4m3")
    assert np.array_equal(got, fa.matmul(qa, b.astype(ml_dtypes.float8_e5m2)))


# --- block-scaled matmul by hand ------------------------------------------------------------

E4M3, E8M0 = FORMATS["float8_e4m3fn"], FORMATS["float8_e8m0fnu"]
TE_1X4 = BlockFormat("t1x4", E4M3, (4,), ScaleRule.TE)  # small DeepSeek-style blocks along K
TE_2X4 = BlockFormat("t2x4", E4M3, (2, 4), ScaleRule.TE)
MX_2 = BlockFormat("mx2", E4M3, (2,), ScaleRule.MX_FLOOR, E8M0)  # K blocks 2 and 4: segments of 2
MX_4 = BlockFormat("mx4", E4M3, (4,), ScaleRule.MX_FLOOR, E8M0)


@pytest.mark.parametrize(
    "ra,rb,promote,k",
    [
        (TE_1X4, TE_2X4, None, 12),
        (TE_1X4, TE_2X4, 2, 12),
        (MX_2, MX_4, None, 12),
        ("e4m3_tensor", "e4m3_tensor", 3, 12),
        ("e4m3_block128", "e4m3_tile128", None, 256),  # DeepSeek-V3's recipe
    ],
    ids=["te-segment4", "te-promote2", "mx-gcd2", "tensor-promote3", "deepseek"],
)
def test_scaled_matmul_by_hand(ra, rb, promote, k):
    rng = np.random.default_rng(8)
    m, n = 3, 5
    a = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-6, 6, (m, 1)))).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = fa.scaled_matmul(a, b, ra, rb, accumulator=P14, rounding="toward_zero", promote_every=promote)
    ea, eb = encode_blocks(a, ra), encode_blocks(np.ascontiguousarray(b.T), rb)
    rfa, rfb = (get_format(r) for r in (ra, rb))
    qa, qb = decode(ea.codes, rfa.element), decode(eb.codes, rfb.element)
    sa, sb = decode(ea.scales, rfa.scale_format), decode(eb.scales, rfb.scale_format)

    def scale_a(i, kk):  # the recipes' scale grids, read by hand
        return sa[0, 0] if rfa.block is None else sa[i, kk // rfa.block[-1]]

    def scale_b(j, kk):
        if rfb.block is None:
            return sb[0, 0]
        return (
            sb[j // rfb.block[0], kk // rfb.block[-1]] if len(rfb.block) == 2 else sb[j, kk // rfb.block[0]]
        )

    seg = {"t1x4": 4, "mx2": 2, "e4m3_tensor": k, "e4m3_block128": 128}[rfa.name]
    chunk = promote or seg
    for i, j in itertools.product(range(m), range(n)):
        terms = [frac(qa[i, kk]) * frac(qb[j, kk]) for kk in range(k)]
        scales = [frac(np.float32(scale_a(i, c)) * np.float32(scale_b(j, c))) for c in range(0, k, chunk)]
        want, _ = reduce_ref(terms, acc=P14, mode="toward_zero", chunk=chunk, promote=F32, scales=scales)
        assert Fraction(float(got[i, j])) == want, (i, j)


def test_scaled_matmul_tracks_float64():
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((16, 256)).astype(np.float32), rng.standard_normal((256, 8)).astype(np.float32)
    ref = a.astype(np.float64) @ b
    c = fa.scaled_matmul(a, b, "e4m3_block128", "e4m3_tile128")
    assert np.linalg.norm(c - ref) / np.linalg.norm(ref) < 0.06  # FP8 quantization error only


# --- metrics ----------------------------------------------------------------------------------


def test_exact_references_and_errors():
    rng = np.random.default_rng(10)
    x = spread_f32(rng, (3, 50), -30, 30)
    fr = fa.exact_sum(x, axis=1, fractions=True)
    for r in range(3):
        assert fr[r] == sum((frac(t) for t in x[r]), Fraction(0))
        assert fa.exact_sum(x, axis=1)[r] == float(fr[r])
    a, b = spread_f32(rng, (4, 20)), spread_f32(rng, (20, 2))
    exm = fa.exact_matmul(a, b, fractions=True)
    assert exm[3, 1] == sum((frac(a[3, i]) * frac(b[i, 1]) for i in range(20)), Fraction(0))
    assert np.array_equal(fa.exact_matmul(a, b), exm.astype(float))
    assert np.array_equal(fa.exact_dot(a, b.T[1]), exm[:, 1].astype(float))
    rel = fa.relative_error([1.0, 0.0, 1.0, 3.0], [1.0, 0.0, 0.0, 2.0])
    assert rel.tolist() == [0.0, 0.0, math.inf, 0.5]
    assert fa.relative_error(np.array([1.5]), np.array([Fraction(1, 3)], object))[0] == pytest.approx(3.5)
    s = fa.error_summary([1.0, 2.5, 4.0], [1.0, 2.0, 0.0], magnitude=[1.0, 5.0, 2.0])
    assert s["max_rel_err"] == 0.25 and s["max_scaled_err"] == 2.0 and s["max_abs_err"] == 4.0


def test_error_grows_with_k_and_promotion_helps():
    rng = np.random.default_rng(11)
    a, b = rng.random((64, 4096)).astype(np.float32), rng.random((64, 4096)).astype(np.float32)
    ex = fa.exact_dot(a, b)
    err = {}
    for k in (256, 4096):
        for promote in (None, 128):
            got = fa.dot(a[:, :k], b[:, :k], accumulator=14, rounding="toward_zero", promote_every=promote)
            err[k, promote] = np.abs(got / fa.exact_dot(a[:, :k], b[:, :k]) - 1).max()
    assert err[4096, None] > 4 * err[256, None]
    assert err[4096, 128] < err[4096, None] / 8
    assert ex.shape == (64,)


# --- argument errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(order="random"), "order must be one of"),
        (dict(order="blocked"), "needs block=W"),
        (dict(accumulator=25), r"p must be in \[2, 24\]"),
        (dict(accumulator="int8"), "signed float format"),
        (dict(accumulator="mxfp8_e4m3"), "signed float format"),
        (dict(compensated="pairwise"), "compensated must be"),
        (dict(rounding="stochastic"), "needs random_bits= or seed="),
        (
            dict(rounding="stochastic", random_bits=np.zeros((2,), np.uint32)),
            "random_bits must be uint32 of shape",
        ),
        (dict(rounding="stochastic", seed=0, stochastic_bits=32), r"stochastic_bits must be in \[1, 28\]"),
        (dict(promote_every=0), "promote_every must be"),
        (dict(rounding="nearest"), "unknown rounding mode"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fa.sum(np.ones(4, np.float32), **kwargs)


def test_bad_scaled_matmul_arguments():
    a, b = np.ones((2, 256), np.float32), np.ones((256, 2), np.float32)
    with pytest.raises(ValueError, match="must divide the scale segment length 128"):
        fa.scaled_matmul(a, b, "e4m3_block128", "e4m3_tile128", promote_every=96)
    with pytest.raises(ValueError, match="flattened tensor"):
        fa.scaled_matmul(a, b, "int8_block256", "e4m3_tile128")
    with pytest.raises(TypeError, match="block recipe"):
        fa.scaled_matmul(a, b, "float8_e4m3fn", "e4m3_tile128")
    with pytest.raises(ValueError, match="K mismatch"):
        fa.matmul(a, a)


@pytest.mark.parametrize(
    "x, mode, negative",
    [
        ([0.0, 2.0**-140], "toward_negative", False),  # exact sum > 0 rounds down to +0
        ([0.0, -(2.0**-140)], "toward_positive", True),  # exact sum < 0 rounds up to -0
        ([1.0, -1.0], "toward_negative", True),  # exact zero: -0 under toward-negative only
        ([1.0, -1.0], "toward_positive", False),
        ([1.0, -1.0], "nearest_even", False),
        ([-0.0, 0.0], "toward_negative", True),
        ([-0.0, 0.0], "nearest_even", False),
        ([0.0, 0.0], "toward_negative", False),
        ([-0.0, -0.0], "nearest_even", True),  # x + x keeps the sign of x
    ],
)
def test_sign_of_zero_sums(x, mode, negative):
    """IEEE 754-2019 section 6.3: an exact zero sum of opposite-signed operands is +0 except
    under toward-negative (-0); x + x keeps x's sign; a nonzero sum that rounds to zero keeps
    the sign of the exact sum (bfloat16 cannot hold 2^-140)."""
    got = fa.sum(np.array(x, np.float32), accumulator="bfloat16", rounding=mode)
    assert got == 0 and bool(np.signbit(got)) is negative, (x, mode, got)


def test_enums_and_names_give_the_same_bits():
    rng = np.random.default_rng(12)
    a, b = spread_f32(rng, (4, 40)), spread_f32(rng, (40, 3))
    for order, comp in itertools.product(
        ["sequential", "pairwise", "blocked"], [False, True, "kahan", "neumaier"]
    ):
        kw = dict(accumulator="bfloat16", block=4 if order == "blocked" else None)
        want = fa.matmul(a, b, order=order, compensated=comp, **kw)
        got = fa.matmul(a, b, order=fa.Order(order), compensated=fa.Compensation.parse(comp), **kw)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (order, comp)
    assert fa.Compensation.parse(True) is fa.Compensation.KAHAN
    assert fa.Compensation.parse(None) is fa.Compensation.NONE is fa.Compensation.parse("none")
    assert fa.rounding_count(10, order=fa.Order.PAIRWISE, compensated=fa.Compensation.NEUMAIER) == (
        fa.rounding_count(10, order="pairwise", compensated="neumaier")
    )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(order=3), r"order must be one of sequential, pairwise, blocked; got 3"),
        (dict(compensated=1), r"compensated must be False, True, 'kahan' or 'neumaier'"),
        (dict(compensated="Kahan"), r"compensated must be .*; got 'Kahan'"),
        (dict(promote_every=True), "promote_every must be None or an int >= 1"),
        (dict(seed=1.5), "seed must be an int"),
    ],
)
def test_bad_choices_name_the_argument(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fa.dot(np.ones(4, np.float32), np.ones(4, np.float32), **kwargs)


def test_spec_is_resolved_once():
    spec = fa.AccumulatorSpec.build(accumulator=14, order="blocked", block=4, promote_every=8, seed=3)
    assert spec.accumulator == fa.accumulator_format(14) and spec.order is fa.Order.BLOCKED
    assert spec.width == 4 and spec.promoted and spec.promote_to == FORMATS["float32"]
    assert spec.stochastic_bits == 28 and not spec.stochastic  # 51 - 23 for the float32 promotion
    with pytest.raises(AttributeError):
        spec.block = 2  # frozen
