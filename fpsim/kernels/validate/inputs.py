"""The inputs of the cast validations: every input set where a rounding can go wrong.

:func:`input_sets` (float32 unless a 16-bit input dtype is asked for):

* ``codes``: every code of the format decoded, and its negative (formats up to 16 bits;
  float32: a sample of bit patterns);
* ``midpoints``: every tie between neighbouring values and its two float32 neighbours
  (integers: the halves and quarters);
* ``boundaries``: overflow points (max, the midpoint above it, max + ulp, 2 max), the
  subnormal and underflow boundaries, every power of two of float32 with its neighbours;
* ``specials``: +-0, +-inf, quiet, signalling and payload NaNs of both signs;
* ``random``: random bit patterns (every exponent) and random values spanning the format;
* ``shape ...``: odd shapes, (1,), (1023,), (2049,), (3, 5, 7) and a non-contiguous view,
  each a separate call (sizes that are no multiple of any block size);
* ``trace``: the tensors of the bundled sample trace (:func:`fpsim.trace.sample_trace_path`),
  as recorded and scaled by a power of two to the format's range.

For float16 / bfloat16 inputs the set ``inputs`` holds every 16-bit pattern (exhaustive;
a sample with ``cases="quick"``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fpsim.formats import AnyFormat, Format, IntFormat

from .common import binade_spread, check_cases, np_dtype, trace_tensors

_SHAPES_FULL = [(1,), (1023,), (2049,), (4097,), (3, 5, 7), (65537,)]
_SHAPES_QUICK = [(1,), (1023,), (2049,), (3, 5, 7)]


@dataclass(frozen=True)
class InputSet:
    """Named inputs: a numpy array (float32, float16 or bfloat16) of any shape.

    ``transpose`` asks for a non-contiguous tensor: the kernel gets ``x.T`` of the array,
    whose shape is then reversed.
    """

    name: str
    values: np.ndarray
    transpose: bool = False


# --- input sets ---------------------------------------------------------------------------------


def _f32(bits: Iterable[int]) -> np.ndarray:
    return np.asarray(list(bits), dtype=np.uint32).view(np.float32)


SPECIALS = _f32(
    [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001]
    + [0x7FBFFFFF, 0x7FC00001, 0x7FFFFFFF, 0xFFFFFFFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000]
    + [0x7F7FFFFF, 0xFF7FFFFF]
)


def _exact_f32_with_neighbours(values: Iterable[float]) -> np.ndarray:
    """The values that are finite float32 numbers, their float32 neighbours, both signs."""
    v = np.asarray(list(values), dtype=np.float64)
    v = v[np.isfinite(v) & (np.abs(v) <= float(np.finfo(np.float32).max))]
    with np.errstate(over="ignore"):
        v32 = v.astype(np.float32)
    v32 = v32[v32.astype(np.float64) == v]
    with np.errstate(over="ignore"):
        parts = [v32, np.nextafter(v32, np.float32(np.inf)), np.nextafter(v32, np.float32(-np.inf))]
    a = np.concatenate(parts)
    return np.concatenate([a, -a])


def _sample(a: np.ndarray, n: int | None, rng: np.random.Generator, keep_ends: int = 64) -> np.ndarray:
    """``a`` (sorted) or, when longer than n, its two ends and a random subset."""
    if n is None or a.size <= n:
        return a
    mid = rng.choice(a[keep_ends:-keep_ends], size=max(0, n - 2 * keep_ends), replace=False)
    return np.concatenate([a[:keep_ends], mid, a[-keep_ends:]])


def _scaled_to(fmt: AnyFormat, a: np.ndarray) -> np.ndarray:
    """``a`` times the power of two that brings its largest magnitude just under fmt.max."""
    finite = np.abs(a[np.isfinite(a)].astype(np.float64))
    amax = float(finite.max()) if finite.size else 0.0
    if amax == 0.0:
        return a
    k = math.floor(math.log2(fmt.max / amax))
    k = max(-100, min(100, k))
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(a.astype(np.float32), k).astype(np.float32)


def _trace_sets(fmt: AnyFormat, quick: bool) -> list[InputSet]:
    """Recorded tensors: each step's tensors flattened, as recorded and each scaled by a
    power of two (exact) so that its largest magnitude lands just under the format's max."""
    out = []
    for name, arrays in trace_tensors(quick):
        if len(arrays) == 1:
            out.append(InputSet(name, arrays[0].copy()))
            continue
        flat = [a.reshape(-1) for a in arrays]
        out.append(InputSet(name, np.concatenate(flat + [_scaled_to(fmt, a) for a in flat])))
    return out


def _shape_sets(fmt: AnyFormat, quick: bool, rng: np.random.Generator) -> list[InputSet]:
    lo, hi = _binades(fmt)
    out = []
    for shape in _SHAPES_QUICK if quick else _SHAPES_FULL:
        n = math.prod(shape)
        v = binade_spread(rng, n, lo, hi) * rng.choice([-1.0, 1.0], size=n)
        out.append(InputSet(f"shape {shape}", v.astype(np.float32).reshape(shape)))
    v = binade_spread(rng, 33 * 64, lo, hi).astype(np.float32).reshape(33, 64)
    out.append(InputSet("shape (64, 33) non-contiguous", v, transpose=True))
    return out


def _binades(fmt: AnyFormat) -> tuple[int, int]:
    """The binades random values are drawn from (:func:`~.common.binade_spread`): a little
    beyond the format's range (from min_subnormal / 8, or a quarter of an integer format's
    step, up to 4 max), within float32's (2**-149 to 2**127)."""
    top = min(math.frexp(fmt.max)[1] + 1, 127)  # floor(log2(4 max)); frexp: x = f * 2**e, f in [0.5, 1)
    if isinstance(fmt, IntFormat):
        return -fmt.fraction_bits - 3, top
    return max(math.frexp(fmt.min_subnormal)[1] - 4, -149), top


def _float_sets(fmt: Format, quick: bool, rng: np.random.Generator) -> list[InputSet]:
    from fpsim.emulate.element import decode_table

    cap = 4096 if quick else None
    sets = []
    if fmt.bits <= 16:
        table = decode_table(fmt)
        vals = np.unique(table[np.isfinite(table)].astype(np.float64))
        codes = np.concatenate([table, -table])
        sets.append(InputSet("codes", _sample(np.unique(codes.view(np.uint32)).view(np.float32), cap, rng)))
        allv = np.unique(np.concatenate([vals, -vals]))
        mids = (allv[:-1] + allv[1:]) / 2  # exact in float64
        sets.append(InputSet("midpoints", _exact_f32_with_neighbours(_sample(mids, cap, rng))))
    else:
        n = 1 << (12 if quick else 16)
        bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint32)
        sets.append(InputSet("codes", bits.view(np.float32)))
        v = np.unique(bits.view(np.float32)[np.isfinite(bits.view(np.float32))].astype(np.float64))
        sets.append(InputSet("midpoints", _exact_f32_with_neighbours(v[:: max(1, v.size // 2000)])))
    m = fmt.mantissa_bits
    ulp = math.ldexp(1.0, fmt.max_exponent - m)
    mx = fmt.max
    edges = [mx, mx + ulp / 2, mx + ulp, 2 * mx, mx - ulp / 2, mx - ulp, float(np.finfo(np.float32).max)]
    sub, nrm = fmt.min_subnormal, fmt.min_normal
    edges += [sub / 2, sub, 1.5 * sub, 0.75 * sub, sub / 4, nrm, nrm - sub / 2, nrm - sub, nrm + sub / 2]
    edges += [1.0, 1.0 + fmt.eps / 2, 1.0 + fmt.eps, 1.0 - fmt.eps / 4]
    edges += [math.ldexp(1.0, e) for e in range(-149, 128)]
    sets.append(InputSet("boundaries", _exact_f32_with_neighbours(edges)))
    return sets


def _int_sets(fmt: IntFormat, quick: bool, rng: np.random.Generator) -> list[InputSet]:
    q = math.ldexp(1.0, -fmt.fraction_bits)
    ints = np.arange(fmt.min_int - 3, fmt.max_int + 4, dtype=np.float64) * q
    halves = ints + q / 2
    quarters = np.concatenate([ints + q / 4, ints + 3 * q / 4])
    cap = 4096 if quick else None
    edges = [math.ldexp(1.0, e) for e in range(-149, 128)]
    edges += [2.0**24 + 2, 2.0**24 - 1, 1e30, 3.4e38, float(np.finfo(np.float32).max), 0.49999997]
    edges += [fmt.max, fmt.max + q / 2, fmt.max + q, fmt.min, fmt.min - q / 2, fmt.min - q]
    return [
        InputSet("codes", np.concatenate([ints, -ints]).astype(np.float32)),
        InputSet(
            "midpoints", _exact_f32_with_neighbours(np.concatenate([_sample(halves, cap, rng), quarters]))
        ),
        InputSet("boundaries", _exact_f32_with_neighbours(edges)),
    ]


def _random_set(fmt: AnyFormat, n: int, rng: np.random.Generator) -> InputSet:
    bits = rng.integers(0, 1 << 32, size=n // 2, dtype=np.uint32).view(np.float32)
    k = n - n // 2
    mag = binade_spread(rng, k, *_binades(fmt)) * rng.choice([-1.0, 1.0], size=k)
    with np.errstate(over="ignore", under="ignore"):
        return InputSet("random", np.concatenate([bits, mag.astype(np.float32)]))


def input_sets(fmt: Any, cases: str = "full", input_dtype: str = "float32", seed: int = 0) -> list[InputSet]:
    """The inputs :func:`fpsim.kernels.validate.validate` feeds a kernel for ``fmt`` (module docstring).

    Args:
        fmt: a format or its name.
        cases: "full" or "quick" (fewer codes, midpoints, random values, shapes and trace steps).
        input_dtype: "float32", "float16" or "bfloat16".
        seed: seed of the random parts (the sets are deterministic for a seed).

    Returns:
        InputSets with read-only numpy values of ``input_dtype`` (cached: the same call
        returns the same arrays).
    """
    from ..cast import element_format

    check_cases(cases)
    np_dtype(input_dtype)
    return list(_input_sets(element_format(fmt), cases, input_dtype, seed))


@functools.lru_cache(maxsize=128)
def _input_sets(fmt: AnyFormat, cases: str, input_dtype: str, seed: int) -> tuple[InputSet, ...]:
    parts = _make_input_sets(fmt, cases, input_dtype, seed)
    for p in parts:
        p.values.flags.writeable = False
    return tuple(parts)


def _make_input_sets(fmt: AnyFormat, cases: str, input_dtype: str, seed: int) -> list[InputSet]:
    quick = cases == "quick"
    rng = np.random.default_rng([seed, sum(fmt.name.encode()), fmt.bits])
    if input_dtype == "float32":
        parts = _int_sets(fmt, quick, rng) if isinstance(fmt, IntFormat) else _float_sets(fmt, quick, rng)
        parts.append(InputSet("specials", SPECIALS))
        parts.append(_random_set(fmt, 1 << (12 if quick else 18), rng))
        return parts + _shape_sets(fmt, quick, rng) + _trace_sets(fmt, quick)
    dt = np_dtype(input_dtype)
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    if quick:
        every = np.concatenate([every[:256], rng.choice(every, 8192, replace=False), every[-256:]])
        every = np.concatenate([every, every ^ np.uint16(0x8000)])
    parts = [InputSet("inputs", every.view(dt))]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for s in _shape_sets(fmt, quick, rng) + _trace_sets(fmt, quick):
            parts.append(InputSet(s.name, s.values.astype(dt), s.transpose))
    return parts
