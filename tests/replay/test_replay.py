"""Replay: loss scaling against torch's GradScaler, 8-bit Adam against bitsandbytes, metrics and
memory by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from oracles import with_nans

from fpsim.replay import PRESETS, LossScaler, ReplayConfig, memory_table, replay
from fpsim.replay.config import DEFAULT_CONFIGS, resolve_configs
from fpsim.replay.engine import select_steps
from fpsim.replay.optim import Adam, AdamW
from fpsim.trace import TraceWriter, open_trace


def write_trace(path, grads, p0, lr=1e-3, name="w"):
    with TraceWriter(path) as w:
        for s, g in enumerate(grads, 1):
            tensors = {"grad": {name: g}}
            if s == 1:
                tensors["param"] = {name: p0}
            w.write_step(s, tensors, lr=lr)
    return path


def test_loss_scaler_trajectory_equals_torch_gradscaler():
    """Overflow pattern fed to torch.amp.GradScaler on the CPU and to fpsim's LossScaler:
    the same scale after every step and the same skipped steps (growth_interval 3)."""
    torch = pytest.importorskip("torch")
    pattern = [0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    mine = LossScaler(init_scale=2.0**10, growth_interval=3)
    state = mine.init()
    for overflow in pattern:
        before = p.detach().clone()
        scaler.scale(torch.ones(()))  # GradScaler creates its scale tensor lazily here
        p.grad = torch.full((4,), float("inf") if overflow else 1.0) * scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped = bool(torch.equal(before, p.detach()))
        assert skipped == bool(overflow)
        state = mine.update(state, bool(overflow))
        assert state.scale == scaler.get_scale()


def test_replay_fp16_grads_skip_and_back_off_like_gradscaler(tmp_path):
    """A gradient of 2.0 overflows float16 at scale 65536 (step 1) and again at 32768 (step 4:
    2 * 32768 = 65536 rounds past 65504 to inf): two skipped steps, the scale ends at 16384 —
    torch's GradScaler on the same float16 gradients agrees step by step."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(64).astype(np.float32) * 0.01 for _ in range(6)]
    grads[0][0] = 2.0
    grads[3][5] = 2.0
    trace = write_trace(tmp_path / "t", grads, np.ones(64, np.float32))
    r = replay(trace, ["fp16-grads-dynamic"], optimizer=Adam(), progress=False)
    per = r.per_step("fp16-grads-dynamic")
    p = torch.nn.Parameter(torch.ones(64))
    opt = torch.optim.Adam([p], lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    for step, g in zip(per, grads):
        assert step["loss_scale"] == scaler.get_scale()
        scaler.scale(torch.ones(()))
        p.grad = (torch.from_numpy(g) * scaler.get_scale()).half().float()  # the float16 backward
        before = p.detach().clone()
        scaler.step(opt)
        scaler.update()
        assert bool(step["skipped"]) == bool(torch.equal(before, p.detach()))
    assert [s["skipped"] for s in per] == [1, 0, 0, 1, 0, 0]
    assert per[-1]["loss_scale"] == 16384
    assert r.summary()["results"][1]["skipped_steps"] == 2  # (results[0] is the FP32 reference)


def _bnb_run(p0, grads):
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = bnb.optim.Adam8bit([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    return p.detach().numpy(), opt.state[p]


def test_bnb_scheme_replay_agrees_with_bitsandbytes_adam8bit(tmp_path):
    """bitsandbytes 0.50.2 Adam8bit on the CPU vs the replay with its exact CPU quantizer
    (``bnb-8bit-cpu``: dynamic maps, blocks of 256, the 65536-bin LUT). Measured: parameters
    after 20 steps differ by 1.1e-6 of the update's norm and >= 99.8% of the stored first-moment
    codes are equal; the rest comes from bitsandbytes' own float32 update formula (it folds
    the bias corrections into the step size and eps) flipping codes at bin edges."""
    rng = np.random.default_rng(0)
    n, steps = 32768, 20
    p0 = rng.standard_normal(n).astype(np.float32)
    grads = [(rng.standard_normal(n) * np.exp(rng.normal(-6, 2, n))).astype(np.float32) for _ in range(steps)]
    bnb_p, bnb_state = _bnb_run(p0, grads)
    r = replay(write_trace(tmp_path / "t", grads, p0), ["bnb-8bit-cpu"], optimizer=Adam(), progress=False)
    mine = r.final_params["bnb-8bit-cpu"]["w"]
    assert np.linalg.norm(mine - bnb_p) / np.linalg.norm(bnb_p - p0) < 5e-6
    cfg = PRESETS["bnb-8bit-cpu"]
    from fpsim import encode

    m_codes = encode(r.final_states["bnb-8bit-cpu"]["w"]["exp_avg"], cfg.m).codes
    assert np.mean(m_codes == bnb_state["state1"].numpy()) > 0.995


def test_nearest_8bit_states_truncate_tiny_second_moments(tmp_path):
    """The silent failure fpsim exists to show: gradients spanning ~2**24 within a block of 256.
    Nearest rounding to the unsigned dynamic map sends tiny second moments to 0 while the
    first moment keeps a value, so m / (sqrt(v) + eps) explodes; bitsandbytes' CPU LUT maps
    near-zero values to a nonzero code and happens to avoid it. Measured relative distance to
    the FP32 run after 20 steps: ~8 for nearest, ~0.19 for the LUT (and for bitsandbytes)."""
    rng = np.random.default_rng(0)
    n, steps = 32768, 20
    p0 = rng.standard_normal(n).astype(np.float32)
    grads = [(rng.standard_normal(n) * np.exp(rng.normal(-6, 2, n))).astype(np.float32) for _ in range(steps)]
    r = replay(
        write_trace(tmp_path / "t", grads, p0),
        ["bnb-8bit-all", "bnb-8bit-cpu"],
        optimizer=Adam(),
        progress=False,
    )
    ref = r.final_params["reference"]["w"]

    def drift(name):
        return np.linalg.norm(r.final_params[name]["w"] - ref) / np.linalg.norm(ref - p0)

    assert drift("bnb-8bit-all") > 2 and drift("bnb-8bit-cpu") < 0.5
    by_cfg = {x["config"]: x for x in r.summary()["results"]}
    assert by_cfg["bnb-8bit-all"]["zero_state_share"] > by_cfg["bnb-8bit-cpu"]["zero_state_share"]


def test_bf16_master_swamping_and_state_zeros_by_hand(tmp_path):
    """One step: params of 1.0 in bfloat16 and SGD-free Adam updates of ~lr: an update below half
    a bfloat16 ulp (2**-8) is swamped. With lr = 1e-3 every Adam update (~lr) is lost."""
    p0 = np.ones(1000, np.float32)
    g = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    r = replay(
        write_trace(tmp_path / "t", [g], p0, lr=1e-3),
        ["bf16-master", "fp32"],
        optimizer=Adam(),
        progress=False,
    )
    res = {x["config"]: x for x in r.summary()["results"]}
    assert res["bf16-master"]["swamped_share"] == 1.0 and res["fp32"]["swamped_share"] == 0.0
    assert res["fp32"]["final_param_rel_error"] == 0.0 and res["fp32"]["mean_update_cosine"] == 1.0
    assert np.array_equal(r.final_params["bf16-master"]["w"], p0)


def test_largest_error_is_nan_once_a_step_diverges(tmp_path):
    """NaN gradients from step 3 on (NaNs of every kind, signaling ones too): the per-step
    parameter error is finite before, NaN from then on, and the summary's largest error is
    NaN, not the largest of the finite ones (Python's max keeps its first argument against
    a NaN); the gradient norm of a step with signaling NaNs is NaN, without a warning."""
    rng = np.random.default_rng(5)
    p0 = rng.standard_normal(600).astype(np.float32)
    grads = [rng.standard_normal(600).astype(np.float32) for _ in range(4)]
    grads[2] = with_nans(grads[2], start=7)
    r = replay(write_trace(tmp_path / "t", grads, p0), ["bf16-master"], progress=False)
    errors = [s["param_rel_error"] for s in r.per_step("bf16-master")]
    assert [math.isnan(e) for e in errors] == [False, False, True, True]
    assert 0 < max(errors[:2]) < math.inf
    row = next(x for x in r.summary()["results"] if x["config"] == "bf16-master")
    assert row["max_param_rel_error"] == row["final_param_rel_error"] == "nan"  # (JSON-ready)
    assert [math.isnan(r.grad_sq[s, "w"]) for s in (1, 2, 3, 4)] == [False, False, True, False]


def test_memory_table_by_hand():
    sizes = {"big": 8192, "small": 100}
    rows = {
        r["config"]: r
        for r in memory_table(
            [PRESETS["fp32"], PRESETS["bnb-8bit"], PRESETS["bf16-master-kahan"], PRESETS["msamp-o2"]],
            sizes,
            AdamW(),
        )
    }
    assert rows["fp32"]["total"] == 16.0
    # 8-bit states with a float32 absmax per 256 for the big tensor, float32 states for the small one
    states = (8192 * 2 * (1 + 4 / 256) + 100 * 8) / 8292
    assert rows["bnb-8bit"]["states"] + rows["bnb-8bit"]["scales"] == pytest.approx(states, rel=1e-12)
    assert rows["bnb-8bit"]["scales"] == pytest.approx(8192 * 2 * 4 / 256 / 8292, rel=1e-12)
    assert rows["bf16-master-kahan"]["master"] == 2 and rows["bf16-master-kahan"]["kahan_buffer"] == 2
    assert rows["msamp-o2"]["total"] == pytest.approx(2 + 4 + 1 + 2, rel=1e-12)  # fp16 master, fp32 grads


def test_unknown_config_and_missing_lr_are_clear_errors(tmp_path):
    trace = tmp_path / "t"
    with TraceWriter(trace) as w:
        w.write_step(1, {"grad": {"w": np.ones(3, np.float32)}, "param": {"w": np.zeros(3, np.float32)}})
    with pytest.raises(ValueError, match="unknown replay configuration 'fp7'"):
        replay(trace, ["fp7"], progress=False)
    with pytest.raises(ValueError, match="no recorded lr"):
        replay(trace, ["fp32"], progress=False)
    assert replay(trace, [ReplayConfig("x")], lr=0.1, progress=False).summary()["results"][1]["steps"] == 1


def test_default_configs_and_steps_are_resolved_as_documented(tmp_path):
    """replay's default configurations are DEFAULT_CONFIGS; presets and steps resolve as the
    Dask executor resolves them."""
    trace = write_trace(tmp_path / "t", [np.ones(3, np.float32)] * 2, np.zeros(3, np.float32))
    assert [c.name for c in replay(trace, progress=False).configs] == list(DEFAULT_CONFIGS)
    own = ReplayConfig("x")
    assert resolve_configs(["fp32", own]) == [PRESETS["fp32"], own]
    assert resolve_configs(["fp32"])[0] is PRESETS["fp32"]
    assert select_steps(open_trace(trace), [2, 1, 2]) == [1, 2]
    assert select_steps(open_trace(trace), None) == [1, 2]
    with pytest.raises(ValueError, match=r"steps \[5\] are not in the trace"):
        select_steps(open_trace(trace), [1, 5])


def test_cli_replay_json_and_files(tmp_path, capsys):
    from fpsim.cli.app import main

    out = tmp_path / "r"
    code = main(
        [
            "replay",
            "--optimizer",
            "adam",
            "--config",
            "bf16-master",
            "--config",
            "fp8-states",
            "--state",
            "m=bnb_dynamic8_block256,v=bnb_dynamic8u_block256",
            "--master",
            "bfloat16",
            "--master-rounding",
            "stochastic",
            "--steps",
            "191:200",
            "--out",
            str(out),
            "--json",
            "--quiet",
            "--figures",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert [r["config"] for r in summary["results"]] == ["reference", "bf16-master", "fp8-states", "custom"]
    keys = {
        "config",
        "steps",
        "final_param_rel_error",
        "mean_update_cosine",
        "swamped_share",
        "zero_state_share",
        "skipped_steps",
        "bytes_per_param",
    }
    for r in summary["results"]:
        assert keys <= set(r) and r["steps"] == 10
    assert summary["results"][0]["bytes_per_param"] == 16.0
    assert summary["results"][3]["bytes_per_param"] == pytest.approx(2 + 4 + 2 * (1 + 4 / 256))
    for name in ("replay.csv", "summary.json", "memory.csv", "report.md", "divergence.png"):
        assert (out / name).exists(), name
    assert main(["replay", "--state", "q=float16", "--out", str(out), "--quiet"]) == 2
    assert "--state takes m=FORMAT" in capsys.readouterr().err


def test_result_does_not_depend_on_threads(tmp_path):
    """Tensors (and pieces of a tensor larger than one task) are updated in parallel: one
    thread and three give the same table and final values, and the reference equals AdamW's
    step applied to whole tensors in order."""
    rng = np.random.default_rng(5)
    shapes = {"big": (600_001,), "w": (37, 41), "b": (7,)}
    p0 = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    grads = [
        {k: (rng.standard_normal(s) * 1e-3).astype(np.float32) for k, s in shapes.items()} for _ in range(3)
    ]
    trace = tmp_path / "t"
    with TraceWriter(trace) as w:
        for s, g in enumerate(grads, 1):
            w.write_step(s, {"grad": g, **({"param": p0} if s == 1 else {})}, lr=1e-3)
    configs = ["bnb-8bit-all", "fp8-states", "msamp-o2", "bf16-master-sr", "fp16-grads-dynamic"]
    one = replay(trace, configs, progress=False, threads=1)
    three = replay(trace, configs, progress=False, threads=3)
    assert one.table().equals(three.table())
    for cfg, params in one.final_params.items():
        for name, p in params.items():
            np.testing.assert_array_equal(p.view(np.uint32), three.final_params[cfg][name].view(np.uint32))
            for st, v in one.final_states[cfg][name].items():
                np.testing.assert_array_equal(
                    v.view(np.uint32), three.final_states[cfg][name][st].view(np.uint32)
                )
    opt = AdamW()
    for name in shapes:
        p, states = p0[name], {st: np.zeros(shapes[name], np.float32) for st in opt.states}
        for t, g in enumerate(grads, 1):
            p, states = opt.step(p, g[name], states, 1e-3, t)
        np.testing.assert_array_equal(
            three.final_params["reference"][name].view(np.uint32), p.view(np.uint32)
        )
    with pytest.raises(ValueError, match="threads must be a positive integer, got 0"):
        replay(trace, [], progress=False, threads=0)


def test_tensors_filter_replays_a_subset_exactly(tmp_path):
    """Without a loss scaler every tensor's replay is independent: the subset's statistics and
    final values equal those of the full replay; unknown names are refused by name."""
    rng = np.random.default_rng(6)
    shapes = {"a": (300,), "b": (17, 3), "c": (5,)}
    grads = [
        {k: (rng.standard_normal(s) * 1e-3).astype(np.float32) for k, s in shapes.items()} for _ in range(2)
    ]
    trace = tmp_path / "t"
    with TraceWriter(trace) as w:
        for s, g in enumerate(grads, 1):
            w.write_step(
                s, {"grad": g, "param": {k: np.ones(v.shape, np.float32) for k, v in g.items()}}, lr=1e-2
            )
    full = replay(trace, ["bnb-8bit-all"], progress=False)
    part = replay(trace, ["bnb-8bit-all"], tensors=["c", "a"], progress=False)
    assert list(part.sizes) == ["a", "c"]
    assert {k for k in part.stats} == {k for k in full.stats if k[1] in ("a", "c")}
    for k, v in part.stats.items():
        assert v == full.stats[k]
    np.testing.assert_array_equal(
        part.final_params["bnb-8bit-all"]["c"], full.final_params["bnb-8bit-all"]["c"]
    )
    with pytest.raises(ValueError, match=r"tensors \['d'\] match no gradient at step 1"):
        replay(trace, [], tensors=["a", "d"], progress=False)


def test_config_holds_resolved_formats_and_shows_their_names():
    """Names are resolved once, when the configuration is made: the fields hold the objects
    (equal to a configuration made from the objects), the repr shows the names, and unknown
    names fail there, by name."""
    from fpsim.formats import RECIPES, RoundMode, get_format

    cfg = ReplayConfig(
        "x",
        m="bnb_dynamic8_block256",
        master="bfloat16",
        master_rounding="stochastic",
        master_overrides=(("embed*", "float32"),),
        weights="float16",
    )
    assert cfg.m is RECIPES["bnb_dynamic8_block256"] and cfg.master == get_format("bfloat16")
    assert cfg.master_rounding is RoundMode.STOCHASTIC and cfg.weights == get_format("float16")
    assert cfg.master_format("embed.w") == get_format("float32") and cfg.master_format("w") == cfg.master
    same = ReplayConfig(
        "x",
        m=cfg.m,
        master=cfg.master,
        master_rounding=RoundMode.STOCHASTIC,
        master_overrides=(("embed*", get_format("float32")),),
        weights=cfg.weights,
    )
    assert same == cfg
    assert repr(cfg).startswith("ReplayConfig(name='x', m='bnb_dynamic8_block256', v='float32',")
    assert "master='bfloat16', master_rounding='stochastic'" in repr(cfg)
    assert "master_overrides=(('embed*', 'float32'),), weights='float16'" in repr(cfg)
    with pytest.raises(ValueError, match="unknown format 'bfloat17'"):
        ReplayConfig("y", master="bfloat17")
    with pytest.raises(ValueError, match="unknown rounding mode 'up'"):
        ReplayConfig("y", master_rounding="up")


def test_backend_and_sqrt_are_checked_once(tmp_path):
    """``backend`` and ``sqrt`` take their names (the same bits on either backend); unknown
    ones are refused by name."""
    trace = write_trace(tmp_path / "t", [np.ones(8, np.float32)], np.ones(8, np.float32))
    base = replay(trace, ["bf16-master-sr"], backend="numpy", progress=False).final_params
    for backend, sqrt in (("auto", None), ("auto", "ieee")):
        r = replay(trace, ["bf16-master-sr"], backend=backend, sqrt=sqrt, progress=False).final_params
        np.testing.assert_array_equal(r["bf16-master-sr"]["w"], base["bf16-master-sr"]["w"])
    with pytest.raises(ValueError, match="backend must be one of auto, numpy, compiled; got 'gpu'"):
        replay(trace, [], backend="gpu", progress=False)
    with pytest.raises(ValueError, match="sqrt must be one of ieee, torch; got 'exact'"):
        replay(trace, [], sqrt="exact", progress=False)


def test_library_presets_keep_the_bundled_trace_in_fp32():
    """Every tensor of the bundled trace is under 4096 elements (the README says so): the
    bitsandbytes and torchao presets keep all its states in FP32, so they replay it exactly as
    the FP32 reference does, while bnb-8bit-all quantizes it."""
    from fpsim.trace import open_trace, sample_trace_path

    tr = open_trace(sample_trace_path())
    assert max(e.size for e in tr.entries(step=190, role="grad")) < 4096
    presets = ["bnb-8bit", "torchao-8bit", "torchao-fp8", "torchao-4bit", "bnb-8bit-all"]
    r = replay(tr, presets, optimizer=Adam(), steps=range(190, 201), progress=False)
    ref = r.final_params["reference"]
    for name in presets[:-1]:
        for tensor, p in r.final_params[name].items():
            np.testing.assert_array_equal(
                p.view(np.uint32), ref[tensor].view(np.uint32), err_msg=f"{name} {tensor}"
            )
    assert any((r.final_params["bnb-8bit-all"][t] != ref[t]).any() for t in ref)
