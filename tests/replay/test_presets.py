"""The presets named after a library against the installed library (bitsandbytes 0.50.2,
torchao 0.18, on the CPU): each state's quantize/dequantize bit for bit against the library's
own quantizer, which tensors keep FP32 states against the optimizer's own choice, per-tensor
state overrides (bitsandbytes' ``override_config``), and the memory table per tensor."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

import fpsim
from fpsim.formats import Codebook
from fpsim.replay import PRESETS, ReplayConfig, memory_table, replay
from fpsim.replay import fused as _fused
from fpsim.replay.optim import AdamW
from fpsim.replay.qmap import QMAP_RECIPES, QMapBlocks, decode_qmap, encode_qmap
from fpsim.replay.storage import is_quantized, load_state, store_and_load
from fpsim.trace import TraceWriter

F32 = np.float32
BACKENDS = ["numpy", "compiled"]
# element counts around the libraries' rules: 4096, multiples of 128 and 256, 1-D and 2-D
SHAPES = {
    "bias": (100,),
    "odd": (4095,),
    "exact": (4096,),
    "ragged": (4100,),
    "by128": (33, 128),  # 4224: a multiple of 128, not of 256
    "mat": (64, 65),  # 4160: a multiple of neither
    "big": (64, 128),
    "embed.weight": (128, 64),
}


def _torchao():
    pytest.importorskip("torchao.optim")
    import torchao.optim as tao

    return tao


def _eager():
    """torchao's optimizers compile their step with torch.compile; the tests run it eagerly."""
    import torch

    return mock.patch.object(torch, "compile", lambda fn, **kw: fn)


def _state_input(n: int, signed: bool, table: np.ndarray, block: int, seed: int = 0) -> np.ndarray:
    """A state tensor of ``n`` elements (a multiple of ``block``) that tells quantizers apart:
    values over 40 binades, a zero block, NaN and inf blocks, and blocks of amax 1, 0.75 and 3
    holding every midpoint of ``table`` (values relative to the amax) and its float32
    neighbours, times the amax (where half-way rules, and division versus multiplication by a
    reciprocal, differ)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-30, 10, n))).astype(F32)
    if not signed:
        x = np.abs(x)
    x[:block] = 0
    x[block + 3] = np.nan
    x[2 * block + 7] = np.inf
    mid = (table[:-1] + table[1:]) / F32(2)
    mid = mid if signed else mid[mid >= 0]
    ties = np.concatenate([mid, np.nextafter(mid, F32(2)), np.nextafter(mid, F32(-2))])
    start = 3 * block
    for amax in (F32(1), F32(0.75), F32(3)):
        for i in range(0, ties.size, block - 1):  # each block: its amax first, then ties
            part = np.clip(ties[i : i + block - 1] * amax, -amax, amax)
            x[start : start + 1 + part.size] = np.concatenate([[amax], part])
            start += block
    assert start <= n
    return x


def _bits(a: np.ndarray) -> np.ndarray:
    """float32 bits, NaN as one class."""
    a = np.asarray(a, F32)
    return np.where(np.isnan(a), F32(np.nan), a).view(np.uint32)


# --- tables --------------------------------------------------------------------------------


def test_qmap_tables_are_torchao_s():
    """The stored tables equal torchao's qmaps (and the 8-bit ones bitsandbytes' dynamic maps)."""
    _torchao()
    from torchao.optim import subclass_4bit as s4
    from torchao.optim import subclass_8bit as s8

    want = {
        "torchao_dynamic8_block256": s8.get_qmap_signed(),
        "torchao_dynamic8u_block256": s8.get_qmap_unsigned(),
        "torchao_dynamic4_block128": s4.get_qmap_signed(),
        "torchao_linear4u_block128": s4.get_qmap_unsigned(),
    }
    assert set(QMAP_RECIPES) == set(want)
    for name, values in want.items():
        np.testing.assert_array_equal(_bits(QMAP_RECIPES[name].table), _bits(np.array(values, F32)), name)
    assert QMAP_RECIPES["torchao_dynamic8_block256"].values == Codebook.bnb_dynamic(True).values


# --- each preset's states against the library's quantizer -----------------------------------

TORCHAO_STATES = [
    ("torchao-8bit", "exp_avg", "OptimState8bit", True),
    ("torchao-8bit", "exp_avg_sq", "OptimState8bit", False),
    ("torchao-4bit", "exp_avg", "OptimState4bit", True),
    ("torchao-4bit", "exp_avg_sq", "OptimState4bit", False),
    ("torchao-fp8", "exp_avg", "OptimStateFp8", True),
    ("torchao-fp8", "exp_avg_sq", "OptimStateFp8", False),
]


def _torchao_state(cls_name: str, x: np.ndarray, signed: bool, block: int):
    """torchao's subclass tensor holding ``x`` (copy_ quantizes) and its codes (unpacked),
    scales (float32 bits) and dequantized values."""
    import torch

    tao = _torchao()
    module = {"OptimState8bit": tao.subclass_8bit, "OptimState4bit": tao.subclass_4bit}
    cls = getattr(module.get(cls_name, tao.subclass_fp8), cls_name)
    if cls_name == "OptimStateFp8":
        st = cls.zeros(x.shape, block)
    else:
        st = cls.zeros(x.shape, signed, block)
    st.copy_(torch.from_numpy(x))
    if cls_name == "OptimState4bit":
        codes = torch.stack([st.codes >> 4, st.codes & 0b1111], dim=-1).reshape(x.shape)
    else:
        codes = st.codes.view(torch.uint8)
    return codes.numpy(), st.scale.numpy().view(np.uint32), st.dequantize().numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("preset, state, cls_name, signed", TORCHAO_STATES)
def test_torchao_states_equal_torchao_bit_for_bit(preset, state, cls_name, signed, backend):
    """The preset's storage of one state (``store_and_load`` / ``load_state``, as the replay
    stores it) gives torchao's subclass tensor's codes, scales and dequantized values bit for
    bit, on an input with every half-way point of the table, NaN, inf and zero blocks."""
    cfg = PRESETS[preset]
    shape = (64, 256)
    fmt = cfg.state_storage(state, "w", int(np.prod(shape)))
    block = fmt.block_elements
    if isinstance(fmt, QMapBlocks):
        table = fmt.table
    else:  # E4M3: the element values relative to the amax (which is scaled to 448)
        e4m3 = fpsim.decode(np.arange(256, dtype=np.uint8), fmt.element)
        table = np.unique(e4m3[np.isfinite(e4m3)]) / F32(448)
    x = _state_input(int(np.prod(shape)), signed, table, block).reshape(shape)
    want_codes, want_scales, want_values = _torchao_state(cls_name, x, signed, block)
    enc, values = store_and_load(fmt, x, fpsim.Backend.resolve(backend))
    np.testing.assert_array_equal(np.asarray(enc.codes).reshape(shape), want_codes)
    np.testing.assert_array_equal(np.asarray(enc.scales).reshape(-1), want_scales)
    np.testing.assert_array_equal(_bits(values), _bits(want_values))
    np.testing.assert_array_equal(
        _bits(load_state(fmt, enc, fpsim.Backend.resolve(backend))), _bits(want_values)
    )


@pytest.mark.parametrize("signed", [True, False])
def test_fpsim_codebook_rule_is_not_torchao_s(signed):
    """Why torchao's 8-bit states have their own format: bitsandbytes' rule (fpsim's Codebook)
    on the same table and input gives other codes (so the test above can fail)."""
    _torchao()
    name = "bnb_dynamic8_block256" if signed else "bnb_dynamic8u_block256"
    bnb = fpsim.get_format(name)
    x = _state_input(64 * 256, signed, bnb.element.table, 256)
    want, _, _ = _torchao_state("OptimState8bit", x, signed, 256)
    assert np.count_nonzero(fpsim.encode(x, bnb).codes != want) > 100
    assert np.array_equal(encode_qmap(x, QMAP_RECIPES[name.replace("bnb", "torchao")]).codes, want)


@pytest.mark.parametrize("state, signed", [("exp_avg", True), ("exp_avg_sq", False)])
@pytest.mark.parametrize("n", [64 * 256, 64 * 256 + 77])
def test_bnb_cpu_states_equal_bitsandbytes_bit_for_bit(state, signed, n):
    """``bnb-8bit-cpu``'s storage gives bitsandbytes' CPU ``quantize_blockwise`` (the kernel
    Adam8bit runs on the CPU, block 256, its dynamic maps) codes and absmax, and its
    ``dequantize_blockwise`` values, bit for bit (a ragged last block too)."""
    torch = pytest.importorskip("torch")
    F = pytest.importorskip("bitsandbytes.functional")
    cfg = PRESETS["bnb-8bit-cpu"]
    fmt = cfg.state_storage(state, "w", n)
    x = _state_input(n - n % 256, signed, fmt.element.table, 256)
    x = np.concatenate([x, np.linspace(0, 1, n % 256, dtype=F32)])
    x = np.where(np.isfinite(x), x, F32(0.5))  # (bitsandbytes' CPU kernel takes finite input)
    code = F.create_dynamic_map(signed=signed)
    q, qs = F.quantize_blockwise(torch.from_numpy(x), code=code, blocksize=256)
    enc, values = store_and_load(fmt, x, fpsim.Backend.NUMPY)
    np.testing.assert_array_equal(enc.codes, q.numpy())
    np.testing.assert_array_equal(enc.scales.reshape(-1), qs.absmax.numpy().view(np.uint32))
    np.testing.assert_array_equal(_bits(values), _bits(F.dequantize_blockwise(q, qs).numpy()))


def test_fused_step_covers_torchao_formats(tmp_path):
    """The fused compiled step covers torchao's qmap formats (``StateKind.QMAP``), and a
    replay of the torchao presets gives the same bits on the compiled and numpy backends."""
    rng = np.random.default_rng(3)
    fmt = QMAP_RECIPES["torchao_dynamic8_block256"], QMAP_RECIPES["torchao_dynamic8u_block256"]
    p = rng.standard_normal(4096).astype(F32)
    stored = {st: encode_qmap(np.zeros(4096, F32), f) for st, f in zip(("exp_avg", "exp_avg_sq"), fmt)}
    refs = {"exp_avg": p, "exp_avg_sq": p * p}
    formats = dict(zip(stored, fmt))
    assert _fused.plan(AdamW(), formats, stored, p, p, refs, fpsim.Backend.COMPILED) is not None
    trace = _trace(tmp_path / "t", {"w": (64, 128), "v": (4100,)}, steps=3)
    names = ["torchao-8bit", "torchao-4bit", "torchao-fp8"]
    a = replay(trace, names, backend="numpy", progress=False)
    b = replay(trace, names, backend="compiled", progress=False)
    for c in names:
        for t in ("w", "v"):
            np.testing.assert_array_equal(_bits(a.final_params[c][t]), _bits(b.final_params[c][t]))
            for st in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_array_equal(
                    _bits(a.final_states[c][t][st]), _bits(b.final_states[c][t][st])
                )


# --- which tensors keep FP32 states --------------------------------------------------------


def _params():
    import torch

    torch.manual_seed(0)
    return {name: torch.nn.Parameter(torch.randn(shape)) for name, shape in SHAPES.items()}


def _quantized_by_library(opt, params, is_low) -> dict[str, bool]:
    import torch

    for p in params.values():
        p.grad = torch.randn_like(p)
    opt.step()
    return {name: is_low(opt.state[p]) for name, p in params.items()}


def _quantized_by_preset(cfg: ReplayConfig, state: str) -> dict[str, bool]:
    return {n: is_quantized(cfg.state_storage(state, n, int(np.prod(s)))) for n, s in SHAPES.items()}


@pytest.mark.parametrize(
    "preset, cls_name",
    [("torchao-8bit", "AdamW8bit"), ("torchao-4bit", "AdamW4bit"), ("torchao-fp8", "AdamWFp8")],
)
def test_torchao_presets_keep_fp32_where_torchao_does(preset, cls_name):
    """torchao's optimizer on tensors around 4096 elements and its block size: the tensors it
    gives subclass (quantized) states are the ones the preset quantizes, for both moments; the
    generic ``fp8-states`` (every tensor) disagrees on these shapes."""
    import torch

    tao = _torchao()
    params = _params()
    opt = getattr(tao, cls_name)(list(params.values()), lr=1e-3)
    with _eager():
        got = _quantized_by_library(opt, params, lambda s: type(s["exp_avg"]) is not torch.Tensor)
        both = {n: type(opt.state[p]["exp_avg_sq"]) is not torch.Tensor for n, p in params.items()}
    assert got == both
    assert _quantized_by_preset(PRESETS[preset], "exp_avg") == got
    assert _quantized_by_preset(PRESETS[preset], "exp_avg_sq") == got
    assert _quantized_by_preset(PRESETS["fp8-states"], "exp_avg") != got


@pytest.mark.parametrize("preset", ["bnb-8bit", "bnb-8bit-cpu"])
def test_bnb_presets_keep_fp32_where_bitsandbytes_does(preset):
    """bitsandbytes' Adam8bit (min_8bit_size 4096, ragged blocks quantized): its uint8 states
    are the preset's quantized ones; ``bnb-8bit-all`` quantizes the small ones too."""
    import torch

    bnb = pytest.importorskip("bitsandbytes")
    params = _params()
    opt = bnb.optim.Adam8bit(list(params.values()), lr=1e-3)
    got = _quantized_by_library(opt, params, lambda s: s["state1"].dtype == torch.uint8)
    assert got == {n: int(np.prod(s)) >= 4096 for n, s in SHAPES.items()}
    for st in ("exp_avg", "exp_avg_sq"):
        assert _quantized_by_preset(PRESETS[preset], st) == got
    assert _quantized_by_preset(PRESETS["bnb-8bit-all"], "exp_avg") != got


def test_state_overrides_do_what_bnb_override_config_does():
    """``GlobalOptimManager.override_config(p, "optim_bits", 32)`` keeps p's states in FP32;
    the override ``("embed*", "float32")`` does the same for the tensors it names."""
    import torch

    bnb = pytest.importorskip("bitsandbytes")
    params = _params()
    mng = bnb.optim.GlobalOptimManager.get_instance()
    mng.register_parameters(list(params.values()))
    mng.override_config(params["embed.weight"], "optim_bits", 32)
    try:
        opt = bnb.optim.Adam8bit(list(params.values()), lr=1e-3)
        got = _quantized_by_library(opt, params, lambda s: s["state1"].dtype == torch.uint8)
    finally:
        mng.pid2config.clear()
        mng.index2config.clear()
    assert not got["embed.weight"] and got["big"]
    cfg = ReplayConfig(
        "bnb-embed32",
        m=PRESETS["bnb-8bit-cpu"].m,
        v=PRESETS["bnb-8bit-cpu"].v,
        min_quantized_size=4096,
        state_overrides=(("embed*", "float32"),),
    )
    for st in ("exp_avg", "exp_avg_sq"):
        assert _quantized_by_preset(cfg, st) == got


# --- overrides, rules and errors -----------------------------------------------------------


def _trace(path, shapes: dict[str, tuple], steps: int = 4):
    rng = np.random.default_rng(7)
    with TraceWriter(path) as w:
        for s in range(1, steps + 1):
            tensors = {"grad": {n: (rng.standard_normal(sh) * 1e-2).astype(F32) for n, sh in shapes.items()}}
            if s == 1:
                tensors["param"] = {n: rng.standard_normal(sh).astype(F32) for n, sh in shapes.items()}
            w.write_step(s, tensors, lr=1e-3)
    return path


def test_overrides_and_rules_reach_the_replay(tmp_path):
    """In a replay, the tensors whose states a rule or an override keeps in FP32 follow the FP32
    reference bit for bit (states and parameters); the others do not. A per-state override
    changes that state only."""
    shapes = {"embed.weight": (64, 128), "fc.weight": (64, 128), "ragged": (4100,), "bias": (100,)}
    trace = _trace(tmp_path / "t", shapes)
    cfg = ReplayConfig(
        "x",
        m="torchao_dynamic8_block256",
        v="torchao_dynamic8u_block256",
        min_quantized_size=4096,
        quantize_ragged=False,
        state_overrides=(("embed*", "float32"), ("fc.*", "exp_avg_sq", "bfloat16")),
    )
    r = replay(trace, [cfg, "fp8-states"], progress=False)
    ref_p, ref_s = r.final_params["reference"], r.final_states["reference"]
    mine_p, mine_s = r.final_params["x"], r.final_states["x"]
    for name in ("embed.weight", "ragged", "bias"):
        np.testing.assert_array_equal(mine_p[name], ref_p[name], name)
        for st in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(mine_s[name][st], ref_s[name][st], name)
    assert not np.array_equal(mine_p["fc.weight"], ref_p["fc.weight"])
    v = mine_s["fc.weight"]["exp_avg_sq"]
    np.testing.assert_array_equal(v, fpsim.quantize(v, "bfloat16"))  # stored in bfloat16
    assert not np.array_equal(v, ref_s["fc.weight"]["exp_avg_sq"])
    m = mine_s["fc.weight"]["exp_avg"]
    assert np.unique(m).size < 64 * 256  # codes into a 256-entry table, 32 scales
    assert not np.array_equal(r.final_params["fp8-states"]["bias"], ref_p["bias"])


def test_state_storage_rules_and_first_match():
    cfg = ReplayConfig(
        "x",
        m="int8_block256",
        v="torchao_linear4u_block128",
        min_quantized_size=10,
        quantize_ragged=False,
        state_overrides=(("a.*", "exp_avg", "bfloat16"), ("a.*", "float16"), ("*", "mxfp8_e4m3")),
    )
    f32, bf16, f16 = (fpsim.get_format(n) for n in ("float32", "bfloat16", "float16"))
    assert cfg.state_overrides[1] == ("a.*", "*", f16)  # a pair means every state
    assert cfg.state_storage("exp_avg", "a.w", 512) == bf16  # first match wins
    assert cfg.state_storage("exp_avg_sq", "a.w", 512) == f16
    assert cfg.state_storage("exp_avg_sq", "b", 512) == fpsim.get_format("mxfp8_e4m3")
    assert cfg.state_storage("exp_avg_sq", "b", 5) == f32  # below min_quantized_size
    assert cfg.state_format("exp_avg_sq") is QMAP_RECIPES["torchao_linear4u_block128"]
    plain = ReplayConfig("y", m="int8_block256", v="torchao_linear4u_block128", quantize_ragged=False)
    assert plain.state_storage("exp_avg", "w", 300) == f32  # 256 does not divide 300
    assert plain.state_storage("exp_avg", "w", 512) is plain.m
    assert plain.state_storage("exp_avg_sq", "w", 384) is plain.v  # 128 divides 384
    assert plain.state_storage("exp_avg_sq", "w", 300) == f32
    ragged = ReplayConfig("z", m="int8_block256")
    assert ragged.state_storage("exp_avg", "w", 300) is ragged.m
    per_tensor = ReplayConfig("e", m="e4m3_tensor", quantize_ragged=False)
    assert per_tensor.state_storage("exp_avg", "w", 7) is per_tensor.m  # one scale: no ragged block
    shown = repr(cfg)
    assert (
        "v='torchao_linear4u_block128', momentum='float32', min_quantized_size=10, quantize_ragged=False"
        in shown
    )
    assert (
        "state_overrides=(('a.*', 'exp_avg', 'bfloat16'), ('a.*', '*', 'float16'), ('*', '*', 'mxfp8_e4m3'))"
        in shown
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"m": "torchao_dynamic9"},
            r"unknown format 'torchao_dynamic9'.*torchao state formats: torchao_dynamic8",
        ),
        (
            {"state_overrides": (("embed*",),)},
            r"state_overrides takes \(tensor pattern, state pattern, format\)",
        ),
        ({"state_overrides": (("embed*", 3, "float32"),)}, r"state_overrides takes .* got \('embed\*', 3"),
        ({"state_overrides": (("embed*", "bfloat17"),)}, r"unknown format 'bfloat17'"),
        ({"min_quantized_size": -1}, r"min_quantized_size must be an integer >= 0, got -1"),
        ({"quantize_ragged": "no"}, r"quantize_ragged must be True or False, got 'no'"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReplayConfig("bad", **kwargs)


def test_qmap_format_checks_its_table_and_block():
    with pytest.raises(ValueError, match="strictly increasing"):
        QMapBlocks("q", (0.5, 0.25), 8)
    with pytest.raises(ValueError, match="exact in float32"):
        QMapBlocks("q", (0.1, 1.0), 8)
    with pytest.raises(ValueError, match="block must be a positive integer, got 0"):
        QMapBlocks("q", (0.5, 1.0), 0)
    enc = encode_qmap(np.ones(10, F32), QMAP_RECIPES["torchao_linear4u_block128"])
    with pytest.raises(ValueError, match=r"scales have shape \(2,\), the codes need \(1,\)"):
        decode_qmap(type(enc)(enc.codes, np.zeros(2, np.uint32)), QMAP_RECIPES["torchao_linear4u_block128"])


# --- memory --------------------------------------------------------------------------------


def test_memory_table_counts_each_tensor_in_its_storage():
    """Per tensor by hand: torchao-8bit keeps 100 and 4224 (not a multiple of 256) in FP32,
    torchao-4bit quantizes 4224 (a multiple of 128), an override keeps the embedding FP32."""
    sizes = {"embed.weight": 8192, "fc.weight": 4224, "fc.bias": 100, "out.weight": 8192}
    total = sum(sizes.values())
    embed32 = ReplayConfig(
        "embed32", **{k: getattr(PRESETS["torchao-4bit"], k) for k in ("m", "v", "min_quantized_size")},
        quantize_ragged=False, state_overrides=(("embed*", "float32"),),
    )  # fmt: skip
    rows = {
        r["config"]: r
        for r in memory_table([PRESETS["torchao-8bit"], PRESETS["torchao-4bit"], embed32], sizes)
    }
    q8, q4 = 1 + 4 / 256, 0.5 + 4 / 128  # bytes per element of one state, scales included
    assert rows["torchao-8bit"]["states"] + rows["torchao-8bit"]["scales"] == pytest.approx(
        2 * (16384 * q8 + 4324 * 4) / total, rel=1e-12
    )
    assert rows["torchao-4bit"]["states"] + rows["torchao-4bit"]["scales"] == pytest.approx(
        2 * (20608 * q4 + 100 * 4) / total, rel=1e-12
    )
    assert rows["embed32"]["states"] + rows["embed32"]["scales"] == pytest.approx(
        2 * (12416 * q4 + 8292 * 4) / total, rel=1e-12
    )
    assert rows["torchao-4bit"]["total"] == pytest.approx(
        4 + 4 + rows["torchao-4bit"]["states"] + rows["torchao-4bit"]["scales"], rel=1e-12
    )
    assert rows["torchao-4bit"]["scales"] == pytest.approx(2 * 20608 * 4 / 128 / total, rel=1e-12)


def test_generic_presets_quantize_every_tensor():
    """``fp8-states`` and ``int8-states`` are documented as every-tensor configurations."""
    for name in ("fp8-states", "int8-states", "bnb-8bit-all"):
        assert all(_quantized_by_preset(PRESETS[name], "exp_avg").values()), name
