"""Block formats: presets, validation, block geometry, ragged blocks and round trips.

Oracles are the recipe transcriptions in ``oracles.scaling`` (written from the recipes' sources)
with ml_dtypes casts, and tensors built to be exactly representable, whose codes and scales
are known by construction. fpsim's own encode is compared only with itself where the brief
asks for a metamorphic check (a ragged block against the same elements encoded alone).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
from oracles import scalar_table
from oracles import scaling as R

import fpsim
from fpsim import RECIPES, BlockCodes, BlockFormat, Codebook, IntFormat, ScaleRule, get_format

F32 = np.float32
E4M3 = get_format("float8_e4m3fn")
E8M0 = get_format("float8_e8m0fnu")

PRESET_NAMES = [
    "mxfp8_e4m3",
    "mxfp8_e5m2",
    "mxfp6_e2m3",
    "mxfp6_e3m2",
    "mxfp4_e2m1",
    "mxint8",
    "nvfp4",
    "int8_block256",
    "int8_block2048",
    "bnb_dynamic8_block256",
    "bnb_dynamic8_block2048",
]


def spread(rng: np.random.Generator, shape, span: float = 20.0) -> np.ndarray:
    """Normal values times e**U(-span, span) per element, with about 5% exact zeros."""
    x = np.asarray(rng.standard_normal(shape) * np.exp(rng.uniform(-span, span, shape)))
    x[rng.random(shape) < 0.05] = 0
    return x.astype(F32)


# --- presets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_preset_reachable_by_name(name):
    bf = get_format(name)
    assert isinstance(bf, BlockFormat)
    assert bf is RECIPES[name]
    assert bf.name == name and str(bf) == name
    assert get_format(bf) is bf


@pytest.mark.parametrize(
    "name, element, block, rule, scale_format",
    [
        ("mxfp8_e4m3", "float8_e4m3fn", (32,), ScaleRule.MX_FLOOR, "float8_e8m0fnu"),
        ("mxfp8_e5m2", "float8_e5m2", (32,), ScaleRule.MX_FLOOR, "float8_e8m0fnu"),
        ("mxfp6_e2m3", "float6_e2m3fn", (32,), ScaleRule.MX_FLOOR, "float8_e8m0fnu"),
        ("mxfp6_e3m2", "float6_e3m2fn", (32,), ScaleRule.MX_FLOOR, "float8_e8m0fnu"),
        ("mxfp4_e2m1", "float4_e2m1fn", (32,), ScaleRule.MX_FLOOR, "float8_e8m0fnu"),
        ("nvfp4", "float4_e2m1fn", (16,), ScaleRule.NVFP4, "float8_e4m3fn"),
        ("int8_block256", None, (256,), ScaleRule.ABSMAX, "float32"),
        ("bnb_dynamic8_block2048", None, (2048,), ScaleRule.ABSMAX, "float32"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_preset_fields(name, element, block, rule, scale_format):
    """The presets are the recipes of sections 4-7 in ``tests/oracles/scaling.py``."""
    bf = get_format(name)
    if element is not None:
        assert bf.element is get_format(element)
    assert bf.block == block and bf.rule is rule and bf.scale_format.name == scale_format


def test_preset_elements_of_int_and_codebook_recipes():
    """mxint8 elements are k/64 symmetric (section 4, MXINT8); int8_block* are
    -127..127; bnb presets use the signed dynamic map and block the flattened tensor."""
    mxint8 = get_format("mxint8").element
    assert isinstance(mxint8, IntFormat)
    assert (mxint8.bits, mxint8.symmetric, mxint8.fraction_bits) == (8, True, 6)
    assert mxint8.max == 127 / 64 and mxint8.min == -127 / 64
    for name in ("int8_block256", "int8_block2048"):
        el = get_format(name).element
        assert isinstance(el, IntFormat) and el.symmetric and el.fraction_bits == 0
        assert (el.min_int, el.max_int) == (-127, 127)
        assert get_format(name).flatten
    for name in ("bnb_dynamic8_block256", "bnb_dynamic8_block2048"):
        bf = get_format(name)
        assert isinstance(bf.element, Codebook) and bf.flatten and bf.element.lut_bins == 0
        assert bf.element.table.tobytes() == Codebook.bnb_dynamic(True).table.tobytes()


@pytest.mark.parametrize(
    "name, bits",
    [
        ("mxfp8_e4m3", 8.25),
        ("mxfp8_e5m2", 8.25),
        ("mxfp6_e2m3", 6.25),
        ("mxfp6_e3m2", 6.25),
        ("mxfp4_e2m1", 4.25),
        ("mxint8", 8.25),
        ("nvfp4", 4.5),
        ("int8_block256", 8.125),
        ("int8_block2048", 8 + 32 / 2048),
        ("bnb_dynamic8_block256", 8.125),
        ("bnb_dynamic8_block2048", 8 + 32 / 2048),
        ("fp8_e4m3_block256", 8.125),
        ("e4m3_block128", 8.25),
        ("e4m3_tile128", 8 + 32 / 128**2),
        ("e4m3_tensor", 8.0),  # per-tensor scales count as 0
        ("e4m3_row", 8.0),  # block size depends on the shape
    ],
)
def test_bits_per_element(name, bits):
    bf = get_format(name)
    assert bf.bits_per_element == bits
    assert bf.bytes_per_element == bits / 8


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(block=()), r"block entries must be positive or -1, got \(\)"),
        (dict(block=(0,)), r"block entries must be positive or -1, got \(0,\)"),
        (dict(block=(32, -2)), r"block entries must be positive or -1, got \(32, -2\)"),
        (dict(block=(16, 16), flatten=True), r"flatten needs a 1-D block, got \(16, 16\)"),
        (dict(element=Codebook.bnb_dynamic(), rule=ScaleRule.TE), r"codebook elements need ScaleRule.ABSMAX"),
        (dict(rule=ScaleRule.MX_FLOOR), r"MX rules store float8_e8m0fnu scales"),
        (dict(rule=ScaleRule.MX_RCEIL, scale_format=E4M3), r"MX rules store float8_e8m0fnu scales"),
        (dict(rule=ScaleRule.NVFP4, scale_format=E8M0), r"ScaleRule.NVFP4 stores float8_e4m3fn scales"),
        (dict(rule=ScaleRule.TE, scale_format=E8M0), r"te stores float32 scales"),
        (dict(rule=ScaleRule.ABSMAX, scale_format=E4M3), r"absmax stores float32 scales"),
    ],
    ids=[
        "empty-block",
        "zero-block",
        "negative-block",
        "flatten-2d",
        "codebook-te",
        "mx-f32-scale",
        "mx-e4m3-scale",
        "nvfp4-e8m0-scale",
        "te-e8m0-scale",
        "absmax-e4m3-scale",
    ],
)
def test_invalid_blockformat(kwargs, match):
    args = dict(name="bad", element=E4M3, block=(32,), rule=ScaleRule.TE)
    args.update(kwargs)
    with pytest.raises(ValueError, match=r"BlockFormat 'bad': " + match):
        BlockFormat(**args)


@pytest.mark.parametrize(
    "values, lut_bins, match",
    [
        ((0.5,), 0, "need 2..256 strictly increasing values in"),
        (tuple(np.linspace(-1, 1, 257)), 0, "need 2..256 strictly increasing values in"),
        ((0.0, 0.0, 1.0), 0, "need 2..256 strictly increasing values in"),
        ((0.5, -0.5), 0, "need 2..256 strictly increasing values in"),
        ((-1.5, 1.0), 0, "need 2..256 strictly increasing values in"),
        ((-1.0, 0.1, 1.0), 0, "values must be exact in float32"),
        ((-1.0, 1.0), 256, "lut_bins must be 0 or 65536, got 256"),
    ],
    ids=["one", "257", "repeat", "decreasing", "above-1", "not-f32", "lut-bins"],
)
def test_invalid_codebook(values, lut_bins, match):
    with pytest.raises(ValueError, match=r"Codebook 'c': " + match):
        Codebook("c", values, lut_bins)


def test_codebook_properties():
    book = Codebook.bnb_dynamic(True)
    assert book.bits == 8 and book.max == 1.0 and len(book.values) == 256
    assert Codebook("tiny", (-1.0, 0.0, 1.0)).bits == 2


@pytest.mark.parametrize("name", ["e4m3_tile128", "mxfp8_e4m3", "nvfp4", "e4m3_row"])
def test_block_wider_than_tensor_rank(name):
    """A recipe whose blocks span the last k axes cannot take a tensor of rank < k."""
    bf = get_format(name)
    k = len(bf.block)
    shape = (100,) if k == 2 else ()
    msg = re.escape(f"{name}: blocks {bf.block} span the last {k} axes; got a tensor of shape {shape}")
    with pytest.raises(ValueError, match=msg):
        fpsim.encode(np.zeros(shape, F32), bf)


def test_pad_false_rejects_non_dividing_axis():
    bf = dataclasses.replace(get_format("mxfp8_e4m3"), pad=False)
    with pytest.raises(ValueError, match=r"axis 1 has length 100, not a multiple of the block 32.*pad=False"):
        fpsim.encode(np.ones((4, 100), F32), bf)
    tiles = dataclasses.replace(get_format("e4m3_tile128"), pad=False)
    with pytest.raises(ValueError, match=r"axis 0 has length 300, not a multiple of the block 128"):
        fpsim.encode(np.ones((300, 256), F32), tiles)
    flat = dataclasses.replace(get_format("int8_block256"), pad=False)
    with pytest.raises(ValueError, match=r"axis 0 has length 300, not a multiple of the block 256"):
        fpsim.encode(np.ones((3, 100), F32), flat)
    # dividing shapes are fine, and so is decode
    bc = fpsim.encode(np.ones((4, 96), F32), bf)
    assert bc.scales.shape == (4, 3)
    assert np.array_equal(fpsim.decode(bc, bf), np.ones((4, 96), F32))


def test_decode_errors():
    bf = get_format("mxfp8_e4m3")
    x = np.ones((2, 64), F32)
    bc = fpsim.encode(x, bf)
    with pytest.raises(TypeError, match=r"decode with mxfp8_e4m3 needs the BlockCodes that encode returned"):
        fpsim.decode(bc.codes, bf)
    with pytest.raises(ValueError, match=r"scales have shape \(2, 3\), the codes need \(2, 2\)"):
        fpsim.decode(BlockCodes(bc.codes, np.zeros((2, 3), np.uint8)), bf)


def test_element_format_is_not_a_block_format():
    from fpsim.emulate.blocks import encode_blocks

    with pytest.raises(TypeError, match=r"float8_e4m3fn is an element format"):
        encode_blocks(np.ones(4, F32), "float8_e4m3fn")


# --- geometry and oracles ----------------------------------------------------------------------


def te_ref(x: np.ndarray, blocks: np.ndarray, bf: BlockFormat):
    """TE rule on given blocks (sections 2-3): returns (scale_inv bits, codes)."""
    amax = R.fmax_amax(blocks, axis=tuple(range(1, blocks.ndim)))
    scale = R.te_scale(amax, bf.elem_max, bf.pow2, bf.eps)
    return R.f32_bits(F32(1) / scale).reshape(-1), scale.reshape(-1)


def check_te_blocks(x: np.ndarray, bf: BlockFormat, block_slices):
    """fpsim's TE scales and codes equal the TE rule applied to each listed block."""
    bc = fpsim.encode(x, bf)
    want_codes = np.zeros(x.shape, np.uint8)
    want_scales = []
    for sl in block_slices:
        blk = x[sl]
        amax = R.fmax_amax(blk.reshape(1, -1))
        scale = R.te_scale(amax, bf.elem_max, bf.pow2, bf.eps)[0, 0]
        want_scales.append(R.f32_bits(F32(1) / scale))
        want_codes[sl] = R.cast_sat((blk * scale).astype(F32), "float8_e4m3fn")
    R.assert_hex_equal(
        bc.scales.reshape(-1).view(np.uint32), np.array(want_scales), f"{bf.name} scales", width=8
    )
    R.assert_hex_equal(bc.codes, want_codes, f"{bf.name} codes", inputs=x)
    return bc


def test_per_row_scales():
    """block (-1,): one TE scale per row (per token), any leading shape."""
    rng = np.random.default_rng(1)
    bf = get_format("e4m3_row")
    x = spread(rng, (5, 37), 6)
    x[2] = 0  # a zero row: scale 1
    bc = check_te_blocks(x, bf, [np.s_[i : i + 1, :] for i in range(5)])
    assert bc.scales.shape == (5, 1)
    assert bc.scales[2, 0] == 0x3F800000
    x3 = spread(rng, (2, 3, 9), 6)
    bc3 = check_te_blocks(x3, bf, [np.s_[i, j : j + 1, :] for i in range(2) for j in range(3)])
    assert bc3.scales.shape == (2, 3, 1)


def test_per_column_scales():
    """block (-1, 1): one TE scale per column of a matrix."""
    rng = np.random.default_rng(2)
    bf = BlockFormat("e4m3_col", E4M3, (-1, 1), ScaleRule.TE)
    x = spread(rng, (6, 11), 6)
    x[:, 4] = 0
    bc = check_te_blocks(x, bf, [np.s_[:, j : j + 1] for j in range(11)])
    assert bc.scales.shape == (1, 11)
    assert bc.scales[0, 4] == 0x3F800000


def test_tiles_128x128_on_300x260():
    """128x128 tiles (TE Float8BlockScaling weights, pow2 scales): a (300, 260) matrix has a
    3x3 grid whose last row / column of tiles are ragged (44 rows, 4 columns)."""
    rng = np.random.default_rng(3)
    bf = get_format("e4m3_tile128")
    x = spread(rng, (300, 260), 4) * np.exp2(rng.integers(-20, 20, (300, 1))).astype(F32)
    x[128:256, 0:128] = 0  # a zero tile: scale 1
    tiles = [np.s_[i : i + 128, j : j + 128] for i in (0, 128, 256) for j in (0, 128, 256)]
    bc = check_te_blocks(x, bf, tiles)
    assert bc.scales.shape == (3, 3)
    assert bc.scales[1, 0] == 0x3F800000
    s = bc.scales.view(F32)
    assert np.all(np.frexp(s)[0] == 0.5), "pow2 scales must be powers of two"


def test_flatten_blocks_the_flattened_tensor():
    """flatten=True: blocks of 256 run over x.reshape(-1), across rows."""
    rng = np.random.default_rng(4)
    bf = get_format("int8_block256")
    x = spread(rng, (3, 100), 5)
    bc = fpsim.encode(x, bf)
    assert bc.codes.shape == (3, 100) and bc.scales.shape == (2,)
    codes, scales = R.absmax_int8_ref(R.blocks_flat(x, 256))
    R.assert_hex_equal(bc.codes, R.unblocks_flat(codes, x.shape), "int8_block256 codes", inputs=x)
    R.assert_hex_equal(bc.scales.view(np.uint32), scales, "int8_block256 scales", width=8)
    # the first block straddles rows 0-2; the same elements as a 1-D tensor give the same result
    flat = fpsim.encode(x.reshape(-1), bf)
    assert np.array_equal(flat.codes.reshape(3, 100), bc.codes) and np.array_equal(flat.scales, bc.scales)


# reference encoders for 1-D block recipes: x -> (codes, scale codes as uint8/uint32)
def _ref_mx(elem):
    return lambda x: R.mx_floor_ref(x, elem)


def _ref_nvfp4(x):
    codes, s8, _ = R.nvfp4_ref(x)
    return codes, s8


def _ref_block128(x):
    bf = get_format("e4m3_block128")
    xb = R.blocks_last(x, 128)
    scale = R.te_scale(R.fmax_amax(xb), bf.elem_max, pow2=True)
    codes = R.cast_sat((xb * scale).astype(F32), "float8_e4m3fn")
    return R.unblocks_last(codes, x.shape[-1]), R.f32_bits(F32(1) / scale[..., 0])


def _ref_flat(fn, bs):
    def ref(x):
        codes, scales = fn(R.blocks_flat(x, bs))
        return R.unblocks_flat(codes, x.shape), scales

    return ref


def _bnb_nearest(xb):
    q, amax = R.bnb_kernel_codes(xb, Codebook.bnb_dynamic(True).table)  # CUDA kQuantizeBlockwise
    return q, R.f32_bits(amax[..., 0])


ONE_D_REFS = {
    "mxfp8_e4m3": _ref_mx("float8_e4m3fn"),
    "mxfp6_e3m2": _ref_mx("float6_e3m2fn"),
    "mxfp4_e2m1": _ref_mx("float4_e2m1fn"),
    "mxint8": _ref_mx("mxint8"),
    "nvfp4": _ref_nvfp4,
    "e4m3_block128": _ref_block128,
    "int8_block256": _ref_flat(R.absmax_int8_ref, 256),
    "fp8_e4m3_block256": _ref_flat(R.absmax_fp8_ref, 256),
    "bnb_dynamic8_block256": _ref_flat(_bnb_nearest, 256),
}


@pytest.mark.parametrize(
    "shape", [(), (1,), (1023,), (3, 5, 7)], ids=lambda s: "x".join(map(str, s)) or "scalar"
)
@pytest.mark.parametrize("name", list(ONE_D_REFS))
def test_odd_shapes_one_d_blocks(name, shape):
    """1-D block recipes on shapes that do not fill a block: the missing elements act as
    zeros. A 0-d tensor has no last axis: flatten recipes take it as one element, recipes
    blocking the last axis refuse it."""
    bf = get_format(name)
    rng = np.random.default_rng([5, len(shape), sum(shape)])
    x = spread(rng, shape, 20)
    if shape == () and not bf.flatten:
        with pytest.raises(ValueError, match=r"span the last 1 axes; got a tensor of shape \(\)"):
            fpsim.encode(x, bf)
        return
    bc = fpsim.encode(x, bf)
    want_codes, want_scales = ONE_D_REFS[name](x.reshape(shape or (1,)))
    assert bc.codes.shape == shape
    if bf.flatten:
        grid = (math.ceil(max(x.size, 1) / bf.block[0]),)
    else:
        grid = (*shape[:-1], math.ceil(shape[-1] / bf.block[0]))
    assert bc.scales.shape == grid
    R.assert_hex_equal(bc.codes.reshape(-1), want_codes.reshape(-1), f"{name} codes", inputs=x)
    R.assert_hex_equal(bc.scales.reshape(-1), np.asarray(want_scales).reshape(-1), f"{name} scales", width=8)
    assert fpsim.decode(bc, bf).shape == shape


@pytest.mark.parametrize(
    "name, shape, tail",
    [
        ("mxfp8_e4m3", (3, 71), np.s_[:, 64:]),
        ("mxfp4_e2m1", (2, 33), np.s_[:, 32:]),
        ("mxint8", (2, 40), np.s_[:, 32:]),
        ("nvfp4", (2, 37), np.s_[:, 32:]),
        ("e4m3_block128", (3, 300), np.s_[:, 256:]),
        ("e4m3_tile128", (300, 260), np.s_[256:, 256:]),
        ("int8_block256", (549,), np.s_[512:]),
        ("fp8_e4m3_block256", (549,), np.s_[512:]),
        ("bnb_dynamic8_block256", (549,), np.s_[512:]),
        ("bnb_dynamic8_block2048", (4100,), np.s_[4096:]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_ragged_block_scale_uses_its_real_elements(name, shape, tail):
    """The ragged last block's scale is the scale of its real elements alone: encoding the
    tail by itself gives the same scale and codes. (NVFP4: the tensor maximum sits in the tail
    so both encodings share the per-tensor scale.)"""
    bf = get_format(name)
    rng = np.random.default_rng(6)
    x = spread(rng, shape, 3)
    if name == "nvfp4":
        x[tail][0, 0] = 1e4  # x[tail] is a view (basic slice)
    whole = fpsim.encode(x, bf)
    alone = fpsim.encode(np.ascontiguousarray(x[tail]), bf)
    got_codes = whole.codes[tail]
    R.assert_hex_equal(got_codes, alone.codes, f"{name} tail codes", inputs=x[tail])
    if len(shape) == 1:
        got_scales = whole.scales[-1:]
    elif name == "e4m3_tile128":
        got_scales = whole.scales[-1:, -1:]
    else:
        got_scales = whole.scales[:, -1:]
    R.assert_hex_equal(got_scales, alone.scales, f"{name} tail scales", width=8)
    assert whole.tensor_scale == alone.tensor_scale


# --- round trips --------------------------------------------------------------------------------


def block_ids(shape, bf: BlockFormat):
    """Block index of every element (C order over the grid) and the grid shape, computed
    from the BlockFormat's documented geometry."""
    n = math.prod(shape)
    if bf.flatten:
        b = bf.block[0]
        return (np.arange(n) // b).reshape(shape), (math.ceil(n / b),)
    if bf.block is None:
        return np.zeros(shape, np.int64), (1,) * len(shape)
    k = len(bf.block)
    blk = [1] * (len(shape) - k) + [t if b == -1 else b for t, b in zip(shape[-k:], bf.block)]
    grid = tuple(math.ceil(t / b) for t, b in zip(shape, blk))
    idx = np.indices(shape)
    per_axis = [idx[a] // blk[a] for a in range(len(shape))]
    return np.ravel_multi_index(per_axis, grid), grid


def element_table(el):
    """(codes, float64 values) of every non-NaN element code, and the top codes (|value| in the
    element's top binade [2**floor(log2 max), max])."""
    if isinstance(el, Codebook):
        codes = np.arange(len(el.values))
        vals = el.table.astype(np.float64)
    elif isinstance(el, IntFormat):
        k = np.arange(el.min_int, el.max_int + 1)
        codes, vals = k & 0xFF, k * 2.0**-el.fraction_bits
    else:
        vals = scalar_table(el)
        codes = np.flatnonzero(np.isfinite(vals))
        vals = vals[codes]
    top_lo = math.ldexp(0.5, math.frexp(el.max)[1])  # 2**floor(log2 max), from the exponent
    top = codes[(np.abs(vals) >= top_lo) & (np.abs(vals) <= el.max)]
    return codes, vals, top, dict(zip(codes.tolist(), vals.tolist()))


ROUND_TRIP = {
    "mxfp8_e4m3": (6, 96),
    "mxfp8_e5m2": (6, 96),
    "mxfp6_e2m3": (6, 96),
    "mxfp6_e3m2": (6, 96),
    "mxfp4_e2m1": (6, 96),
    "mxint8": (6, 96),
    "nvfp4": (4, 64),
    "int8_block256": (3, 1000),
    "int8_block2048": (3, 1000),
    "fp8_e4m3_block256": (3, 1000),
    "bnb_dynamic8_block256": (3, 1000),
    "bnb_dynamic8_block2048": (3, 1000),
    "bnb_dynamic8u_block256": (3, 1000),
    "e4m3_tensor": (7, 9),
    "e5m2_tensor": (7, 9),
    "e4m3_row": (5, 40),
    "e4m3_block128": (3, 300),
    "e4m3_tile128": (300, 260),
}


@pytest.mark.parametrize("name", list(ROUND_TRIP))
def test_round_trip_of_representable_tensors(name):
    """x = element value x block scale, with each block's maximum in the element's top
    binade (MX: the floor rule recovers the exponent; TE/ABSMAX/bnb: the maximum is the
    element's max, or 1.0 for codebooks, so the scale is the exact power of two used; NVFP4:
    the tensor maximum is 6 * 448 so S_enc = 1 and each block scale is the E4M3 value used).
    encode gives exactly those codes and scales, and decode gives x back bit for bit."""
    bf = get_format(name)
    shape = ROUND_TRIP[name]
    rng = np.random.default_rng([7, len(name)])
    ids, grid = block_ids(shape, bf)
    nblocks = math.prod(grid)
    codes_pool, _, top, value_of = element_table(bf.element)
    if isinstance(bf.element, Codebook):
        top = np.array([len(bf.element.values) - 1])  # the entry 1.0
    elif bf.rule is not ScaleRule.NVFP4 and not bf.rule.is_mx:
        top = codes_pool[np.abs([value_of[c] for c in codes_pool]) == bf.elem_max]  # exactly +-max
    codes = rng.choice(codes_pool, size=shape)
    flat_ids = ids.reshape(-1)
    flat_codes = codes.reshape(-1)
    for b in range(nblocks):
        where = np.flatnonzero(flat_ids == b)
        flat_codes[rng.choice(where)] = rng.choice(top)
    if bf.rule.is_mx:
        exps = rng.integers(-127, 100, nblocks)
        exps[0] = -127
        mult = np.ldexp(1.0, exps)  # 2**exps exactly (np.exp2 rounds with the SIMD dispatch)
        want_scales = (exps + 127).astype(np.uint8)
    elif bf.rule is ScaleRule.NVFP4:
        e4m3_vals = scalar_table(E4M3)
        s8_codes = rng.integers(0x01, 0x7F, nblocks)
        s8_codes[0] = 0x7E  # 448: the tensor amax is 6 * 448 = 2688
        for b in range(nblocks):  # every block holds a +-6
            where = np.flatnonzero(flat_ids == b)
            flat_codes[where[0]] = rng.choice([0x7, 0xF])
        mult = e4m3_vals[s8_codes]
        want_scales = s8_codes.astype(np.uint8)
    else:
        lo = -30 if bf.rule is ScaleRule.ABSMAX and bf.eps else -60
        exps = rng.integers(lo, 60, nblocks)
        mult = np.ldexp(1.0, exps)  # 2**exps exactly (np.exp2 rounds with the SIMD dispatch)
        want_scales = R.f32_bits(mult)
    vals = np.array([value_of[c] for c in flat_codes])
    x64 = vals * mult[flat_ids]
    x = x64.astype(F32).reshape(shape)
    assert np.array_equal(x.astype(np.float64).reshape(-1), x64), "test data not exact in float32"
    bc = fpsim.encode(x, bf)
    assert bc.scales.shape == grid
    R.assert_hex_equal(bc.codes, codes.astype(np.uint8), f"{name} codes", inputs=x)
    R.assert_hex_equal(bc.scales.reshape(-1), want_scales, f"{name} scales", width=8)
    if bf.rule is ScaleRule.NVFP4:
        assert bc.tensor_scale == 1.0
    else:
        assert bc.tensor_scale is None
    back = fpsim.decode(bc, bf)
    assert back.dtype == F32 and back.shape == shape
    R.assert_hex_equal(back.view(np.uint32), x.view(np.uint32), f"{name} decode(encode(x)) bits", width=8)
    assert np.array_equal(fpsim.quantize(x, bf).view(np.uint32), x.view(np.uint32))
