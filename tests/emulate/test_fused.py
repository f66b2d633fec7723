"""The fused quantize-dequantize (fpsim.emulate.fused, fpsim._compiled.operand) against the
numpy tier: ``fpsim.quantize(x, fmt, backend="numpy")``, i.e. decode(encode(x)), bit for bit.

Every format of every preset GEMM recipe (the delayed casts aside: they carry a state) on odd
shapes with ragged last blocks and tiles, inputs holding NaN, infinities, -0, subnormals,
all-zero and saturating blocks; nearest-even, stochastic rounding with given words and with
words drawn from a seed inside the loop (compared with ``random_bits_at``).
"""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
from fpsim.emulate import fused
from fpsim.emulate.delayed import DelayedScaling
from fpsim.emulate.random import random_bits_at
from fpsim.formats import RECIPES, RoundMode
from fpsim.train.gemm import GEMM_RECIPES

pytest.importorskip("numba")

FORMATS = {
    op.format.name: op.format
    for r in GEMM_RECIPES.values()
    for op in (r.input, r.weight, r.grad_output)
    if not isinstance(op.format, DelayedScaling)
}
SHAPES = [(3, 200), (130, 17), (1, 1), (17, 33)]


def _inputs(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Values over many binades (exact powers of two times normal draws, rounded to float32),
    with the special values spread over the first rows and blocks."""
    rng = np.random.default_rng(seed)
    mant = rng.standard_normal(shape).astype(np.float32)
    x = np.ldexp(mant, rng.integers(-20, 20, shape)).astype(np.float32)
    flat = x.reshape(-1)
    special = np.array(
        [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -3e-42, 1.1754942e-38, 3.0e38, -448.0, 6.0],
        np.float32,
    )
    k = min(special.size, -(-flat.size // 37))
    flat[::37][:k] = special[:k]  # one every 37 elements: in different blocks
    if shape[1] > 40:  # a row of zeros and one of tiny values: zero scales and subnormal results
        x[1, :] = 0.0
        x[2, :] = np.float32(1e-40) * np.arange(shape[1], dtype=np.float32)
    if shape[0] > 20:  # a whole NaN-free row block far above the others
        x[20, :] = np.float32(2.0**100)
    return x


def _same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal float32 bit patterns, NaN compared by class (any NaN matches any NaN)."""
    want = np.asarray(want, np.float32)
    assert got.shape == want.shape and got.dtype == np.float32
    nan = np.isnan(got)
    assert np.array_equal(nan, np.isnan(want)), "NaN positions differ"
    a, b = got[~nan].view(np.uint32), want[~nan].view(np.uint32)
    bad = np.flatnonzero(a != b)
    assert bad.size == 0, f"{bad.size} values differ, first at {bad[:5]}: {a[bad[:5]]} vs {b[bad[:5]]}"


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_fused_equals_numpy_tier(name: str, shape: tuple[int, int]) -> None:
    fmt = FORMATS[name]
    x = _inputs(shape, len(name) + shape[0])
    _same(fused.quantize_values(x, fmt, RoundMode.NEAREST_EVEN), fpsim.quantize(x, fmt, backend="numpy"))
    words = np.random.default_rng(7).integers(0, 1 << 32, shape, dtype=np.uint32)
    want = fpsim.quantize(x, fmt, backend="numpy", rounding="stochastic", random_bits=words)
    _same(fused.quantize_values(x, fmt, RoundMode.STOCHASTIC, rand=words), want)
    seeded = random_bits_at(12345, 0, x.size).reshape(shape)
    want = fpsim.quantize(x, fmt, backend="numpy", rounding="stochastic", random_bits=seeded)
    _same(fused.quantize_values(x, fmt, RoundMode.STOCHASTIC, seed=12345), want)


def test_the_fused_cast_can_tell_a_wrong_value():
    """The comparison sees one flipped bit (the oracle is not the code under test)."""
    fmt = FORMATS["mxfp8_e4m3_rceil"]
    x = _inputs((3, 200), 0)
    got = fused.quantize_values(x, fmt, RoundMode.NEAREST_EVEN)
    flat = got.reshape(-1)
    i = np.flatnonzero(np.isfinite(flat) & (flat != 0))[3]
    flat[i] = np.nextafter(flat[i], np.float32(np.inf))
    with pytest.raises(AssertionError, match="1 values differ"):
        _same(got, fpsim.quantize(x, fmt, backend="numpy"))


def test_fused_refuses_what_it_does_not_cover():
    book = RECIPES["bnb_dynamic8_block256"]
    assert "codebook" in fused.uncovered(book)
    x = np.ones((2, 256), np.float32)
    with pytest.raises(ValueError, match="does not cover"):
        fused.quantize_values(x, book, RoundMode.NEAREST_EVEN)
    with pytest.raises(ValueError, match="exactly one of rand"):
        fused.quantize_values(x, FORMATS["nvfp4"], RoundMode.STOCHASTIC)
    with pytest.raises(ValueError, match="one per element"):
        fused.quantize_values(x, FORMATS["nvfp4"], RoundMode.STOCHASTIC, rand=np.zeros(3, np.uint32))
    with pytest.raises(TypeError, match="float32"):
        fused.quantize_values(x.astype(np.float64), FORMATS["nvfp4"], RoundMode.NEAREST_EVEN)
    with pytest.raises(ValueError, match="span the last 2 axes"):
        fused.quantize_values(np.ones(16, np.float32), FORMATS["nvfp4_tile16"], RoundMode.NEAREST_EVEN)
