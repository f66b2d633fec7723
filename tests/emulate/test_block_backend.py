"""The ``backend=`` of the verbs: numpy and compiled give the same codes, scales and values.

The compiled tier (:mod:`fpsim._compiled.loops`, numba) runs the nearest-entry codebook
recipes, and the element cast of the scaled recipes (MX, NVFP4, TE's per-tensor, per-block and
tile scaling) in :mod:`fpsim._compiled.measure`'s loop; every comparison here is bit for bit
(NaN by class), the numpy path forced with ``backend="numpy"``, on data with NaNs of every
kind (quiet and signaling, both signs).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracles import with_nans

import fpsim
from fpsim import Backend
from fpsim._compiled import available as compiled_available
from fpsim.emulate import blocks
from fpsim.formats import BlockFormat, Codebook, RoundMode, ScaleRule

pytestmark = pytest.mark.dispatch  # .ci/run reruns these with the SIMD dispatch masked

CODEBOOKS = ["bnb_dynamic8_block256", "bnb_dynamic8u_block256", "bnb_dynamic8_block2048"]


def _data(n: int, unsigned: bool) -> np.ndarray:
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    x[: min(n, 300)] = 0  # a whole zero block
    x[-3:] = [np.inf, -np.inf, np.nan]
    return with_nans(np.abs(x) if unsigned else x, start=min(n - 1, 400))


def _same_values(got: np.ndarray, want: np.ndarray) -> None:
    g, w = np.asarray(got, np.float32).reshape(-1), np.asarray(want, np.float32).reshape(-1)
    nan = np.isnan(g) & np.isnan(w)
    assert np.array_equal(g.view(np.uint32)[~nan], w.view(np.uint32)[~nan])
    assert np.array_equal(np.isnan(g), np.isnan(w))


@pytest.mark.parametrize("name", CODEBOOKS)
def test_block_verbs_numpy_and_compiled_agree(name):
    pytest.importorskip("numba")
    x = _data(70_001, "8u" in name)
    enc = {b: fpsim.encode(x, name, backend=b) for b in ("numpy", "compiled")}
    np.testing.assert_array_equal(enc["numpy"].codes, enc["compiled"].codes)
    np.testing.assert_array_equal(enc["numpy"].scales, enc["compiled"].scales)
    for b in ("numpy", "compiled"):
        _same_values(
            fpsim.decode(enc[b], name, backend="compiled"), fpsim.decode(enc[b], name, backend="numpy")
        )
    _same_values(fpsim.quantize(x, name, backend="compiled"), fpsim.quantize(x, name, backend=Backend.NUMPY))
    (e_c, v_c), (e_n, v_n) = (blocks.encode_decode_blocks(x, name, backend=b) for b in ("compiled", "numpy"))
    np.testing.assert_array_equal(e_c.codes, e_n.codes)
    np.testing.assert_array_equal(e_c.scales, e_n.scales)
    _same_values(v_c, v_n)


_F = fpsim.FORMATS
SCALED = [  # the GEMM recipes' block formats (fpsim.train.gemm) and the registry's scaled ones
    BlockFormat("mxfp8_rceil", _F["float8_e4m3fn"], (32,), ScaleRule.MX_RCEIL, _F["float8_e8m0fnu"]),
    BlockFormat("nvfp4_tile16", _F["float4_e2m1fn"], (16, 16), ScaleRule.NVFP4, _F["float8_e4m3fn"]),
    *(
        fpsim.RECIPES[n]
        for n in ("mxfp8_e4m3", "mxfp4_e2m1", "mxint8", "nvfp4", "int8_block256")
        + ("e4m3_tensor", "e5m2_tensor", "e4m3_block128", "e4m3_tile128")
    ),
]


@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
@pytest.mark.parametrize("bf", SCALED, ids=lambda f: f.name)
def test_scaled_block_formats_numpy_and_compiled_agree(bf, rounding):
    """Codes, scales, tensor scale and values, on ragged shapes (blocks and tiles cut by the
    edges, an axis shorter than the block) holding NaNs of every kind, infinities, zeros."""
    pytest.importorskip("numba")
    for shape in ((37, 300), (5, 20), (130, 48)):
        x = _data(math.prod(shape), False).reshape(shape)
        kw = {"rounding": rounding}
        if rounding == "stochastic":
            kw["random_bits"] = np.random.default_rng(1).integers(0, 2**32, shape, dtype=np.uint32)
        got = {b: fpsim.encode(x, bf, backend=b, **kw) for b in ("numpy", "compiled")}
        np.testing.assert_array_equal(got["numpy"].codes, got["compiled"].codes)
        np.testing.assert_array_equal(got["numpy"].scales, got["compiled"].scales)
        assert got["numpy"].tensor_scale == got["compiled"].tensor_scale
        _same_values(fpsim.decode(got["compiled"], bf, backend="compiled"), fpsim.decode(got["numpy"], bf))


@pytest.mark.parametrize("bf", SCALED[:2] + SCALED[-2:], ids=lambda f: f.name)
def test_a_short_axis_is_one_zero_padded_block(bf):
    """An axis shorter than its block gives the codes and scales of the tensor padded with
    zeros to the block (the oracle pads by hand), on both backends."""
    x = _data(40 * 12, False).reshape(40, 12)
    rows = bf.block[0] if len(bf.block) == 2 else 1
    padded = np.zeros((-(-40 // rows) * rows, bf.block[-1]), np.float32)
    padded[:40, :12] = x
    want = fpsim.encode(padded, bf, backend="numpy")
    for b in ("numpy", "compiled") if compiled_available() else ("numpy",):
        got = fpsim.encode(x, bf, backend=b)
        np.testing.assert_array_equal(got.codes, want.codes[:40, :12])
        np.testing.assert_array_equal(got.scales, want.scales)


def test_compiled_codebook_follows_the_backend():
    bf = fpsim.RECIPES["bnb_dynamic8_block256"]
    assert blocks.compiled_codebook(bf, RoundMode.NEAREST_EVEN, (512,), Backend.COMPILED)
    assert not blocks.compiled_codebook(bf, RoundMode.NEAREST_EVEN, (512,), Backend.NUMPY)
    assert not blocks.compiled_codebook(bf, RoundMode.STOCHASTIC, (512,), Backend.COMPILED)


def test_per_tensor_codebook_chunk_takes_the_given_tensor_amax():
    """A chunk of a tensor in a per-tensor codebook recipe is scaled by the amax of the whole
    tensor on both backends (the compiled loop computes amaxes from its input, so it steps
    aside), as the scale rule says: scale = the given amax."""
    pytest.importorskip("numba")
    bf = BlockFormat("bnb_dynamic8_tensor", Codebook.bnb_dynamic(True), None, ScaleRule.ABSMAX)
    x = with_nans(np.random.default_rng(0).standard_normal(2000).astype(np.float32), start=100)
    x[1500] = 50.0  # the tensor's amax lies outside the chunk
    amax = max(abs(v) for v in x.tolist() if v == v)
    got = {b: blocks.encode_blocks(x[:1000], bf, tensor_amax=amax, backend=b) for b in ("numpy", "compiled")}
    for enc in got.values():
        assert enc.scales.view(np.float32).tolist() == [np.float32(amax)]
    np.testing.assert_array_equal(got["numpy"].codes, got["compiled"].codes)


def test_unknown_backend_is_refused_by_every_verb():
    x = np.ones(4, np.float32)
    for call in (
        lambda: fpsim.encode(x, "float8_e4m3fn", backend="gpu"),
        lambda: fpsim.quantize(x, "mxfp8_e4m3", backend="gpu"),
        lambda: blocks.encode_blocks(x, "int8_block256", backend="gpu"),
        lambda: blocks.decode_blocks(
            blocks.encode_blocks(x, "int8_block256"), "int8_block256", backend="gpu"
        ),
    ):
        with pytest.raises(ValueError, match="auto, numpy, compiled"):
            call()


def test_stochastic_bits_are_checked_for_block_formats():
    x = np.ones(64, np.float32)
    for fmt in ("mxfp8_e4m3", "bnb_dynamic8_block256", "float8_e4m3fn"):
        with pytest.raises(ValueError, match="stochastic_bits"):
            fpsim.encode(x, fmt, rounding="stochastic", rng=0, stochastic_bits=0)
