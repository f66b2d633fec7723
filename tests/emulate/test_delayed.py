"""TE DelayedScaling (amax history) stepped over hand-made sequences.

Rules of section 1 in ``tests/oracles/scaling.py``, numbered in fpsim/emulate/delayed.py (TE
``delayed_scaling.cu`` kernel_bulk, the default fused update): the cast uses the scale
already stored (step 0: 1); the amax (NaN ignored) goes into history[0]; then, if it is
nonzero, the history rolls to ``[0, h2, ..., h_{N-1}, last]`` and "max" takes the max over
``h1..h_{N-1}`` and ``last`` (the last N amaxes); if it is zero nothing rolls and the scale
is kept. The scale is ``f32(f32(fp8_max * 2**-margin) / amax)`` for finite positive amax,
else kept; inf -> FLT_MAX. Expected histories are written out by hand; scales come from
torch float32 division of the hand-picked window amaxes; codes from torch's cast of f32(x *
scale).
"""

from __future__ import annotations

import numpy as np
import pytest
from oracles import is_nan_code
from oracles import scaling as R

import fpsim
from fpsim import DelayedScaling, DelayedState

torch = pytest.importorskip("torch")

F32 = np.float32
FLT_MAX = float(np.finfo(F32).max)
TINY = 2.0**-149
INF = np.inf


def tensor_with_amax(amax: float, seed: int, nan: bool = False) -> np.ndarray:
    """A (3, 5) float32 tensor whose largest magnitude is ``amax`` (at a negative element
    when finite), the rest in [0, amax); optionally with a NaN element."""
    rng = np.random.default_rng(seed)
    x = (rng.uniform(-1, 1, (3, 5)) * (amax if np.isfinite(amax) else 1.0)).astype(F32)
    if amax == 0:
        x[:] = 0
    elif np.isinf(amax):
        x[1, 2] = amax
    else:
        x[np.unravel_index(np.argmax(np.abs(x)), x.shape)] = -F32(amax)
        assert np.fmax.reduce(np.abs(x), axis=None) == F32(amax)
    if nan:  # at the smallest magnitude, never at the amax
        x[np.unravel_index(np.argmin(np.abs(x)), x.shape)] = np.nan
    return x


def torch_scale(scaled_max: float, amax: float) -> float:
    """f32(scaled_max / amax) by torch, inf -> FLT_MAX."""
    s = (torch.tensor(scaled_max, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32)).item()
    return FLT_MAX if np.isinf(s) else s


def torch_codes(x: np.ndarray, scale: float, element: str) -> np.ndarray:
    t = torch.from_numpy(x) * torch.tensor(scale, dtype=torch.float32)
    if element == "float8_e5m2":  # torch's E5M2 cast does not saturate: clamp first
        return t.clamp(-57344.0, 57344.0).to(torch.float8_e5m2).view(torch.uint8).numpy()
    return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def check_step(codes, x, scale, element, what):
    """codes equal torch's saturating cast of f32(x * scale) (NaN compared by class), and the
    stored decode scale is f32(1/scale)."""
    want = torch_codes(x, scale, element)
    nan = np.isnan(x)
    assert np.all(is_nan_code(codes.codes[nan], element)) and np.all(is_nan_code(want[nan], element))
    R.assert_hex_equal(codes.codes[~nan], want[~nan], f"{what} codes", inputs=x[~nan])
    inv = (torch.tensor(1.0) / torch.tensor(scale, dtype=torch.float32)).numpy().reshape(1).view(np.uint32)
    R.assert_hex_equal(codes.scales.view(np.uint32), inv, f"{what} scale_inv", width=8)


# The sequence: step amaxes, with a zero tensor (step 1), a tensor holding inf (step 2), a
# spike (step 3), a NaN element (step 6) and tiny (subnormal) amaxes (steps 7-10).
AMAXES = [2.0, 0.0, INF, 1000.0, 4.0, 0.5, 3.0, TINY, TINY, TINY, TINY, 448.0]
NAN_AT = {6}
T = TINY
# history after each step, by hand (N = 4): roll [0, h2, h3, last] unless last == 0
HISTORY = [
    [0, 0, 0, 2],
    [0, 0, 0, 2],  # amax 0: no roll
    [0, 0, 2, INF],
    [0, 2, INF, 1000],
    [0, INF, 1000, 4],
    [0, 1000, 4, 0.5],  # inf (h1) leaves the history but still counted in this step's max
    [0, 4, 0.5, 3],
    [0, 0.5, 3, T],
    [0, 3, T, T],
    [0, T, T, T],
    [0, T, T, T],
    [0, T, T, 448],
]
# amax used for the next scale (None: keep the previous scale)
WINDOW_MAX = [2.0, None, None, None, None, None, 1000.0, 4.0, 3.0, 3.0, TINY, 448.0]
MOST_RECENT = [2.0, None, None, 1000.0, 4.0, 0.5, 3.0, TINY, TINY, TINY, TINY, 448.0]


def expected_scales(window, scaled_max):
    """Scale used at each step: 1 at step 0, then each step's update (kept when None)."""
    used, scale = [], 1.0
    for amax in window:
        used.append(scale)
        if amax is not None:
            scale = torch_scale(scaled_max, amax)
    return used, scale


@pytest.mark.parametrize(
    "algo, margin, window",
    [
        ("max", 0, WINDOW_MAX),
        ("most_recent", 0, MOST_RECENT),
        ("max", 1, WINDOW_MAX),
        ("most_recent", 3, MOST_RECENT),
    ],
    ids=["max", "most_recent", "max-margin1", "most_recent-margin3"],
)
def test_delayed_sequence(algo, margin, window):
    ds = DelayedScaling("float8_e4m3fn", history_len=4, amax_compute_algo=algo, margin=margin)
    used, final = expected_scales(window, 448.0 * 2.0**-margin)
    state = ds.init()
    assert state.scale == 1.0 and np.array_equal(state.history, np.zeros(4, F32))
    assert state.history.dtype == F32
    for i, amax in enumerate(AMAXES):
        x = tensor_with_amax(amax, seed=i, nan=i in NAN_AT)
        before = state.history.copy()
        codes, new = ds.step(state, x)
        assert np.array_equal(state.history, before), "step must not modify the old state"
        assert state.scale == used[i], f"step {i}: scale used {state.scale} != {used[i]}"
        check_step(codes, x, used[i], "float8_e4m3fn", f"step {i}")
        want_h = np.array(HISTORY[i], F32)
        assert np.array_equal(new.history, want_h), f"step {i}: history {new.history} != {want_h}"
        state = new
    assert state.scale == final


def test_hand_scale_values():
    """The torch-computed scales of the sequence, by hand: 448/2 = 224, 448/1000 = 0.448
    (f32 0x3EE56042), 448/4 = 112, 448/3 = 0x43155555, 448/2**-149 = inf -> FLT_MAX."""
    assert torch_scale(448.0, 2.0) == 224.0
    assert R.f32_bits(torch_scale(448.0, 1000.0)) == 0x3EE56042
    assert R.f32_bits(torch_scale(448.0, 3.0)) == 0x43155555
    assert torch_scale(448.0, TINY) == FLT_MAX
    ds = DelayedScaling(history_len=4)
    state = ds.init()
    for i, amax in enumerate(AMAXES[:7]):
        _, state = ds.step(state, tensor_with_amax(amax, seed=i, nan=i in NAN_AT))
    assert R.f32_bits(state.scale) == 0x3EE56042
    assert R.f32_bits(state.scale_inv) == R.f32_bits(F32(1) / F32(0.448))


def test_max_keeps_scale_on_zero_step_despite_history():
    """With "max", a zero step does not roll and uses amax 0, so the previous scale is kept
    even though the history holds nonzero amaxes (rule 3 of fpsim/emulate/delayed.py)."""
    ds = DelayedScaling(history_len=3)
    state = ds.init()
    _, state = ds.step(state, tensor_with_amax(8.0, 0))
    _, state = ds.step(state, tensor_with_amax(2.0, 1))  # window max 8 -> 56
    assert state.scale == 56.0 and np.array_equal(state.history, F32([0, 8, 2]))
    _, state = ds.step(state, np.zeros(4, F32))
    assert state.scale == 56.0 and np.array_equal(state.history, F32([0, 8, 2]))
    _, state = ds.step(state, tensor_with_amax(1.0, 2))  # window {8, 2, 1} -> 56
    assert state.scale == 56.0 and np.array_equal(state.history, F32([0, 2, 1]))
    _, state = ds.step(state, tensor_with_amax(1.0, 3))  # window {2, 1, 1} -> 224
    assert state.scale == 224.0 and np.array_equal(state.history, F32([0, 1, 1]))


def test_history_len_one():
    """N = 1: the only slot is zeroed after every nonzero step (kernel_bulk writes 0 to
    slot 0), the window is the current amax, zero steps keep the scale."""
    amaxes = [2.0, 0.0, 5.0, INF, TINY, 3.0]
    for algo in ("max", "most_recent"):
        ds = DelayedScaling(history_len=1, amax_compute_algo=algo)
        state = ds.init()
        used, _ = expected_scales([2.0, None, 5.0, None, TINY, 3.0], 448.0)
        for i, amax in enumerate(amaxes):
            x = tensor_with_amax(amax, seed=10 + i)
            assert state.scale == used[i], (algo, i)
            codes, state = ds.step(state, x)
            check_step(codes, x, used[i], "float8_e4m3fn", f"{algo} N=1 step {i}")
            assert np.array_equal(state.history, F32([0])), (algo, i, state.history)
        assert state.scale == torch_scale(448.0, 3.0)


def test_e5m2_with_margin():
    """E5M2 (HYBRID backward): scaled_max = 57344 * 2**-2 = 14336; torch's E5M2 cast after
    clamping to +-57344 (saturating)."""
    ds = DelayedScaling("float8_e5m2", history_len=2, margin=2)
    state = ds.init()
    seq = [1.0, 3.0, 1e-3, 7.0]
    used, _ = expected_scales([1.0, 3.0, 3.0, 7.0], 14336.0)
    assert used[1] == 14336.0
    for i, amax in enumerate(seq):
        x = tensor_with_amax(amax, seed=20 + i)
        codes, state = ds.step(state, x)
        check_step(codes, x, used[i], "float8_e5m2", f"e5m2 step {i}")


def test_saturation_when_the_tensor_outgrows_the_delayed_scale():
    """A spike cast with the previous (larger) scale saturates to +-448 instead of
    overflowing (cvt.rn.satfinite)."""
    ds = DelayedScaling(history_len=8)
    state = ds.init()
    _, state = ds.step(state, tensor_with_amax(1.0, 30))
    x = np.array([100.0, -5.0, 1.0], F32)  # 100 * 448 overflows E4M3
    codes, _ = ds.step(state, x)
    R.assert_hex_equal(codes.codes, [0x7E, 0xFE, 0x7E], "saturated codes")


@pytest.mark.parametrize("element", ["float8_e4m3fn", "float8_e5m2"])
def test_backends_give_the_same_steps(element):
    """The cast on the compiled backend gives the numpy tier's codes (NaNs of every kind,
    infinities, saturation, flushed subnormals, stochastic rounding) and the same states."""
    pytest.importorskip("numba")
    from oracles import with_nans

    ds = DelayedScaling(element, history_len=4)
    rng = np.random.default_rng(7)
    states = {b: ds.init() for b in ("numpy", "compiled")}
    for step in range(4):
        x = (rng.standard_normal(3000) * np.exp2(rng.integers(-30, 10, 3000)) * 10.0**step).astype(F32)
        x = with_nans(x, start=step)
        x[-3:] = [np.inf, -np.inf, 0.0]
        words = rng.integers(0, 2**32, x.shape, dtype=np.uint32)
        for kw in ({}, {"subnormals": False}, {"rounding": "stochastic", "random_bits": words}):
            got = {b: ds.step(states[b], x, backend=b, **kw) for b in states}
            np.testing.assert_array_equal(got["numpy"][0].codes, got["compiled"][0].codes)
            np.testing.assert_array_equal(got["numpy"][0].scales, got["compiled"][0].scales)
        states = {b: got[b][1] for b in states}
        assert states["numpy"].scale == states["compiled"].scale
        assert np.array_equal(states["numpy"].history, states["compiled"].history)


def test_run_equals_steps():
    ds = DelayedScaling(history_len=4)
    xs = [tensor_with_amax(a, seed=40 + i) for i, a in enumerate(AMAXES)]
    state = ds.init()
    manual = []
    for x in xs:
        c, state = ds.step(state, x)
        manual.append((c, state))
    ran = list(ds.run(xs))
    assert len(ran) == len(manual)
    for (c1, s1), (c2, s2) in zip(manual, ran):
        assert np.array_equal(c1.codes, c2.codes) and np.array_equal(c1.scales, c2.scales)
        assert np.array_equal(s1.history, s2.history) and s1.scale == s2.scale
    # run continues from a given state
    first = list(ds.run(xs[:5]))[-1][1]
    rest = list(ds.run(xs[5:], state=first))
    assert rest[-1][1].scale == manual[-1][1].scale
    assert np.array_equal(rest[-1][1].history, manual[-1][1].history)


def test_state_scale_inv():
    assert DelayedState(np.zeros(2, F32), 3.0).scale_inv == float(F32(1) / F32(3))


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(history_len=0), ValueError, r"history_len must be >= 1, got 0"),
        (dict(history_len=-3), ValueError, r"history_len must be >= 1, got -3"),
        (
            dict(amax_compute_algo="mean"),
            ValueError,
            r"amax_compute_algo must be 'max' or 'most_recent', got 'mean'",
        ),
        (dict(element="int8"), TypeError, r"DelayedScaling needs a float element format, got int8"),
        (
            dict(element="mxfp8_e4m3"),
            TypeError,
            r"DelayedScaling needs a float element format, got mxfp8_e4m3",
        ),
        (dict(element="float8_e9m9"), ValueError, r"unknown format 'float8_e9m9'"),
    ],
    ids=["len0", "len-neg", "algo", "int-element", "block-element", "unknown-element"],
)
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        DelayedScaling(**kwargs)


def test_dequantize_with_scale_inv():
    """DelayedScaling codes are element codes: decoding them with scale_inv gives the
    dequantized tensor q * f32(1/scale) (section 1)."""
    ds = DelayedScaling(history_len=2)
    state = ds.init()
    _, state = ds.step(state, tensor_with_amax(2.0, 50))
    x = tensor_with_amax(1.5, 51)
    codes, _ = ds.step(state, x)
    q = fpsim.decode(codes.codes, "float8_e4m3fn")
    inv = codes.scales.view(F32)[0]
    want = torch.from_numpy(x * F32(224)).to(torch.float8_e4m3fn).to(torch.float32).numpy() * inv
    assert np.array_equal(q * inv, want)
