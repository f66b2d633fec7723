"""The replay answers the question asked: it replays what was recorded as the real optimizer
did (update counts, skipped steps, recorded states) or refuses, naming what is missing.

The oracles are torch.optim and torch.amp.GradScaler run in the test, on this machine; with
``sqrt="torch"`` the FP32 replay uses torch's own square root, so it must equal them bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.cli.app import main
from fpsim.replay import LossScaler, ReplayConfig, replay
from fpsim.replay.optim import SGD, Adam, AdamW
from fpsim.trace import TraceWriter, open_trace

torch = pytest.importorskip("torch")
from fpsim.trace import TorchCapture  # noqa: E402


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def _readme_loop(path, steps=6, every=1, opt_cls=torch.optim.AdamW, **opt_kw):
    """The README's capture loop (0-based enumerate); returns the final parameters and states,
    and every parameter after each update (to check one-update replays)."""
    model = _model()
    opt = opt_cls(model.parameters(), lr=1e-2, **opt_kw)
    after = []
    with TorchCapture(model, path, every=every, params=True, optimizer=opt) as cap:
        for step, (x, y) in enumerate(_batches(steps)):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            cap.step(step, loss=loss.item())
            opt.step()
            after.append({n: p.detach().numpy().copy() for n, p in model.named_parameters()})
    names = dict(model.named_parameters())
    states = {
        n: {k: v.numpy().copy() for k, v in opt.state[p].items() if v.dim() > 0} for n, p in names.items()
    }
    return after, states


def assert_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, (
        f"{what}: {bad.size} of {got.size} differ, first at {bad[:4]}: "
        f"{got.flat[bad[:4]]} vs {want.flat[bad[:4]]}"
    )


def test_readme_loop_replays_to_torch_bit_for_bit(tmp_path):
    """Step 0 is update 1 (recorded by the capture): the FP32 replay with torch's sqrt equals
    torch's AdamW after the last update, parameters and states."""
    after, states = _readme_loop(tmp_path / "t")
    tr = open_trace(tmp_path / "t")
    assert tr.steps[0] == 0 and tr.update(0) == 1
    r = replay(tr, [ReplayConfig("fp32")], optimizer=AdamW(), sqrt="torch", progress=False)
    for label in ("reference", "fp32"):
        for name, want in after[-1].items():
            assert_bits(r.final_params[label][name], want, f"{label} {name}")
            for st in ("exp_avg", "exp_avg_sq"):
                assert_bits(r.final_states[label][name][st], states[name][st], f"{label} {name} {st}")


def test_cli_save_state_holds_torch_final_values(tmp_path, capsys):
    after, states = _readme_loop(tmp_path / "t")
    out = tmp_path / "state"
    argv = ["replay", str(tmp_path / "t"), "--config", "fp32", "--sqrt", "torch", "--save-state", str(out)]
    assert main([*argv, "--out", str(tmp_path / "r"), "--quiet", "--json"]) == 0
    from safetensors.numpy import load_file

    saved = load_file(out / "fp32.safetensors")
    for name, want in after[-1].items():
        assert_bits(saved[f"param:{name}"], want, name)
        assert_bits(saved[f"state.exp_avg_sq:{name}"], states[name]["exp_avg_sq"], name)
    assert (out / "reference.safetensors").exists()


def test_step_numbers_from_zero_without_counts_are_refused_by_name(tmp_path, capsys):
    """A trace without update counts whose first step is 0: the step cannot be update 0; the
    error says what to pass, and first_update=1 replays it as torch did."""
    after, _ = _readme_loop(tmp_path / "t", steps=3)
    src = open_trace(tmp_path / "t")
    with TraceWriter(tmp_path / "bare") as w:  # the same tensors, without update counts
        for s in src.steps:
            tensors = {}
            for e in src.entries(s):
                tensors.setdefault(e.role, {})[e.name] = np.array(src.read(e))
            w.write_step(s, tensors, lr=src.lr(s))
    with pytest.raises(ValueError, match=r"step 0 would be update 0.*first_update="):
        replay(tmp_path / "bare", [], progress=False)
    assert main(["replay", str(tmp_path / "bare"), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "would be update 0" in capsys.readouterr().err
    r = replay(tmp_path / "bare", [], optimizer=AdamW(), sqrt="torch", first_update=1, progress=False)
    for name, want in after[-1].items():
        assert_bits(r.final_params["reference"][name], want, name)


def test_sparse_capture_is_refused_in_sequence_and_replays_each_update(tmp_path, capsys):
    """every=2 records updates 1, 3, 5: a sequence replay would chain updates that did not
    follow each other, so it is refused; mode='each' replays each recorded step as one update
    from its recorded values, which is torch's update of that step, bit for bit."""
    after, _ = _readme_loop(tmp_path / "t", steps=6, every=2)
    tr = open_trace(tmp_path / "t")
    assert [tr.update(s) for s in tr.steps] == [1, 3, 5]
    with pytest.raises(ValueError, match=r"update 2 between steps 0 and 2.*mode='each'"):
        replay(tr, [], progress=False)
    assert main(["replay", str(tmp_path / "t"), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "--mode each" in capsys.readouterr().err
    for s in tr.steps:
        r = replay(tr, [], optimizer=AdamW(), sqrt="torch", mode="each", steps=[s], progress=False)
        for name, want in after[s].items():
            assert_bits(r.final_params["reference"][name], want, f"step {s} {name}")
    r = replay(tr, ["bf16-master"], mode="each", progress=False)
    assert r.mode == "each" and r.steps == [0, 2, 4] and r.summary()["mode"] == "each"


def test_each_mode_refuses_steps_without_states(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.write_step(
            3, {"grad": {"w": np.ones(4, np.float32)}, "param": {"w": np.ones(4, np.float32)}}, lr=0.1
        )
    with pytest.raises(ValueError, match=r"step 3 \(update 3\) has no recorded exp_avg/exp_avg_sq"):
        replay(tmp_path / "t", [], mode="each", progress=False)
    with pytest.raises(ValueError, match="no recorded parameter"):
        with TraceWriter(tmp_path / "u") as w:
            w.write_step(1, {"grad": {"w": np.ones(4, np.float32)}}, lr=0.1)
        replay(tmp_path / "u", [], progress=False)


def test_states_the_optimizer_does_not_use_are_an_error(tmp_path):
    _readme_loop(tmp_path / "t", steps=3)
    with pytest.raises(ValueError, match=r"records optimizer states \['exp_avg', 'exp_avg_sq'\], which sgd"):
        replay(tmp_path / "t", [], optimizer=SGD(), steps=[1, 2], progress=False)


def test_grad_scaler_loop_with_skipped_steps_equals_the_replay(tmp_path):
    """A real GradScaler + AdamW loop where steps 2, 3 and 7 overflow: the trace records the
    unscaled gradients and the skips; the FP32 reference (which skips what the run skipped)
    and a configuration with the same dynamic loss scaler (which finds the overflows itself)
    both equal torch bit for bit: loss scales, skipped steps, parameters, states and Adam's
    update count (which the skipped steps do not advance)."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)
    overflow, scales, skipped = {2, 3, 7}, [], []
    with TorchCapture(model, tmp_path / "t", params=True, optimizer=opt, scaler=scaler) as cap:
        for step, (x, y) in enumerate(_batches(10)):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y) * (1e36 if step in overflow else 1.0)
            scales.append(scaler.get_scale())
            scaler.scale(loss).backward()
            cap.step(step, loss=loss.item())
            before = [p.detach().clone() for p in model.parameters()]
            scaler.step(opt)
            scaler.update()
            skipped.append(all(torch.equal(a, p) for a, p in zip(before, model.parameters())))
    assert skipped == [s in overflow for s in range(10)]
    tr = open_trace(tmp_path / "t")
    assert [tr.skipped(s) for s in tr.steps] == skipped
    cfg = ReplayConfig("amp", loss_scaler=LossScaler(init_scale=2.0**12, growth_interval=2))
    r = replay(tr, [cfg], optimizer=AdamW(), sqrt="torch", progress=False)
    assert [r.scale[s, "amp"] for s in tr.steps] == scales
    assert [r.skipped[s, "amp"] for s in tr.steps] == skipped
    assert r.trace_skipped == [2, 3, 7]
    names = dict(model.named_parameters())
    for label in ("reference", "amp"):
        for name, p in names.items():
            assert_bits(r.final_params[label][name], p.detach().numpy(), f"{label} {name}")
            for st in ("exp_avg", "exp_avg_sq"):
                assert_bits(r.final_states[label][name][st], opt.state[p][st].numpy(), f"{label} {name} {st}")
    assert int(opt.state[names["0.weight"]]["step"]) == 7


def test_config_that_skips_on_its_own_does_not_advance_its_count(tmp_path):
    """fp16 gradients overflow at step 2 for the fp16 config only: its Adam count lags the
    reference's from then on, as torch's would; the same trace replayed with the config's update
    counts by hand (steps 1, 3, ... as updates 1, 2, ...) gives its parameters exactly."""
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(16).astype(np.float32) * 1e-2 for _ in range(4)]
    grads[1][0] = 4.0  # * 65536 overflows float16
    with TraceWriter(tmp_path / "t") as w:
        for s, g in enumerate(grads, 1):
            extra = {"param": {"w": np.ones(16, np.float32)}} if s == 1 else {}
            w.write_step(s, {"grad": {"w": g}, **extra}, lr=1e-2)
    cfg = ReplayConfig("fp16", grad="float16", loss_scaler=LossScaler(dynamic=False))
    r = replay(tmp_path / "t", [cfg], optimizer=Adam(), progress=False)
    assert [r.skipped[s, "fp16"] for s in (1, 2, 3, 4)] == [False, True, False, False]
    # by hand: fpsim's Adam on the float16-rounded gradients of steps 1, 3, 4 as updates 1, 2, 3
    opt, p = Adam(), np.ones(16, np.float32)
    st = {"exp_avg": np.zeros(16, np.float32), "exp_avg_sq": np.zeros(16, np.float32)}
    inv = np.float32(1 / 65536)
    for t, g in enumerate((grads[0], grads[2], grads[3]), 1):
        q = (g * np.float32(65536)).astype(np.float16).astype(np.float32) * inv
        p, st = opt.step(p, q, st, 1e-2, t)
    assert_bits(r.final_params["fp16"]["w"], p, "fp16 config")


def test_jax_capture_replays_from_its_recorded_moments(tmp_path):
    """optax's Adam state recorded as mu/nu, with its count: the replay reads them as Adam's
    states (from them, not from zeros). The update math is torch's (fpsim.replay.optim.Adam), so the
    one-update replay of a recorded step lands within float32 rounding of optax's own next
    moments (rel 1e-6: optax rounds mu = b1*mu + (1-b1)*g without torch's fma), while starting
    from zeros would be off by orders of magnitude."""
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    import jax.numpy as jnp

    from fpsim.trace import capture_jax

    key = jax.random.PRNGKey(0)
    params = {"w": jax.random.normal(key, (8, 4)), "b": jnp.zeros(4)}
    data = jax.random.normal(jax.random.PRNGKey(1), (16, 8))

    def loss_fn(p, x):
        return jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2)

    opt = optax.adam(1e-2)
    state = opt.init(params)
    writer, moments = None, []
    for step in range(4):
        loss, grads = jax.value_and_grad(loss_fn)(params, data + step)
        adam = state[0]
        writer = capture_jax(
            writer or tmp_path / "t", step, grads, params=params, loss=loss, lr=1e-2,
            states={"mu": adam.mu, "nu": adam.nu}, update=int(adam.count) + 1,
        )  # fmt: skip
        updates, state = opt.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        moments.append(state[0])
    writer.close()
    tr = open_trace(tmp_path / "t")
    assert [tr.update(s) for s in tr.steps] == [1, 2, 3, 4]
    r = replay(tr, [], optimizer=Adam(), mode="each", steps=[2], progress=False)
    for name in ("w", "b"):
        got = r.final_states["reference"][name]
        np.testing.assert_allclose(got["exp_avg"], np.asarray(moments[2].mu[name]), rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(got["exp_avg_sq"], np.asarray(moments[2].nu[name]), rtol=1e-6, atol=1e-18)
    mu = np.asarray(moments[2].mu["w"])
    from_zeros = np.asarray(tr.read(tr.entry(2, "w", "grad"))) * np.float32(0.1)  # Adam's m from zero states
    assert np.max(np.abs(from_zeros - mu)) > 1e-2 * np.max(np.abs(mu))
