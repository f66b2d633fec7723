"""Block formats against the libraries they emulate: torchao MX and AdamWFp8, bitsandbytes.

Section numbers refer to the list of recipes in ``tests/oracles/scaling.py``. The libraries
are optional: each group skips cleanly (``pytest.importorskip``) when torchao or bitsandbytes is missing.

Known deviations of the installed torchao (0.18, eager path) from the MX rules fpsim
follows are kept out of the random comparisons and pinned one by one in
``test_torchao_mx_deviations_pinned`` (hand-worked values for both sides), so a change in
torchao is noticed:

* FLOOR/CEIL/EVEN clamp the float scale to 2**-126 (FLT_MIN_NORMAL, a torch.compile
  workaround) while storing E8M0 code 0 (2**-127): blocks with code 0 and nonzero data get
  elements of x * 2**126. fpsim uses 2**127, the stored scale (OCP MX 6.3).
* FLOOR/CEIL/EVEN map only NaN amaxes to 0xFF: an inf amax gives code 255 - emax_elem
  (247 for E4M3), and a NaN block's finite elements become 0 (divided by the float of
  0xFF << 23 = inf). fpsim: any non-finite amax gives 0xFF and NaN elements (section 4).
* RCEIL computes ``ceil(log2(amax / max))`` with float32 torch.log2, which rounds to an
  integer just above a power of two and then does not round the scale up; fpsim uses the
  bit rule of TE / cuBLAS ``cvt.rp`` (round up iff the mantissa is nonzero). RCEIL also
  multiplies the data of code-0 blocks by 1.0 (TE's exp2f_rcp quirk) and maps an inf amax
  to 0xFE; fpsim uses 2**127 and 0xFF.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from oracles import scaling as R

import fpsim
from fpsim import BlockFormat, Codebook, ScaleRule, get_format

pytestmark = pytest.mark.dispatch  # .ci/run reruns these with the SIMD dispatch masked

torch = pytest.importorskip("torch")

F32 = np.float32


def lazy_torchao_mx():
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    cfg = pytest.importorskip("torchao.prototype.mx_formats.config")
    return mx.to_mx, cfg.ScaleCalculationMode


def lazy_bnb():
    return pytest.importorskip("bitsandbytes.functional")


# --- torchao MX (section 4) ----------------------------------------------------------------

MX_RULES = {
    "floor": ScaleRule.MX_FLOOR,
    "ceil": ScaleRule.MX_CEIL,
    "even": ScaleRule.MX_EVEN,
    "rceil": ScaleRule.MX_RCEIL,
}
MX_ELEMENTS = {  # preset -> torchao element dtype (torch dtypes resolved lazily)
    "mxfp8_e4m3": "float8_e4m3fn",
    "mxfp8_e5m2": "float8_e5m2",
    "mxfp4_e2m1": "float4_e2m1fn_x2",
    "mxfp6_e2m3": "fp6_e2m3",
    "mxfp6_e3m2": "fp6_e3m2",
}
EMAX = {"mxfp8_e4m3": 8, "mxfp8_e5m2": 15, "mxfp4_e2m1": 2, "mxfp6_e2m3": 2, "mxfp6_e3m2": 4}


def torchao_mx(x: np.ndarray, preset: str, rule: str):
    """torchao ``to_mx`` scales (uint8 E8M0) and element codes (one per element)."""
    to_mx, mode = lazy_torchao_mx()
    el = MX_ELEMENTS[preset]
    elem = getattr(torch, el) if el.startswith("float") else el
    scales, data = to_mx(torch.from_numpy(x), elem, 32, scaling_mode=getattr(mode, rule.upper()))
    s = scales.view(torch.uint8).numpy()
    d = data.view(torch.uint8).numpy()
    if el == "float4_e2m1fn_x2":  # two per byte, the even element in the low nibble
        d = np.stack([d & 0xF, d >> 4], axis=-1).reshape(x.shape)
    return s, d


def mx_data(preset: str, seed: int) -> np.ndarray:
    """(96, 256) float32: blocks of 32 with magnitudes e**U(-20, 20), plus zero blocks,
    blocks mixing tiny and float32-subnormal elements with a normal maximum, elements spread
    over e**+-20 inside one block, exact powers of two and exact element-max multiples as
    block maxima (where FLOOR/CEIL/RCEIL differ), the smallest amax whose scale code is 1,
    and maxima near FLT_MAX. Every block's scale code is >= 1 or the block is zero (see the
    module doc)."""
    rng = np.random.default_rng([seed, len(preset)])
    emax = EMAX[preset]
    x = rng.standard_normal((96, 8, 32)) * np.exp(rng.uniform(-20, 20, (96, 8, 1)))
    x[0] = 0
    x[1, :, :] *= np.exp(rng.uniform(-20, 20, (8, 32)))  # e**+-40 inside a block
    x[2, :, 1:] = rng.standard_normal((8, 31)) * 1e-40  # float32 subnormals
    x[2, :, 0] = rng.uniform(1, 2, 8)
    x[3, :, 1:] = rng.standard_normal((8, 31)) * 1e-30
    x[3, :, 0] = 1e-25
    for j in range(8):
        x[4, j, 0] = 2.0 ** rng.integers(-60, 60)  # power-of-two amax
        x[5, j, 0] = R.ELEMENTS[get_format(preset).element.name][1] * 2.0 ** rng.integers(-60, 60)
        x[5, j, 1:] = np.abs(x[5, j, 1:]).clip(max=np.abs(x[5, j, 0])) * np.sign(x[5, j, 1:])
    x[4, :, 1:] = np.clip(x[4, :, 1:], -np.abs(x[4, :, :1]), np.abs(x[4, :, :1]))
    x[6] = rng.uniform(-1, 1, (8, 32)) * 2.0 ** (emax - 126)
    x[6, :, 0] = 2.0 ** (emax - 126)  # floor(log2 amax) - emax = -126: code 1
    x[7] = rng.uniform(-1, 1, (8, 32)) * 3.4e38
    x[7, :, 0] = 3.4028235e38
    return x.reshape(96, 256).astype(F32)


@pytest.mark.parametrize("preset", list(MX_ELEMENTS))
@pytest.mark.parametrize("rule", list(MX_RULES))
def test_mx_against_torchao(rule, preset):
    """fpsim MX (rule x element) equals torchao ``to_mx``: E8M0 scale codes and element codes."""
    x = mx_data(preset, seed=1)
    want_s, want_d = torchao_mx(x, preset, rule)
    bf = dataclasses.replace(get_format(preset), rule=MX_RULES[rule])
    bc = fpsim.encode(x, bf)
    assert np.all((bc.scales >= 1) | (np.abs(x).reshape(96, 8, 32).max(-1) == 0))  # data premise
    R.assert_hex_equal(bc.scales, want_s, f"{preset}/{rule} scales")
    R.assert_hex_equal(bc.codes, want_d, f"{preset}/{rule} element codes", inputs=x)


@pytest.mark.parametrize("preset", ["mxfp8_e4m3", "mxfp4_e2m1"])
def test_mx_ragged_against_torchao_padded(preset):
    """A ragged last block (100 columns) equals torchao on the tensor zero-padded to 128."""
    x = mx_data(preset, seed=2)[:, :100].copy()
    xp = np.pad(x, [(0, 0), (0, 28)])
    want_s, want_d = torchao_mx(xp, preset, "floor")
    bc = fpsim.encode(x, preset)
    R.assert_hex_equal(bc.scales, want_s, f"{preset} ragged scales")
    R.assert_hex_equal(bc.codes, want_d[:, :100], f"{preset} ragged codes", inputs=x)


def _e4m3_block(values):
    x = np.zeros(32, F32)
    x[: len(values)] = values
    return x


# rule, block values, (torchao scale, torchao first codes), (fpsim scale, fpsim first codes)
TORCHAO_PINS = {
    # amax 2**-120: floor -128 -> code 0 (2**-127); torchao multiplies by 2**126: 2**6 (0x68),
    # 1.5 (0x3C); fpsim by 2**127: 2**7 (0x70), 3 (0x44)
    "floor-code0-data": ("floor", [2.0**-120, 1.5 * 2.0**-126], (0x00, [0x68, 0x3C]), (0x00, [0x70, 0x44])),
    "ceil-code0-data": ("ceil", [2.0**-120, 1.5 * 2.0**-126], (0x00, [0x68, 0x3C]), (0x00, [0x70, 0x44])),
    # inf amax: torchao exponent field 255 -> 128 - 8 = 120 -> 247; inf/2**120 -> 448, 1 -> 0.
    # fpsim: 0xFF, NaN elements
    "floor-inf": ("floor", [np.inf, 1.0], (247, [0x7E, 0x00]), (0xFF, [0x7F, 0x7F])),
    # NaN amax: both 0xFF; torchao divides by inf (0xFF << 23): 1 -> 0; fpsim: NaN elements
    "floor-nan": ("floor", [np.nan, 1.0], (0xFF, [0x7F, 0x00]), (0xFF, [0x7F, 0x7F])),
    # amax = 0x1.c00002p+24: amax * f32(1/448) = 0x1.000002p+16, mantissa != 0 -> 2**17 (144),
    # 0x1.c00002p+24 / 2**17 = 224.00002 -> 224 (0x76); torchao: log2 rounds to 16 -> 143,
    # 448.0001 saturates (0x7E)
    "rceil-above-pow2": (
        "rceil",
        [float.fromhex("0x1.c00002p+24"), 3.0],
        (143, [0x7E, 0x00]),
        (144, [0x76, 0x00]),
    ),
    # amax 2**-120: descale 2**-128.8 -> code 0; torchao data * 1.0 -> 0; fpsim * 2**127
    "rceil-code0-data": ("rceil", [2.0**-120, 1.5 * 2.0**-126], (0x00, [0x00, 0x00]), (0x00, [0x70, 0x44])),
    # inf amax: torchao 0xFE (satfinite) with data * 2**-127; fpsim 0xFF, NaN elements
    "rceil-inf": ("rceil", [np.inf, 1.0], (0xFE, [0x7E, 0x00]), (0xFF, [0x7F, 0x7F])),
}


@pytest.mark.parametrize("case", list(TORCHAO_PINS))
def test_torchao_mx_deviations_pinned(case):
    """torchao 0.18's known deviations (module doc), hand-worked for both sides (E4M3)."""
    rule, values, (ao_s, ao_c), (fp_s, fp_c) = TORCHAO_PINS[case]
    x = np.stack([_e4m3_block(values), np.ones(32, F32)])
    s, d = torchao_mx(x, "mxfp8_e4m3", rule)
    bc = fpsim.encode(x, dataclasses.replace(get_format("mxfp8_e4m3"), rule=MX_RULES[rule]))
    n = len(ao_c)
    R.assert_hex_equal(s[0], [ao_s], f"{case}: torchao scale (pinned)")
    R.assert_hex_equal(d[0, :n], ao_c, f"{case}: torchao codes (pinned)")
    R.assert_hex_equal(bc.scales[0], [fp_s], f"{case}: fpsim scale")
    R.assert_hex_equal(bc.codes[0, :n], fp_c, f"{case}: fpsim codes")
    # the second block (all ones) is ordinary: both agree
    R.assert_hex_equal(bc.scales[1], s[1], f"{case}: ordinary block scale")
    R.assert_hex_equal(bc.codes[1], d[1], f"{case}: ordinary block codes")


# --- torchao AdamWFp8 (section 7) ----------------------------------------------------------------


def test_adamw_fp8_quantize_against_torchao():
    """torchao.optim.subclass_fp8.quantize_fp8(x, 256) equals the fp8_e4m3_block256 preset:
    codes and float32 scales, with a zero block, a block below the 1e-12 clamp and blocks
    from e**-20 to 1e38."""
    sub = pytest.importorskip("torchao.optim.subclass_fp8")
    quantize_fp8 = getattr(sub, "quantize_fp8", None)
    if quantize_fp8 is None:
        pytest.skip("torchao.optim.subclass_fp8 has no quantize_fp8")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 256)) * np.exp(rng.uniform(-20, 20, (64, 1)))
    x[5] = 0
    x[6] *= 1e-14 / np.abs(x[6]).max()
    x[7] *= 1e38 / np.abs(x[7]).max()
    x[8, 1:] *= 1e-30
    x = x.astype(F32)
    codes, scale = quantize_fp8(torch.from_numpy(x.copy()), 256)
    bc = fpsim.encode(x.reshape(-1), "fp8_e4m3_block256")
    R.assert_hex_equal(bc.scales.view(np.uint32), scale.numpy().view(np.uint32), "AdamWFp8 scales", width=8)
    R.assert_hex_equal(bc.codes, codes.view(torch.uint8).numpy().reshape(-1), "AdamWFp8 codes", inputs=x)


# --- bitsandbytes (section 6) ----------------------------------------------------------------


def bnb_bf(signed: bool, bs: int, lut_bins: int = 65536) -> BlockFormat:
    book = Codebook.bnb_dynamic(signed, lut_bins=lut_bins)
    return BlockFormat("t", book, (bs,), ScaleRule.ABSMAX, flatten=True)


def bnb_data(signed: bool, bs: int, seed: int) -> np.ndarray:
    """Three full blocks and a ragged tail of 37: N(0,1), a zero block, a block with
    magnitudes spread over e**+-15 and exact zeros, a tiny (1e-6) block; |x| for the
    unsigned map (Adam's second moment)."""
    rng = np.random.default_rng([seed, bs, signed])
    x = rng.standard_normal(4 * bs + 37)
    x[bs : 2 * bs] = 0
    x[2 * bs : 3 * bs] *= np.exp(rng.uniform(-15, 15, bs))
    x[2 * bs : 2 * bs + 10] = 0
    x[3 * bs : 4 * bs] *= 1e-6
    x = x.astype(F32)
    return x if signed else np.abs(x)


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_bnb_dynamic_map_tables(signed):
    """Codebook.bnb_dynamic(signed).table equals create_dynamic_map(signed) bit for bit."""
    F = lazy_bnb()
    want = F.create_dynamic_map(signed=signed).numpy().astype(F32)
    got = Codebook.bnb_dynamic(signed).table
    R.assert_hex_equal(got.view(np.uint32), want.view(np.uint32), f"dynamic map signed={signed}", width=8)


@pytest.mark.parametrize("bs", [64, 256, 2048, 4096])
@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_bnb_quantize_blockwise(signed, bs):
    """Codebook(lut_bins=65536) equals bitsandbytes' CPU quantize_blockwise (codes and absmax)
    and dequantize_blockwise equals fpsim.decode bit for bit."""
    F = lazy_bnb()
    x = bnb_data(signed, bs, seed=4)
    code = F.create_dynamic_map(signed=signed)
    q, st = F.quantize_blockwise(torch.from_numpy(x), code=code, blocksize=bs)
    bf = bnb_bf(signed, bs)
    bc = fpsim.encode(x, bf)
    assert bc.scales.shape == (5,)
    R.assert_hex_equal(bc.scales.view(np.uint32), st.absmax.numpy().view(np.uint32), "absmax", width=8)
    R.assert_hex_equal(bc.codes, q.numpy(), f"codes (bs={bs}, signed={signed})", inputs=x)
    deq = F.dequantize_blockwise(q, st).numpy()
    R.assert_hex_equal(fpsim.decode(bc, bf).view(np.uint32), deq.view(np.uint32), "dequantize", width=8)


def lut_emulation(x: np.ndarray, table: np.ndarray, bs: int) -> np.ndarray:
    """bitsandbytes 0.50.2 CPU kernel, transcribed from section 6 steps 1-5: inv =
    f32(1/absmax); v = clamp(f32(x * inv), -1, 1); k = trunc(f32(fma(f32((v + 1) * 0.5),
    65535, 0.5))) & 0xFFFF (NaN -> 0); LUT[i] = #{j: mid_j < f32(f32(2i) / 65535) - 1},
    mid_j = f32(f32(c_j + c_j+1) * 0.5); zero blocks -> 0."""
    xb = R.blocks_flat(x, bs)
    amax = np.fmax.reduce(np.abs(xb), axis=1, initial=0, keepdims=True).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.clip((xb * (F32(1) / amax)).astype(F32), F32(-1), F32(1))
    a = ((v + F32(1)) * F32(0.5)).astype(F32)
    k = (a.astype(np.float64) * 65535 + 0.5).astype(F32)  # exact in float64: one rounding (FMA)
    k = np.where(np.isnan(k), 0, np.trunc(k)).astype(np.int64) & 0xFFFF
    i = np.arange(65536, dtype=F32)
    grid = ((i + i) / F32(65535)).astype(F32) - F32(1)
    mid = ((table[:-1] + table[1:]) * F32(0.5)).astype(F32)
    lut = (mid[None, :] < grid[:, None]).sum(axis=1)
    q = np.where(amax == 0, 0, lut[k])
    return R.unblocks_flat(q.astype(np.uint8), x.shape)


def test_bnb_cpu_lut_versus_exact_nearest(record_property):
    """On N(0,1) data (block 256, signed map) bitsandbytes' CPU kernel misses the exact nearest
    entry for a small fraction of elements (about 0.15%, see ``Codebook`` in
    fpsim/formats/block.py). Every code it returns, misses included, is predicted by the LUT
    rule (section 6), and outside the misses it is the exact nearest entry."""
    F = lazy_bnb()
    rng = np.random.default_rng(5)
    x = rng.standard_normal(256 * 1000).astype(F32)
    table = Codebook.bnb_dynamic(True).table
    q, _ = F.quantize_blockwise(torch.from_numpy(x), code=F.create_dynamic_map(signed=True), blocksize=256)
    q = q.numpy()
    predicted = lut_emulation(x, table, 256)
    R.assert_hex_equal(q, predicted, "bnb CPU codes vs the LUT rule", inputs=x)
    xb = R.blocks_flat(x, 256)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    v = np.clip((xb * (F32(1) / amax)).astype(F32), F32(-1), F32(1))
    nearest = R.nearest_index(v, table)
    miss = q != nearest
    rate = miss.mean()
    jumps = np.abs(q.astype(np.int64) - nearest)[miss]
    record_property("bnb_cpu_lut_miss_rate", float(rate))
    print(
        f"\nbnb CPU LUT vs exact nearest: {miss.sum()} of {x.size} ({rate:.3%}), max jump {jumps.max()} codes"
    )
    assert 0 < rate < 0.005, rate
    # a v exactly on a float32 midpoint is a tie: the CUDA rule (lut_bins=0) takes the even entry
    tie = np.isin(v.reshape(-1), ((table[:-1] + table[1:]) * F32(0.5)).astype(F32))
    same = ~miss & ~tie
    assert np.array_equal(q[same], fpsim.encode(x, bnb_bf(True, 256, lut_bins=0)).codes[same]), (
        "outside the LUT misses and the midpoints the default (nearest) codebook equals bnb"
    )
    assert np.array_equal(fpsim.encode(x, bnb_bf(True, 256)).codes, q)


def test_bnb_cpu_lut_bin_edges():
    """Normalized values within a few ulps of the LUT bin edges where the code changes
    (a = (v + 1) / 2 near (n - 0.5) / 65535, section 6, the CPU kernel's grid): bitsandbytes' CPU codes
    follow the LUT rule there, and Codebook(lut_bins=65536) equals bitsandbytes."""
    F = lazy_bnb()
    table = Codebook.bnb_dynamic(True).table
    i = np.arange(65536, dtype=F32)
    grid = ((i + i) / F32(65535)).astype(F32) - F32(1)
    mid = ((table[:-1] + table[1:]) * F32(0.5)).astype(F32)
    lut = (mid[None, :] < grid[:, None]).sum(axis=1)
    edges = np.flatnonzero(np.diff(lut)) + 1  # bins n where the code changes
    a = ((edges - 0.5) / 65535).astype(F32)
    cand = []
    for k in range(-4, 5):
        ak = a.copy()
        for _ in range(abs(k)):
            ak = np.nextafter(ak, F32(np.inf) if k > 0 else F32(-np.inf))
        cand.append((ak * F32(2) - F32(1)).astype(F32))
    v = np.unique(np.concatenate(cand))
    v = v[(v > -1) & (v < 1)]
    bs = 256
    x = np.concatenate([[F32(1)], v]).astype(F32)
    x = np.pad(x, (0, (-x.size) % bs))
    x[::bs] = 1.0  # every block has absmax 1, so v = x
    predicted = lut_emulation(x, table, bs)
    assert np.unique(predicted).size > 200  # the edges of almost every code
    q, st = F.quantize_blockwise(torch.from_numpy(x), code=F.create_dynamic_map(signed=True), blocksize=bs)
    R.assert_hex_equal(q.numpy(), predicted, "bnb vs the LUT rule", inputs=x)
    bc = fpsim.encode(x, bnb_bf(True, bs))
    R.assert_hex_equal(bc.codes, q.numpy(), "fpsim vs bnb at LUT bin edges", inputs=x)
