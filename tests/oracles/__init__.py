"""Shared oracles and test data for the fpsim tests (``from oracles import ...``).

The oracles here never call the code under test (``fpsim.encode`` / ``fpsim.decode``): code
classes (NaN or not) come from the scalar tier :func:`fpsim.emulate.reference.decode_scalar`, and the
reference casts from ml_dtypes / numpy.
"""

from __future__ import annotations

import math
import warnings
from functools import cache

import ml_dtypes
import numpy as np
import pytest

from fpsim import FORMATS, Format, IntFormat, RoundMode, get_format
from fpsim.emulate.reference import decode_scalar

# --- format and mode lists (for parametrize) ----------------------------------------------

FLOAT_FORMATS = [f for f in FORMATS.values() if isinstance(f, Format)]
INT_FORMATS = [f for f in FORMATS.values() if isinstance(f, IntFormat)]
ALL_FORMATS = list(FORMATS.values())
SMALL_FORMATS = [f for f in ALL_FORMATS if f.bits <= 16]
MODES = list(RoundMode)


def fmt_id(fmt) -> str:
    return fmt.name


def mode_id(mode) -> str:
    return mode.value


# --- ml_dtypes / numpy twins of the formats -------------------------------------------------

_NUMPY_TWINS = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "uint8": np.uint8}


def uint_dtype(fmt) -> np.dtype:
    """Unsigned integer dtype of the width of the format's storage (one code per element)."""
    fmt = get_format(fmt)
    return np.dtype(np.uint8 if fmt.bits <= 8 else np.uint16 if fmt.bits <= 16 else np.uint32)


def ml_dtype_or_none(fmt) -> np.dtype | None:
    """The numpy / ml_dtypes dtype of ``fmt`` (same name), or None when neither has it."""
    fmt = get_format(fmt)
    if fmt.name in _NUMPY_TWINS:
        return np.dtype(_NUMPY_TWINS[fmt.name])
    t = getattr(ml_dtypes, fmt.name, None)
    return None if t is None else np.dtype(t)


def ml_dtype(fmt) -> np.dtype:
    """Like :func:`ml_dtype_or_none` but skips the calling test when there is no twin."""
    dt = ml_dtype_or_none(fmt)
    if dt is None:
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {get_format(fmt).name}")
    return dt


def ml_encode(x: np.ndarray, fmt) -> np.ndarray:
    """Codes of ``x.astype(<ml_dtypes type>)``.

    ml_dtypes stores sub-byte types (float4_e2m1fn, float6_*, int4) one per byte; the code
    is the low ``fmt.bits`` bits of that byte.
    """
    fmt = get_format(fmt)
    dt = ml_dtype(fmt)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        stored = np.asarray(x).astype(dt)
    u = uint_dtype(fmt)
    return stored.view(u) & u.type((1 << fmt.bits) - 1)


def ml_decode(codes: np.ndarray, fmt) -> np.ndarray:
    """Values (float32 for floats, int64 for ints) of ``codes`` viewed as the ml_dtypes type."""
    fmt = get_format(fmt)
    dt = ml_dtype(fmt)
    stored = np.asarray(codes).astype(uint_dtype(fmt)).view(dt)
    return stored.astype(np.int64 if isinstance(fmt, IntFormat) else np.float32)


# --- NaN class of codes, from the scalar tier --------------------------------------------


@cache
def scalar_table(fmt) -> np.ndarray:
    """float64 value of every code of a format of <= 16 bits, by ``decode_scalar`` (read-only)."""
    fmt = get_format(fmt)
    assert fmt.bits <= 16
    table = np.array([decode_scalar(c, fmt) for c in range(1 << fmt.bits)], dtype=np.float64)
    table.flags.writeable = False
    return table


def is_nan_code(codes, fmt) -> np.ndarray:
    """Whether each code is a NaN of ``fmt`` (False for out-of-range codes)."""
    fmt = get_format(fmt)
    c = np.asarray(codes).astype(np.int64)
    if isinstance(fmt, IntFormat):
        return np.zeros(c.shape, bool)
    if fmt.bits == 32:
        ok = (c >= 0) & (c < 1 << 32)
        return ok & np.isnan(np.where(ok, c, 0).astype(np.uint32).view(np.float32))
    ok = (c >= 0) & (c < 1 << fmt.bits)
    return ok & np.isnan(scalar_table(fmt)[np.where(ok, c, 0)])


# --- readable mismatch reports ------------------------------------------------------------


def describe_input(v) -> str:
    """repr, IEEE bit pattern and C99 hex of one input element."""
    v = np.asarray(v)
    if v.dtype.kind == "f" or ml_dtype_or_none_by_dtype(v.dtype):
        bits = v.reshape(1).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[v.dtype.itemsize])[0]
        f = float(v)
        hexf = f.hex() if math.isfinite(f) else str(f)
        return f"{v.dtype.name}({f!r}) bits=0x{int(bits):0{2 * v.dtype.itemsize}x} [{hexf}]"
    return f"{v.dtype.name}({v.item()!r})"


def ml_dtype_or_none_by_dtype(dt: np.dtype) -> bool:
    try:
        ml_dtypes.finfo(dt)
    except (TypeError, ValueError):
        return False
    return True


def describe_code(code: int, fmt) -> str:
    """A code in hex, split into its fields, with its value (scalar tier)."""
    fmt = get_format(fmt)
    code = int(code)
    width = (fmt.bits + 3) // 4
    if not 0 <= code < (1 << fmt.bits):
        return f"0x{code:x} (out of range for {fmt.bits} bits)"
    value = decode_scalar(code, fmt)
    if isinstance(fmt, IntFormat):
        return f"0x{code:0{width}x} (={int(value)})"
    m, e = fmt.mantissa_bits, fmt.exponent_bits
    man = code & ((1 << m) - 1)
    exp = (code >> m) & ((1 << e) - 1)
    fields = f"e={exp:0{e}b} m={man:0{m}b}" if m else f"e={exp:0{e}b}"
    if fmt.signed:
        fields = f"s={code >> (e + m)} " + fields
    return f"0x{code:0{width}x} ({fields}) = {value!r}"


def assert_codes_equal(got, want, fmt, inputs=None, nan_by_class=False, context: str = "") -> None:
    """Zero-tolerance comparison of two code arrays of ``fmt``.

    With ``nan_by_class`` two codes that both are NaNs of ``fmt`` (by the scalar tier) count as
    equal. On mismatch the message shows how many differ and the first 8 with their input
    (``inputs``, same shape), the expected and the obtained code, field by field.
    """
    fmt = get_format(fmt)
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype.kind in "iu", f"{fmt.name}: codes must be integers, got dtype {got.dtype}"
    assert got.shape == want.shape, f"{fmt.name}: shape {got.shape} != expected {want.shape}"
    g = got.astype(np.int64).reshape(-1)
    w = want.astype(np.int64).reshape(-1)
    bad = g != w
    if nan_by_class and bad.any():
        bad &= ~(is_nan_code(g, fmt) & is_nan_code(w, fmt))
    if not bad.any():
        return
    idx = np.flatnonzero(bad)
    x = None if inputs is None else np.asarray(inputs).reshape(-1)
    if x is not None:
        assert x.size == g.size, "inputs must have the shape of the codes"
    lines = [
        f"{idx.size} of {g.size} codes differ in {fmt.name}{' (' + context + ')' if context else ''}"
        f"{' (NaNs compared by class)' if nan_by_class else ''}; first {min(8, idx.size)}:"
    ]
    for i in idx[:8]:
        where = np.unravel_index(i, got.shape) if got.ndim else ()
        src = "" if x is None else f"x={describe_input(x[i])}\n      "
        lines.append(
            f"  at {tuple(int(k) for k in where)}: {src}"
            f"want {describe_code(w[i], fmt)}\n      got  {describe_code(g[i], fmt)}"
        )
    raise AssertionError("\n".join(lines))


# --- test points ------------------------------------------------------------------------------


def _f32_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


# float32's own extremes: smallest / largest subnormal, smallest normal, max, and NaN patterns
# (quiet, signalling, with payload).
F32_EXTREMES = _f32_bits(
    [0x00000001, 0x00000002, 0x007FFFFF, 0x00800000, 0x00800001, 0x7F7FFFFF, 0x7F800000]
    + [0x7FC00000, 0x7F800001, 0x7FBFFFFF, 0x7FC00001, 0x7FFFFFFF]
)


# NaNs of every kind, to put deliberately into the inputs of every tier comparison: signaling
# (quiet bit clear) and quiet, both signs, several payloads. 0x7F97C976 is the signaling NaN
# of issue 27, on which numpy's SIMD fmax kernels disagreed.
NAN_BITS32 = (0x7F97C976, 0xFF800001, 0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0xFFBFFFFF, 0x7FBFFFFF, 0xFFC00000)
NAN_BITS64 = (
    0x7FF0000000000001,  # signaling, smallest payload
    0xFFF4000000000000,  # signaling, negative
    0x7FF7FFFFFFFFFFFF,  # signaling, largest payload
    0x7FF8000000000001,  # quiet, payload 1
    0xFFFFFFFFFFFFFFFF,  # quiet, negative, every payload bit
    0xFFF8000000000000,  # quiet, negative (x86's default NaN)
    0x7FF2F3B8E9AC0001,  # signaling, mixed payload
)


def nan_patterns(dtype) -> np.ndarray:
    """:data:`NAN_BITS32` or :data:`NAN_BITS64` as an array of float32 / float64 ``dtype``."""
    dt = np.dtype(dtype)
    bits = {np.dtype(np.float32): (NAN_BITS32, np.uint32), np.dtype(np.float64): (NAN_BITS64, np.uint64)}[dt]
    return np.asarray(bits[0], bits[1]).view(dt)


def with_nans(x, start: int = 0, spacing: int = 37, rounds: int = 2) -> np.ndarray:
    """A copy of float32 / float64 ``x`` holding the NaNs of :func:`nan_patterns`: each
    pattern ``rounds`` times, at flat positions ``start``, ``start + spacing``, ... (an odd
    spacing puts them at every offset in blocks and SIMD lanes, next to the other values; the
    data beyond ``start + rounds * len(patterns) * spacing`` stay free of them). Tests whose
    data come from random bit patterns hold these NaNs this way, not by the seed's luck."""
    out = np.array(x, copy=True)
    u = np.uint64 if out.dtype.itemsize == 8 else np.uint32
    bits = np.tile(nan_patterns(out.dtype).view(u), rounds)  # written as integers: bit for bit
    pos = start + spacing * np.arange(bits.size)
    keep = pos < out.size
    out.reshape(-1).view(u)[pos[keep]] = bits[keep]
    return out


def _with_neighbours(values) -> list[np.ndarray]:
    """The values that are exact float32 numbers, with their float32 neighbours."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v) & (np.abs(v) <= float(np.finfo(np.float32).max))]
    v32 = v.astype(np.float32)
    v32 = v32[v32.astype(np.float64) == v]
    with np.errstate(over="ignore"):  # float32 max's upper neighbour is inf
        return [v32, np.nextafter(v32, np.float32(np.inf)), np.nextafter(v32, np.float32(-np.inf))]


def _unique_f32(parts) -> np.ndarray:
    a = np.concatenate([np.asarray(p, dtype=np.float32).reshape(-1) for p in parts])
    a = np.concatenate([a, -a])
    a = np.unique(a.view(np.uint32)).view(np.float32)
    a.flags.writeable = False
    return a


@cache
def finite_values(fmt) -> np.ndarray:
    """Sorted distinct finite values of a float format of <= 16 bits (float64)."""
    t = scalar_table(fmt)
    return np.unique(t[np.isfinite(t)])


@cache
def boundary_points(fmt) -> np.ndarray:
    """The few points at the edges of a float format's range, as float32 (both signs).

    Overflow (max, the midpoint between max and max + ulp, max + ulp, 2 max) and underflow
    (min_subnormal / 2, min_subnormal, min_normal) points with their float32 neighbours, every
    power of two in float32's range with its neighbours, +-0, +-inf, NaNs of both signs and
    float32's subnormal and NaN extremes.
    """
    fmt = get_format(fmt)
    assert isinstance(fmt, Format)
    ulp = math.ldexp(1.0, fmt.max_exponent - fmt.mantissa_bits)
    mx = fmt.max
    edges = [mx, mx + ulp / 2, mx + ulp, 2 * mx, mx - ulp / 2]
    edges += [fmt.min_subnormal / 2, fmt.min_subnormal, 1.5 * fmt.min_subnormal, fmt.min_normal]
    edges += [fmt.min_normal - fmt.min_subnormal / 2, 1.0, 1.0 + fmt.eps / 2]
    pow2 = [math.ldexp(1.0, e) for e in range(-149, 128)]
    specials = np.array([0.0, np.inf, np.nan], dtype=np.float32)
    return _unique_f32([*_with_neighbours(edges), *_with_neighbours(pow2), specials, F32_EXTREMES])


@cache
def special_points(fmt) -> np.ndarray:
    """Every point where a float format's rounding can change its mind, as float32.

    For formats of <= 16 bits: every finite value, every midpoint between neighbouring
    values (checked to be exact in float32) and the float32 neighbours of each midpoint, plus
    :func:`boundary_points`. For float32 (too many codes) the boundary points and the
    neighbours of a sample of float32 values. Negatives included, duplicates removed.
    """
    fmt = get_format(fmt)
    assert isinstance(fmt, Format)
    parts = [boundary_points(fmt)]
    if fmt.bits <= 16:
        vals = finite_values(fmt)
        mids = (vals[:-1] + vals[1:]) / 2  # exact: float64 has far more bits than needed
        mids32 = mids.astype(np.float32)
        assert np.array_equal(mids32.astype(np.float64), mids), f"{fmt.name}: midpoint not exact in float32"
        parts += [vals.astype(np.float32), *_with_neighbours(mids)]
    else:
        rng = np.random.default_rng(32)
        sample = rng.integers(0, 0x7F800000, size=2000, dtype=np.uint32).view(np.float32)
        parts += _with_neighbours(sample)
    return _unique_f32(parts)


@cache
def int_special_points(fmt) -> np.ndarray:
    """Points for an integer format: every in-range integer and a few beyond, the half-way
    points and their float32 neighbours, huge values, +-0, +-inf, NaN (float32)."""
    fmt = get_format(fmt)
    assert isinstance(fmt, IntFormat)
    q = 2.0 ** -getattr(fmt, "fraction_bits", 0)  # the step between codes' values
    ints = np.arange(round(fmt.min / q) - 3, round(fmt.max / q) + 4, dtype=np.float64) * q
    halves = ints + q / 2
    quarters = np.concatenate([ints + q / 4, ints + 3 * q / 4])
    wide = [2.0**k for k in range(fmt.bits - 1, 33)] + [2.0**24 + 2, 2.0**24 - 1, 1e30, 3.4e38]
    tiny = [2.0**-149, 2.0**-126, 1e-20, 0.49999997]
    specials = np.array([0.0, np.inf, np.nan], dtype=np.float32)
    return _unique_f32([ints, *_with_neighbours(halves), quarters, *_with_neighbours(wide + tiny), specials])


def points_for(fmt) -> np.ndarray:
    """special_points or int_special_points, whichever fits the format."""
    fmt = get_format(fmt)
    return int_special_points(fmt) if isinstance(fmt, IntFormat) else special_points(fmt)


def targeted_points(fmt, n: int, seed: int = 0) -> np.ndarray:
    """About ``n`` float32 points for ``fmt``: all boundary points, a sample of the special
    points (values, midpoints, their neighbours), random float32 bit patterns and random
    values inside the format's range. Shuffled, deterministic for a given seed."""
    fmt = get_format(fmt)
    rng = np.random.default_rng([seed, sum(fmt.name.encode())])
    if isinstance(fmt, IntFormat):
        core = int_special_points(fmt)
        top = fmt.max + 4.0
    else:
        core = boundary_points(fmt)
        top = min(fmt.max * 2.0, 3.4e38)
    spec = points_for(fmt)
    k = max(0, n - core.size) // 2 if isinstance(fmt, Format) else 0
    picked = [core]
    if k and spec.size:
        picked.append(rng.choice(spec, size=min(k, spec.size), replace=False))
    rest = max(0, n - sum(p.size for p in picked))
    randbits = rng.integers(0, 1 << 32, size=rest // 2, dtype=np.uint32).view(np.float32)
    lo = fmt.min_subnormal / 4 if isinstance(fmt, Format) else 0.01
    mag = np.exp(rng.uniform(np.log(lo), np.log(top), size=rest - rest // 2))
    inrange = (mag * rng.choice([-1.0, 1.0], size=mag.size)).astype(np.float32)
    out = np.concatenate(picked + [randbits, inrange])
    out = np.unique(out.view(np.uint32)).view(np.float32)
    rng.shuffle(out)
    return out


def float64_points(fmt, n: int = 3000, seed: int = 0) -> np.ndarray:
    """float64 values around the midpoints of ``fmt``, random ones in its range, edge cases.

    Around each sampled midpoint: the midpoint, its float64 neighbours, and offsets of
    2**-40 and 2**-30 relative (far below float32's resolution, so a cast to float32 first
    would land on the midpoint).
    """
    fmt = get_format(fmt)
    rng = np.random.default_rng([seed, fmt.bits, fmt.mantissa_bits])
    if fmt.bits <= 16:
        vals = finite_values(fmt)
        mids = (vals[:-1] + vals[1:]) / 2
    else:  # float32: midpoints between sampled float32 numbers and their upper neighbours
        v = special_points(fmt)
        v = v[np.isfinite(v) & (np.abs(v) < np.float32(3.4e38))]
        mids = (v.astype(np.float64) + np.nextafter(v, np.float32(np.inf)).astype(np.float64)) / 2
    mids = rng.choice(mids, size=min(n // 6, mids.size), replace=False)
    around = [mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)]
    around += [mids * (1 + 2.0**-40), mids * (1 - 2.0**-40), mids * (1 + 2.0**-30)]
    top = min(fmt.max * 4, 1.7e308)
    lo = fmt.min_subnormal / 8
    rand = np.exp(rng.uniform(np.log(lo), np.log(top), size=n // 4)) * rng.choice([-1, 1], size=n // 4)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300, 5e-324, 2.0**-1074 * 3])
    x = np.concatenate(around + [rand, edges])
    return x


def scalar_codes(x, fmt, **kwargs) -> np.ndarray:
    """``encode_scalar`` applied element by element (random_bits as an array of x's shape)."""
    from fpsim.emulate.reference import encode_scalar

    fmt = get_format(fmt)
    x = np.asarray(x)
    rbits = kwargs.pop("random_bits", None)
    flat = x.reshape(-1)
    rflat = np.zeros(flat.size, np.uint32) if rbits is None else np.asarray(rbits).reshape(-1)
    out = [encode_scalar(float(v), fmt, random_bits=int(r), **kwargs) for v, r in zip(flat, rflat)]
    return np.array(out, dtype=np.int64).reshape(x.shape)


__all__ = [
    "ALL_FORMATS",
    "FLOAT_FORMATS",
    "INT_FORMATS",
    "MODES",
    "NAN_BITS32",
    "NAN_BITS64",
    "SMALL_FORMATS",
    "assert_codes_equal",
    "boundary_points",
    "float64_points",
    "is_nan_code",
    "ml_decode",
    "ml_dtype",
    "ml_dtype_or_none",
    "ml_encode",
    "nan_patterns",
    "points_for",
    "scalar_codes",
    "special_points",
    "targeted_points",
    "with_nans",
]
