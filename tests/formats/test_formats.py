"""Format descriptions: derived properties against ml_dtypes.finfo/iinfo and the specs."""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim import Encoding, Format, IntFormat, get_format

FLOATS = [f for f in fpsim.FORMATS.values() if isinstance(f, Format)]
INTS = [f for f in fpsim.FORMATS.values() if isinstance(f, IntFormat)]


def ml_type(fmt):
    return {"float32": np.float32, "float16": np.float16}.get(fmt.name) or getattr(ml_dtypes, fmt.name)


REQUIRED = [
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3",
    "float8_e3m4",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
    "int8",
    "int4",
]


def test_registry_has_the_required_formats():
    missing = [n for n in REQUIRED if n not in fpsim.FORMATS]
    assert not missing, missing


@pytest.mark.parametrize("fmt", FLOATS, ids=str)
def test_derived_properties_equal_ml_dtypes_finfo(fmt):
    fi = ml_dtypes.finfo(ml_type(fmt))
    assert fmt.bits == fi.bits
    assert fmt.max == float(fi.max)
    assert fmt.min_normal == float(fi.smallest_normal)
    assert fmt.min_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)
    assert fmt.mantissa_bits == fi.nmant
    assert fmt.exponent_bits == fi.nexp
    assert fmt.min_exponent == fi.minexp
    assert fmt.max_exponent == fi.maxexp - 1


@pytest.mark.parametrize("fmt", FLOATS, ids=str)
def test_special_codes_agree_with_ml_dtypes(fmt):
    """Code of max decodes to max; NaN/inf codes decode to NaN/inf in ml_dtypes."""
    t = ml_type(fmt)
    view = np.dtype(fmt.code_dtype)

    def value(code):
        return (
            float(np.array([code], view).view(t)[0])
            if fmt.bits >= 8
            else float(np.array([code], np.uint8).view(t)[0])
        )

    assert value(fmt.code_of_max) == fmt.max
    assert (fmt.code_of_nan is None) == (not fmt.has_nan)
    if fmt.code_of_nan is not None:
        assert math.isnan(value(fmt.code_of_nan))
    if fmt.code_of_inf is None:
        assert not fmt.has_inf
    else:
        assert value(fmt.code_of_inf) == math.inf


def test_spec_values():
    """Maxima and minima from the specs (OCP FP8 v1.0 table 1, OCP MX v1.0 tables 1-3)."""
    g = get_format
    assert (g("float8_e4m3fn").max, g("float8_e5m2").max) == (448.0, 57344.0)
    assert (g("float6_e2m3fn").max, g("float6_e3m2fn").max, g("float4_e2m1fn").max) == (7.5, 28.0, 6.0)
    assert g("float8_e8m0fnu").max == 2.0**127 and g("float8_e8m0fnu").min_normal == 2.0**-127
    assert g("float8_e4m3").max == 240.0  # IEEE-style: the top binade holds inf and NaN
    assert g("float16").min_subnormal == 2.0**-24 and g("float16").max == 65504.0
    assert g("float4_e2m1fn").bytes_per_element == 0.5
    assert g("float6_e3m2fn").bytes_per_element == 0.75
    assert g("float8_e4m3fn").dynamic_range == pytest.approx(math.log2(448 / 2**-9))


@pytest.mark.parametrize("fmt", INTS, ids=str)
def test_int_formats_equal_iinfo(fmt):
    t = getattr(ml_dtypes, fmt.name, None) or np.dtype(fmt.name).type
    ii = ml_dtypes.iinfo(t)
    assert (fmt.min, fmt.max, fmt.bits) == (ii.min, ii.max, ii.bits)


def test_get_format_unknown_name_lists_known_names():
    with pytest.raises(ValueError, match="unknown format 'float7'.*float8_e4m3fn.*int4"):
        get_format("float7")
    with pytest.raises(TypeError, match="format must be a name, a dtype or a Format"):
        get_format(3.5)


def test_user_defined_format_without_registry():
    """An IEEE-style E4M3 with a different bias and subnormals off, defined in place."""
    fmt = Format("e4m3_b8_ftz", exponent_bits=4, mantissa_bits=3, bias=8, subnormals=False)
    assert get_format(fmt) is fmt and "e4m3_b8_ftz" not in fpsim.FORMATS
    assert fmt.max == 2.0**6 * 1.875 and fmt.min_subnormal == fmt.min_normal == 2.0**-7
    assert fpsim.decode(np.array([1], np.uint8), fmt)[0] == 0.0  # a subnormal code reads as zero
    assert fpsim.quantize(np.float32(1.0), fmt) == 1.0


def test_variants_by_replace_and_immutability():
    f16 = get_format("float16")
    ftz = dataclasses.replace(f16, name="float16_ftz", subnormals=False)
    assert ftz.min_subnormal == f16.min_normal and f16.subnormals
    with pytest.raises(dataclasses.FrozenInstanceError):
        f16.bias = 3
    with pytest.raises(TypeError):
        fpsim.FORMATS["mine"] = ftz


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(exponent_bits=0, mantissa_bits=3, bias=1), "exponent_bits >= 1"),
        (dict(exponent_bits=8, mantissa_bits=30, bias=127), "at most 32 bits"),
        (dict(exponent_bits=4, mantissa_bits=0, bias=7), "IEEE encoding needs mantissa_bits"),
        (
            dict(exponent_bits=4, mantissa_bits=3, bias=7, signed=False, encoding=Encoding.FNUZ),
            "needs a sign",
        ),
        (dict(exponent_bits=9, mantissa_bits=3, bias=127), "exact in float32"),
        (dict(exponent_bits=4, mantissa_bits=3, bias=7, encoding="fn"), "must be an Encoding"),
    ],
)
def test_invalid_formats_are_rejected_with_a_reason(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Format("bad", **kwargs)


def test_wide_user_format_encodes_and_decodes_like_the_scalar_tier():
    """A 22-bit float32-range format with 14 significant bits (a tensor-core accumulator)."""
    from fpsim.emulate.reference import decode_scalar, encode_scalar

    fmt = dataclasses.replace(get_format("float32"), name="p14", mantissa_bits=13)
    x = np.random.default_rng(0).standard_normal(2000).astype(np.float32) * np.float32(1e-30)
    x = np.concatenate([x, np.float32([0, -0.0, np.inf, np.nan, 3e38, 1e-45])])
    codes = fpsim.encode(x, fmt)
    assert codes.dtype == np.uint32
    assert [int(c) for c in codes] == [encode_scalar(float(v), fmt) for v in x]
    want = np.array([decode_scalar(int(c), fmt) for c in codes], np.float32)
    np.testing.assert_array_equal(fpsim.decode(codes, fmt).view(np.uint32), want.view(np.uint32))
