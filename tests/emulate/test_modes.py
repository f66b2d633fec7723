"""Every rounding mode: the array tier against the scalar tier, stochastic rounding's
statistics, hand-worked examples and argument errors."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from fractions import Fraction
from functools import cache

import numpy as np
import pytest
from oracles import (
    ALL_FORMATS,
    FLOAT_FORMATS,
    assert_codes_equal,
    float64_points,
    fmt_id,
    scalar_codes,
    scalar_table,
    targeted_points,
)

import fpsim
from fpsim import RoundMode, get_format
from fpsim.emulate.reference import encode_scalar

SR = RoundMode.STOCHASTIC
# (mode, stochastic_bits): the stochastic mode twice, with the full word and with 3 bits
MODE_CASES = [(m, 32) for m in RoundMode if m is not SR] + [(SR, 32), (SR, 3)]
MODE_IDS = [m.value if m is not SR else f"stochastic-{n}bit" for m, n in MODE_CASES]
N_POINTS = 2000


@cache
def points(fmt) -> np.ndarray:
    return targeted_points(fmt, N_POINTS, seed=1)


def random_words(shape, *salt) -> np.ndarray:
    """uint32 random words from a seeded generator, with the extremes 0 and 2**32 - 1 mixed in."""
    rng = np.random.default_rng([12345, *salt])
    r = rng.integers(0, 1 << 32, size=shape, dtype=np.uint32)
    flat = r.reshape(-1)
    flat[::17] = 0
    flat[5::17] = 0xFFFFFFFF
    return r


def encode_both(x, fmt, mode, nbits, **kw):
    """(array tier, scalar tier) codes of x; random words only for the stochastic mode."""
    if mode is SR:
        kw = dict(kw, random_bits=random_words(np.shape(x), fmt.bits, nbits), stochastic_bits=nbits)
    got = fpsim.encode(x, fmt, rounding=mode, **kw)
    want = scalar_codes(x, fmt, rounding=mode, **kw)
    return got, want


@pytest.mark.parametrize("saturate", [False, True], ids=["nosat", "sat"])
@pytest.mark.parametrize(("mode", "nbits"), MODE_CASES, ids=MODE_IDS)
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=fmt_id)
def test_array_tier_equals_scalar_tier(fmt, mode, nbits, saturate):
    x = points(fmt)
    got, want = encode_both(x, fmt, mode, nbits, saturate=saturate)
    assert got.dtype == np.dtype(fmt.code_dtype)
    assert_codes_equal(got, want, fmt, x, context=f"{mode.value}, saturate={saturate}")


FTZ_FORMATS = ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2fnuz", "float6_e3m2fn", "float32"]


@pytest.mark.parametrize(("mode", "nbits"), MODE_CASES, ids=MODE_IDS)
@pytest.mark.parametrize("fmt", FTZ_FORMATS)
def test_flush_to_zero_equals_scalar_tier(fmt, mode, nbits):
    f = get_format(fmt)
    x = points(f)
    got, want = encode_both(x, f, mode, nbits, subnormals=False)
    assert_codes_equal(got, want, f, x, context=f"{mode.value}, subnormals=False")
    # a Format with subnormals=False means the same as the argument
    g = replace(f, name=f.name + "_ftz", subnormals=False)
    got2, _ = encode_both(x, g, mode, nbits)
    assert_codes_equal(got2, want, g, x, context=f"{mode.value}, Format(subnormals=False)")


@pytest.mark.parametrize(("mode", "nbits"), MODE_CASES, ids=MODE_IDS)
@pytest.mark.parametrize("fmt", FLOAT_FORMATS, ids=fmt_id)
def test_float64_inputs_equal_scalar_tier(fmt, mode, nbits):
    x = float64_points(fmt, n=420, seed=3)
    got, want = encode_both(x, fmt, mode, nbits)
    assert_codes_equal(got, want, fmt, x, context=f"float64, {mode.value}")


SHAPES = [(), (1,), (0,), (1023,), (3, 5, 7), (2, 1, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize(("mode", "nbits"), MODE_CASES, ids=MODE_IDS)
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e8m0fnu", "bfloat16", "int4"])
def test_odd_shapes(fmt, mode, nbits, shape):
    f = get_format(fmt)
    size = math.prod(shape)
    pool = points(f)
    x = np.random.default_rng(size).choice(pool, size=size).reshape(shape)
    got, want = encode_both(x, f, mode, nbits)
    assert got.shape == shape and got.dtype == np.dtype(f.code_dtype)
    assert_codes_equal(got, want, f, x)


@pytest.mark.parametrize(("mode", "nbits"), MODE_CASES, ids=MODE_IDS)
@pytest.mark.parametrize("fmt", ["float16", "float8_e4m3fn", "float32"])
def test_non_contiguous_inputs(fmt, mode, nbits):
    f = get_format(fmt)
    base = np.random.default_rng(9).choice(points(f), size=(40, 60))
    for x in (base.T, base[::3, 1::2], base[:, ::-1]):
        got, want = encode_both(x, f, mode, nbits)
        assert got.shape == x.shape
        assert_codes_equal(got, want, f, x)


@pytest.mark.parametrize(("mode", "nbits"), MODE_CASES, ids=MODE_IDS)
@pytest.mark.parametrize("fmt", ["float16", "float8_e5m2", "bfloat16", "float32", "int8", "float8_e8m0fnu"])
def test_large_arrays_across_chunks(fmt, mode, nbits):
    """100k elements (the numpy path works in chunks of 2**15) drawn from a pool whose
    scalar-tier codes are known, out-of-range elements scattered through every chunk."""
    f = get_format(fmt)
    pool = points(f)[:600]
    rpool = random_words(pool.shape, 77)
    kw = {"random_bits": rpool, "stochastic_bits": nbits} if mode is SR else {}
    pool_codes = scalar_codes(pool, f, rounding=mode, **kw)
    idx = np.random.default_rng(4).integers(0, pool.size, size=100_003)
    x = pool[idx]
    kw = {"random_bits": rpool[idx], "stochastic_bits": nbits} if mode is SR else {}
    got = fpsim.encode(x, f, rounding=mode, **kw)
    assert_codes_equal(got, pool_codes[idx], f, x)


# --- stochastic rounding ------------------------------------------------------------------


def test_stochastic_is_reproducible():
    x = np.random.default_rng(0).normal(size=(50, 40)).astype(np.float32)
    r = random_words(x.shape, 1)
    a = fpsim.encode(x, "float8_e4m3fn", rounding="stochastic", random_bits=r)
    b = fpsim.encode(x, "float8_e4m3fn", rounding="stochastic", random_bits=r.copy())
    np.testing.assert_array_equal(a, b)
    s1 = fpsim.encode(x, "float8_e4m3fn", rounding="stochastic", rng=123)
    s2 = fpsim.encode(x, "float8_e4m3fn", rounding="stochastic", rng=123)
    s3 = fpsim.encode(x, "float8_e4m3fn", rounding="stochastic", rng=124)
    np.testing.assert_array_equal(s1, s2)
    assert (s1 != s3).sum() > 100  # different seeds, different roundings of inexact values
    g1 = fpsim.encode(x, "float8_e4m3fn", rounding="stochastic", rng=np.random.default_rng(5))
    g2 = fpsim.encode(x, "float8_e4m3fn", rounding="stochastic", rng=np.random.default_rng(5))
    np.testing.assert_array_equal(g1, g2)
    gen = np.random.default_rng(5)
    c1 = fpsim.encode(x, "float8_e4m3fn", rounding="stochastic", rng=gen)
    c2 = fpsim.encode(x, "float8_e4m3fn", rounding="stochastic", rng=gen)  # the generator moved on
    assert (c1 != c2).sum() > 100
    # every stochastic result is one of the two neighbours (toward zero or away from it)
    tz = fpsim.encode(x, "float8_e4m3fn", rounding="toward_zero")
    aw = np.array([encode_scalar(float(v), "float8_e4m3fn", "toward_zero") for v in x.reshape(-1)])
    np.testing.assert_array_equal(tz.reshape(-1), aw)
    assert np.all((s1 == tz) | (s1.astype(int) - tz.astype(int) == 1))


# (format, x as float32, lower neighbour, upper neighbour) with x strictly between them.
# x is the float32 nearest to the named value; the tests use its exact position.
SR_CASES = [
    ("bfloat16", 1 + 0.3 * 2.0**-7, 1.0, 1 + 2.0**-7),
    ("bfloat16", -(1 + 0.3 * 2.0**-7), -1.0, -(1 + 2.0**-7)),
    ("float8_e4m3fn", 1 + 0.3 * 0.125, 1.0, 1.125),
    ("float8_e4m3fn", 2.3 * 2.0**-9, 2 * 2.0**-9, 3 * 2.0**-9),  # subnormal range
    ("float16", 5.7 * 2.0**-24, 5 * 2.0**-24, 6 * 2.0**-24),  # subnormal range
    ("float8_e5m2", 0.9 * 2.0**-16, 0.0, 2.0**-16),  # below the smallest subnormal
    ("float4_e2m1fn", 4.5, 4.0, 6.0),
]
SR_IDS = [f"{f}:{x:.6g}" for f, x, _, _ in SR_CASES]
N_DRAWS = 200_000


@pytest.mark.parametrize("nbits", [32, 3])
@pytest.mark.parametrize(("fmt", "v", "lo", "hi"), SR_CASES, ids=SR_IDS)
def test_stochastic_mean(fmt, v, lo, hi, nbits):
    """Mean of 200k stochastic roundings of x vs its expectation.

    With p the probability of rounding to ``hi``, the mean of N draws has standard deviation
    ``|hi - lo| * sqrt(p (1 - p) / N)``; we allow 5 of them (a false alarm about once in
    1.7 million runs; the seed is fixed anyway). For 32 random bits the expectation is x
    itself (the discarded bits fit in 32: exactly unbiased); for n = 3 bits it is
    ``lo + floor(f * 8) / 8 * (hi - lo)`` with f the position of x, biased toward zero.
    """
    f = get_format(fmt)
    x32 = np.float32(v)
    pos = (Fraction(float(x32)) - Fraction(lo)) / (Fraction(hi) - Fraction(lo))
    assert 0 < pos < 1
    p = Fraction(math.floor(pos * 2**nbits), 2**nbits) if nbits < 32 else pos
    expected = lo + float(p) * (hi - lo)
    x = np.full(N_DRAWS, x32)
    codes = fpsim.encode(x, f, rounding="stochastic", rng=2024 + nbits, stochastic_bits=nbits)
    vals = scalar_table(f)[codes.astype(np.int64)]  # values by the scalar tier
    assert set(np.unique(vals).tolist()) <= {lo, hi}
    mean = vals.mean()
    sigma = abs(hi - lo) * math.sqrt(float(p * (1 - p)) / N_DRAWS)
    bound = 5 * sigma
    assert abs(mean - expected) <= bound, (
        f"{fmt}: mean {mean!r} of {N_DRAWS} draws, expected {expected!r} (p={float(p):.6f}), "
        f"5-sigma bound {bound:.3g}"
    )
    if nbits == 3 and p != pos:
        # and the truncated probability is measurably different from the exact one here
        assert abs(mean - float(x32)) > bound


def _position(x32: np.float32, fmt) -> Fraction:
    """Exact position of |x| between its neighbours, from the scalar tier's toward-zero code."""
    f = get_format(fmt)
    low_code = encode_scalar(float(x32), f, "toward_zero")
    lo = abs(Fraction(scalar_table(f)[low_code]))
    up_code = encode_scalar(float(x32), f, "toward_positive" if x32 > 0 else "toward_negative")
    hi = abs(Fraction(scalar_table(f)[up_code]))
    assert lo <= abs(Fraction(float(x32))) < hi or lo == hi
    if lo == hi:
        return Fraction(0)  # x is exact
    return (abs(Fraction(float(x32))) - lo) / (hi - lo)


@pytest.mark.parametrize("nbits", [1, 2, 3, 5, 8, 12, 16, 17, 20])
@pytest.mark.parametrize("fmt", ["bfloat16", "float8_e4m3fn", "float16"])
def test_stochastic_probability_is_exact(fmt, nbits):
    """Over all 2**n values of the low n bits (random high bits, which must be ignored), x
    rounds away from zero exactly floor(f * 2**n) times. For bfloat16 n = 17, 20 exceed the
    16 discarded bits: then it is exactly f * 2**n."""
    f = get_format(fmt)
    rng = np.random.default_rng(nbits)
    words = np.arange(1 << nbits, dtype=np.uint64)
    high = rng.integers(0, 1 << 32, size=words.size, dtype=np.uint64) >> np.uint64(nbits) << np.uint64(nbits)
    words = ((words | high) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    base = {"bfloat16": 1.0, "float8_e4m3fn": 1.0, "float16": 3.0}[fmt]
    ulp = base * f.eps if fmt != "float16" else 2.0 * f.eps
    # fractions: random, a few exact multiples of 2**-n (the >= boundary) and one just below
    fracs = list(rng.uniform(0, 1, size=3)) + [0.5, 0.25, 2.0**-nbits, 1 - 2.0**-nbits, 0.5 - 2.0**-24]
    for sign in (1, -1):
        for fr in fracs:
            x32 = np.float32(sign * (base + fr * ulp))
            pos = _position(x32, f)
            if pos == 0:
                continue
            codes = fpsim.encode(
                np.full(words.size, x32), f, rounding="stochastic", random_bits=words, stochastic_bits=nbits
            )
            tz = encode_scalar(float(x32), f, "toward_zero")
            ups = int((codes.astype(np.int64) != tz).sum())
            assert ups == math.floor(pos * 2**nbits), (fmt, float(x32), nbits, float(pos), ups)


def test_stochastic_full_word_threshold():
    """x = 1 + ulp/4 in bfloat16: floor(f * 2**32) = 2**30, so the word R rounds away from
    zero iff 2**30 + R >= 2**32, i.e. R >= 0xC0000000."""
    x = np.full(4, np.float32(1 + 2.0**-9))
    r = np.array([0xBFFFFFFF, 0xC0000000, 0, 0xFFFFFFFF], np.uint32)
    got = fpsim.encode(x, "bfloat16", rounding="stochastic", random_bits=r)
    assert_codes_equal(got, [0x3F80, 0x3F81, 0x3F80, 0x3F81], "bfloat16", x)
    assert [encode_scalar(float(v), "bfloat16", "stochastic", random_bits=int(w)) for v, w in zip(x, r)] == [
        0x3F80,
        0x3F81,
        0x3F80,
        0x3F81,
    ]
    # exact values are never moved, whatever the word
    y = np.full(2, np.float32(1.0))
    got = fpsim.encode(y, "bfloat16", rounding="stochastic", random_bits=np.uint32([0, 0xFFFFFFFF]))
    assert_codes_equal(got, [0x3F80, 0x3F80], "bfloat16", y)


# --- hand-worked examples ------------------------------------------------------------------
# (format, x, mode, saturate, expected code). Derivations in the comments; rules from the
# RoundMode docstring (fpsim/formats/rounding.py): ties, directed modes, and overflow (nearest and
# stochastic to inf, toward-zero and odd to max, directed by sign; no inf -> NaN; no NaN ->
# max; saturate -> max).

NE, NA, TZ, TP, TN, ODD = (
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "toward_positive",
    "toward_negative",
    "odd",
)
F16, E4, E5, UZ = "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz"
HAND = [
    # float16: 1.0 = 0x3C00, ulp(1) = 2**-10. 1 + 2**-11 is the tie between 0x3C00 and 0x3C01.
    (F16, 1 + 2.0**-11, NE, False, 0x3C00),  # tie -> even significand (0)
    (F16, 1 + 2.0**-11, NA, False, 0x3C01),  # tie -> away from zero
    (F16, 1 + 2.0**-11, TZ, False, 0x3C00),
    (F16, 1 + 2.0**-11, TP, False, 0x3C01),
    (F16, 1 + 2.0**-11, TN, False, 0x3C00),
    (F16, 1 + 2.0**-11, ODD, False, 0x3C01),  # truncation 0x3C00 is even and inexact -> 0x3C01
    (F16, -(1 + 2.0**-11), TP, False, 0xBC00),  # toward +inf: -1
    (F16, -(1 + 2.0**-11), TN, False, 0xBC01),  # toward -inf: -(1 + 2**-10)
    (F16, -(1 + 2.0**-11), NA, False, 0xBC01),
    (F16, 1 + 3 * 2.0**-11, NE, False, 0x3C02),  # tie between 0x3C01 (odd) and 0x3C02 -> 0x3C02
    (F16, 1 + 3 * 2.0**-11, ODD, False, 0x3C01),  # truncation 0x3C01 already odd
    (F16, 2049.0, NE, False, 0x6800),  # ulp(2048) = 2: 2048 + 1 is a tie, 2048 is even
    (F16, 2049.0, NA, False, 0x6801),
    (F16, 2051.0, NE, False, 0x6802),  # tie between 2050 (odd) and 2052
    (F16, 65519.0, NE, False, 0x7BFF),  # below the midpoint 65520 between max 65504 and 65536
    (F16, 65520.0, NE, False, 0x7C00),  # tie: 65504 has an odd significand -> 65536 -> inf
    (F16, 65520.0, NE, True, 0x7BFF),  # saturate
    (F16, 65520.0, TZ, False, 0x7BFF),  # toward zero never overflows to inf
    (F16, 1e6, TN, False, 0x7BFF),  # positive overflow toward -inf: max
    (F16, -1e6, TN, False, 0xFC00),  # negative overflow toward -inf: -inf
    (F16, -1e6, TP, False, 0xFBFF),
    (F16, 1e6, ODD, False, 0x7BFF),  # odd overflows to max
    (F16, np.inf, ODD, False, 0x7C00),  # an infinite input stays infinite
    (F16, np.inf, TZ, True, 0x7BFF),  # ... unless saturating
    (F16, 2.0**-25, NE, False, 0x0000),  # half the smallest subnormal: tie -> 0
    (F16, 2.0**-25, NA, False, 0x0001),
    (F16, 2.0**-25, TP, False, 0x0001),
    (F16, 2.0**-25, ODD, False, 0x0001),
    (F16, -(2.0**-25), TZ, False, 0x8000),  # -0 keeps its sign
    (F16, 3 * 2.0**-26, NE, False, 0x0001),  # 0.75 of the smallest subnormal
    (F16, 2.0**-14 - 2.0**-25, NE, False, 0x0400),  # tie 1023 (odd) / 1024 units: carry to min normal
    (F16, 2.0**-14 - 2.0**-25, TZ, False, 0x03FF),
    # float8_e4m3fn: bias 7, max 448 = 0x7E (1.110 * 2**8), ulp there 32, NaN 0x7F, no inf.
    (E4, 464.0, NE, False, 0x7E),  # tie between 448 (even) and 480 (not finite) -> 448
    (E4, 464.0, NA, False, 0x7F),  # tie away -> 480 > max -> NaN (no inf)
    (E4, 464.0, NA, True, 0x7E),
    (E4, float(np.nextafter(np.float32(464), np.float32(500))), NE, False, 0x7F),
    (E4, float(np.nextafter(np.float32(464), np.float32(500))), NE, True, 0x7E),
    (E4, 449.0, TP, False, 0x7F),  # rounds up to 480 > max: overflow toward +inf -> NaN
    (E4, 449.0, TN, False, 0x7E),
    (E4, 449.0, TZ, False, 0x7E),
    (E4, 449.0, ODD, False, 0x7E),  # truncate 448 (14 quanta, even) -> 15 quanta = 480 > max -> max
    (E4, -449.0, TN, False, 0xFF),  # negative overflow toward -inf -> NaN with sign
    (E4, -449.0, TP, False, 0xFE),
    (E4, np.inf, NE, False, 0x7F),
    (E4, -np.inf, NE, True, 0xFE),  # saturate: -inf -> -448
    (E4, np.nan, NE, True, 0x7F),  # NaN stays NaN when saturating
    (E4, 2.0**-10, NE, False, 0x00),  # half the smallest subnormal 2**-9: tie -> 0
    (E4, 3 * 2.0**-10, NE, False, 0x02),  # 1.5 units: tie between 1 (odd) and 2
    (E4, 1.0625, NE, False, 0x38),  # 1 + ulp/2: tie -> 1.0
    (E4, 1.0625, NA, False, 0x39),
    (E4, 1.1875, NE, False, 0x3A),  # tie between 1.125 (odd) and 1.25
    (E4, 1.1875, ODD, False, 0x39),
    (E4, 17.0, NE, False, 0x58),  # 16 = 0x58, ulp 2: tie -> 16
    (E4, 19.0, NE, False, 0x5A),  # tie between 18 (odd) and 20
    # float8_e5m2: max 57344 = 0x7B, ulp 8192; 61440 is the tie with 65536 (inf).
    (E5, 61440.0, NE, False, 0x7C),
    (E5, 61440.0, TZ, False, 0x7B),
    (E5, 61440.0, NE, True, 0x7B),
    (E5, 61439.0, NE, False, 0x7B),
    # float8_e4m3fnuz: bias 8, no -0, NaN = 0x80, max 240 = 0x7F (ulp 16).
    (UZ, -0.0, NE, False, 0x00),
    (UZ, -(2.0**-20), NE, False, 0x00),  # rounds to zero: +0, not a NaN
    (UZ, -(2.0**-20), TN, False, 0x81),  # toward -inf: minus the smallest subnormal
    (UZ, -1.0, NE, False, 0xC0),
    (UZ, 248.0, NE, False, 0x80),  # tie between 240 (odd) and 256 (overflow) -> NaN
    (UZ, 248.0, TZ, False, 0x7F),
    (UZ, np.inf, NE, False, 0x80),
    (UZ, -np.nan, NE, False, 0x80),
    # float8_e8m0fnu: powers of two 2**-127 (0x00) .. 2**127 (0xFE), NaN 0xFF. Between 2**k and
    # 2**(k+1) the tie 1.5 * 2**k has "significand" 1, odd, so ties go up.
    ("float8_e8m0fnu", 3.0, NE, False, 129),
    ("float8_e8m0fnu", 3.0, TZ, False, 128),
    ("float8_e8m0fnu", 2.9, NE, False, 128),
    ("float8_e8m0fnu", 0.0, NE, False, 0xFF),  # no zero
    ("float8_e8m0fnu", -1.0, NE, False, 0xFF),  # unsigned
    ("float8_e8m0fnu", 2.0**-128, NE, False, 0x00),  # below the smallest value: the smallest
    ("float8_e8m0fnu", 2.0**-128, TZ, False, 0x00),
    ("float8_e8m0fnu", 1.5 * 2.0**-127, NE, False, 0x01),
    ("float8_e8m0fnu", 2.0**127, NE, False, 0xFE),
    ("float8_e8m0fnu", 1.5 * 2.0**127, NE, False, 0xFF),  # overflow -> NaN
    ("float8_e8m0fnu", 1.5 * 2.0**127, NE, True, 0xFE),
    ("float8_e8m0fnu", np.inf, NE, True, 0xFE),
    # float4_e2m1fn: codes 0..7 = 0, .5, 1, 1.5, 2, 3, 4, 6; no inf, no NaN.
    ("float4_e2m1fn", 5.0, NE, False, 0x6),  # tie between 4 (even) and 6
    ("float4_e2m1fn", 5.0, NA, False, 0x7),
    ("float4_e2m1fn", 7.0, NE, False, 0x7),  # tie with 8 -> overflow -> max (no inf, no NaN)
    ("float4_e2m1fn", 1e9, TP, False, 0x7),
    ("float4_e2m1fn", -np.inf, NE, False, 0xF),
    ("float4_e2m1fn", np.nan, NE, False, 0x0),  # NaN -> +0 (documented)
    ("float4_e2m1fn", 0.25, NE, False, 0x0),
    ("float4_e2m1fn", 0.75, NE, False, 0x2),  # tie between 0.5 (odd) and 1.0
    ("float4_e2m1fn", -0.25, NE, False, 0x8),
    ("float4_e2m1fn", 0.25, TP, False, 0x1),
    # bfloat16: 1.0 = 0x3F80, ulp 2**-7; max 0x7F7F.
    ("bfloat16", 1 + 2.0**-8, NE, False, 0x3F80),
    ("bfloat16", 1 + 3 * 2.0**-8, NE, False, 0x3F82),
    ("bfloat16", 1 + 2.0**-20, TP, False, 0x3F81),
    ("bfloat16", float(np.finfo(np.float32).max), NE, False, 0x7F80),  # above max + ulp/2 -> inf
    ("bfloat16", float(np.finfo(np.float32).max), TZ, False, 0x7F7F),
    # float32 from float64 inputs
    ("float32", 1 + 2.0**-24, NE, False, 0x3F800000),
    ("float32", 1 + 2.0**-24 + 2.0**-50, NE, False, 0x3F800001),
    ("float32", 1 + 2.0**-30, ODD, False, 0x3F800001),
    ("float32", 2.0**-150, NE, False, 0x00000000),
    ("float32", 2.0**-150, NA, False, 0x00000001),
    ("float32", 3 * 2.0**-151, NE, False, 0x00000001),
    ("float32", 1e39, NE, False, 0x7F800000),
    ("float32", 1e39, TZ, False, 0x7F7FFFFF),
    # int8: round, then wrap (or clamp)
    ("int8", 2.5, NE, False, 2),
    ("int8", 2.5, NA, False, 3),
    ("int8", 2.5, ODD, False, 3),
    ("int8", -2.5, TP, False, 0xFE),
    ("int8", -2.5, TN, False, 0xFD),
    ("int8", 127.5, NE, False, 0x80),  # 128 wraps to -128
    ("int8", 127.5, NE, True, 0x7F),
]


@pytest.mark.parametrize(
    ("fmt", "x", "mode", "saturate", "want"),
    HAND,
    ids=[f"{f}-{x!r}-{m}{'-sat' if s else ''}" for f, x, m, s, _ in HAND],
)
def test_hand_worked_examples(fmt, x, mode, saturate, want):
    f = get_format(fmt)
    # float32 input where x is a float32 number, float64 otherwise (and for the float32 target)
    with np.errstate(over="ignore"):
        exact32 = np.isnan(x) or float(np.float32(x)) == x
    a = np.array([x], dtype=np.float32 if exact32 and fmt != "float32" else np.float64)
    assert np.isnan(x) or float(a[0]) == x, "example not exact in its input dtype"
    got = fpsim.encode(a, f, rounding=mode, saturate=saturate)
    assert_codes_equal(got, [want], f, a, context=f"{mode}, saturate={saturate}")
    assert encode_scalar(x, f, mode, saturate=saturate) == want


# --- errors -------------------------------------------------------------------------------


def test_unknown_rounding_mode_lists_allowed():
    with pytest.raises(ValueError, match="unknown rounding mode 'nearest'") as info:
        fpsim.encode(np.float32([1.0]), "float16", rounding="nearest")
    for m in RoundMode:
        assert m.value in str(info.value)
    with pytest.raises(ValueError, match="allowed"):
        encode_scalar(1.0, "float16", "round_half_up")


def test_rounding_mode_accepts_enum_and_name():
    x = np.float32([1 + 2.0**-11])
    assert int(fpsim.encode(x, "float16", rounding=RoundMode.NEAREST_AWAY)[0]) == 0x3C01
    assert int(fpsim.encode(x, "float16", rounding="nearest_away")[0]) == 0x3C01


def test_stochastic_needs_random_bits_or_rng():
    with pytest.raises(ValueError, match="random_bits"):
        fpsim.encode(np.float32([1.0]), "bfloat16", rounding="stochastic")


@pytest.mark.parametrize("dtype", [np.int32, np.uint64, np.uint16, np.float32, np.int64])
def test_random_bits_wrong_dtype(dtype):
    with pytest.raises(TypeError, match=r"uint32.*" + np.dtype(dtype).name):
        fpsim.encode(
            np.float32([1.0, 2.0]), "bfloat16", rounding="stochastic", random_bits=np.zeros(2, dtype)
        )


@pytest.mark.parametrize("shape", [(3,), (2, 1), (1, 2), ()])
def test_random_bits_wrong_shape(shape):
    with pytest.raises(ValueError, match=r"shape.*\(2,\)"):
        fpsim.encode(
            np.float32([1.0, 2.0]), "bfloat16", rounding="stochastic", random_bits=np.zeros(shape, np.uint32)
        )


@pytest.mark.parametrize("nbits", [0, 33, -1])
def test_stochastic_bits_out_of_range(nbits):
    r = np.zeros(1, np.uint32)
    with pytest.raises(ValueError, match=rf"stochastic_bits must be in \[1, 32\], got {nbits}"):
        fpsim.encode(
            np.float32([1.1]), "bfloat16", rounding="stochastic", random_bits=r, stochastic_bits=nbits
        )
    with pytest.raises(ValueError, match="stochastic_bits"):
        encode_scalar(1.1, "bfloat16", "stochastic", stochastic_bits=nbits)


def test_unknown_format_lists_known_names():
    with pytest.raises(ValueError, match=re.escape("unknown format 'float8_e4m3x'")) as info:
        fpsim.encode(np.float32([1.0]), "float8_e4m3x")
    for name in fpsim.FORMATS:
        assert name in str(info.value)
    with pytest.raises(TypeError, match="format must be a name, a dtype or a Format"):
        fpsim.encode(np.float32([1.0]), 8)
