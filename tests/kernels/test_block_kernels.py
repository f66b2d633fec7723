"""Block-quantization kernels (fpsim.kernels.blocks) against fpsim.emulate.blocks.encode_blocks, bit for bit.

Runs in Triton's CPU interpreter (conftest). Inputs hold ragged last blocks, an all-zero
block, blocks with inf and NaN (the NaN patterns of every kind: quiet and signaling, both
signs), float32 subnormals (MX scale exponents clamped at -127) and values over 40 binades.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from oracles import with_nans

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from fpsim.emulate.blocks import encode_blocks as ref_encode  # noqa: E402
from fpsim.formats import (  # noqa: E402
    FORMATS,  # noqa: E402
    RECIPES,
    BlockFormat,
    ScaleRule,
)
from fpsim.kernels import blocks  # noqa: E402


def _inputs(shape: tuple, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))
    x = x.astype(np.float32)
    flat = x.reshape(-1)
    flat[:40] = 0  # an all-zero block (32- and 16-element blocks)
    flat[40:48] = (rng.standard_normal(8) * 2.0**-140).astype(np.float32)  # subnormals
    flat[-3] = np.nan
    flat[-9] = np.inf
    flat[-20] = -np.inf
    return with_nans(x, start=50, spacing=23, rounds=1)  # after the zero block and subnormals


def _check(x: np.ndarray, bf, **kw) -> None:
    got = blocks.encode_blocks(torch.from_numpy(x), bf, **kw)
    kw_ref = dict(kw)
    if "random_bits" in kw_ref:
        kw_ref["random_bits"] = np.asarray(kw_ref["random_bits"])
    want = ref_encode(x, bf, **kw_ref)
    np.testing.assert_array_equal(got.codes.numpy(), want.codes)
    assert got.scales.numpy().dtype == want.scales.dtype
    np.testing.assert_array_equal(got.scales.numpy(), want.scales)
    assert got.tensor_scale == want.tensor_scale


def _shape(bf: BlockFormat) -> tuple:
    if bf.block is not None and len(bf.block) == 2:
        return (130, 135)  # ragged 128x128 tiles
    if bf.block is not None and -1 not in bf.block and bf.block[0] >= 256:
        return (3, 350)
    return (5, 77)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipes_bit_exact(name):
    bf = RECIPES[name]
    _check(_inputs(_shape(bf)), name)


_MX_ELEMENTS = {
    "e4m3": FORMATS["float8_e4m3fn"],
    "e5m2": FORMATS["float8_e5m2"],
    "e2m1": FORMATS["float4_e2m1fn"],
    "e2m3": FORMATS["float6_e2m3fn"],
    "e3m2": FORMATS["float6_e3m2fn"],
    "int8": RECIPES["mxint8"].element,
}


@pytest.mark.parametrize("rule", [r for r in ScaleRule if r.traits.scale_format == "float8_e8m0fnu"])
@pytest.mark.parametrize("elem", sorted(_MX_ELEMENTS))
def test_mx_rules_bit_exact(rule, elem):
    bf = BlockFormat(f"mx_{elem}_{rule.value}", _MX_ELEMENTS[elem], (32,), rule, FORMATS["float8_e8m0fnu"])
    x = _inputs((3, 100), seed=1)
    x[1, :32] = np.float32(448 * 1.0625)  # amax rounding up under EVEN / CEIL / RCEIL
    x[2, 32:64] *= np.float32(2.0**100)  # overflowing exponents: NaN scales
    _check(x, bf)


_PER_TENSOR = [(r, r.amax_ignores_nan) for r in ScaleRule] + [(ScaleRule.ABSMAX, True)]


@pytest.mark.parametrize(("rule", "nan"), _PER_TENSOR, ids=lambda a: getattr(a, "value", str(a)))
def test_per_tensor_scales_span_the_programs(rule, nan, monkeypatch):
    """One scale over more elements than one program holds (16384, here 64 to keep the
    interpreter quick): every program takes the amax of pass 1, which skips or propagates NaN as
    the rule's amax does (a NaN in the first program, the amax in the last)."""
    monkeypatch.setattr(blocks, "_CHUNK", 64)
    sf = FORMATS[rule.traits.scale_format]
    bf = BlockFormat("pt", FORMATS["float8_e4m3fn"], None, rule, sf)
    x = np.random.default_rng(5).standard_normal((2, 70)).astype(np.float32)
    x[1, -1] = 1000  # the amax in the third program's 12 elements
    if nan:
        x[0, 3] = np.nan
    _check(x, bf)


@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_ue8m0_ceil_eps_and_subnormal_quotients(eps):
    """DeepGEMM's 1x128 UE8M0 recipe: the eps clamp, quotients 2**-127 and 1.5 * 2**-127."""
    e4m3, e8m0 = FORMATS["float8_e4m3fn"], FORMATS["float8_e8m0fnu"]
    bf = BlockFormat("dg", e4m3, (128,), ScaleRule.UE8M0_CEIL, e8m0, eps=eps)
    x = _inputs((4, 256), seed=4)
    x[0, :128] *= np.float32(1e-9)
    x[1, :128], x[1, 0] = np.float32(2.0**-121), np.float32(7 * 2.0**-121)
    x[2, :128], x[2, 0] = np.float32(2.0**-122), np.float32(21 * 2.0**-122)
    _check(x, bf)


@pytest.mark.parametrize(
    "name", ["mxfp8_e4m3", "mxint8", "mxfp4_e2m1", "nvfp4", "e4m3_block128", "int8_block256", "e5m2_tensor"]
)
@pytest.mark.parametrize("rounding", ["nearest_away", "toward_zero", "toward_positive", "stochastic"])
def test_roundings_bit_exact(name, rounding):
    x = _inputs((4, 90), seed=2)
    kw = {"rounding": rounding}
    if rounding == "stochastic":
        bits = np.random.default_rng(3).integers(0, 2**32, x.shape, dtype=np.uint32)
        kw["random_bits"] = bits
    _check(x, name, **kw)


def test_rowwise_and_batched_tiles():
    _check(_inputs((2, 3, 40)), "e4m3_row")
    _check(_inputs((2, 130, 20)), "e4m3_tile128")
    _check(_inputs((2, 3, 40)), "mxfp6_e3m2")


def test_tensor_amax_and_eps():
    x = _inputs((7, 33))
    _check(x, "e4m3_tensor", tensor_amax=1000.0)
    _check(x, "nvfp4", tensor_amax=3.0e4)
    bf = dataclasses.replace(RECIPES["e4m3_block128"], name="te_eps", eps=1e-3, pow2=False)
    _check(np.zeros((2, 130), np.float32), bf)
    _check(x * np.float32(1e-6), bf)


def test_trace_tensors():
    from fpsim.trace import open_trace, sample_trace_path

    trace = open_trace(sample_trace_path())
    entries = [e for e in trace.entries(step=trace.steps[-1]) if e.is_float][:2]
    for e in entries:
        a = np.array(trace.read(e), dtype=np.float32)
        a = a.reshape(-1)[:2048] if a.ndim < 2 else a[:40, :300]
        for name in ("mxfp8_e4m3", "nvfp4", "bnb_dynamic8_block256", "e4m3_tensor"):
            _check(np.ascontiguousarray(a), name)


def test_errors():
    x = torch.ones(4)
    with pytest.raises(TypeError, match="element format"):
        blocks.encode_blocks(x, "float8_e4m3fn")
    with pytest.raises(TypeError, match="float32"):
        blocks.encode_blocks(x.double(), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="empty"):
        blocks.encode_blocks(torch.ones(0), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="nearest_even"):
        blocks.encode_blocks(x, "bnb_dynamic8_block256", rounding="toward_zero")
    with pytest.raises(ValueError):
        blocks.encode_blocks(x, "mxfp8_e4m3", rounding="stochastic")
    with pytest.raises(ValueError, match="tile|axes|block"):
        blocks.encode_blocks(x, "e4m3_tile128")


def test_validate_all_block_rows():
    from fpsim.kernels import validate

    report = validate.validate_all(
        "cpu",
        True,
        formats=["mxfp4_e2m1", "bnb_dynamic8_block256", "float8_e4m3fn"],
        kernels=["blocks.encode_blocks"],
        roundings=["nearest_even", "stochastic"],
    )
    rows = {(r["format"], r["rounding"]): r for r in report["cases"]}
    assert ("bnb_dynamic8_block256", "stochastic") not in rows  # codebooks: nearest only
    assert ("mxfp4_e2m1", "stochastic") in rows and len(rows) == 3  # no element formats
    assert report["mismatches"] == 0 and report["errors"] == 0
    assert all(r["compared"] > 0 for r in rows.values())


def test_validate_covers_every_scale_rule():
    """fpsim validate-kernels has a block row for every rule, presets or not (the ones without a
    preset under the first preset of their scale format), and the new rule's row is exact."""
    from fpsim.kernels import validate
    from fpsim.kernels.validate.blocks import recipes

    table = recipes()
    assert {bf.rule for bf in table.values()} == set(ScaleRule) and set(RECIPES) <= set(table)
    report = validate.validate_all(
        "cpu",
        True,
        formats=["mxfp8_e4m3_ue8m0_ceil"],
        kernels=["blocks.encode_blocks"],
        roundings=["nearest_even"],
    )
    assert [r["format"] for r in report["cases"]] == ["mxfp8_e4m3_ue8m0_ceil"]
    assert report["mismatches"] == 0 and report["errors"] == 0 and report["compared"] > 0


@pytest.mark.parametrize(
    "name,rounding",
    [("mxfp8_e4m3", "nearest_even"), ("mxint8", "stochastic"), ("nvfp4", "nearest_even")]
    + [("bnb_dynamic8_block256", "nearest_even"), ("e4m3_tensor", "toward_zero"), ("e4m3_tile128", "odd")]
    + [("int8_block256", "nearest_even")],
)
def test_block_kernel_compiles_for_sm90(name, rounding):
    """Lowered to PTX without a GPU: every division is div.rn.f32 and nothing is fused."""
    import re

    triton = pytest.importorskip("triton")
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend, GPUTarget
        from triton.compiler import ASTSource
    except ImportError:  # pragma: no cover - older triton
        pytest.skip("this triton has no ASTSource/GPUTarget")
    from fpsim.formats import RoundMode
    from fpsim.kernels._codes import Random
    from fpsim.kernels._loader import kernel_module
    from fpsim.kernels.block_args import block_args, tiling

    bf = RECIPES[name]
    mode = RoundMode.parse(rounding)
    fn = kernel_module("_blocks_kernel", interpret=False).block_kernel
    args = block_args(bf, mode, Random.LOADED if mode is RoundMode.STOCHASTIC else Random.NONE)
    scale8 = args.P.SCALE8
    consts = dict(P=args.P, BRP=4 if "tile" in name else 1, BCP=32)  # a smaller tile than a launch's
    types = {"x_ptr": "*i32", "r_ptr": "*i32", "code_ptr": "*u8", "scale_ptr": "*u8" if scale8 else "*i32"}
    types.update(tamax_ptr="*i32", mid_ptr="*fp32")
    names = fn.arg_names
    cidx = {(names.index(k),): v for k, v in consts.items()}
    runtime = dict(grid=tiling(_shape(bf), bf, 1 << 14).grid, fmt=args.fmt, scale=args.scale, s8=args.s8)
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(6)}  # the pointers (torch allocations)
    for arg, value in runtime.items():  # the tuples' fields specialised as a launch does
        ty, keys = native_specialize_impl(BaseBackend, value, False, True, True)
        types[arg] = ty
        for j, (t, key) in enumerate(zip(ty, keys)):
            if t == "constexpr":  # a field equal to 1
                cidx[(names.index(arg), j)] = key
            elif key == "D":  # a field divisible by 16
                attrs[(names.index(arg), j)] = [["tt.divisibility", 16]]
    sig = {n: ("constexpr" if n in consts else types.get(n, "i32")) for n in names}
    try:
        k = triton.compile(
            ASTSource(fn=fn, signature=sig, constexprs=cidx, attrs=attrs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4, "enable_fp_fusion": False},
        )
    except RuntimeError as e:  # pragma: no cover - no ptxas in this triton build
        if "ptxas" in str(e).lower():
            pytest.skip(f"cannot assemble for sm_90 here: {e}")
        raise
    ptx = k.asm["ptx"]
    assert not re.search(r"\bfma(\.[a-z]+)*\.f32\b", ptx)
    assert not re.search(r"\bdiv\.(full|approx)\.f32\b", ptx)
    assert not re.search(r"\brcp\.approx", ptx)


@pytest.mark.parametrize(
    "name", ["mxfp8_e4m3", "nvfp4", "int8_block256", "bnb_dynamic8_block256", "e4m3_tensor"]
)
def test_metrics_tally_kernel(name):
    """Counts and maxima equal fpsim.analysis.metrics' exactly; float sums within
    kernels.metrics.sum_bound."""
    from fpsim.analysis import metrics
    from fpsim.emulate.blocks import decode_blocks
    from fpsim.kernels.metrics import sum_bound, tally

    bf = RECIPES[name]
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 300)) * np.exp2(rng.integers(-30, 30, (3, 300)))).astype(np.float32)
    x.reshape(-1)[:5] = [np.nan, np.inf, -np.inf, 0, 1e-45]
    x = with_nans(x, start=40)
    enc = ref_encode(x, bf)
    q = decode_blocks(enc, bf)
    want = metrics.tally_partial(x.reshape(-1), q.reshape(-1), enc.codes.reshape(-1), bf.element, False)
    got = tally(torch.from_numpy(x), torch.from_numpy(q), enc.codes, bf.element)
    for k in ("elements", "nonzero", "nan_in", "inf_in", "underflow", "subnormal", "overflow", "saturated"):
        assert got[k] == getattr(want, k), k
    for k in ("max_abs_err", "max_rel_err", "max_abs_in"):
        assert got[k] == getattr(want, k), k
    for k in ("sum_sq_err", "sum_sq_signal", "underflow_energy"):
        w, g = getattr(want, k), got[k]
        assert abs(g - w) <= sum_bound(x.size) * w, k


def test_metrics_kernel_compiles_for_sm90():
    """The float64 division lowers to div.rn.f64 and no product is fused into an fma."""
    import re

    triton = pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:  # pragma: no cover - older triton
        pytest.skip("this triton has no ASTSource/GPUTarget")
    from fpsim.kernels._loader import kernel_module

    fn = kernel_module("_metrics_kernel", interpret=False).tally_kernel
    types = {"x_ptr": "*i32", "q_ptr": "*i32", "f_ptr": "*u8", "cnt_ptr": "*i32"}
    types.update(sum_ptr="*fp64", max_ptr="*fp64", n="i32")
    sig = {n: ("constexpr" if n == "BLOCK" else types[n]) for n in fn.arg_names}
    try:
        k = triton.compile(
            ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index("BLOCK"),): 1024}),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4, "enable_fp_fusion": False},
        )
    except RuntimeError as e:  # pragma: no cover - no ptxas in this triton build
        if "ptxas" in str(e).lower():
            pytest.skip(f"cannot assemble for sm_90 here: {e}")
        raise
    ptx = k.asm["ptx"]
    assert "div.rn.f64" in ptx
    assert not re.search(r"\bfma(\.[a-z]+)*\.f64\b", ptx)


@pytest.mark.parametrize("name", ["bnb_dynamic8_block256", "bnb_dynamic8u_block256"])
def test_codebook_ties_and_tiny_absmax(name):
    """The codebook kernel on the hard blocks of the nearest rule (oracles.scaling.
    bnb_hard_blocks: every float32 midpoint and its neighbours, absmaxes from 1.1e-38 down to
    2**-149 and 0, inf and NaN): equal to the numpy tier and to the transcription of
    bitsandbytes' CUDA kernel (ties to the even entry, NaN to entry 0, no absmax clamp)."""
    from oracles import scaling as R

    bf = RECIPES[name]
    x = R.bnb_hard_blocks(bf.element.table, "8u" not in name)
    _check(x, name)
    want, amax = R.bnb_kernel_codes(x.reshape(-1, 256), bf.element.table)
    got = blocks.encode_blocks(torch.from_numpy(x), name)
    np.testing.assert_array_equal(got.codes.numpy(), want.reshape(-1))
    np.testing.assert_array_equal(got.scales.numpy(), amax[:, 0].view(np.uint32))
