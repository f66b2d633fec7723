"""encode (nearest-even) against independent casts: ml_dtypes, numpy, torch, the scalar tier.

Known ml_dtypes deviations from fpsim's documented behaviour are handled explicitly, each
pinned by its own test (per ml_dtypes release) so that a change in ml_dtypes is noticed:

* formats without NaN (float6_e2m3fn, float6_e3m2fn, float4_e2m1fn): ml_dtypes (0.6 and 0.7)
  turns NaN into a zero whose sign is the inverse of the NaN's; fpsim documents +0 (code 0).
* float8_e8m0fnu, ml_dtypes 0.6 only: every float32 *subnormal* input in (2**-127, 2**-126)
  rounds up to 2**-126, even below the midpoint 1.5 * 2**-127; round-to-nearest-even keeps
  2**-127. With 0.6 those inputs are compared with the scalar tier instead; 0.7 rounds them
  to nearest and is compared directly.
* float64 inputs, ml_dtypes 0.6 only: it converts through float32 and can round twice; fpsim
  rounds once. 0.7 rounds float64 once, and the float64 points are compared with it too.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from oracles import (
    FLOAT_FORMATS,
    assert_codes_equal,
    finite_values,
    float64_points,
    fmt_id,
    int_special_points,
    is_nan_code,
    ml_decode,
    ml_dtype_or_none,
    ml_encode,
    scalar_codes,
    scalar_table,
    special_points,
    uint_dtype,
)

import fpsim
from fpsim import Encoding, get_format
from fpsim.emulate.reference import encode_scalar

ML_FLOAT_FORMATS = [f for f in FLOAT_FORMATS if ml_dtype_or_none(f) is not None]
NO_NAN_FORMATS = [f for f in FLOAT_FORMATS if f.encoding is Encoding.FINITE]
E8M0 = get_format("float8_e8m0fnu")
ML_DTYPES_06 = tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2]) < (0, 7)
"""ml_dtypes before 0.7: E8M0 from float32 subnormals rounds up, float64 goes through float32."""


def _f32_subnormal(x: np.ndarray) -> np.ndarray:
    """float32 inputs (or float64 inputs that are float32 subnormals) strictly between 0 and
    2**-126 in magnitude."""
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        a = np.abs(np.asarray(x, dtype=np.float64))
    return (a > 0) & (a < 2.0**-126)


def check_against_ml_dtypes(x: np.ndarray, fmt, context: str = "") -> None:
    """encode(x, fmt) equals ml_dtypes' cast, NaN by class, with the documented deviations."""
    fmt = get_format(fmt)
    got = fpsim.encode(x, fmt)
    assert got.dtype == np.dtype(fmt.code_dtype) and got.shape == x.shape
    want = ml_encode(x, fmt)
    keep = np.ones(x.shape, bool)
    isnan = np.isnan(x)
    if fmt.encoding is Encoding.FINITE and isnan.any():
        # (a) ml_dtypes gives a zero (of the inverse sign); fpsim documents exactly +0.
        assert np.all(ml_decode(want[isnan], fmt) == 0), "ml_dtypes no longer maps NaN to a zero"
        assert_codes_equal(got[isnan], np.zeros(isnan.sum(), np.int64), fmt, x[isnan], context="NaN -> +0")
        keep &= ~isnan
    if fmt == E8M0 and ML_DTYPES_06:
        # (b) ml_dtypes 0.6's subnormal handling; compared with the scalar tier instead.
        sub = _f32_subnormal(x)
        if sub.any():
            xs = x[sub]
            assert_codes_equal(got[sub], scalar_codes(xs, fmt), fmt, xs, context="float32 subnormals")
        keep &= ~sub
    assert_codes_equal(got[keep], want[keep], fmt, x[keep], nan_by_class=True, context=context)


@pytest.mark.parametrize("fmt", ML_FLOAT_FORMATS, ids=fmt_id)
def test_special_points_match_ml_dtypes(fmt):
    x = special_points(fmt)
    check_against_ml_dtypes(x, fmt, "special points")


@pytest.mark.parametrize("fmt", ML_FLOAT_FORMATS, ids=fmt_id)
def test_random_float32_bits_match_ml_dtypes(fmt, random_f32):
    check_against_ml_dtypes(random_f32, fmt, "random float32 bit patterns")


@pytest.mark.parametrize("fmt", ML_FLOAT_FORMATS, ids=fmt_id)
def test_special_points_match_scalar_tier(fmt):
    """The same special points against the scalar tier (a sample for the 16-bit formats)."""
    x = special_points(fmt)
    if x.size > 6000:
        x = np.random.default_rng(1).choice(x, size=6000, replace=False)
    assert_codes_equal(fpsim.encode(x, fmt), scalar_codes(x, fmt), fmt, x)


def test_special_points_cover_midpoints_and_overflow():
    """The generator itself: e4m3fn midpoints, overflow and underflow points are there."""
    x = set(special_points("float8_e4m3fn").tolist())
    for v in (448.0, 464.0, 480.0, 896.0, 2.0**-10, 2.0**-9, 2.0**-6, 1.0625, -464.0, 0.0):
        assert v in x, v
    assert np.nextafter(np.float32(464), np.float32(0)) in x
    assert np.nextafter(np.float32(464), np.float32(1000)) in x
    bits = special_points("float8_e4m3fn").view(np.uint32)
    for b in (0x7FC00000, 0xFFC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x007FFFFF):
        assert b in bits, hex(b)


# --- the pinned ml_dtypes deviations ---------------------------------------------------------


@pytest.mark.parametrize("fmt", NO_NAN_FORMATS, ids=fmt_id)
def test_no_nan_formats_encode_nan_as_positive_zero(fmt):
    x = np.array([np.nan, -np.nan], np.float32)
    x = np.concatenate([x, np.array([0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)])
    assert_codes_equal(fpsim.encode(x, fmt), np.zeros(4, np.int64), fmt, x)
    # ml_dtypes 0.6.0 instead gives a zero with the sign opposite to the NaN's:
    # +NaN -> -0 (sign bit set), -NaN -> +0.
    want_ml = np.array([fmt.sign_mask, 0, fmt.sign_mask, 0])
    np.testing.assert_array_equal(ml_encode(x, fmt), want_ml)


def test_e8m0_float32_subnormals_against_ml_dtypes():
    # E8M0 has the values 2**-127 (code 0) and 2**-126 (code 1) at the bottom; the midpoint is
    # 1.5 * 2**-127, so round-to-nearest-even takes 1.1 * 2**-127 to 2**-127, code 0.
    # ml_dtypes 0.6 rounds every float32 subnormal input in (2**-127, 2**-126) up to
    # 2**-126 (code 1), below the midpoint too; 0.7 rounds them to nearest, as fpsim does.
    x = np.array([1.1 * 2.0**-127, 1.4999 * 2.0**-127, 1.5 * 2.0**-127, 1.6 * 2.0**-127], np.float32)
    assert x[0] < 2.0**-126 and x[0] > 2.0**-127
    assert_codes_equal(fpsim.encode(x, E8M0), [0, 0, 1, 1], E8M0, x)
    assert_codes_equal(scalar_codes(x, E8M0), [0, 0, 1, 1], E8M0, x)
    np.testing.assert_array_equal(ml_encode(x, E8M0), [1, 1, 1, 1] if ML_DTYPES_06 else [0, 0, 1, 1])
    # float32 *normal* inputs are rounded correctly by ml_dtypes: 1.1 * 2**-126 -> 2**-126
    y = np.array([1.1 * 2.0**-126, 1.6 * 2.0**-126], np.float32)
    np.testing.assert_array_equal(ml_encode(y, E8M0), [1, 2])
    np.testing.assert_array_equal(fpsim.encode(y, E8M0), [1, 2])


def test_e8m0_all_float32_subnormals_against_scalar_tier():
    """A stride through every float32 subnormal (both signs) vs the scalar tier."""
    bits = np.arange(1, 1 << 23, 251, dtype=np.uint32)
    bits = np.concatenate([bits, [1, 0x00400000, 0x00400001, 0x003FFFFF, 0x007FFFFF, 0x00600000]])
    x = np.concatenate([bits, bits | 0x80000000]).astype(np.uint32).view(np.float32)
    assert_codes_equal(fpsim.encode(x, E8M0), scalar_codes(x, E8M0), E8M0, x)


# --- torch ------------------------------------------------------------------------------------


def torch_codes(x: np.ndarray, dtype_name: str) -> np.ndarray:
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype_name)
    y = torch.from_numpy(np.array(x, copy=True)).to(dt)
    return (
        y.view(torch.uint8 if y.element_size() == 1 else torch.int16)
        .numpy()
        .view(np.uint8 if y.element_size() == 1 else np.uint16)
    )


@pytest.mark.parametrize(
    "fmt, torch_dtype, saturate",
    [
        ("float8_e4m3fn", "float8_e4m3fn", True),  # torch's e4m3fn cast saturates
        ("float8_e5m2", "float8_e5m2", False),  # torch's e5m2 cast does not
        ("bfloat16", "bfloat16", False),
        ("float16", "float16", False),
    ],
    ids=["e4m3fn-saturate", "e5m2", "bfloat16", "float16"],
)
@pytest.mark.parametrize("points", ["special", "random"])
def test_matches_torch_casts(fmt, torch_dtype, saturate, points, random_f32):
    x = special_points(fmt) if points == "special" else random_f32
    got = fpsim.encode(x, fmt, saturate=saturate)
    want = torch_codes(x, torch_dtype)
    assert_codes_equal(got, want, fmt, x, nan_by_class=True, context=f"torch.{torch_dtype}")


def test_torch_e4m3fn_saturation_facts():
    # hand-checked: torch saturates finite overflow and infinities, keeps NaN
    x = np.array([464.0, 464.00003, 1e9, np.inf, -np.inf, np.nan], np.float32)
    want = [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F]
    assert_codes_equal(fpsim.encode(x, "float8_e4m3fn", saturate=True), want, "float8_e4m3fn", x)
    np.testing.assert_array_equal(torch_codes(x, "float8_e4m3fn"), want)


# --- float64 inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FLOAT_FORMATS, ids=fmt_id)
def test_float64_inputs_match_scalar_tier(fmt):
    x = float64_points(fmt)
    got = fpsim.encode(x, fmt)
    assert got.dtype == np.dtype(fmt.code_dtype)
    assert_codes_equal(got, scalar_codes(x, fmt), fmt, x)


@pytest.mark.parametrize("fmt", FLOAT_FORMATS, ids=fmt_id)
def test_float64_just_off_midpoints_round_once(fmt):
    """A float64 input a hair above a midpoint rounds up, a hair below rounds down (in
    nearest-even); a conversion to float32 first would turn both into a tie."""
    fmt = get_format(fmt)
    if fmt.bits <= 16:
        vals = finite_values(fmt)
        vals = vals[vals > 0]
        lo, hi = vals[:-1], vals[1:]
    else:
        lo = np.float32([1.0, 3.0, 2.0**100, 2.0**-126, 2.0**-149 * 3, 2.0**-149, 1.5, 2.0**127])
        lo = np.concatenate([lo, np.random.default_rng(2).uniform(-30, 30, 2000).astype(np.float32)])
        lo = np.abs(lo)
        hi = np.nextafter(lo, np.float32(np.inf))
        lo, hi = lo.astype(np.float64), hi.astype(np.float64)
    mid = (lo + hi) / 2
    up = np.nextafter(mid, np.inf)
    down = np.nextafter(mid, -np.inf)
    x, want = [up, down], [hi, lo]
    if fmt.signed:
        x, want = x + [-up, -down], want + [-hi, -lo]
    x, want = np.concatenate(x), np.concatenate(want)
    got = fpsim.encode(x, fmt)
    # values of the codes by the scalar tier (float32 codes: by reinterpretation)
    if fmt.bits <= 16:
        got_vals = scalar_table(fmt)[got.astype(np.int64)]
    else:
        got_vals = got.view(np.float32).astype(np.float64)
    bad = got_vals != want
    assert not bad.any(), f"{fmt.name}: {bad.sum()} wrong, first x={x[bad][:4]!r} -> {got_vals[bad][:4]!r}"


def test_float64_double_rounding_example():
    # 464 is the midpoint between 448 (e4m3fn max, even) and 480 (not finite). 464.0000000001
    # is above it, so a single nearest rounding overflows: no inf in e4m3fn -> NaN (0x7F).
    # ml_dtypes 0.6 goes through float32 first (464.0000000001 -> 464.0, a tie) and then
    # rounds the tie to even, 448 (0x7E); 0.7 rounds once, as fpsim does.
    x = np.array([464.0000000001, -464.0000000001, 463.9999999999])
    assert_codes_equal(fpsim.encode(x, "float8_e4m3fn"), [0x7F, 0xFF, 0x7E], "float8_e4m3fn", x)
    assert [encode_scalar(v, "float8_e4m3fn") for v in x] == [0x7F, 0xFF, 0x7E]
    want_ml = [0x7E, 0xFE, 0x7E] if ML_DTYPES_06 else [0x7F, 0xFF, 0x7E]
    np.testing.assert_array_equal(ml_encode(x, "float8_e4m3fn"), want_ml)


@pytest.mark.skipif(ML_DTYPES_06, reason="ml_dtypes 0.6 rounds float64 through float32 (twice)")
@pytest.mark.parametrize("fmt", ML_FLOAT_FORMATS, ids=fmt_id)
def test_float64_points_match_ml_dtypes(fmt):
    """Midpoints of the format in float64 and their neighbours, offsets far below float32's
    resolution: ml_dtypes 0.7 rounds them once, as fpsim does."""
    check_against_ml_dtypes(float64_points(fmt), fmt, "float64 points")


@pytest.mark.parametrize("fmt", ML_FLOAT_FORMATS, ids=fmt_id)
def test_float64_exact_in_float32_matches_ml_dtypes(fmt, random_f32):
    x32 = np.concatenate([special_points(fmt), random_f32[: 10**6]])
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        x64 = x32.astype(np.float64)
    check_against_ml_dtypes(x64, fmt, "float64 inputs exact in float32")


def test_float32_target_from_float64_matches_numpy():
    """float64 -> float32 codes vs numpy's IEEE cast (nearest-even) on 10**6 random doubles."""
    rng = np.random.default_rng(64)
    bits = rng.integers(0, 1 << 64, size=10**6, dtype=np.uint64)
    # squeeze the exponents to around float32's range so the rounding is exercised
    exp = rng.integers(1023 - 160, 1023 + 130, size=bits.size, dtype=np.uint64)
    bits = (bits & np.uint64(0x800FFFFFFFFFFFFF)) | (exp << np.uint64(52))
    x = np.concatenate([bits.view(np.float64), float64_points("float32")])
    with np.errstate(over="ignore"):
        want = x.astype(np.float32).view(np.uint32)
    assert_codes_equal(fpsim.encode(x, "float32"), want, "float32", x, nan_by_class=True)


# --- other input types ------------------------------------------------------------------------

INPUT_CHECK_FORMATS = ["float8_e4m3fn", "float8_e5m2fnuz", "float4_e2m1fn", "bfloat16", "float16", "float32"]
INPUT_CHECK_FORMATS += ["float8_e8m0fnu", "int8", "uint4"]


@pytest.mark.parametrize("fmt", INPUT_CHECK_FORMATS)
@pytest.mark.parametrize("src", ["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["nearest_even", "toward_positive", "odd", "stochastic"])
def test_half_precision_inputs_equal_float32_inputs(fmt, src, mode):
    dt = np.dtype(np.float16) if src == "float16" else np.dtype(ml_dtypes.bfloat16)
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dt)
    r = np.random.default_rng(5).integers(0, 1 << 32, size=x.shape, dtype=np.uint32)
    x32 = x.astype(np.float32)  # exact
    got = fpsim.encode(x, fmt, rounding=mode, random_bits=r)
    want = fpsim.encode(x32, fmt, rounding=mode, random_bits=r)
    assert got.dtype == want.dtype
    assert_codes_equal(got, want, fmt, x, nan_by_class=True)


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "bfloat16", "float16"])
def test_ml_dtypes_fp8_inputs_equal_float32_inputs(fmt):
    for src in ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"):
        dt = np.dtype(getattr(ml_dtypes, src))
        x = (
            np.arange(256, dtype=np.uint8).view(dt)
            if src != "float4_e2m1fn"
            else (np.arange(16, dtype=np.uint8).view(dt))
        )
        assert_codes_equal(
            fpsim.encode(x, fmt), ml_encode(x.astype(np.float32), fmt), fmt, x, nan_by_class=True
        )


@pytest.mark.parametrize("fmt", INPUT_CHECK_FORMATS)
@pytest.mark.parametrize("mode", ["nearest_even", "toward_zero", "nearest_away"])
def test_integer_inputs_equal_float_inputs(fmt, mode):
    i8 = np.arange(-128, 128, dtype=np.int8)
    i16 = np.arange(-(1 << 15), 1 << 15, dtype=np.int64).astype(np.int16)
    big = [2**31 - 1, -(2**31), 2**24 + 1, 2**24 + 3, -(2**24 + 1), 2**30 + 2**6 + 1, 65519, 65520, 465]
    i32 = np.array(big + list(range(-300, 300)), dtype=np.int32)
    u32 = np.array([2**32 - 1, 2**31 + 1, 2**24 + 1, 0, 7], dtype=np.uint32)
    i64 = np.array([2**53, -(2**53), 2**40 + 1, 3, -3], dtype=np.int64)
    u8 = np.arange(256, dtype=np.uint8)
    b = np.array([True, False])
    for x in (i8, i16, i32, u32, i64, u8, b):
        ref = x.astype(np.float64)  # exact for all of these
        want = fpsim.encode(ref, fmt, rounding=mode)
        assert_codes_equal(fpsim.encode(x, fmt, rounding=mode), want, fmt, ref, context=f"{x.dtype} input")
        if x.size <= 1000:  # the float64 path itself, on the values that matter here
            assert_codes_equal(want, scalar_codes(ref, fmt, rounding=mode), fmt, ref, context=f"{x.dtype}")


def test_int32_inputs_are_not_rounded_to_float32_first():
    # 2**24 + 1 is not a float32; toward_positive to float32 must give 2**24 + 2, and
    # nearest-even to bfloat16 of 2**24 + 2**16 + 1 (just above a bfloat16 midpoint) rounds up.
    x = np.array([2**24 + 1], np.int32)
    assert int(fpsim.encode(x, "float32", rounding="toward_positive")[0]) == 0x4B800001
    y = np.array([2**24 + 2**16 + 1], np.int32)
    want = encode_scalar(float(2**24 + 2**17), "bfloat16")
    assert int(fpsim.encode(y, "bfloat16")[0]) == want == 0x4B81


@pytest.mark.parametrize("fmt", INPUT_CHECK_FORMATS)
def test_python_scalars_and_lists(fmt):
    f = get_format(fmt)
    for v in (0.1, -2.5, 1e-30, 1e30, 3, -7, 0, True, float("nan"), float("inf"), 464.0000000001):
        got = fpsim.encode(v, f)
        assert np.shape(got) == (), v
        want = encode_scalar(float(v), f)
        assert int(got) == want, (v, got, want)
        assert np.asarray(got).dtype == np.dtype(f.code_dtype)
    lst = [0.1, -2.5, 3.0, 1e30]
    assert_codes_equal(fpsim.encode(lst, f), scalar_codes(np.array(lst), f), f, np.array(lst))


@pytest.mark.parametrize(
    "bad",
    [np.array(["a"]), np.array([1 + 2j]), np.array([None], dtype=object)],
    ids=["str", "complex", "object"],
)
def test_encode_rejects_other_dtypes(bad):
    with pytest.raises(TypeError, match="cannot encode"):
        fpsim.encode(bad, "float8_e4m3fn")


# --- integer formats --------------------------------------------------------------------------


def _int_inputs(lo: float, hi: float, n: int = 200_000, seed: int = 0) -> np.ndarray:
    """float32 values in the open interval (lo, hi): integers, halves, their float32
    neighbours, random values."""
    rng = np.random.default_rng(seed)
    k = np.arange(np.ceil(lo), np.floor(hi) + 1)
    grid = np.concatenate([k, k + 0.5, k - 0.5, k + 0.25]).astype(np.float32)
    grid = np.concatenate(
        [grid, np.nextafter(grid, np.float32(np.inf)), np.nextafter(grid, np.float32(-np.inf))]
    )
    rand = rng.uniform(lo, hi, size=n).astype(np.float32)
    x = np.concatenate([grid, rand, np.float32([0.0, -0.0, 1e-40, -1e-40])])
    return x[(x > lo) & (x < hi)]


def test_int8_toward_zero_matches_numpy_cast():
    x = _int_inputs(-129, 128)
    with np.errstate(invalid="ignore"):
        want = x.astype(np.int8).view(np.uint8)
    assert_codes_equal(fpsim.encode(x, "int8", rounding="toward_zero"), want, "int8", x)


def test_uint8_toward_zero_matches_numpy_cast():
    x = _int_inputs(-1, 256)
    want = x.astype(np.uint8)
    assert_codes_equal(fpsim.encode(x, "uint8", rounding="toward_zero"), want, "uint8", x)


@pytest.mark.parametrize("fmt, lo, hi", [("int4", -9, 8), ("uint4", -1, 16)])
def test_int4_toward_zero_matches_ml_dtypes(fmt, lo, hi):
    # ml_dtypes casts float -> int4 / uint4 by truncation toward zero
    x = _int_inputs(lo, hi, n=50_000)
    assert_codes_equal(fpsim.encode(x, fmt, rounding="toward_zero"), ml_encode(x, fmt), fmt, x)


def _numpy_round(x: np.ndarray, mode: str) -> np.ndarray:
    """Round float64 values to integers (float64), independent of fpsim."""
    if mode == "nearest_even":
        return np.rint(x)
    if mode == "toward_zero":
        return np.trunc(x)
    if mode == "toward_positive":
        return np.ceil(x)
    if mode == "toward_negative":
        return np.floor(x)
    if mode == "nearest_away":
        return np.copysign(np.floor(np.abs(x) + 0.5), x)  # exact: |x| < 2**53
    if mode == "odd":
        t = np.trunc(x)
        return np.where((t != x) & (np.fmod(t, 2) == 0), t + np.sign(x), t)
    raise AssertionError(mode)


INT_MODES = ["nearest_even", "nearest_away", "toward_zero", "toward_positive", "toward_negative", "odd"]


@pytest.mark.parametrize("mode", INT_MODES)
@pytest.mark.parametrize("fmt", ["int8", "int4", "uint8", "uint4"])
def test_int_formats_saturate_and_wrap_vs_numpy(fmt, mode):
    f = get_format(fmt)
    rng = np.random.default_rng(11)
    x32 = np.concatenate(
        [
            _int_inputs(f.min - 40, f.max + 40, n=20_000),
            rng.uniform(-1e6, 1e6, size=20_000).astype(np.float32),
            np.float32([2.0**40, -(2.0**40), 2.0**24 + 2, 1e30, -1e30]),
        ]
    )
    x = x32.astype(np.float64)
    r = _numpy_round(x, mode)
    mask = (1 << f.bits) - 1
    with np.errstate(invalid="ignore"):
        wrapped = (r.astype(np.int64) & mask).astype(np.int64)
    clamped = (np.clip(r, f.min, f.max).astype(np.int64) & mask).astype(np.int64)
    assert_codes_equal(fpsim.encode(x32, f, rounding=mode), wrapped, f, x32, context="wrap")
    assert_codes_equal(
        fpsim.encode(x32, f, rounding=mode, saturate=True), clamped, f, x32, context="saturate"
    )


@pytest.mark.parametrize("fmt", ["int8", "int4", "uint8", "uint4"])
@pytest.mark.parametrize("saturate", [False, True], ids=["wrap", "saturate"])
def test_int_formats_special_points_vs_scalar_tier(fmt, saturate):
    x = int_special_points(fmt)
    got = fpsim.encode(x, fmt, saturate=saturate)
    assert got.dtype == np.dtype(get_format(fmt).code_dtype)
    assert_codes_equal(got, scalar_codes(x, fmt, saturate=saturate), fmt, x)


def test_int_formats_hand_examples():
    # int8 wraps like a C cast of the rounded integer: 300 -> 44, -129 -> 127, 127.5 -> 128 -> -128
    x = np.float32([300, -129, 127.5, 2.5, -2.5, np.inf, -np.inf, np.nan, 2.0**31, 2.0**40 + 2.0**20])
    want_wrap = [44, 0x7F, 0x80, 2, 0xFE, 0, 0, 0, 0, 0]
    want_sat = [0x7F, 0x80, 0x7F, 2, 0xFE, 0x7F, 0x80, 0, 0x7F, 0x7F]
    assert_codes_equal(fpsim.encode(x, "int8"), want_wrap, "int8", x)
    assert_codes_equal(fpsim.encode(x, "int8", saturate=True), want_sat, "int8", x)
    # uint4: -1 wraps to 15, saturates to 0; 16 wraps to 0, saturates to 15
    y = np.float32([-1, 16, 15.5, 7.5])
    assert_codes_equal(fpsim.encode(y, "uint4"), [15, 0, 0, 8], "uint4", y)
    assert_codes_equal(fpsim.encode(y, "uint4", saturate=True), [0, 15, 15, 8], "uint4", y)


def test_codes_dtype_per_format():
    for f in fpsim.FORMATS.values():
        got = fpsim.encode(np.float32([1.0, 2.0]), f)
        assert got.dtype == np.dtype(f.code_dtype) == uint_dtype(f), f.name


def test_nan_oracle_independent_of_fpsim():
    # the NaN class used by nan_by_class comes from the scalar tier; spot-check it
    assert is_nan_code(np.array([0x7F, 0xFF, 0x7E]), "float8_e4m3fn").tolist() == [True, True, False]
    assert is_nan_code(np.array([0x80, 0x00]), "float8_e4m3fnuz").tolist() == [True, False]
    assert is_nan_code(np.array([0x7C, 0x7D, 0xFF]), "float8_e5m2").tolist() == [False, True, True]
    assert not is_nan_code(np.arange(64), "float6_e2m3fn").any()


def test_assert_codes_equal_reports_fields():
    x = np.float32([464.0, 1.0])
    with pytest.raises(AssertionError) as info:
        assert_codes_equal(np.uint8([0x7F, 0x38]), np.uint8([0x7E, 0x38]), "float8_e4m3fn", x)
    msg = str(info.value)
    assert "1 of 2 codes differ" in msg
    assert "0x7e (s=0 e=1111 m=110) = 448.0" in msg and "0x7f (s=0 e=1111 m=111) = nan" in msg
    assert "bits=0x43e80000" in msg and "float32(464.0)" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # NaN class: two different NaN codes are equal only with nan_by_class
        assert_codes_equal(np.uint8([0x7F]), np.uint8([0xFF]), "float8_e4m3fn", nan_by_class=True)
        with pytest.raises(AssertionError):
            assert_codes_equal(np.uint8([0x7F]), np.uint8([0xFF]), "float8_e4m3fn")
