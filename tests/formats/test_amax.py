"""fpsim.formats.amax against Python's ``max`` over the ``math.isnan``-filtered magnitudes.

The inputs hold quiet and signaling NaNs of both signs and several payloads (on which numpy's
SIMD ``fmax`` kernels disagree), infinities, signed zeros and subnormals, at every length
from 1 to 70 (SIMD bodies and tails) and every position, in float32 and float64, reduced
whole and along several axes. The oracle uses no numpy reduction: each element becomes a
Python float (NaN stays NaN), and ``max`` runs over a Python list.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracles import nan_patterns, with_nans

from fpsim.formats import RECIPES, Codebook, ScaleRule
from fpsim.formats.amax import amax_ignore_nan, amax_propagate_nan

pytestmark = pytest.mark.dispatch  # .ci/run reruns these with the SIMD dispatch masked

_UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}
_QNAN = {np.dtype(np.float32): 0x7FC00000, np.dtype(np.float64): 0x7FF8000000000000}
DTYPES = (np.float32, np.float64)


def _oracle(values: list[float], propagate: bool) -> float:
    mags = [abs(v) for v in values]
    if propagate and any(math.isnan(v) for v in mags):
        return math.nan
    return max((v for v in mags if not math.isnan(v)), default=0.0)


def _bits(a, dtype) -> np.ndarray:
    return np.asarray(a, dtype).reshape(-1).view(_UINT[np.dtype(dtype)])


def _assert_bits(got, want: list[float], dtype) -> None:
    """``got`` (of ``dtype``) equals ``want`` bit for bit; a NaN must be the canonical quiet NaN."""
    dt = np.dtype(dtype)
    assert np.asarray(got).dtype == dt
    g = _bits(got, dt)
    w = np.array([_QNAN[dt] if math.isnan(v) else int(_bits(v, dt)[0]) for v in want], _UINT[dt])
    bad = np.flatnonzero(g != w)
    assert not bad.size, [(int(i), hex(int(g[i])), hex(int(w[i]))) for i in bad[:8]]


def _data(n: int, dtype, rng: np.random.Generator) -> np.ndarray:
    """``n`` values over the whole range: normals of every size, subnormals, +-0, +-inf, huge."""
    mag = np.exp(rng.uniform(-700 if dtype == np.float64 else -100, 88, n))
    x = (mag * rng.choice([-1.0, 1.0], n)).astype(dtype)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 3.0e38, -3.02e38, 1e-45, -1e-40], dtype)
    pick = rng.random(n) < 0.15
    x[pick] = rng.choice(specials, int(pick.sum()))
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_length_and_nan_position(dtype):
    """Lengths 1..70, every NaN pattern at every position, with and without a second NaN."""
    rng = np.random.default_rng(27)
    nans = nan_patterns(dtype)
    u = _UINT[np.dtype(dtype)]
    for n in range(1, 71):
        base = _data(n, dtype, rng)
        cases = [base]
        for pos in range(n):
            x = base.copy()
            x.view(u)[pos] = nans[(n + pos) % nans.size].view(u)
            if n > 2 and pos % 3 == 0:  # a second NaN of another kind
                x.view(u)[(pos * 7 + 1) % n] = nans[(n + pos + 3) % nans.size].view(u)
            cases.append(x)
        for x in cases:
            values = x.tolist()
            _assert_bits(amax_ignore_nan(x), [_oracle(values, False)], dtype)
            _assert_bits(amax_propagate_nan(x), [_oracle(values, True)], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", ((3, 5, 7), (1, 33, 17), (4, 1, 65), (2, 6, 2, 9)), ids=str)
def test_axes_and_keepdims(dtype, shape):
    """Every axis, pairs of axes, negative axes and None, with and without keepdims, against
    the oracle on the rows that a moveaxis + reshape gathers (data movement only)."""
    rng = np.random.default_rng(sum(shape))
    n = math.prod(shape)
    x = _data(n, dtype, rng)
    u = _UINT[np.dtype(dtype)]
    nans = nan_patterns(dtype)
    where = rng.choice(n, size=max(1, n // 13), replace=False)
    x.view(u)[where] = np.resize(nans, where.size).view(u)
    x = x.reshape(shape)
    nd = len(shape)
    axes = [None, 0, -1, (0, nd - 1), tuple(range(1, nd)), (1,) if nd > 2 else 0]
    for axis in axes:
        red = tuple(range(nd)) if axis is None else tuple(a % nd for a in np.atleast_1d(axis))
        rows = np.moveaxis(x, red, tuple(range(nd - len(red), nd))).reshape(
            -1, math.prod(shape[a] for a in red)
        )
        for keepdims in (False, True):
            out_shape = tuple(1 if a in red else shape[a] for a in range(nd) if keepdims or a not in red)
            for fn, prop in ((amax_ignore_nan, False), (amax_propagate_nan, True)):
                got = fn(x, axis=axis, keepdims=keepdims)
                assert np.shape(got) == out_shape, (axis, keepdims, np.shape(got))
                want = [_oracle(r.tolist(), prop) for r in rows]
                _assert_bits(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_strided_views_and_the_input_left_alone(dtype):
    rng = np.random.default_rng(5)
    x = _data(200, dtype, rng).reshape(20, 10)
    u = _UINT[np.dtype(dtype)]
    x.view(u)[3, ::3] = np.resize(nan_patterns(dtype), 4).view(u)
    before = x.view(u).copy()
    for view in (x[::3], x.T, x[:, ::-2], x[5:6, 4]):
        for axis in (None, 0, -1):
            for fn, prop in ((amax_ignore_nan, False), (amax_propagate_nan, True)):
                got = fn(view, axis=axis)
                rows = np.moveaxis(view, 0 if axis is None else axis, -1)
                rows = rows.reshape(1, -1) if axis is None else rows.reshape(-1, rows.shape[-1])
                _assert_bits(got, [_oracle(r.tolist(), prop) for r in rows], dtype)
    assert np.array_equal(x.view(u), before)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_empty_and_scalar_inputs(dtype):
    for fn in (amax_ignore_nan, amax_propagate_nan):
        zero = fn(np.zeros(0, dtype))
        assert isinstance(zero, np.generic) and zero.dtype == dtype and _bits(zero, dtype)[0] == 0
        assert fn(np.zeros((3, 0), dtype), axis=1).shape == (3,)
        assert not fn(np.zeros((3, 0), dtype), axis=1).any()
        assert fn(np.zeros((3, 0), dtype), axis=0).shape == (0,)
        assert fn(np.zeros((3, 0), dtype), axis=0, keepdims=True).shape == (1, 0)
        neg = fn(np.asarray(-2.5, dtype))
        assert isinstance(neg, np.generic) and neg == 2.5
        # -0 is +0 (the sign bit cleared), as fmaxf over |x| gives
        assert _bits(fn(np.array([-0.0, -0.0], dtype)), dtype)[0] == 0
    snan = nan_patterns(dtype)[:1]
    assert amax_ignore_nan(snan) == 0
    assert _bits(amax_propagate_nan(snan), dtype)[0] == _QNAN[np.dtype(dtype)]


@pytest.mark.parametrize("bad", [np.zeros(3, np.float16), np.zeros(3, np.int32), [1.0, 2.0], 1.5])
def test_other_dtypes_are_refused(bad):
    # a list or a Python float is float64 for numpy: that one is accepted
    if np.asarray(bad).dtype == np.float64:
        assert amax_ignore_nan(bad) == max(abs(v) for v in np.atleast_1d(bad).tolist())
        return
    with pytest.raises(TypeError, match=f"float32 or float64 array, got dtype {np.asarray(bad).dtype}"):
        amax_ignore_nan(bad)
    with pytest.raises(TypeError, match="float32 or float64"):
        amax_propagate_nan(bad)


# --- the numpy tier's amaxes, on data with every kind of NaN --------------------------------


def _nan_data() -> tuple[np.ndarray, np.ndarray]:
    """(15, 253) float32 over many binades with the NaN patterns in rows 0-2 and a signaling
    NaN after a huge value in the last row, in the tail that numpy's SIMD loops leave to
    scalar code (where its fmax returned NaN, or a smaller maximum, in issue 27); and the
    same data with each NaN replaced by 0."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((15, 253)) * np.exp(rng.uniform(-10, 10, (15, 1)))).astype(np.float32)
    x[1, 40] = x[14, 200] = 3.0e38
    x.view(np.uint32)[14, 251] = 0x7F97C976
    xn = with_nans(x, start=3, spacing=37, rounds=2)
    nan = (xn.view(np.uint32) & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return xn, np.where(nan, np.float32(0), xn)


def _recipes() -> dict:
    """The block recipes, and small blocks and tiles of each rule (reductions short enough for
    numpy's scalar code)."""
    import dataclasses

    out = dict(RECIPES)
    for name, base, block in (
        ("te_1x24", "e4m3_block128", (24,)),
        ("te_tile4x8", "e4m3_tile128", (4, 8)),
        ("nvfp4_tile2x8", "nvfp4", (2, 8)),
        ("bnb_block40", "bnb_dynamic8_block256", (40,)),
        ("int8_block24", "int8_block256", (24,)),
        ("mx_block8", "mxfp8_e4m3", (8,)),
    ):
        out[name] = dataclasses.replace(RECIPES[base], name=name, block=block)
    return out


def test_tensor_amaxes_skip_every_nan():
    from fpsim.analysis.metrics import tensor_amax
    from fpsim.emulate.delayed import DelayedScaling
    from fpsim.trace.operand_stats import stats_vector

    xn, _ = _nan_data()
    want = _oracle(xn.reshape(-1).tolist(), False)
    assert want == float(np.float32(3.0e38))
    assert tensor_amax(xn.reshape(-1)) == want
    with np.errstate(invalid="ignore"):  # (casting a signaling NaN raises the invalid flag)
        x64 = xn.reshape(-1).astype(np.float64)
    assert tensor_amax(x64) == want  # the float32 values of float64 data
    assert stats_vector(xn)[4] == want
    ds = DelayedScaling("float8_e4m3fn", history_len=4)
    _, state = ds.step(ds.init(), xn)
    assert state.history[-1] == want and state.scale == float(np.float32(448) / np.float32(want))


def test_qmap_scales_propagate_nan_as_the_canonical_nan():
    from fpsim.replay.qmap import QMAP_RECIPES, encode_qmap

    xn, _ = _nan_data()
    enc = encode_qmap(xn, QMAP_RECIPES["torchao_dynamic8_block256"])  # one block per row
    blocks = np.pad(xn.reshape(-1), (0, -xn.size % 256)).reshape(-1, 256)  # (the ragged last: zeros)
    amaxes = [_oracle(b.tolist(), True) for b in blocks]
    want = [a if math.isnan(a) else max(a, float(np.float32(1e-12))) for a in amaxes]
    _assert_bits(enc.scales.view(np.float32), want, np.float32)
    assert sum(map(math.isnan, want)) == 4


@pytest.mark.parametrize("name", sorted(_recipes()))
def test_block_recipes_skip_or_propagate_every_nan(name):
    """Rules that skip NaN (TE, NVFP4, codebooks: fmaxf) give the scales of the data with each
    NaN replaced by 0; rules that propagate it (MX, absmax: torch.amax) give those scales or,
    in the blocks holding a NaN, the canonical NaN scale code: on both backends."""
    from fpsim.emulate.blocks import encode_blocks

    bf = _recipes()[name]
    xn, clean = _nan_data()
    nan = xn != xn
    ignore = bf.rule in (ScaleRule.TE, ScaleRule.NVFP4) or isinstance(bf.element, Codebook)
    nan_code = 0xFF if bf.rule.is_mx else 0x7FC00000
    for backend in ("numpy", "compiled") if _has_numba() else ("numpy",):
        got, want = encode_blocks(xn, bf, backend=backend), encode_blocks(clean, bf, backend=backend)
        assert got.tensor_scale == want.tensor_scale, backend
        same = got.scales == want.scales
        if ignore:
            assert same.all(), (backend, np.flatnonzero(~same)[:8])
            assert np.array_equal(got.codes[~nan], want.codes[~nan]), backend
        else:
            assert (got.scales[~same] == nan_code).all() and not same.all(), backend


def _has_numba() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True
