"""Mergeable metrics: counts against direct ml_dtypes computations, sums against exact sums,
chunk and merge invariance, swamping on hand-worked cases."""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim.analysis.metrics import (
    CHUNK,
    Partial,
    chunk_slices,
    iter_chunks,
    measure,
    measure_chunk,
    measure_swamping,
    random_bits_at,
)

PLAIN = ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float6_e3m2fn", "float4_e2m1fn"]


def gradients(n: int, seed: int = 0) -> np.ndarray:
    """Log-normal magnitudes over ~40 binades, random signs, some zeros, NaN and inf."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp(rng.normal(-6, 4, n))).astype(np.float32)
    x[rng.integers(0, n, n // 100)] = 0
    x[:3] = [np.nan, np.inf, -np.inf]
    return x


@pytest.mark.parametrize("name", PLAIN)
def test_counts_equal_a_direct_ml_dtypes_computation(name):
    x = gradients(300_000)
    p = measure(x, name)
    with np.errstate(over="ignore"):
        q = x.astype(getattr(ml_dtypes, name, np.float16)).astype(np.float32)
    fmt = fpsim.get_format(name)
    finite = np.isfinite(x)
    nz = finite & (x != 0)
    assert p.elements == x.size and p.nan_in == 1 and p.inf_in == 2
    assert p.nonzero == np.count_nonzero(nz)
    assert p.underflow == np.count_nonzero(nz & (q == 0))
    assert p.subnormal == np.count_nonzero(nz & (q != 0) & (np.abs(q) < fmt.min_normal))
    assert p.overflow == np.count_nonzero(finite & ~np.isfinite(q))
    # ml_dtypes saturates only the finite-only formats: there values above max are clamped
    sat = np.count_nonzero(finite & (np.abs(q) == fmt.max) & (np.abs(x) > fmt.max))
    assert p.saturated == sat


def test_saturating_e4m3fn_counts_equal_torch():
    torch = pytest.importorskip("torch")
    x = gradients(200_000, seed=1) * np.float32(1e5)
    p = measure(x, "float8_e4m3fn", saturate=True)
    q = torch.from_numpy(x).to(torch.float8_e4m3fn).float().numpy()
    finite = np.isfinite(x)
    assert p.overflow == 0
    assert p.saturated == np.count_nonzero(finite & (np.abs(q) == 448) & (np.abs(x) > 448)) > 0


@pytest.mark.parametrize("name", ["float8_e4m3fn", "bfloat16", "mxfp8_e4m3", "nvfp4", "int8_block256"])
def test_sums_are_exact_sums_of_float64_terms_to_1e_12(name):
    """Pairwise float64 sums inside a chunk: relative error <= n * 2**-53 bound, far below 1e-12."""
    x = gradients(70_000, seed=2)
    p = measure(x, name)
    q = fpsim.quantize(x, name)
    ok = np.isfinite(x) & np.isfinite(q)
    err = q.astype(np.float64)[ok] - x[ok]
    exact_err = math.fsum((err * err).tolist())
    exact_sig = math.fsum((x[np.isfinite(x)].astype(np.float64) ** 2).tolist())
    assert float(p.sum_sq_err) == pytest.approx(exact_err, rel=1e-12)
    assert float(p.sum_sq_signal) == pytest.approx(exact_sig, rel=1e-12)
    assert p.sqnr_db == pytest.approx(10 * math.log10(exact_sig / exact_err), rel=1e-12)
    assert p.rel_l2_error == pytest.approx(math.sqrt(exact_err / exact_sig), rel=1e-12)
    assert p.max_abs_err == np.max(np.abs(err))


def test_underflow_energy_share_by_hand():
    x = np.array([1.0, 1e-30, -2e-30, 0.0, 3.0], np.float32)
    p = measure(x, "float16")
    assert p.underflow == 2 and p.nonzero == 4
    tiny = float(np.float32(1e-30)) ** 2 + float(np.float32(-2e-30)) ** 2
    assert p.underflow_energy_share == pytest.approx(tiny / (1 + 9 + tiny), rel=1e-15)
    assert p.sqnr_db == pytest.approx(10 * math.log10((10 + tiny) / tiny), rel=1e-12)


def test_histogram_counts_binades():
    x = gradients(100_000, seed=3)
    p = measure(x, "float16", with_hist=True)
    nz = np.isfinite(x) & (x != 0)
    e = np.frexp(x[nz].astype(np.float64))[1] - 1  # floor(log2 |x|)
    want = np.bincount(np.maximum(e + 127, 0), minlength=256)  # float32 subnormals share bin 0
    np.testing.assert_array_equal(p.hist, want)
    assert not measure(x, "float16").hist.any()  # only filled when asked


@pytest.mark.parametrize(
    "name, shape",
    [
        ("float8_e4m3fn", (3 * CHUNK + 17,)),
        ("e4m3_row", (700, 3001)),
        ("e4m3_tile128", (390, 5000)),
        ("mxfp4_e2m1", (5, 300, 1000)),
        ("e4m3_tensor", (2 * CHUNK + 5,)),
        ("nvfp4", (1600, 1000)),
        ("bnb_dynamic8_block2048", (CHUNK + 4096 * 3 + 5,)),
    ],
)
def test_streaming_equals_processing_whole_and_merge_order_is_free(name, shape, tmp_path):
    x = gradients(math.prod(shape), seed=4).reshape(shape)
    whole = measure(x, name, with_hist=True)
    slices = chunk_slices(shape, name)
    assert len(slices) > 1 and slices[0][0] == 0 and slices[-1][1] == x.size
    # the same tensor memory-mapped from disk, chunk by chunk, merged in reverse order
    path = tmp_path / "x.npy"
    np.save(path, x)
    mm = np.load(path, mmap_mode="r")
    amax = float(np.fmax.reduce(np.abs(x).reshape(-1), initial=0))
    parts = [
        measure_chunk(c, name, offset=o, tensor_amax=amax, with_hist=True) for o, c in iter_chunks(mm, name)
    ]
    merged = sum(reversed(parts), Partial())
    assert merged.totals() == whole.totals()
    np.testing.assert_array_equal(merged.hist, whole.hist)


def test_merge_is_associative_and_exact():
    rng = np.random.default_rng(5)
    ps = [measure(rng.standard_normal(1000).astype(np.float32) * 10.0**k, "float8_e5m2") for k in (-8, 0, 8)]
    a, b = (ps[0] + ps[1]) + ps[2], ps[0] + (ps[1] + ps[2])
    assert a.totals() == b.totals()
    assert isinstance(a.sum_sq_err, Fraction) and a.sum_sq_err == sum(p.sum_sq_err for p in ps)


def test_stochastic_measure_is_reproducible_and_chunk_invariant():
    x = gradients(CHUNK + 1000, seed=6)
    a = measure(x, "bfloat16", "stochastic", seed=9)
    assert a.totals() == measure(x, "bfloat16", "stochastic", seed=9).totals()
    assert a.totals() != measure(x, "bfloat16", "stochastic", seed=10).totals()
    np.testing.assert_array_equal(random_bits_at(3, 100, 50), random_bits_at(3, 0, 150)[100:])


def test_non_float_input_is_rejected():
    with pytest.raises(TypeError, match="int32.*not a float type"):
        measure_chunk(np.arange(5, dtype=np.int32), "float16")


# --- swamping ---------------------------------------------------------------------------------


def test_fp16_swamps_100_plus_0_001():
    """100 + 0.001 == 100 in float16 (spacing 0.0625 at 100); 0.04 rounds to 100.0625."""
    theta = np.full(4, 100.0, np.float32)
    delta = np.array([0.001, -0.001, 0.04, 0.0], np.float32)
    s = measure_swamping(theta, delta, "float16")
    assert (s.updates, s.lost) == (3, 2)
    assert s.update_ratio == pytest.approx(0.0625 / (0.001 + 0.001 + float(np.float32(0.04))), rel=1e-7)
    assert measure_swamping(theta, delta, "float32").lost == 0


def test_stochastic_rounding_keeps_the_update_on_average():
    """delta = 0.3 ulp of bfloat16 at 1.0: nearest loses all; stochastic realises 0.3 ulp on average.

    Each element moves by one ulp with p = 0.3; over n = 200k elements the realised/intended
    ratio has standard deviation sqrt(p(1-p)/n)/p ~ 0.0034; we allow 5 sigma.
    """
    n = 200_000
    ulp = 2.0**-7
    theta = np.ones(n, np.float32)
    delta = np.full(n, 0.3 * ulp, np.float32)
    assert measure_swamping(theta, delta, "bfloat16").swamped_share == 1.0
    s = measure_swamping(theta, delta, "bfloat16", "stochastic", seed=1)
    sigma = math.sqrt(0.3 * 0.7 / n) / 0.3
    assert abs(s.update_ratio - 1.0) < 5 * sigma
    assert s.swamped_share == pytest.approx(0.7, abs=5 * math.sqrt(0.21 / n))


def test_swamping_needs_an_element_format_and_matching_shapes():
    with pytest.raises(TypeError, match="element format"):
        measure_swamping(np.ones(3), np.ones(3), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="3 elements, delta 2"):
        measure_swamping(np.ones(3), np.ones(2), "float16")


def test_swamping_survives_an_update_that_overflows_the_format():
    """448 + 100 overflows E4M3 (NaN): counted as an update, not lost, no realised size; the
    scaled form (gradient and -lr, formed chunk by chunk) gives the same as a precomputed delta."""
    theta = np.array([448.0, 1.0], np.float32)
    grad = np.array([-100.0, -1e-6], np.float32)
    s = measure_swamping(theta, grad, "float8_e4m3fn", scale=-1.0)
    assert (s.updates, s.lost) == (2, 1) and s.update_ratio == 0.0
    rng = np.random.default_rng(7)
    th, g = rng.standard_normal(5000).astype(np.float32), rng.standard_normal(5000).astype(np.float32)
    a = measure_swamping(th, g, "bfloat16", "stochastic", seed=3, scale=-1e-3)
    b = measure_swamping(th, np.float32(-1e-3) * g, "bfloat16", "stochastic", seed=3)
    assert a.totals() == b.totals()
