"""The compiled element encoder (``backend="compiled"``, :mod:`fpsim._compiled.measure`) against
the numpy tier, which is tested against ml_dtypes, torch and the scalar reference: the same codes
for every format, rounding mode, saturation, flush, stochastic width and source width, on every
code of each format (values and the midpoints between neighbours: all the ties) and on float32
bit patterns of every exponent (zeros, subnormals, inf, NaN: quiet and signaling, both signs,
several payloads, in float32 and float64)."""

from __future__ import annotations

import numpy as np
import pytest
from oracles import with_nans

import fpsim
from fpsim._compiled import Backend
from fpsim.emulate import element
from fpsim.formats import FORMATS, RoundMode

pytestmark = pytest.mark.dispatch  # .ci/run reruns these with the SIMD dispatch masked

pytest.importorskip("numba")

_RNG = np.random.default_rng(19)
BITS = with_nans(
    np.concatenate(
        [
            _RNG.integers(0, 1 << 32, 6000, dtype=np.uint32).view(np.float32),
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 3.4e38], np.float32),
        ]
    )
)
WORDS = _RNG.integers(0, 1 << 32, BITS.size, dtype=np.uint32)


def _both(x, fmt, mode, **kw):
    a = element.encode_array(x, fmt, mode, backend=Backend.NUMPY, **kw)
    b = element.encode_array(x, fmt, mode, backend=Backend.COMPILED, **kw)
    assert a.dtype == b.dtype and a.shape == b.shape
    return a, b


def _every_code_and_tie(fmt) -> np.ndarray:
    """Every finite value of the format, the midpoints of neighbours (ties) and a step past
    the largest value, both signs, as float64 (exact)."""
    v = element.decode_table(fmt).astype(np.float64) if fmt.bits <= 16 else BITS.astype(np.float64)
    v = np.unique(np.abs(v[np.isfinite(v)]))
    mids = (v[1:] + v[:-1]) / 2
    top = [v[-1] * 1.5, v[-1] * 4]
    out = np.concatenate([v, mids, top])
    return np.concatenate([out, -out])


@pytest.mark.parametrize("name", sorted(n for n, f in FORMATS.items() if f.bits <= 16))
def test_every_code_and_tie_in_every_mode(name):
    """Nearest-even on every code and tie from float32 and float64; the other modes on every
    code and tie of the formats up to 8 bits, on a sample of the 16-bit ones."""
    fmt = FORMATS[name]
    x = _every_code_and_tie(fmt)
    for src in (x, x.astype(np.float32)):
        a, b = _both(src, fmt, RoundMode.NEAREST_EVEN)
        assert np.array_equal(a, b), (name, src.dtype, src[a != b][:4], a[a != b][:4], b[a != b][:4])
    src = x.astype(np.float32)[:: 1 if fmt.bits <= 8 else 23]
    r = _RNG.integers(0, 1 << 32, src.size, dtype=np.uint32)
    for mode in RoundMode:
        rand = r if mode is RoundMode.STOCHASTIC else None
        a, b = _both(src, fmt, mode, rand=rand)
        assert np.array_equal(a, b), (name, mode, src[a != b][:4], a[a != b][:4], b[a != b][:4])


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_bit_patterns_every_option(name):
    fmt = FORMATS[name]
    with np.errstate(invalid="ignore"):
        wide = with_nans(BITS.astype(np.float64) * 3.25, start=3)
    for src in (BITS, wide):
        for mode in RoundMode:
            for saturate in (False, True):
                for subnormals in (True, False):
                    for nbits in (32, 7) if mode is RoundMode.STOCHASTIC else (32,):
                        rand = WORDS if mode is RoundMode.STOCHASTIC else None
                        kw = dict(saturate=saturate, subnormals=subnormals, rand=rand, nbits=nbits)
                        a, b = _both(src, fmt, mode, **kw)
                        assert np.array_equal(a, b), (name, mode, kw, src[a != b][:4])


def test_public_verbs_choose_the_backend():
    x = with_nans((_RNG.standard_normal((3, 700)) * 10.0).astype(np.float32))
    for name in ("float8_e4m3fn", "bfloat16", "int8", "float4_e2m1fn"):
        want = fpsim.encode(x, name, backend="numpy")
        got = fpsim.encode(x, name, backend="compiled")
        assert got.dtype == want.dtype and np.array_equal(got, want)
        q = fpsim.quantize(x, name, backend="compiled", rounding="stochastic", rng=3)
        want = fpsim.quantize(x, name, backend="numpy", rounding="stochastic", rng=3)
        assert np.array_equal(q.view(np.uint32), want.view(np.uint32))  # NaNs included, bit for bit
    big = with_nans(_RNG.standard_normal(element.PIECE * 2 + 5).astype(np.float32), element.PIECE - 40)
    assert np.array_equal(
        fpsim.encode(big, "float8_e5m2", backend="compiled"),
        fpsim.encode(big, "float8_e5m2", backend="numpy"),
    )


def test_compiled_codes_match_ml_dtypes():
    """An oracle beside the numpy tier: ml_dtypes' nearest-even casts (float32 input)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = BITS[np.isfinite(BITS)]
    for name in ("float8_e4m3fn", "float8_e5m2", "bfloat16"):
        dt = getattr(ml_dtypes, name)
        want = x.astype(dt).view(np.uint8 if dt(0).itemsize == 1 else np.uint16)
        got = fpsim.encode(x, name, backend="compiled", saturate=False)
        fin = np.isfinite(x.astype(dt).astype(np.float32))
        assert np.array_equal(got[fin], want[fin])
