"""Formats named by dtypes (numpy, ml_dtypes, JAX, torch) and the verbs' array types.

Oracles: ml_dtypes' casts (``x.astype(ml_dtypes.float8_e4m3fn)``) and torch's casts
(``x.to(torch.float8_e4m3fn)``), computed here on the machine at hand; codes compared bit for
bit, NaN by class.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from oracles import FLOAT_FORMATS, ml_decode, ml_dtype_or_none, ml_encode

import fpsim
from fpsim import Encoding, get_format

ML_FLOATS = [f for f in FLOAT_FORMATS if ml_dtype_or_none(f) is not None]
TORCH_FLOATS = [
    f for f in FLOAT_FORMATS if isinstance(getattr(torch, f.name, None), torch.dtype) and f.signed
]


def _inputs(fmt, n: int = 2000) -> np.ndarray:
    """Random float32 values over the format's range and beyond (subnormals, overflow), both
    signs, and the special values (rounding itself is tested point by point elsewhere)."""
    rng = np.random.default_rng(sum(fmt.name.encode()))
    lo, hi = max(fmt.min_subnormal / 4, 1e-45), min(fmt.max * 2, 3e38)
    mag = np.exp(rng.uniform(np.log(lo), np.log(hi), n)) * rng.choice([-1.0, 1.0], n)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, fmt.max, -fmt.max, fmt.min_normal, fmt.min_subnormal]
    return np.concatenate([mag, special]).astype(np.float32)


def _same_values(got: np.ndarray, want: np.ndarray) -> None:
    """float32 arrays equal bit for bit, NaN by class."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, f"{bad.size} differ, first at {bad[0]}: got {got[bad[0]]!r}, want {want[bad[0]]!r}"


@pytest.mark.parametrize("fmt", ML_FLOATS, ids=lambda f: f.name)
def test_an_ml_dtypes_type_names_its_format(fmt):
    dt = ml_dtype_or_none(fmt)
    assert get_format(dt.type) is fmt and get_format(dt) is fmt
    x = _inputs(fmt)
    if fmt.encoding is Encoding.FINITE:  # ml_dtypes' NaN-to-zero sign quirk: tested elsewhere
        x = x[~np.isnan(x)]
    got, want = fpsim.encode(x, dt.type), ml_encode(x, fmt)
    nan = np.isnan(ml_decode(got, fmt)) & np.isnan(ml_decode(want, fmt))  # NaN by class
    assert np.array_equal(got[~nan], want[~nan])
    assert isinstance(fpsim.quantize(x, dt), np.ndarray)


@pytest.mark.parametrize("fmt", TORCH_FLOATS, ids=lambda f: f.name)
def test_a_torch_dtype_names_its_format_and_a_tensor_comes_back(fmt):
    dtype = getattr(torch, fmt.name)
    assert get_format(dtype) is fmt
    x = torch.from_numpy(_inputs(fmt))
    # torch saturates float8_e4m3fn (only); the format is the same, saturate is the caller's
    saturate = fmt.name == "float8_e4m3fn"
    got = fpsim.quantize(x, dtype, saturate=saturate)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.device == x.device
    _same_values(got.numpy(), x.to(dtype).float().numpy())


def test_torch_tensors_of_narrow_dtypes_are_read_bit_for_bit():
    x = torch.randn(4096) * 100
    for src in (torch.bfloat16, torch.float16, torch.float8_e5m2, torch.float8_e4m3fn):
        t = x.to(src)
        got = fpsim.quantize(t, "float8_e4m3fn", saturate=True)
        _same_values(got.numpy(), t.float().to(torch.float8_e4m3fn).float().numpy())
        codes = fpsim.encode(t, torch.float8_e4m3fn, saturate=True)
        assert isinstance(codes, np.ndarray) and codes.dtype == np.uint8
        back = fpsim.decode(torch.from_numpy(codes), ml_dtypes.float8_e4m3fn)
        _same_values(back.numpy(), got.numpy())
    blocks = fpsim.quantize(x, "mxfp8_e4m3")
    assert isinstance(blocks, torch.Tensor) and blocks.dtype == torch.float32
    _same_values(blocks.numpy(), fpsim.quantize(x.numpy(), "mxfp8_e4m3"))


def test_numpy_and_jax_dtypes_and_arrays():
    assert get_format(np.float16) is get_format("float16")
    assert get_format(np.dtype(ml_dtypes.bfloat16)) is get_format("bfloat16")
    assert get_format(jnp.bfloat16) is get_format("bfloat16")
    assert get_format(jnp.float32) is get_format("float32")
    # (element formats on JAX arrays give JAX arrays: tests/emulate/test_jax.py)
    g = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    blocks = fpsim.quantize(jnp.asarray(g), "mxfp8_e4m3")  # block formats: on the host, JAX back
    assert isinstance(blocks, type(jnp.asarray(g)))
    _same_values(np.asarray(blocks), fpsim.quantize(g, "mxfp8_e4m3"))


@pytest.mark.parametrize(
    "dtype", [np.float64, np.int32, np.dtype(np.complex64), "torch.float64", "torch.float4_e2m1fn_x2"]
)
def test_a_dtype_without_a_format_is_refused_naming_the_allowed_ones(dtype):
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    with pytest.raises(ValueError, match="no fpsim format.*float8_e4m3fn"):
        fpsim.quantize(np.ones(3, np.float32), dtype)


def test_arrays_and_other_objects_are_not_formats():
    for bad in (np.zeros(3), None, 3.0):
        with pytest.raises(TypeError, match="format must be a name, a dtype or a Format"):
            get_format(bad)
