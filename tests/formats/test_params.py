"""A format's numbers are one tuple, :class:`fpsim.formats.params.FormatParams`, read by every tier.

Checked here: each field against ml_dtypes (``finfo``, ``iinfo`` and its casts of 1.0, -1.0,
inf and NaN), an independent description of the same formats; the encode options; that the
numba loops, the Triton kernels' host and the accumulation kernel's parameter tensor are
given this tuple (the kernels' words as int32 bit patterns of the same numbers); and that no
module of ``fpsim/`` defines a second tuple of a format's numbers (an AST scan, shown to find
one). The tiers' results are compared bit for bit with the numpy tier in tests/emulate/ and
tests/kernels/.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fpsim.emulate import element
from fpsim.formats import FORMATS, Encoding, Format, IntFormat
from fpsim.formats.params import FormatParams, format_params

ROOT = Path(__file__).resolve().parents[2]
FLOATS = [n for n, f in FORMATS.items() if isinstance(f, Format) and n != "float32"]
INTS = [n for n, f in FORMATS.items() if isinstance(f, IntFormat)]
_UINT = {4: np.uint8, 6: np.uint8, 8: np.uint8, 16: np.uint16}


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def _code(value: float, name: str) -> int:
    """ml_dtypes' (numpy's for float16) code of ``value`` cast to format ``name``."""
    dtype = _dtype(name)
    return int(np.array(value, np.float32).astype(dtype).view(_UINT[dtype.itemsize * 8]))


def _f64_bits(v: float) -> int:
    return int(np.float64(v).view(np.int64))


@pytest.mark.parametrize("name", FLOATS)
def test_float_fields_match_ml_dtypes(name):
    fmt, fi = FORMATS[name], ml_dtypes.finfo(_dtype(name))
    p = format_params(fmt)
    assert (p.is_int, p.bits, p.e, p.m, p.emin) == (0, fi.bits, fi.nexp, fi.nmant, fi.minexp)
    assert p.code_max == _code(float(fi.max), name)
    assert p.f64_max == _f64_bits(float(fi.max))
    assert p.f64_min_normal == _f64_bits(float(fi.smallest_normal))
    assert p.code_max >> p.m <= p.top_field == (1 << fi.nexp) - 1
    assert (_code(1.0, name) >> p.m) == p.bias  # 1.0's exponent field is the bias
    signed = float(np.array(-1.0, np.float32).astype(_dtype(name))) == -1.0
    assert p.signed == int(signed)
    assert p.sign_mask == (_code(-1.0, name) ^ _code(1.0, name) if signed else 0)
    assert p.sign_shift == fi.nexp + fi.nmant and (not signed or p.sign_mask == 1 << p.sign_shift)
    assert p.mag_mask == ((1 << fi.bits) - 1) ^ p.sign_mask == p.imask ^ p.sign_mask
    assert (p.frac_mask, p.mant_one, p.d0, p.emin_b) == (
        (1 << fi.nmant) - 1,
        1 << fi.nmant,
        23 - fi.nmant,
        fi.minexp + 127,
    )
    has_sub = float(fi.smallest_subnormal) < float(fi.smallest_normal)
    assert p.subnormal == int(has_sub) and p.subn_mask == (0xFFFFFFFF if has_sub else 0)
    assert p.has_zero == int(float(np.array(0.0, np.float32).astype(_dtype(name))) == 0.0)
    nan = np.isnan(np.array(np.nan, np.float32).astype(_dtype(name)).astype(np.float32))
    assert p.has_nan == int(nan) and p.code_nan == (_code(np.nan, name) if nan else 0)
    inf = np.isinf(np.array(np.inf, np.float32).astype(_dtype(name)).astype(np.float32))
    assert p.code_inf == (_code(np.inf, name) if inf else 0) and (p.enc == Encoding.IEEE.code) == inf
    assert p.enc == fmt.encoding.code and p.wide == 0 and p.fast == int(signed and p.has_zero)


def test_float32_fields():
    """float32 is not an ml_dtypes type: numpy's ``finfo`` and bit patterns."""
    p, fi = format_params(FORMATS["float32"]), np.finfo(np.float32)
    bits = np.array([fi.max, np.inf, np.nan, -0.0], np.float32).view(np.uint32).tolist()
    assert (p.code_max, p.code_inf, p.code_nan, p.sign_mask) == tuple(bits)
    assert (p.m, p.emin, p.bits, p.wide, p.subnormal) == (fi.nmant, fi.minexp, 32, 1, 1)
    assert (p.f64_max, p.f64_min_normal) == (_f64_bits(fi.max), _f64_bits(fi.smallest_normal))


@pytest.mark.parametrize("name", INTS)
def test_int_fields_match_ml_dtypes(name):
    fmt, ii = FORMATS[name], ml_dtypes.iinfo(_dtype(name))
    p = format_params(fmt)
    assert (p.is_int, p.bits, p.max_int, p.min_int, p.frac) == (1, ii.bits, ii.max, ii.min, 0)
    assert p.signed == int(ii.min < 0) and p.imask == (1 << ii.bits) - 1 and p.clamp == 0
    assert format_params(fmt, saturate=True).clamp == 1


@pytest.mark.parametrize("name", ["float16", "float8_e4m3fn", "float4_e2m1fn", "int8"])
def test_encode_options(name):
    fmt = FORMATS[name]
    plain, sat, ftz = (format_params(fmt, saturate=s, ftz=f) for s, f in ((0, 0), (1, 0), (0, 1)))
    assert (plain.saturate, sat.saturate, ftz.ftz) == (0, 1, 1)
    if isinstance(fmt, Format):
        assert (plain.inf_lim, sat.inf_lim) == (fmt.code_of_max, 0xFFFFFFFF)
        assert (plain.ftz_lim, ftz.ftz_lim) == (0, 1 << fmt.mantissa_bits)
    # the options change nothing else
    assert plain._replace(saturate=1, clamp=sat.clamp, inf_lim=sat.inf_lim) == sat
    assert plain._replace(ftz=1, ftz_lim=ftz.ftz_lim) == ftz


def test_a_format_without_subnormals():
    fmt = replace(FORMATS["float16"], name="float16_nosub", subnormals=False)
    p = format_params(fmt)
    assert (p.subnormal, p.subn_mask) == (0, 0)
    assert format_params(fmt) is p  # built once per (format, options)


def test_bad_format_is_refused():
    with pytest.raises(TypeError, match="Format or IntFormat"):
        format_params("float16")


def test_the_numba_loops_take_the_tuple():
    assert element.loop_params(FORMATS["float8_e4m3fn"], True, False) == tuple(
        format_params(FORMATS["float8_e4m3fn"], saturate=True)
    )


@pytest.mark.parametrize("name", [*FORMATS])
def test_the_kernels_take_the_tuple_as_int32_words(name):
    """:func:`fpsim.kernels.format_args.format_args` passes the same numbers: each 32-bit word as
    the int32 with its bits (Triton types an int by its value), the float64 bounds as they are."""
    from fpsim.kernels.arguments import i32
    from fpsim.kernels.format_args import FormatPaths, format_args

    for sat, ftz in ((False, False), (True, True)):
        p = format_params(FORMATS[name], saturate=sat, ftz=ftz)
        words, paths = format_args(FORMATS[name], saturate=sat, ftz=ftz)
        assert type(words) is FormatParams and paths == FormatPaths.of(p)
        for field, v, w in zip(FormatParams._fields, p, words, strict=True):
            if field.startswith("f64_"):
                assert w == v, field
            else:
                assert -(1 << 31) <= v < (1 << 32) and w == i32(v) and -(1 << 31) <= w < (1 << 31), field


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2fnuz"])
def test_the_accumulation_kernel_reads_the_tuple(name):
    """A row of the accumulation kernel's int64 parameter tensor is the format's tuple."""
    from fpsim.kernels import accumulate

    fmt = FORMATS[name]
    row = accumulate._format_params(fmt)
    assert row == list(format_params(fmt, ftz=not fmt.subnormals and fmt.mantissa_bits > 0))
    assert len(row) == accumulate.FORMAT_PARAMS == len(FormatParams._fields)
    assert all(-(1 << 63) <= v < (1 << 63) for v in row)


FIXED_ORDER = (
    "is_int", "signed", "has_zero", "has_nan", "enc", "bits", "e", "m", "emin", "bias", "code_max",
    "code_inf", "code_nan", "subnormal", "fast", "wide", "frac", "max_int", "min_int", "saturate", "ftz",
    "clamp", "emin_b", "d0", "inf_lim", "ftz_lim", "mant_one", "sign_shift", "subn_mask", "sign_mask",
    "mag_mask", "frac_mask", "top_field", "imask", "f64_min_normal", "f64_max",
)  # fmt: skip


def test_fields_keep_their_positions():
    """numba's disk cache keeps the loops' field positions (measure.P_*) frozen in, and checks
    only measure.py for changes: a field may be appended, never moved."""
    assert FormatParams._fields[: len(FIXED_ORDER)] == FIXED_ORDER


# --- no second tuple of a format's numbers ----------------------------------------------------------

_FORMAT_FIELDS = {"code_max", "emin", "mant_one", "code_inf", "code_nan"}


def _format_tuples(source: str) -> list[str]:
    """Classes in ``source`` deriving from NamedTuple with a field naming a format's number."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("NamedTuple") for b in node.bases):
            fields = {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
            if fields & _FORMAT_FIELDS:
                found.append(node.name)
    return found


def test_the_scan_finds_a_second_format_tuple():
    src = "from typing import NamedTuple\nclass LoopFormat(NamedTuple):\n    m: int\n    code_max: int\n"
    assert _format_tuples(src) == ["LoopFormat"]
    assert _format_tuples("import typing\nclass A(typing.NamedTuple):\n    emin: int = 0\n") == ["A"]


def test_no_module_defines_a_second_format_tuple():
    found = {
        str(path.relative_to(ROOT)): names
        for path in sorted((ROOT / "fpsim").rglob("*.py"))
        if (names := _format_tuples(path.read_text()))
    }
    assert found == {"fpsim/formats/params.py": ["FormatParams"]}
