"""Each ScaleRule transcribed from its source, with hand-worked numbers and torch casts.

Section numbers refer to the list of recipes in ``tests/oracles/scaling.py`` (as read from
Transformer Engine, torchao, bitsandbytes and the OCP MX reference code). Expected codes and scales are
worked out by hand (hex constants) or computed with torch float32 ops in the order the
source uses, torch's ``.to(float8_*)`` casts and ml_dtypes; never with fpsim itself.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from oracles import is_nan_code
from oracles import scaling as R

import fpsim
from fpsim import BlockFormat, Codebook, ScaleRule, get_format

pytestmark = pytest.mark.dispatch  # .ci/run reruns these with the SIMD dispatch masked

torch = pytest.importorskip("torch")

F32 = np.float32
FLT_MAX = np.finfo(F32).max
E4M3 = get_format("float8_e4m3fn")
ONE = 0x3F800000  # float32 bits of 1.0


def f32bits(v) -> int:
    return int(np.asarray(v, F32).view(np.uint32))


def torch_e4m3(v) -> np.ndarray:
    """torch's float32 -> float8_e4m3fn cast (RNE; saturating in torch 2.13 eager)."""
    return torch.from_numpy(np.asarray(v, F32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def torch_e5m2_sat(v) -> np.ndarray:
    """Saturating E5M2: torch's E5M2 cast overflows to inf, so clamp first (as torchao
    does); clamping commutes with RNE saturation."""
    t = torch.from_numpy(np.asarray(v, F32)).clamp(-57344.0, 57344.0)
    return t.to(torch.float8_e5m2).view(torch.uint8).numpy()


def with_rule(name: str, rule: ScaleRule) -> BlockFormat:
    return dataclasses.replace(get_format(name), rule=rule)


def test_torch_e4m3_cast_saturates():
    """The oracle's premise: torch 2.13's eager float8_e4m3fn cast saturates (inf -> 448)."""
    got = torch_e4m3([1000.0, 464.0, np.inf, -np.inf, np.nan])
    assert got[:4].tolist() == [0x7E, 0x7E, 0x7E, 0xFE] and got[4] & 0x7F == 0x7F


# --- TE current scaling (section 2) -----------------------------------------------------------


@pytest.mark.parametrize(
    "x, scale_inv, codes",
    [
        # 448/3 = 149.33333 (0x43155555); 1/that = 0x3BDB6DB7; 3*s = 448, -1.5*s = -224, 0.1*s = 14.93 -> 15
        ([3.0, -1.5, 0.1], 0x3BDB6DB7, [0x7E, 0xF6, 0x57]),
        # amax 0 -> scale 1
        ([0.0, -0.0, 0.0], ONE, [0x00, 0x80, 0x00]),
        # amax inf -> scale 1; inf saturates to 448
        ([np.inf, 2.0, -0.5], ONE, [0x7E, 0x40, 0xB0]),
        # NaN elements are ignored by the amax (fmaxf): amax 2 -> scale 224, scale_inv = 0x3B924925
        ([np.nan, 2.0, -1.0], 0x3B924925, [0x7F, 0x7E, 0xF6]),
        # all NaN: amax 0 -> scale 1
        ([np.nan, np.nan], ONE, [0x7F, 0x7F]),
        # amax 2**-149: 448 / amax overflows -> FLT_MAX; 1/FLT_MAX = 2**-128 (0x00200000);
        # 2**-149 * FLT_MAX ~ 2**-20 -> 0
        ([2.0**-149, 0.0], 0x00200000, [0x00, 0x00]),
    ],
    ids=["amax3", "zero", "inf", "nan-ignored", "all-nan", "tiny-amax-flt-max"],
)
def test_te_current_scaling_by_hand(x, scale_inv, codes):
    """TE Float8CurrentScaling (compute_scale_from_amax, section 2): scale = f32(448/amax);
    amax 0/inf -> 1; inf scale -> FLT_MAX; stored scale_inv = f32(1/scale)."""
    x = np.array(x, F32)
    bc = fpsim.encode(x, "e4m3_tensor")
    assert bc.scales.shape == (1,)
    R.assert_hex_equal(bc.scales.view(np.uint32), [scale_inv], "scale_inv", width=8)
    R.assert_hex_equal(bc.codes, codes, "codes", inputs=x)
    # the same numbers from torch float32 ops and torch's cast
    a = np.fmax.reduce(np.abs(x), initial=0)
    scale = (torch.tensor(448.0) / torch.tensor(a)).item() if 0 < a < np.inf else 1.0
    scale = F32(FLT_MAX if np.isinf(scale) else scale)
    assert f32bits(F32(1) / scale) == scale_inv
    R.assert_hex_equal(codes, torch_e4m3(x * scale), "hand codes vs torch cast", inputs=x)


@pytest.mark.parametrize(
    "amax, scale, scale_inv",
    [
        (3.0, 0x43000000, 0x3C000000),  # 448/3 = 149.33 -> masked to 128
        (448.0, ONE, ONE),  # exactly 1
        (1000.0, 0x3E800000, 0x40800000),  # 0.448 -> 0.25
        (2.0**-149, 0x7F000000, 0x00400000),  # inf -> FLT_MAX -> 2**127; inverse 2**-127
        (0.0, ONE, ONE),
        (np.inf, ONE, ONE),
    ],
    ids=["amax3", "amax448", "amax1000", "tiny", "zero", "inf"],
)
def test_te_pow2_masks_down(amax, scale, scale_inv):
    """pow2 scales (section 2, ``pow2``): bits(scale) & 0xFF800000, a round-down to a power of
    two; scale 1 for amax 0/inf; FLT_MAX -> 2**127."""
    bf = dataclasses.replace(get_format("e4m3_tensor"), pow2=True)
    x = np.array([amax, -amax / 2 if np.isfinite(amax) else 1.0], F32)
    bc = fpsim.encode(x, bf)
    R.assert_hex_equal(bc.scales.view(np.uint32), [scale_inv], "scale_inv", width=8)
    s = np.array(scale, np.uint32).view(F32)
    R.assert_hex_equal(bc.codes, torch_e4m3(x * s), "codes", inputs=x)
    assert f32bits(F32(1) / s) == scale_inv


def test_te_amax_epsilon():
    """amax < eps -> eps (section 2, the eps bound); eps also lifts a zero amax, so a zero tensor
    gets 448/eps, not 1."""
    bf = dataclasses.replace(get_format("e4m3_tensor"), eps=1.0)
    bc = fpsim.encode(np.array([0.5, -0.25], F32), bf)  # amax 0.5 -> 1.0 -> scale 448
    R.assert_hex_equal(bc.scales.view(np.uint32), [0x3B124925], "scale_inv = f32(1/448)", width=8)
    R.assert_hex_equal(bc.codes, [0x76, 0xEE], "codes 224, -112")
    bc = fpsim.encode(np.zeros(3, F32), bf)
    R.assert_hex_equal(bc.scales.view(np.uint32), [0x3B124925], "zero tensor with eps", width=8)
    bc = fpsim.encode(np.array([3.0], F32), bf)  # amax above eps: unchanged
    R.assert_hex_equal(bc.scales.view(np.uint32), [0x3BDB6DB7], "amax 3 with eps 1", width=8)


@pytest.mark.parametrize("name", ["e4m3_tensor", "e5m2_tensor"])
def test_te_current_scaling_against_torch(name):
    """Random tensors over many binades: fpsim equals torch float32 ops
    (448/amax or 57344/amax, 1/scale) and torch's saturating casts (section 2)."""
    rng = np.random.default_rng(11)
    bf = get_format(name)
    cast = torch_e4m3 if name == "e4m3_tensor" else torch_e5m2_sat
    for trial in range(20):
        x = (rng.standard_normal((8, 33)) * np.exp(rng.uniform(-30, 30))).astype(F32)
        x[rng.random(x.shape) < 0.02] = np.nan
        t = torch.from_numpy(x)
        amax = torch.nan_to_num(t.abs(), nan=0.0).max()
        scale = torch.tensor(bf.elem_max, dtype=torch.float32) / amax
        scale = torch.where(torch.isinf(scale), torch.tensor(FLT_MAX), scale)
        want_inv = (1.0 / scale).numpy().reshape(1).view(np.uint32)
        want = cast((t * scale).numpy())
        bc = fpsim.encode(x, bf)
        R.assert_hex_equal(
            bc.scales.reshape(-1).view(np.uint32), want_inv, f"{name} scale_inv #{trial}", width=8
        )
        # NaN by class: fpsim's E5M2 NaN is the quiet pattern 0x7E, torch's is 0x7F
        nan = np.isnan(x)
        assert np.all(is_nan_code(bc.codes[nan], bf.element)) and np.all(is_nan_code(want[nan], bf.element))
        R.assert_hex_equal(bc.codes[~nan], want[~nan], f"{name} codes #{trial}", inputs=x[~nan])


# --- TE Float8BlockScaling 1x128 (section 3) -------------------------------------------------


def test_te_block_1x128_by_hand():
    """1x128 blocks along the last axis, pow2 scales (section 3): amaxes 3, 448, 1000, 0 give
    scales 128, 1, 0.25, 1; 1000 * 0.25 = 250 -> E4M3 256 (0x78)."""
    x = np.zeros((2, 256), F32)
    x[0, 5], x[0, 6] = 3.0, -1.0  # 3*128 = 384 (0x7C), -128 (0xF0)
    x[0, 200] = 448.0  # scale 1 -> 0x7E
    x[1, 0] = -1000.0  # -250 -> -256 (0xF8)
    bc = fpsim.encode(x, "e4m3_block128")
    assert bc.scales.shape == (2, 2)
    R.assert_hex_equal(
        bc.scales.view(np.uint32), [[0x3C000000, ONE], [0x40800000, ONE]], "scale_inv", width=8
    )
    assert bc.codes[0, 5] == 0x7C and bc.codes[0, 6] == 0xF0 and bc.codes[0, 200] == 0x7E
    assert bc.codes[1, 0] == 0xF8
    assert np.count_nonzero(bc.codes) == 4


def test_te_block_1x128_against_torch():
    """Random (16, 300) tensors, a ragged block of 44 and a zero block: per-block f32 scale
    448/amax masked to a power of two, elements by torch's cast of f32(x * scale)."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((16, 300)) * np.exp(rng.uniform(-25, 25, (16, 1)))).astype(F32)
    x[3, 128:256] = 0
    xb = torch.from_numpy(R.blocks_last(x, 128))
    amax = xb.abs().amax(-1, keepdim=True)
    scale = torch.where(amax == 0, torch.tensor(1.0), torch.tensor(448.0) / amax)
    scale = torch.where(torch.isinf(scale), torch.tensor(FLT_MAX), scale)
    scale = (scale.view(torch.int32) & 0x7F800000).view(torch.float32)  # positive: sign bit 0
    codes = R.unblocks_last(torch_e4m3((xb * scale).numpy()), 300)
    inv = (1.0 / scale).numpy()[..., 0].view(np.uint32)
    bc = fpsim.encode(x, "e4m3_block128")
    R.assert_hex_equal(bc.scales.view(np.uint32), inv, "scale_inv", width=8)
    R.assert_hex_equal(bc.codes, codes, "codes", inputs=x)
    assert bc.scales[3, 1] == ONE


# --- ABSMAX (sections 3 and 7, linear INT8) ---------------------------------------------------


def test_absmax_fp8_by_hand():
    """torchao AdamWFp8 quantize_fp8 (section 7): s = f32(clip(amax, f32(1e-12)) / 448),
    codes = e4m3(f32(x / s)). amax 1 -> s = f32(1/448) = 0x3B124925, 0.5 / s = 223.99998 ->
    224 (0x76); a zero block -> s = f32(f32(1e-12)/448) = 0x2720D7C5, codes 0; amax 448 ->
    s = 1."""
    x = np.zeros(768, F32)
    x[0], x[1], x[2] = 1.0, 0.5, -0.25
    x[512], x[513] = -448.0, 3.0
    bc = fpsim.encode(x, "fp8_e4m3_block256")
    R.assert_hex_equal(bc.scales.view(np.uint32), [0x3B124925, 0x2720D7C5, ONE], "scales", width=8)
    assert bc.codes[:3].tolist() == [0x7E, 0x76, 0xEE]
    assert bc.codes[512] == 0xFE and bc.codes[513] == 0x44
    assert np.count_nonzero(bc.codes) == 5


def test_absmax_fp8_against_torch():
    """fp8_e4m3_block256 equals torch doing the same ops in float32:
    ``scale = x.abs().amax(-1).clip(1e-12) / 448``, ``(x / scale).to(float8_e4m3fn)``;
    blocks span e**+-20, one is zero and one has amax below the 1e-12 clamp."""
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((40, 256)) * np.exp(rng.uniform(-20, 20, (40, 1)))).astype(F32)
    x[7] = 0
    x[9] *= F32(1e-14) / np.abs(x[9]).max()
    t = torch.from_numpy(x)
    scale = t.abs().amax(-1).clip(1e-12) / torch.finfo(torch.float8_e4m3fn).max
    codes = (t / scale.view(-1, 1)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    bc = fpsim.encode(x.reshape(-1), "fp8_e4m3_block256")
    R.assert_hex_equal(bc.scales.view(np.uint32), scale.numpy().view(np.uint32), "scales", width=8)
    R.assert_hex_equal(bc.codes, codes.reshape(-1), "codes", inputs=x)


def test_absmax_int8_by_hand():
    """Linear symmetric INT8 (int8_block256): s = f32(amax/127), codes RNE(x/s) in
    [-127, 127]. amax 254 -> s = 2: 1, 3, 5, -3, 0.5 -> 0.5, 1.5, 2.5, -1.5, 0.25 -> 0, 2, 2,
    -2, 0; +-254 -> +-127. A zero block has s = 0 and zero codes."""
    x = np.zeros(512, F32)
    x[:7] = [1, 3, 5, -3, 0.5, 254, -254]
    bc = fpsim.encode(x, "int8_block256")
    R.assert_hex_equal(bc.scales.view(np.uint32), [0x40000000, 0], "scales", width=8)
    R.assert_hex_equal(bc.codes[:7], [0x00, 0x02, 0x02, 0xFE, 0x00, 0x7F, 0x81], "codes")
    assert not bc.codes[7:].any()
    assert np.array_equal(fpsim.decode(bc, "int8_block256")[:7], F32([0, 4, 4, -4, 0, 254, -254]))


def test_absmax_int8_against_torch():
    """int8_block256 against torch float32 ops: s = amax / 127, torch.round (half to even)
    of x / s, clamp to +-127; with a ragged tail and a zero block."""
    rng = np.random.default_rng(14)
    x = (rng.standard_normal(256 * 9 + 100) * np.exp(rng.uniform(-20, 20, 256 * 9 + 100))).astype(F32)
    x[256:512] = 0
    xb = torch.from_numpy(R.blocks_flat(x, 256))
    s = xb.abs().amax(-1, keepdim=True) / 127.0
    q = torch.where(s == 0, torch.tensor(0.0), torch.round(xb / s)).clamp(-127, 127).to(torch.int8)
    bc = fpsim.encode(x, "int8_block256")
    R.assert_hex_equal(bc.scales.view(np.uint32), s.numpy()[:, 0].view(np.uint32), "scales", width=8)
    R.assert_hex_equal(bc.codes, q.numpy().view(np.uint8).reshape(-1)[: x.size], "codes", inputs=x)


# --- MX (section 4) ----------------------------------------------------------------------------


def mx_block(values) -> np.ndarray:
    x = np.zeros(32, F32)
    x[: len(values)] = values
    return x


@pytest.mark.parametrize(
    "rule, name, values, scale, codes",
    [
        # floor(log2 1) - 8 = -8 -> 0x77; 1*256 = 256 (0x78), 0.5 -> 128 (0x70), -0.25 -> -64 (0xE8)
        (ScaleRule.MX_FLOOR, "mxfp8_e4m3", [1.0, 0.5, -0.25], 0x77, [0x78, 0x70, 0xE8]),
        # floor keeps -8 for 1.99: 1.99 * 256 = 509.44 > 448 saturates (the spec's clipping)
        (ScaleRule.MX_FLOOR, "mxfp8_e4m3", [1.99, -1.99, 1.0], 0x77, [0x7E, 0xFE, 0x78]),
        # 1.5 -> floor: -8, 1.5*256 = 384 (0x7C)
        (ScaleRule.MX_FLOOR, "mxfp8_e4m3", [1.5], 0x77, [0x7C]),
        # E2M1: floor(log2 7) - 2 = 0 -> 0x7F; 7 -> 6 (0x7), 5 ties to 4 (0x6), -0.25 -> -0 (0x8)
        (ScaleRule.MX_FLOOR, "mxfp4_e2m1", [7.0, 5.0, -0.25], 0x7F, [0x7, 0x6, 0x8]),
        # MXINT8 (emax 0): amax 1 -> 2**0 (0x7F); k/64: 1 -> 64, -1 -> -64, 3/128 -> 1.5 -> 2,
        # 1/128 -> 0.5 -> 0
        (
            ScaleRule.MX_FLOOR,
            "mxint8",
            [1.0, -1.0, 0.5, 3 / 128, 1 / 128],
            0x7F,
            [0x40, 0xC0, 0x20, 0x02, 0x00],
        ),
        # MXINT8 top: 255/128 * 64 = 127.5 -> 128 -> clamps to 127; negative to -127 (symmetric)
        (ScaleRule.MX_FLOOR, "mxint8", [255 / 128, -255 / 128], 0x7F, [0x7F, 0x81]),
        # CEIL: ceil(log2 1.5) - 8 = -7 -> 0x78; 1.5 * 128 = 192 (0x74)
        (ScaleRule.MX_CEIL, "mxfp8_e4m3", [1.5, -1.0], 0x78, [0x74, 0xF0]),
        # CEIL of an exact power of two equals FLOOR
        (ScaleRule.MX_CEIL, "mxfp8_e4m3", [1.0], 0x77, [0x78]),
        # EVEN: 1.9375 = 1.1111b rounds (half up, 3 bits) to 2 -> -7 (0x78); 248 ties to 256 (0x78)
        (ScaleRule.MX_EVEN, "mxfp8_e4m3", [1.9375], 0x78, [0x78]),
        # EVEN: 1.875 = 1.111b is exact -> floor -8; 480 saturates to 448
        (ScaleRule.MX_EVEN, "mxfp8_e4m3", [1.875], 0x77, [0x7E]),
        # EVEN: 1.90625 = 1.11101b -> 1.11111b -> exponent 0 -> -8
        (ScaleRule.MX_EVEN, "mxfp8_e4m3", [1.90625], 0x77, [0x7E]),
        # RCEIL: 448 * f32(1/448) = 1 exactly -> 2**0 (0x7F); 448 -> 0x7E
        (ScaleRule.MX_RCEIL, "mxfp8_e4m3", [448.0], 0x7F, [0x7E]),
        # RCEIL: 449 * f32(1/448) = 1.0022 -> 2**1 (0x80); 224.5 -> 224 (0x76)
        (ScaleRule.MX_RCEIL, "mxfp8_e4m3", [449.0], 0x80, [0x76]),
        # RCEIL: 0.875 * f32(1/448) rounds to exactly 2**-9 -> 0x76; 0.875 * 2**9 = 448
        (ScaleRule.MX_RCEIL, "mxfp8_e4m3", [0.875], 0x76, [0x7E]),
        # RCEIL: 1 * f32(1/448) = 1.14 * 2**-9 -> 2**-8 (0x77)
        (ScaleRule.MX_RCEIL, "mxfp8_e4m3", [1.0], 0x77, [0x78]),
    ],
    ids=[
        "floor-1",
        "floor-clip-1.99",
        "floor-1.5",
        "floor-e2m1-clip",
        "floor-mxint8",
        "floor-mxint8-top",
        "ceil-1.5",
        "ceil-pow2",
        "even-up",
        "even-exact",
        "even-below-half",
        "rceil-448",
        "rceil-449",
        "rceil-0.875",
        "rceil-1",
    ],
)
def test_mx_rules_by_hand(rule, name, values, scale, codes):
    """OCP MX v1.0 6.3 floor rule and torchao's CEIL/EVEN/RCEIL variants (section 4)."""
    bf = with_rule(name, rule)
    x = np.stack([mx_block(values), np.zeros(32, F32)])
    bc = fpsim.encode(x, bf)
    assert bc.scales.shape == (2, 1)
    R.assert_hex_equal(bc.scales[:, 0], [scale, 0x00], "E8M0 scales (second block all zero)")
    R.assert_hex_equal(bc.codes[0, : len(codes)], codes, "codes", inputs=x[0, : len(codes)])
    assert not bc.codes[0, len(codes) :].any() and not bc.codes[1].any()


@pytest.mark.parametrize(
    "rule", [ScaleRule.MX_FLOOR, ScaleRule.MX_CEIL, ScaleRule.MX_EVEN, ScaleRule.MX_RCEIL]
)
def test_mx_special_blocks(rule):
    """Zero block -> exponent clamped at -127 (code 0x00), zero codes; a NaN or inf in a
    block -> scale 0xFF (NaN) and NaN elements (torch.amax propagates NaN, section 4);
    subnormal amax -> 0x00 for the floor family."""
    bf = with_rule("mxfp8_e4m3", rule)
    x = np.zeros((4, 32), F32)
    x[1, :3] = [np.nan, 1.0, 2.0]
    x[2, :2] = [-np.inf, 1.0]
    x[3, :2] = [2.0**-140, -(2.0**-149)]
    bc = fpsim.encode(x, bf)
    assert bc.scales[:, 0].tolist()[:3] == [0x00, 0xFF, 0xFF]
    assert not bc.codes[0].any()
    assert np.all(bc.codes[1:3] & 0x7F == 0x7F), [hex(c) for c in bc.codes[1:3, :4].reshape(-1)]
    # subnormal amax: floor/ceil/even exponents < -127 clamp to 0x00; RCEIL:
    # f32(2**-140 * f32(1/448)) = 2**-149 -> biased exponent 0, mantissa 1 <= 0x400000 -> 0x00.
    # Elements x * 2**127: 2**-13 -> 0, -2**-22 -> -0
    assert bc.scales[3, 0] == 0x00
    R.assert_hex_equal(bc.codes[3, :2], [0x00, 0x80], "subnormal block codes")


# --- NVFP4 (section 5) ------------------------------------------------------------------------


def test_nvfp4_by_hand():
    """TE NVFP4: amax_t = 2688 -> S_enc = 1, S_dec = 1; block amax 2688 -> sdb =
    2688 * f32(1/6) = 448.00001 -> 448 (0x7E); block amax 6 -> 1.0 (0x38). Elements
    x * f32(1/(s8 * S_dec)): 2688/448 = 6 (0x7), 1344 -> 3 (0x5); 6, 3, -1.5 (0xB), 0.25 ties
    to 0, 0.75 ties to 1 (0x2)."""
    x = np.zeros((2, 16), F32)
    x[0, :2] = [2688, 1344]
    x[1, :5] = [6, 3, -1.5, 0.25, 0.75]
    bc = fpsim.encode(x, "nvfp4")
    assert bc.tensor_scale == 1.0
    R.assert_hex_equal(bc.scales, [[0x7E], [0x38]], "block scales")
    R.assert_hex_equal(bc.codes[0, :2], [0x7, 0x5], "block 0 codes")
    R.assert_hex_equal(bc.codes[1, :5], [0x7, 0x5, 0xB, 0x0, 0x2], "block 1 codes")
    assert not bc.codes[0, 2:].any() and not bc.codes[1, 5:].any()


def test_nvfp4_tensor_scale_cases():
    """amax_t = 1: S_enc = 2688, S_dec = f32(1/2688) = 0x39C30C31; block amax 1 -> sdb =
    f32(1 * f32(2688 * f32(1/6))) = 448 -> 0x7E; element 1 * f32(1/f32(448 * S_dec)) = 6.
    amax_t = 0 -> S_enc = 1, zero scales and codes. amax_t = inf -> 2688/inf = 0 -> S_enc 1;
    the inf block's sdb saturates to 448, inf -> 6, finite 1 * f32(1/448) -> 0."""
    bc = fpsim.encode(np.array([[1.0] + [0.0] * 15], F32), "nvfp4")
    assert np.float32(bc.tensor_scale).view(np.uint32) == 0x39C30C31
    assert bc.scales[0, 0] == 0x7E and bc.codes[0, 0] == 0x7
    bc = fpsim.encode(np.zeros((2, 16), F32), "nvfp4")
    assert bc.tensor_scale == 1.0 and not bc.scales.any() and not bc.codes.any()
    x = np.zeros((1, 32), F32)
    x[0, :2] = [np.inf, 1.0]
    x[0, 16] = 3.0
    bc = fpsim.encode(x, "nvfp4")
    assert bc.tensor_scale == 1.0
    R.assert_hex_equal(bc.scales[0], [0x7E, 0x30], "block scales (inf block; amax 3 -> 0.5)")
    R.assert_hex_equal(bc.codes[0, [0, 1, 16]], [0x7, 0x0, 0x7], "codes")


def torch_nvfp4(x: np.ndarray):
    """NVFP4 by torch float32 ops in the newest TE order (section 5): S_enc = min(2688/amax_t,
    FLT_MAX) (1 for amax_t 0 or inf), S_dec = 1/S_enc, s8 = e4m3(amax_b * (S_enc * f32(1/6)))
    by torch's cast, c = min(1/(s8 * S_dec), FLT_MAX) (FLT_MAX when s8 = 0), elements
    RNE-saturating E2M1 of f32(x * c) (ml_dtypes after clamping).

    Returns (codes, s8 codes, S_dec, s8 as float32 blocks, c)."""
    n = x.shape[-1]
    t = torch.from_numpy(R.blocks_last(x, 16))
    amax_b = t.abs().amax(-1, keepdim=True)
    amax_t = t.abs().max()
    s_enc = torch.clamp(torch.tensor(2688.0) / amax_t, max=FLT_MAX)
    if amax_t == 0 or s_enc == 0:
        s_enc = torch.tensor(1.0)
    s_dec = torch.tensor(1.0) / s_enc
    sdb = amax_b * (s_enc * torch.tensor(1 / 6, dtype=torch.float32))
    s8 = torch.clamp(sdb, max=FLT_MAX).to(torch.float8_e4m3fn)
    s8f = s8.to(torch.float32)
    c = torch.where(s8f == 0, torch.tensor(FLT_MAX), torch.clamp(1.0 / (s8f * s_dec), max=FLT_MAX))
    codes = R.unblocks_last(R.cast_sat((t * c).numpy(), "float4_e2m1fn"), n)
    return codes, s8.view(torch.uint8).numpy()[..., 0], s_dec, s8f, c


def check_nvfp4(x: np.ndarray, what: str):
    codes, s8, s_dec, s8f, _ = torch_nvfp4(x)
    bc = fpsim.encode(x, "nvfp4")
    assert F32(bc.tensor_scale).view(np.uint32) == s_dec.numpy().view(np.uint32), what
    R.assert_hex_equal(bc.scales, s8, f"{what}: block scales")
    R.assert_hex_equal(bc.codes, codes, f"{what}: codes", inputs=x)
    # dequant: q * float(s8) * S_dec
    vals = R.blocks_last(bc.codes, 16).astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)
    want = R.unblocks_last((vals * s8f.numpy()) * s_dec.numpy(), x.shape[-1])
    got = fpsim.decode(bc, "nvfp4")
    R.assert_hex_equal(got.view(np.uint32), want.astype(F32).view(np.uint32), f"{what}: decode", width=8)


def test_nvfp4_against_torch():
    """fpsim NVFP4 against the same f32 sequence in torch (``torch_nvfp4``). Blocks span
    e**+-12 so some block scales underflow to E4M3 subnormals and zero."""
    rng = np.random.default_rng(15)
    for trial in range(10):
        x = rng.standard_normal((12, 64)) * np.exp(rng.uniform(-12, 12, (12, 4)).repeat(16, axis=1))
        x = x.astype(F32)
        x[0, 16:32] = 0
        check_nvfp4(x, f"#{trial}")


def ulp_neighbours(a, n: int = 3) -> np.ndarray:
    """float32 values a and their n nearest float32 neighbours on each side, deduplicated."""
    a = np.asarray(a, F32).reshape(-1)
    out, up, dn = [a], a, a
    for _ in range(n):
        up, dn = np.nextafter(up, F32(np.inf)), np.nextafter(dn, F32(-np.inf))
        out += [up, dn]
    return np.unique(np.concatenate(out))


E4M3_POS = np.arange(0x01, 0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
E4M3_MIDS = (E4M3_POS[:-1] + E4M3_POS[1:]) / 2
E2M1_MIDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def pack_blocks(head: np.ndarray, fill: np.ndarray, per_block: int, size: int) -> np.ndarray:
    """Rows of ``size``: each row starts with ``head`` and holds ``per_block`` of ``fill``."""
    rows = []
    for i in range(0, fill.size, per_block):
        r = np.zeros(size, F32)
        r[: head.size] = head
        chunk = fill[i : i + per_block]
        r[head.size : head.size + chunk.size] = chunk
        rows.append(r)
    return np.stack(rows)


@pytest.mark.parametrize("amax_t", [2688.0, 1000.0], ids=["S_enc=1", "S_enc=2.688"])
def test_nvfp4_block_scale_order_at_e4m3_midpoints(amax_t):
    """Block amaxes whose sdb lands within a few ulps of an E4M3 midpoint, where the order of
    the f32 operations decides the block scale: the newest TE order
    ``amax_b * f32(S_enc * f32(1/6))`` and the older ``f32(amax_b / 6) * S_enc`` give
    different E4M3 codes on some of them (checked), and fpsim follows the newest."""
    s_enc = F32(F32(2688) / F32(amax_t))
    amaxes = ulp_neighbours(E4M3_MIDS * 6 / float(s_enc))
    amaxes = amaxes[(amaxes > 0) & (amaxes <= amax_t)]
    x = np.zeros((amaxes.size + 1, 16), F32)
    x[0, 0] = amax_t  # the tensor amax
    x[1:, 0] = amaxes
    x[1:, 1] = -amaxes / 3
    newest = torch_e4m3((amaxes * (s_enc * F32(1 / 6))).astype(F32))
    older = torch_e4m3(((amaxes / F32(6)).astype(F32) * s_enc).astype(F32))
    assert np.count_nonzero(newest != older) > 5, "premise: the two orders must differ somewhere"
    check_nvfp4(x, f"amax_t={amax_t}")


def test_nvfp4_element_multiplier_at_e2m1_midpoints():
    """Elements within a few ulps of E2M1 midpoints after scaling, S_enc = 2688/1000 (not a
    power of two): c = f32(1/f32(s8 * S_dec)) (TE FP32 path) and S_enc / s8 differ in the
    last ulp and round some of these differently (checked); fpsim follows the first."""
    rng = np.random.default_rng(19)
    rows = []
    for s8v in E4M3_POS[rng.choice(np.flatnonzero(E4M3_POS >= 2.0**-6), 12, replace=False)]:
        amax_b = F32(6 * s8v / (2688 / 1000))
        probe = np.zeros((1, 16), F32)
        probe[0, 0] = 1000
        probe = np.concatenate([probe, np.pad([[amax_b]], ((0, 0), (0, 15))).astype(F32)])
        _, _, _, _, c = torch_nvfp4(probe)
        c_b = F32(c[1, 0, 0].item())
        cand = ulp_neighbours(np.concatenate([E2M1_MIDS, -E2M1_MIDS]) / np.float64(c_b))
        cand = cand[np.abs(cand) < amax_b]
        rows.append(pack_blocks(np.array([amax_b], F32), cand, 15, 16))
    x = np.concatenate([np.pad([[1000.0]], ((0, 0), (0, 15))).astype(F32)] + rows)
    codes, s8, s_dec, s8f, c = torch_nvfp4(x)
    s_enc = torch.tensor(2688.0) / torch.tensor(1000.0)
    c_alt = torch.where(s8f == 0, torch.tensor(FLT_MAX), s_enc / s8f)
    alt = R.cast_sat((torch.from_numpy(x[:, None, :]) * c_alt).numpy(), "float4_e2m1fn")
    assert np.count_nonzero(alt.reshape(codes.shape) != codes) > 5, "premise: the multipliers must differ"
    check_nvfp4(x, "e2m1 midpoints")


@pytest.mark.parametrize("name", ["fp8_e4m3_block256", "int8_block256"])
def test_absmax_divides_by_the_scale(name):
    """ABSMAX casts f32(x / s) (torchao quantize_fp8, linear INT8), not x * f32(1/s): points
    within a few ulps of element midpoints times s = f32(1/448) or f32(1/127) (amax 1),
    where the two differ on some (checked). Oracle: torch ``x / scale`` and its cast."""
    bf = get_format(name)
    s = F32(F32(1) / F32(bf.elem_max))
    mids = E4M3_MIDS if name == "fp8_e4m3_block256" else np.arange(127) + 0.5
    cand = ulp_neighbours(np.concatenate([mids, -mids]) * np.float64(s))
    cand = cand[np.abs(cand) < 1]
    x = pack_blocks(np.array([1.0], F32), cand, 255, 256)
    t = torch.from_numpy(x)
    scale = t.abs().amax(-1, keepdim=True).clip(1e-12) / bf.elem_max
    if name == "fp8_e4m3_block256":
        want = (t / scale).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        alt = (t * (1.0 / scale)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    else:
        want = torch.round(t / scale).clamp(-127, 127).to(torch.int8).view(torch.uint8).numpy()
        alt = torch.round(t * (1.0 / scale)).clamp(-127, 127).to(torch.int8).view(torch.uint8).numpy()
    assert np.count_nonzero(want != alt) > 3, "premise: division and multiplication must differ"
    bc = fpsim.encode(x.reshape(-1), bf)
    R.assert_hex_equal(bc.scales.view(np.uint32), scale.numpy()[:, 0].view(np.uint32), "scales", width=8)
    R.assert_hex_equal(bc.codes, want.reshape(-1), f"{name} codes", inputs=x)


# --- default codebook: nearest entry (section 6) ---------------------------------------------


def codebook_bf(signed: bool, bs: int = 256) -> BlockFormat:
    return BlockFormat("t", Codebook.bnb_dynamic(signed), (bs,), ScaleRule.ABSMAX, flatten=True)


def brute_force_codes(x: np.ndarray, table: np.ndarray, bs: int):
    """v = f32(x * f32(1/absmax)) (no clamp: absmax 0 gives inf); index of the nearest entry by
    float64 |c - v| (ties to the lower index; the tests using it avoid midpoints), NaN -> 0."""
    xb = R.blocks_flat(x, bs)
    amax = R.fmax_amax(xb)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = (F32(1) / amax).astype(F32)
        v = (xb * inv).astype(F32)
    q = np.where(np.isnan(v), 0, R.nearest_index(np.nan_to_num(v), table).reshape(xb.shape))
    return R.unblocks_flat(q.astype(np.uint8), x.shape), R.f32_bits(amax[:, 0]), v


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_codebook_nearest_on_random_data(signed):
    """lut_bins=0 is the nearest entry: brute force on N(0,1) blocks, log-spread magnitudes, a
    zero block (absmax 0: 1/absmax is inf, 0 * inf NaN, code 0) and a ragged tail."""
    rng = np.random.default_rng(16)
    x = rng.standard_normal(256 * 200 + 77).astype(F32)
    x[: 256 * 20] *= np.exp(rng.uniform(-15, 15, 256 * 20)).astype(F32)
    x[256 * 30 : 256 * 31] = 0
    x[256 * 31 : 256 * 32] *= F32(1e-35)  # a tiny but normal absmax
    if not signed:
        x = np.abs(x)
    book = Codebook.bnb_dynamic(signed)
    want, scales, _ = brute_force_codes(x, book.table, 256)
    bc = fpsim.encode(x, codebook_bf(signed))
    R.assert_hex_equal(bc.scales.view(np.uint32), scales, "absmax", width=8)
    R.assert_hex_equal(bc.codes, want, "codes", inputs=x)
    assert (bc.codes[256 * 30 : 256 * 31] == 0).all()  # kQuantizeBlockwise: NaN -> entry 0


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_codebook_nearest_specials(signed):
    """Blocks whose absmax element scales to 1 or just below it, with NaN and +-inf elements:
    brute force on the normalized values, and NaN (a NaN element, or a block whose absmax is
    inf, where the inf becomes inf * 0 = NaN) gets entry 0: dQuantize's comparisons with NaN
    are all false, which walks the binary search down to pivot 0."""
    rng = np.random.default_rng(17)
    amax = rng.uniform(1, 2, 4096).astype(F32)
    assert (amax * (F32(1) / amax) < F32(1)).any()  # 1 - ulp: the entry below 1 may be nearer
    x = np.repeat(amax, 4).reshape(-1, 4) * np.array([1, -1, 0.5, -0.25], F32)
    x = x.reshape(-1).astype(F32)
    x[5], x[9], x[17] = np.nan, np.inf, -np.inf
    if not signed:
        x = np.abs(x)
    book = Codebook.bnb_dynamic(signed)
    xb = x.reshape(-1, 4)
    amax = np.fmax.reduce(np.abs(xb), axis=1, initial=0, keepdims=True)  # fmaxf skips NaN (bnb CUDA)
    with np.errstate(invalid="ignore"):
        v = (xb * (F32(1) / amax)).astype(F32).reshape(-1)
    want = np.where(np.isnan(v), 0, R.nearest_index(np.nan_to_num(v), book.table))
    bc = fpsim.encode(x, codebook_bf(signed, bs=4))
    R.assert_hex_equal(bc.codes, want, "codes", inputs=x)
    assert bc.codes[5] == bc.codes[9] == 0  # NaN; inf * f32(1/inf) = NaN


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_codebook_nearest_at_midpoints(signed):
    """The hardest points for the codebook rule: every float32 value at or next to the midpoint
    of two neighbouring entries (a block whose absmax is 1, so v = x).

    bitsandbytes' CUDA kernel (csrc/kernels.cu dQuantize<0>, transcribed step by step in
    oracles.scaling.bnb_dquantize) compares v with the float32-rounded midpoints
    ``f32(f32(c[i] + c[i+1]) * 0.5)`` around the even pivot its binary search ends on: a v
    equal to a midpoint goes to the even entry of the pair (up from an odd entry, down from
    an even one). Where the midpoint is exact that is a tie broken to even; where it rounded,
    the even entry can be the farther one, pinned here to those points.
    """
    book = Codebook.bnb_dynamic(signed)
    c = book.table.astype(np.float64)
    mids = (c[:-1] + c[1:]) / 2
    m32 = mids.astype(F32)  # nearest float32 to the exact midpoint
    pts = np.concatenate(
        [m32, np.nextafter(m32, F32(2)), np.nextafter(m32, F32(-2)), np.nextafter(mids, 2).astype(F32)]
    )
    pts = np.unique(pts[(pts >= c[0]) & (pts <= c[-1])])
    x = np.concatenate([[F32(1)], pts]).astype(F32)
    want = R.bnb_dquantize(x, book.table)
    bc = fpsim.encode(x, codebook_bf(signed, bs=x.size))
    assert bc.scales.view(np.uint32)[0] == ONE
    R.assert_hex_equal(bc.codes, want, f"codes at midpoints ({book.name})", inputs=x)
    f32_mid = ((book.table[:-1] + book.table[1:]) * F32(0.5)).astype(F32)  # float32, as the kernel
    i = np.arange(f32_mid.size)
    at = 1 + np.searchsorted(pts, f32_mid)
    assert np.array_equal(x[at], f32_mid)
    assert np.array_equal(x[at + 1], np.nextafter(f32_mid, F32(2)))
    assert np.array_equal(x[at - 1], np.nextafter(f32_mid, F32(-2)))
    R.assert_hex_equal(bc.codes[at], i + (i & 1), "midpoints: the even entry", inputs=f32_mid)
    R.assert_hex_equal(bc.codes[at + 1], i + 1, "one float32 above: the upper entry")
    R.assert_hex_equal(bc.codes[at - 1], i, "one float32 below: the lower entry")
    d = np.abs(x[:, None].astype(np.float64) - c[None, :])
    got_d, best = d[np.arange(x.size), bc.codes], d.min(axis=1)
    farther = got_d > best
    rounded = f32_mid.astype(np.float64) != mids
    assert set(x[farther].tolist()) <= set(f32_mid[rounded].tolist())
    assert np.count_nonzero(farther) == (55 if signed else 44)
    exact_ties = np.flatnonzero(~rounded)
    assert (bc.codes[at[exact_ties]] % 2 == 0).all() and np.any(exact_ties % 2 == 1)  # some go up


def test_codebook_multiplies_by_the_inverse_absmax():
    """The normalized value is f32(x * f32(1/absmax)) (bitsandbytes' CUDA kernel, and its
    pure-torch full blocks), not x / absmax: with absmax 3, points within a few ulps of
    midpoint * 3 where the two land on different entries (checked) follow the product,
    through the kernel's search (oracles.scaling.bnb_kernel_codes)."""
    book = Codebook.bnb_dynamic(True)
    c = book.table
    exact_mid = (c[:-1].astype(np.float64) + c[1:]) / 2
    cand = ulp_neighbours(exact_mid * 3)
    cand = cand[np.abs(cand) < 3]
    v_mul = (cand * (F32(1) / F32(3))).astype(F32)
    v_div = (cand / F32(3)).astype(F32)
    differ = R.bnb_dquantize(v_mul, c) != R.bnb_dquantize(v_div, c)
    assert np.count_nonzero(differ) > 5, "premise: product and quotient must differ somewhere"
    x = np.concatenate([[F32(3)], cand]).astype(F32)
    want, amax = R.bnb_kernel_codes(x, c)
    bc = fpsim.encode(x, codebook_bf(True, bs=x.size))
    R.assert_hex_equal(bc.scales.view(np.uint32), R.f32_bits(amax), "absmax", width=8)
    R.assert_hex_equal(bc.codes, want, "codes", inputs=x)


TINY_ABSMAX = [3e-39, 5e-39, 9.99e-39, 1.1e-38]  # subnormal, 1/absmax finite (the first three below 1e-38)


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_codebook_tiny_and_zero_absmax_use_the_reciprocal(signed):
    """No clamp of the absmax (bitsandbytes' kernels compute ``1.0f / absmax``;
    only its pure-torch path clamps at 1e-38): blocks of the entries times subnormal absmaxes
    above 2**-128 keep v = x * f32(1/absmax) at the entries (a 1e-38 clamp would scale v by
    absmax * 1e38: 70% too small at 3e-39, 50% at 5e-39); an absmax of at most 2**-128 makes
    1/absmax inf (v = +-inf: the end entries, zeros NaN: entry 0) and an all-zero block gives
    codes 0. Codes and absmaxes against the kernel transcription
    (oracles.scaling.bnb_kernel_codes)."""
    book = Codebook.bnb_dynamic(signed)
    c = book.table
    x = R.bnb_hard_blocks(c, signed)
    xb = x.reshape(-1, 256)
    want, amax = R.bnb_kernel_codes(xb, c)
    bc = fpsim.encode(x, codebook_bf(signed))
    R.assert_hex_equal(bc.scales.view(np.uint32), R.f32_bits(amax[:, 0]), "absmax", width=8)
    R.assert_hex_equal(bc.codes, want.reshape(-1), "codes", inputs=x)
    codes, decoded = bc.codes.reshape(-1, 256), fpsim.decode(bc, codebook_bf(signed)).reshape(-1, 256)
    rows = {float(a): r for r, a in enumerate(amax[:, 0])}
    for a in TINY_ABSMAX:
        r = rows[float(F32(a))]
        assert codes[r, 255] == 255 and decoded[r, 255] == F32(a)  # 1.0 * absmax, not 0.3 .. 1 of it
        big = np.abs(c) >= 0.05  # far above the subnormal spacing of x
        assert np.array_equal(codes[r][big], np.arange(256)[big]), a  # each entry maps to itself
        if a < 6e-39:
            clamped = R.bnb_dquantize((xb[r] * (F32(1) / F32(1e-38))).astype(F32), c)
            assert np.count_nonzero(clamped != codes[r]) > 250, "premise: the 1e-38 clamp differs"
    for a in [2.0**-128, 1e-40, 2.0**-149]:
        r = rows[float(F32(a))]
        xr = xb[r]
        end = np.where(xr > 0, 255, 0)
        R.assert_hex_equal(codes[r], end, f"absmax {a}: +-inf and NaN", inputs=xr)
    r = rows[float(np.nextafter(F32(2.0**-128), F32(1)))]  # the smallest absmax with finite 1/absmax
    assert np.isfinite(F32(1) / amax[r, 0]) and codes[r, 255] == 255
    assert (codes[rows[0.0]] == 0).all()


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_codebook_tiny_absmax_equals_bitsandbytes_cpu(signed):
    """bitsandbytes' CPU kernel (cpu_ops.cpp quantize_cpu_impl) has the CUDA kernel's scale:
    ``1.0f / absmax``, no clamp, codes 0 for absmax 0, and +-inf clamped to the ends. On the
    entries that its 65536-bin table resolves (neighbours more than 8 bins apart, |c| >= 0.01)
    in blocks of absmax 3e-39 .. 1.1e-38, and on blocks of absmax at most 2**-128 and 0,
    fpsim's nearest codes equal bitsandbytes' (the CPU functions have no nearest search of
    their own: it is a table, see Codebook)."""
    F = pytest.importorskip("bitsandbytes.functional")
    book = Codebook.bnb_dynamic(signed)
    c = book.table
    gap = np.minimum(np.diff(c, prepend=-np.inf), np.diff(c, append=np.inf))
    ok = (gap > 8 * 2 / 65535) & (np.abs(c) >= 0.01)
    rows = []
    for a in TINY_ABSMAX + [2.0**-128, 1e-40, 2.0**-149, 0.0]:
        row = (F32(a) * c[ok]).astype(F32)
        row = np.concatenate([row, np.full(256 - row.size, F32(a))])
        rows.append(row if signed else np.abs(row))
    x = np.concatenate(rows)
    q, st = F.quantize_blockwise(torch.from_numpy(x), code=F.create_dynamic_map(signed=signed), blocksize=256)
    bc = fpsim.encode(x, codebook_bf(signed))
    R.assert_hex_equal(bc.scales.view(np.uint32), st.absmax.numpy().view(np.uint32), "absmax", width=8)
    R.assert_hex_equal(bc.codes, q.numpy(), "codes against bitsandbytes' CPU kernel", inputs=x)
    assert np.array_equal(bc.codes[: ok.sum()], np.flatnonzero(ok))  # 3e-39: each entry to itself


def test_codebook_hand_values_and_decode():
    """Entries map to themselves; decode is f32(code value * absmax) (section 6)."""
    book = Codebook.bnb_dynamic(True)
    t = book.table
    x = np.array([2.0, 0.0, -2.0 * t[0], 2.0 * t[128], 2.0 * t[0]], F32)  # absmax 2
    bc = fpsim.encode(x, codebook_bf(True))
    assert bc.scales.view(np.uint32)[0] == 0x40000000
    # -2*t[0] = 1.98593748 is between t[254] and t[255]; nearest by brute force
    hi = R.nearest_index([x[2] / 2], t)[0]
    assert bc.codes.tolist() == [255, 127, hi, 128, 0]
    got = fpsim.decode(bc, codebook_bf(True))
    want = (t[bc.codes] * F32(2)).astype(F32)
    R.assert_hex_equal(got.view(np.uint32), want.view(np.uint32), "decode", width=8)


# --- stochastic rounding in blocks -------------------------------------------------------------


@pytest.mark.parametrize(
    "name, amax, vals",
    [
        # scale 2**-8: x * 256 = 1 + k/128 lies between E4M3 1 and 1.125 at k/16 of the gap
        ("mxfp8_e4m3", 1.0, (1 + np.arange(1, 16) / 128) / 256),
        # s = 254/127 = 2: x / s = 3 + k/16 lies between 3 and 4 at k/16 of the gap
        ("int8_block256", 254.0, 2 * (3 + np.arange(1, 16) / 16)),
    ],
    ids=["mxfp8_e4m3", "int8_block256"],
)
def test_block_stochastic_rounding_is_exactly_unbiased(name, amax, vals):
    """With 4 random bits and values whose position between neighbours is k/16, averaging
    over all 16 random words gives back x exactly (RoundMode.STOCHASTIC: up iff
    floor(f * 16) + R >= 16), for both signs. The scale comes from the block's amax only."""
    bf = get_format(name)
    size = bf.block[0]
    row = np.zeros(size, F32)
    row[0] = amax
    row[1:16] = vals
    row[16:31] = -vals
    assert np.array_equal(row[1:16].astype(np.float64), vals)
    x = np.tile(row, (16, 1))
    bits = np.repeat(np.arange(16, dtype=np.uint32), size).reshape(16, size)
    bc = fpsim.encode(x, bf, rounding="stochastic", random_bits=bits, stochastic_bits=4)
    assert np.all(bc.scales == bc.scales.reshape(-1)[0])  # every row: the same scale
    dec = fpsim.decode(bc, bf).astype(np.float64)
    assert np.array_equal(dec.mean(axis=0), row.astype(np.float64)), (dec.mean(axis=0)[:16], row[:16])
    assert np.all([len(np.unique(dec[:, i])) == 2 for i in range(1, 31)])  # rounded both ways
    again = fpsim.encode(x, bf, rounding="stochastic", random_bits=bits, stochastic_bits=4)
    assert np.array_equal(again.codes, bc.codes)


@pytest.mark.parametrize("name", ["mxfp4_e2m1", "nvfp4", "bnb_dynamic8_block256", "fp8_e4m3_block256"])
def test_block_stochastic_rounding_reproducible(name):
    """Fixed random_bits (or a fixed seed) give the same codes; other bits give others; the
    scales do not depend on the random bits."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((8, 256)).astype(F32)
    bits = rng.integers(0, 2**32, x.shape, dtype=np.uint32)
    a = fpsim.encode(x, name, rounding="stochastic", random_bits=bits)
    b = fpsim.encode(x, name, rounding="stochastic", random_bits=bits.copy())
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    c = fpsim.encode(x, name, rounding="stochastic", random_bits=bits ^ np.uint32(0x80000000))
    assert not np.array_equal(a.codes, c.codes)
    assert np.array_equal(a.scales, c.scales)
    assert np.array_equal(fpsim.encode(x, name).scales, a.scales)
    s1 = fpsim.encode(x, name, rounding="stochastic", rng=5)
    s2 = fpsim.encode(x, name, rounding="stochastic", rng=5)
    assert np.array_equal(s1.codes, s2.codes)


def test_codebook_stochastic_rounding_rule_exact():
    """RoundMode.STOCHASTIC on codebook entries, exactly: with 4 random bits and all 16
    words, v between entries lo < hi at fraction f = (v - lo) / (hi - lo) rounds up for
    exactly floor(16 f) of the words (up iff floor(16 f) + R >= 16); entries never move;
    values below the first entry (-0.99296874) give the first entry."""
    rng = np.random.default_rng(21)
    book = Codebook.bnb_dynamic(True)
    t = book.table.astype(np.float64)
    row = rng.uniform(-1, 1, 256).astype(F32)
    row[0] = 1.0  # absmax 1: v = x
    row[1:6] = book.table[[3, 100, 127, 200, 254]]  # entries
    x = np.tile(row, (16, 1))
    bits = np.repeat(np.arange(16, dtype=np.uint32), 256).reshape(16, 256)
    bc = fpsim.encode(x, codebook_bf(True), rounding="stochastic", random_bits=bits, stochastic_bits=4)
    below = row < t[0]  # in [-1, -0.99296874): saturates to the first entry
    assert below.any()
    assert np.all(bc.codes[:, below] == 0)
    row, codes = row[~below], bc.codes[:, ~below]
    lo = np.clip(np.searchsorted(t, row, side="right") - 1, 0, 254)
    f = (row.astype(np.float64) - t[lo]) / (t[lo + 1] - t[lo])
    ups = (codes == lo + 1).sum(axis=0)
    downs = (codes == lo).sum(axis=0)
    assert np.all(ups + downs == 16)
    assert np.array_equal(ups, np.floor(16 * f).astype(np.int64)), np.flatnonzero(ups != np.floor(16 * f))


def test_codebook_stochastic_rounding_unbiased():
    """Stochastic codebook rounding: the mean of code value over 4096 random words is within
    6 standard errors of v for every element (an entry gap g gives a std <= g/2)."""
    rng = np.random.default_rng(18)
    book = Codebook.bnb_dynamic(True)
    t = book.table.astype(np.float64)
    row = rng.uniform(-1, 1, 256).astype(F32)
    row[0] = 1.0  # absmax 1: v = x
    m = 4096
    x = np.tile(row, (m, 1))
    bits = rng.integers(0, 2**32, x.shape, dtype=np.uint32)
    bc = fpsim.encode(x, codebook_bf(True), rounding="stochastic", random_bits=bits)
    mean = t[bc.codes].mean(axis=0)
    lo = np.clip(np.searchsorted(t, row, side="right") - 1, 0, 254)
    gap = t[lo + 1] - t[lo]
    err = np.abs(mean - row)
    assert np.all(err <= 6 * gap / 2 / np.sqrt(m) + 1e-12), np.max(err / gap)
    assert np.all((t[bc.codes] == t[lo]) | (t[bc.codes] == t[lo + 1]))  # only the two neighbours


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_codebook_bucket_lookup_equals_the_kernel_search_on_every_bucket_edge(signed):
    """The O(1) nearest lookup (top 16 bits of the float32 pick a bucket) against the CUDA
    kernel's binary search (oracles.scaling.bnb_dquantize), on both ends of every bucket
    (+-inf and NaN patterns included, unclipped), every midpoint and its neighbours, and
    random values."""
    from fpsim.emulate.scale_rules import codebook_round
    from fpsim.formats import RoundMode

    c = Codebook.bnb_dynamic(signed).table
    mid = (c[:-1] + c[1:]) / F32(2)
    keys = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    v = np.concatenate(
        [
            keys.view(F32),
            (keys | np.uint32(0xFFFF)).view(F32),
            np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], F32),
            mid,
            np.nextafter(mid, F32(2)),
            np.nextafter(mid, F32(-2)),
            np.random.default_rng(0).uniform(-1, 1, 100_000).astype(F32),
        ]
    ).astype(F32)
    got = codebook_round(v, c, RoundMode.NEAREST_EVEN, None, 32)
    R.assert_hex_equal(got, R.bnb_dquantize(v, c), "bucket lookup", inputs=v)


ONE_AXIS = [k for k, b in fpsim.RECIPES.items() if b.block is not None and len(b.block) == 1 and k != "nvfp4"]


@pytest.mark.parametrize("mode", ["nearest_even", "stochastic"])
@pytest.mark.parametrize("name", ONE_AXIS)
def test_large_tensors_encode_block_by_block(name, mode):
    """Large one-axis-block tensors are encoded in chunks of block rows: codes, scales and
    decoded values equal those of encoding each group of blocks on its own (small inputs,
    one piece, the path the oracle tests check), with NaN, inf, zero blocks and a ragged end."""
    bf = fpsim.RECIPES[name]
    rng = np.random.default_rng(18)
    n = 300_001
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))).astype(F32)
    x[:4096] = 0
    x[5000], x[7000], x[9000] = np.nan, np.inf, -np.inf
    bits = rng.integers(0, 2**32, n, dtype=np.uint32)
    kw = {"rounding": mode, "random_bits": bits} if mode == "stochastic" else {}
    whole = fpsim.encode(x, bf, **kw)
    step = 4096 if bf.block[0] in (-1, 32, 128, 256, 2048) else bf.block[0]
    if bf.block[0] == -1:
        step = n  # one block per row: the 1-D tensor is one block
    codes, scales, values = [], [], []
    for i in range(0, n, step):
        part = fpsim.encode(x[i : i + step], bf, **({**kw, "random_bits": bits[i : i + step]} if kw else {}))
        codes.append(part.codes)
        scales.append(part.scales.reshape(-1))
        values.append(fpsim.decode(part, bf))
    R.assert_hex_equal(whole.codes, np.concatenate(codes), f"{name} codes", inputs=x)
    R.assert_hex_equal(whole.scales.reshape(-1), np.concatenate(scales), f"{name} scales")
    got, want = fpsim.decode(whole, bf), np.concatenate(values)
    both_nan = np.isnan(got) & np.isnan(want)
    R.assert_hex_equal(
        np.where(both_nan, 0, got).view(np.uint32),
        np.where(both_nan, 0, want).view(np.uint32),
        f"{name} values",
        width=8,
    )


ROW_BLOCKED = [k for k, b in fpsim.RECIPES.items() if b.block is not None and not b.flatten and k != "nvfp4"]


@pytest.mark.parametrize("name", ROW_BLOCKED)
def test_large_matrices_encode_row_block_by_row_block(name):
    """2-D tensors go through in chunks of whole block rows: codes, scales and values equal
    those of encoding each group of 128 rows on its own (ragged last rows and columns)."""
    bf = fpsim.RECIPES[name]
    rng = np.random.default_rng(19)
    x = (rng.standard_normal((1030, 300)) * np.exp2(rng.integers(-30, 30, (1030, 300)))).astype(F32)
    x[:128] = 0
    x[200, 7], x[300, 9], x[400, 11] = np.nan, np.inf, -np.inf
    whole = fpsim.encode(x, bf)
    parts = [fpsim.encode(x[i : i + 128], bf) for i in range(0, x.shape[0], 128)]
    R.assert_hex_equal(whole.codes, np.concatenate([p.codes for p in parts]), f"{name} codes", inputs=x)
    R.assert_hex_equal(whole.scales, np.concatenate([p.scales for p in parts]), f"{name} scales")
    got = fpsim.decode(whole, bf)
    want = np.concatenate([fpsim.decode(p, bf) for p in parts])
    both_nan = np.isnan(got) & np.isnan(want)
    R.assert_hex_equal(
        np.where(both_nan, 0, got).view(np.uint32),
        np.where(both_nan, 0, want).view(np.uint32),
        f"{name} values",
        width=8,
    )
