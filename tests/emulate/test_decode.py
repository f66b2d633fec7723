"""decode: every code of every small format against ml_dtypes / numpy and the scalar tier."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from oracles import (
    FLOAT_FORMATS,
    INT_FORMATS,
    SMALL_FORMATS,
    fmt_id,
    is_nan_code,
    ml_decode,
    ml_dtype,
    ml_dtype_or_none,
    uint_dtype,
)

import fpsim
from fpsim import Format, IntFormat, get_format
from fpsim.emulate.reference import decode_scalar


def all_codes(fmt) -> np.ndarray:
    return np.arange(1 << fmt.bits, dtype=np.int64).astype(uint_dtype(fmt))


def assert_same_floats(got, want, codes, fmt, what: str) -> None:
    """float32 results equal bit for bit (so -0.0 != +0.0); two NaNs count as equal."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == np.float32, f"decode must return float32, got {got.dtype}"
    assert want.dtype == np.float32
    assert got.shape == want.shape
    bad = (got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want))
    if bad.any():
        i = np.flatnonzero(bad.reshape(-1))
        c = np.asarray(codes).reshape(-1)
        shown = ", ".join(
            f"code 0x{int(c[k]):x}: got {got.reshape(-1)[k]!r} want {want.reshape(-1)[k]!r}" for k in i[:8]
        )
        raise AssertionError(f"{fmt.name}: {i.size} codes decode unlike {what}: {shown}")


@pytest.mark.parametrize("fmt", [f for f in SMALL_FORMATS if ml_dtype_or_none(f) is not None], ids=fmt_id)
def test_every_code_matches_ml_dtypes(fmt):
    codes = all_codes(fmt)
    got = fpsim.decode(codes, fmt)
    want = ml_decode(codes, fmt)
    if isinstance(fmt, IntFormat):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want.astype(np.float32), strict=True)
    else:
        assert_same_floats(got, want, codes, fmt, f"ml_dtypes.{ml_dtype(fmt)}")


@pytest.mark.parametrize("fmt", SMALL_FORMATS, ids=fmt_id)
def test_every_code_matches_scalar_tier(fmt):
    codes = all_codes(fmt)
    got = fpsim.decode(codes, fmt)
    want = np.array([decode_scalar(int(c), fmt) for c in codes], dtype=np.float64)
    want32 = want.astype(np.float32)
    assert np.array_equal(want32.astype(np.float64), want, equal_nan=True), "scalar values not float32"
    assert_same_floats(got, want32, codes, fmt, "decode_scalar")


@pytest.mark.parametrize("fmt", [f for f in FLOAT_FORMATS if f.bits <= 16], ids=fmt_id)
def test_nan_codes_are_the_documented_ones(fmt):
    """The NaN codes of each encoding (formats.Encoding docstring), from the scalar tier."""
    codes = all_codes(fmt)
    nan = is_nan_code(codes, fmt)
    enc = fmt.encoding
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    mag = codes.astype(np.int64) & ((1 << (e + m)) - 1)
    if enc is fpsim.Encoding.IEEE:
        want = (mag >> m == (1 << e) - 1) & (mag & ((1 << m) - 1) != 0)
    elif enc is fpsim.Encoding.FN:
        want = mag == (1 << (e + m)) - 1
    elif enc is fpsim.Encoding.FNUZ:
        want = codes.astype(np.int64) == fmt.sign_mask
    else:
        want = np.zeros(codes.shape, bool)
    np.testing.assert_array_equal(nan, want)
    np.testing.assert_array_equal(np.isnan(fpsim.decode(codes, fmt)), want)
    if fmt.code_of_nan is not None:
        assert np.isnan(fpsim.decode(np.array([fmt.code_of_nan]), fmt)[0])


def test_float32_random_codes_reinterpret():
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 1 << 32, size=10**6, dtype=np.uint32)
    codes[:6] = [0, 0x80000000, 0x7F800000, 0x7F800001, 0xFFFFFFFF, 0x00000001]
    got = fpsim.decode(codes, "float32")
    assert got.dtype == np.float32
    # bit for bit, NaN payloads included: float32 codes are reinterpreted, not decoded
    np.testing.assert_array_equal(got.view(np.uint32), codes)


@pytest.mark.parametrize("code_dtype", [np.uint32, np.int64, np.uint64])
def test_float32_code_dtypes(code_dtype):
    codes = np.array([0, 1, 0x3F800000, 0x7F7FFFFF, 0x80000000, 0xFF800000], dtype=code_dtype)
    got = fpsim.decode(codes, "float32")
    np.testing.assert_array_equal(got.view(np.uint32), codes.astype(np.uint32))


@pytest.mark.parametrize("fmt", INT_FORMATS, ids=fmt_id)
def test_int_formats_sign_extend(fmt):
    codes = all_codes(fmt).astype(np.int64)
    if fmt.signed:
        want = np.where(codes >= 1 << (fmt.bits - 1), codes - (1 << fmt.bits), codes)
    else:
        want = codes
    got = fpsim.decode(codes, fmt)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32), strict=True)
    assert got.min() == fmt.min and got.max() == fmt.max


def test_int8_matches_numpy_view():
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(fpsim.decode(codes, "int8"), codes.view(np.int8).astype(np.float32))


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8_e4m3fn"])
def test_decode_without_subnormals_flushes_to_signed_zero(fmt):
    base = get_format(fmt)
    ftz = replace(base, name=base.name + "_ftz", subnormals=False)
    codes = all_codes(ftz)
    got = fpsim.decode(codes, ftz)
    want = np.array([decode_scalar(int(c), ftz) for c in codes], dtype=np.float32)
    assert_same_floats(got, want, codes, ftz, "decode_scalar")
    m = base.mantissa_bits
    sub = np.array([1, (1 << m) - 1, base.sign_mask | 1, base.sign_mask | ((1 << m) - 1)])
    vals = fpsim.decode(sub, ftz)
    np.testing.assert_array_equal(vals.view(np.uint32), [0, 0, 0x80000000, 0x80000000])
    # the normal codes are unchanged
    normal = codes[(codes.astype(np.int64) & ((1 << (base.exponent_bits + m)) - 1)) >= 1 << m]
    assert_same_floats(fpsim.decode(normal, ftz), fpsim.decode(normal, base), normal, ftz, "with subnormals")


@pytest.mark.parametrize(
    "shape", [(), (1,), (0,), (1023,), (3, 5, 7)], ids=lambda s: "x".join(map(str, s)) or "scalar"
)
@pytest.mark.parametrize("fmt", ["float8_e5m2", "float4_e2m1fn", "int4", "float32"])
def test_decode_shapes_and_code_dtypes(fmt, shape):
    f = get_format(fmt)
    rng = np.random.default_rng(len(shape))
    codes = rng.integers(0, 1 << f.bits, size=shape, dtype=np.int64)
    want = np.array([decode_scalar(int(c), f) for c in codes.reshape(-1)], np.float32).reshape(shape)
    # int32 cannot hold float32 codes >= 2**31 (negative numbers are not codes)
    for dt in (np.int64, np.int32, np.uint32, uint_dtype(f)) if f.bits < 32 else (np.int64, np.uint32):
        got = fpsim.decode(codes.astype(dt), f)
        assert isinstance(got, np.ndarray) or np.isscalar(got)
        got = np.asarray(got)
        assert got.shape == shape and got.dtype == np.float32
        assert_same_floats(got, want, codes, f, f"decode_scalar ({np.dtype(dt).name} codes)")


def test_decode_python_ints_and_lists():
    assert float(fpsim.decode(0x3C00, "float16")) == 1.0
    np.testing.assert_array_equal(fpsim.decode([0x38, 0xB8], "float8_e4m3fn"), np.float32([1.0, -1.0]))


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [np.array([1.0]), np.array([1.0], np.float32), np.array([True])],
    ids=["float64", "float32", "bool"],
)
def test_decode_rejects_non_integer_codes(bad):
    with pytest.raises(TypeError, match=r"integer.*" + str(bad.dtype)):
        fpsim.decode(bad, "float8_e4m3fn")


_RANGE_FORMATS = [f.name for f in SMALL_FORMATS] + ["float32"]


@pytest.mark.parametrize("fmt", _RANGE_FORMATS)
@pytest.mark.parametrize("which", ["negative", "too_big"])
def test_decode_rejects_out_of_range_codes(fmt, which):
    f = get_format(fmt)
    code = -1 if which == "negative" else 1 << f.bits
    for dt in (np.int64, np.uint64) if which == "too_big" else (np.int64, np.int32, np.int8):
        codes = np.array([0, code, 1], dtype=dt)
        with pytest.raises(ValueError, match=rf"out of range.*{f.name}"):
            fpsim.decode(codes, f)


def test_decode_rejects_sub_byte_code_in_a_full_byte():
    # a uint8 holding 16 is not a float4 code even though uint8 is float4's code dtype
    with pytest.raises(ValueError, match="out of range for float4_e2m1fn"):
        fpsim.decode(np.array([3, 16], np.uint8), "float4_e2m1fn")


def test_decode_unknown_format():
    with pytest.raises(ValueError, match="unknown format 'float7'.*float8_e4m3fn"):
        fpsim.decode(np.array([0]), "float7")


# --- JAX --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", SMALL_FORMATS + [get_format("float32")], ids=fmt_id)
def test_decode_under_jit_equals_numpy(fmt):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    if fmt.bits == 32:
        codes = np.random.default_rng(3).integers(0, 1 << 32, size=1 << 16, dtype=np.uint32)
    else:
        codes = all_codes(fmt)
    want = fpsim.decode(codes, fmt)
    got = np.asarray(jax.jit(lambda c: fpsim.decode(c, fmt))(jnp.asarray(codes)))
    assert got.dtype == np.float32
    # bit for bit (zeros' signs, NaN payloads of float32 codes)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_decode_accepts_a_format_object():
    # a Format built by hand (not the registry's instance) with ml_dtypes' float8_e4m3fn layout
    f = Format("my_e4m3", 4, 3, 7, encoding=fpsim.Encoding.FN)
    codes = np.arange(256, dtype=np.uint8)
    assert_same_floats(fpsim.decode(codes, f), ml_decode(codes, "float8_e4m3fn"), codes, f, "ml_dtypes")
