"""ScaleRule.UE8M0_CEIL (DeepGEMM's UE8M0 scales: ``2**ceil(log2(f32(max(amax, eps) /
elem_max)))``, deep_gemm/utils/math.py ``per_token_cast_to_fp8(use_ue8m0=True)``) in the numpy
tier against an oracle written here from that definition: exact rationals (``Fraction``), the
float32 quotient rounded to nearest-even by integer arithmetic, the ceiling found by comparing
powers of two, and the elements ``x * 2**-e`` cast by ml_dtypes. Zero, subnormal, NaN, inf and
power-of-two blocks included. The compiled analysis and the Triton kernel take the rule through
the E8M0 variants of tests/analysis/test_compiled_analysis.py and tests/kernels/test_block_kernels.py
(every tier against this one, bit for bit)."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from fpsim.emulate import blocks
from fpsim.formats import FORMATS, RECIPES, BlockFormat, ScaleRule

E8M0 = FORMATS["float8_e8m0fnu"]


def f32_round(q: Fraction) -> Fraction:
    """``q >= 0`` rounded to float32, nearest-even, subnormals included (no overflow here)."""
    if q == 0:
        return q
    k = q.numerator.bit_length() - q.denominator.bit_length()  # 2**(k-1) < q < 2**(k+1)
    if q < Fraction(2) ** k:
        k -= 1
    ulp = Fraction(2) ** (max(k, -126) - 23)
    n, rem = divmod(q, ulp)
    if rem > ulp / 2 or (rem == ulp / 2 and n % 2):
        n += 1
    return n * ulp


def ceil_log2(q: Fraction) -> int:
    k = q.numerator.bit_length() - q.denominator.bit_length() - 1
    while Fraction(2) ** k < q:
        k += 1
    while Fraction(2) ** (k - 1) >= q:
        k -= 1
    return k


def oracle(x: np.ndarray, bf: BlockFormat) -> tuple[np.ndarray, np.ndarray]:
    """E8M0 scale codes and float8_e4m3fn element codes of 1-D blocks along the last axis."""
    n = bf.block[0]
    blocks_ = x.reshape(-1, n)
    scales, codes = [], []
    eps = Fraction(float(np.float32(bf.eps)))
    for blk in blocks_:
        if np.isnan(blk).any() or np.isinf(blk).any():
            scales.append(255)  # torch.amax propagates NaN; inf/448 is inf: the NaN scale
            codes.append(np.full(n, np.nan))
            continue
        amax = max(Fraction(float(abs(v))) for v in blk)
        e = ceil_log2(f32_round(max(amax, eps) / Fraction(bf.elem_max))) if max(amax, eps) else -200
        if e > 127:
            scales.append(255)
            codes.append(np.full(n, np.nan))
            continue
        e = max(e, -127)
        scales.append(e + 127)
        codes.append(np.array([float(Fraction(float(v)) / Fraction(2) ** e) for v in blk]))
    want = np.array(codes).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(x.shape)
    return np.array(scales, np.uint8).reshape(x.shape[:-1] + (-1,)), want


def _data() -> np.ndarray:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((12, 32)) * np.exp2(rng.integers(-30, 30, (12, 1)))).astype(np.float32)
    x[1] = 0  # a zero block: the eps clamp (or, eps 0, the clamped exponent -127)
    x[2] *= np.float32(2.0**-140)  # subnormal amax: a subnormal quotient
    x[3, 7] = np.nan
    x[4, 9] = -np.inf
    x[5, :] = 1.0
    x[5, 3] = np.float32(448 * 2.0**-7)  # amax/448 exactly a power of two: no rounding up
    x[6, :] = 1.0
    x[6, 3] = np.nextafter(np.float32(448 * 2.0**5), np.float32(np.inf))  # just above: up
    x[7, 0] = np.float32(3e-5)  # below eps 1e-4
    x[8, 0] = np.float32(3.0e38)  # the largest exponents
    x[9] = np.float32(1.0 * 2.0**-121)  # subnormal quotients (eps 0): 2**-127 exactly, code 0
    x[9, 0] = np.float32(7 * 2.0**-121)
    x[10] = np.float32(2.0**-122)
    x[10, 0] = np.float32(21 * 2.0**-122)  # 1.5 * 2**-127: ceil(log2) = -126, code 1
    return x


@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_scales_and_codes_against_the_definition(eps):
    bf = BlockFormat("dg", FORMATS["float8_e4m3fn"], (32,), ScaleRule.UE8M0_CEIL, E8M0, eps=eps)
    x = _data()
    got = blocks.encode_blocks(x, bf)
    want_scales, want_codes = oracle(x, bf)
    np.testing.assert_array_equal(got.scales, want_scales)
    nan_got = np.isnan(got.codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    nan_want = np.isnan(want_codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32))
    np.testing.assert_array_equal(nan_got, nan_want)
    np.testing.assert_array_equal(np.where(nan_got, 0, got.codes), np.where(nan_want, 0, want_codes))
    assert got.scales[5, 0] == 127 - 7 and got.scales[6, 0] == 127 + 6  # the two corners above
    if eps == 0:
        assert got.scales[9:11, 0].tolist() == [0, 1]
    # decoded: element value times 2**e exactly, NaN for the NaN scale
    vals = blocks.decode_blocks(got, bf)
    e = want_scales.astype(np.float64) - 127
    ref = want_codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * np.exp2(np.repeat(e, 32, -1))
    ref[np.repeat(want_scales == 255, 32, -1)] = np.nan
    np.testing.assert_array_equal(vals, ref.astype(np.float32))


def test_an_exponent_beyond_e8m0_is_the_nan_scale():
    """An element format of max below 2: f32(FLT_MAX / 1.984375) is above 2**127."""
    el = RECIPES["mxint8"].element
    bf = BlockFormat("dg_int8", el, (32,), ScaleRule.UE8M0_CEIL, E8M0)
    x = np.ones((2, 32), np.float32)
    x[0, 0] = np.finfo(np.float32).max
    s = blocks.encode_blocks(x, bf).scales
    assert ceil_log2(f32_round(Fraction(float(x[0, 0])) / Fraction(el.max))) == 128
    assert s.tolist() == [[255], [127]]  # 1 / 1.984375 -> 2**0


def test_differs_from_rceil_where_the_sources_differ():
    """RCEIL multiplies by f32(1/elem_max) where DeepGEMM divides (for an element max of
    1.984375 the two ceilings differ just above it), and the eps clamp moves a small amax."""
    el = RECIPES["mxint8"].element
    dg = BlockFormat("dg", el, (32,), ScaleRule.UE8M0_CEIL, E8M0)
    rc = BlockFormat("rc", el, (32,), ScaleRule.MX_RCEIL, E8M0)
    x = np.full((1, 32), np.nextafter(np.float32(el.max), np.float32(4)))
    want = ceil_log2(f32_round(Fraction(float(x[0, 0])) / Fraction(el.max))) + 127
    got_dg, got_rc = blocks.encode_blocks(x, dg).scales[0, 0], blocks.encode_blocks(x, rc).scales[0, 0]
    assert got_dg == want and got_rc != want
    e4m3 = FORMATS["float8_e4m3fn"]
    dg = BlockFormat("dg", e4m3, (32,), ScaleRule.UE8M0_CEIL, E8M0, eps=1e-4)
    x = np.full((1, 32), np.float32(3e-5))
    want = ceil_log2(f32_round(Fraction(float(np.float32(1e-4))) / 448)) + 127
    assert blocks.encode_blocks(x, dg).scales[0, 0] == want
