"""The JAX path (``jax.jit``) gives the numpy path's codes for every format and mode, on the
targeted points and the NaN patterns of every kind (quiet and signaling, both signs)."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from oracles import ALL_FORMATS, MODES, assert_codes_equal, fmt_id, mode_id, nan_patterns, targeted_points

import fpsim
from fpsim import RoundMode, get_format

pytestmark = pytest.mark.dispatch  # .ci/run reruns these with the SIMD dispatch masked

jax = pytest.importorskip("jax")
jnp = jax.numpy

N_POINTS = 20_000


@cache
def points(fmt) -> np.ndarray:
    return np.concatenate([nan_patterns(np.float32), targeted_points(fmt, N_POINTS, seed=7)])


def words(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, n]).integers(0, 1 << 32, size=n, dtype=np.uint32)


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=fmt_id)
def test_jit_encode_equals_numpy(fmt, mode):
    x = points(fmt)
    r = words(x.size)

    @jax.jit
    def enc(a, r):
        return (
            fpsim.encode(a, fmt, rounding=mode, random_bits=r),
            fpsim.encode(a, fmt, rounding=mode, random_bits=r, saturate=True),
        )

    got, got_sat = enc(jnp.asarray(x), jnp.asarray(r))
    for saturate, g in ((False, got), (True, got_sat)):
        want = fpsim.encode(x, fmt, rounding=mode, random_bits=r, saturate=saturate)
        assert isinstance(g, jax.Array)
        assert g.dtype == want.dtype == np.dtype(fmt.code_dtype)
        assert_codes_equal(np.asarray(g), want, fmt, x, context=f"jit, {mode.value}, saturate={saturate}")


@pytest.mark.parametrize("nbits", [1, 3, 17])
@pytest.mark.parametrize("fmt", ["bfloat16", "float8_e4m3fn", "float8_e8m0fnu", "float32", "int4"])
def test_jit_stochastic_bits(fmt, nbits):
    x = points(get_format(fmt))
    r = words(x.size, 1)
    f = jax.jit(
        lambda a, r: fpsim.encode(a, fmt, rounding="stochastic", random_bits=r, stochastic_bits=nbits)
    )
    want = fpsim.encode(x, fmt, rounding="stochastic", random_bits=r, stochastic_bits=nbits)
    assert_codes_equal(np.asarray(f(jnp.asarray(x), jnp.asarray(r))), want, fmt, x)


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
@pytest.mark.parametrize("fmt", ["float16", "float8_e4m3fn", "float8_e5m2fnuz", "float32"])
def test_jit_flush_to_zero(fmt, mode):
    x = points(get_format(fmt))
    r = words(x.size, 2)
    f = jax.jit(lambda a, r: fpsim.encode(a, fmt, rounding=mode, random_bits=r, subnormals=False))
    want = fpsim.encode(x, fmt, rounding=mode, random_bits=r, subnormals=False)
    assert_codes_equal(np.asarray(f(jnp.asarray(x), jnp.asarray(r))), want, fmt, x)


@pytest.mark.parametrize("mode", [RoundMode.NEAREST_EVEN, RoundMode.STOCHASTIC, RoundMode.ODD], ids=mode_id)
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "bfloat16", "float4_e2m1fn", "float8_e8m0fnu", "int8"])
def test_jit_quantize_equals_numpy(fmt, mode):
    x = points(get_format(fmt))
    r = words(x.size, 3)
    f = jax.jit(lambda a, r: fpsim.quantize(a, fmt, rounding=mode, random_bits=r, saturate=True))
    got = np.asarray(f(jnp.asarray(x), jnp.asarray(r)))
    want = fpsim.quantize(x, fmt, rounding=mode, random_bits=r, saturate=True)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "bfloat16", "int8"])
def test_eager_jax_arrays(fmt):
    """Without jit a JAX array in gives a JAX array out, with the numpy path's codes."""
    x = points(get_format(fmt))[:3000].reshape(3, 1000)
    got = fpsim.encode(jnp.asarray(x), fmt)
    assert isinstance(got, jax.Array) and got.shape == x.shape
    assert_codes_equal(np.asarray(got), fpsim.encode(x, fmt), fmt, x)
    q = fpsim.quantize(jnp.asarray(x), fmt)
    assert isinstance(q, jax.Array)
    np.testing.assert_array_equal(np.asarray(q).view(np.uint32), fpsim.quantize(x, fmt).view(np.uint32))


@pytest.mark.parametrize("src", ["float16", "bfloat16", "int8", "int16"])
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "bfloat16", "float32"])
def test_jit_other_input_dtypes(fmt, src):
    """Inputs exactly representable in float32 (the JAX path's working type without x64)."""
    import ml_dtypes

    dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "int8": np.int8, "int16": np.int16}[src]
    bits = np.arange(1 << (8 if src == "int8" else 16), dtype=np.uint32)
    x = bits.astype(np.uint8 if src == "int8" else np.uint16).view(dt)
    f = jax.jit(lambda a: fpsim.encode(a, fmt, rounding="toward_positive"))
    want = fpsim.encode(x, fmt, rounding="toward_positive")
    assert_codes_equal(np.asarray(f(jnp.asarray(x))), want, fmt, x, nan_by_class=True)


def test_jit_shapes():
    for shape in [(), (1,), (3, 5, 7)]:
        x = np.random.default_rng(0).normal(size=shape).astype(np.float32) * 100
        got = jax.jit(lambda a: fpsim.encode(a, "float8_e4m3fn"))(jnp.asarray(x))
        assert got.shape == shape
        assert_codes_equal(np.asarray(got), fpsim.encode(x, "float8_e4m3fn"), "float8_e4m3fn", x)
