"""TorchCapture in a real (tiny) training loop, and capture_jax on pytrees."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fpsim.trace import TorchCapture, TraceWriter, capture_jax, open_trace


def tiny_setup(torch, optimizer="adam"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    return model, opt, x, y


def test_torch_capture_records_grads_params_state_and_lr(tmp_path):
    torch = pytest.importorskip("torch")
    model, opt, x, y = tiny_setup(torch)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    seen = {}
    with TorchCapture(
        model, tmp_path / "t", every=2, params=True, optimizer=opt, metadata={"run": "a"}
    ) as cap:
        for step in range(5):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            recorded = cap.step(step, loss=loss)
            assert recorded == (step % 2 == 0)
            seen[step] = {
                "loss": loss.item(),
                "lr": opt.param_groups[0]["lr"],
                "grad": {n: p.grad.clone() for n, p in model.named_parameters()},
                "param": {n: p.detach().clone() for n, p in model.named_parameters()},
                "state.exp_avg": {
                    n: opt.state[p]["exp_avg"].clone() for n, p in model.named_parameters() if p in opt.state
                },
                "state.exp_avg_sq": {
                    n: opt.state[p]["exp_avg_sq"].clone()
                    for n, p in model.named_parameters()
                    if p in opt.state
                },
            }
            opt.step()
            sched.step()
    t = open_trace(tmp_path / "t")
    assert t.steps == [0, 2, 4]
    assert t.metadata["run"] == "a" and t.metadata["optimizer"] == "Adam" and t.metadata["every"] == 2
    assert t.metadata["torch_version"] == torch.__version__
    names = [n for n, _ in model.named_parameters()]
    assert t.names("grad") == names and t.names("param") == names
    assert t.entries(step=0, role="state.exp_avg") == []  # Adam creates its state in the first step()
    assert "state.step" not in t.roles  # 0-d 'step' counters are not recorded
    for step in t.steps:
        assert t.loss(step) == pytest.approx(seen[step]["loss"]) and t.lr(step) == seen[step]["lr"]
        for role in ("grad", "param", "state.exp_avg", "state.exp_avg_sq"):
            assert [e.name for e in t.entries(step, role)] == list(seen[step][role])
            for name, want in seen[step][role].items():
                np.testing.assert_array_equal(t.read(t.entry(step, name, role)), want.numpy())
    assert t.lr(4) == 0.01 * 0.5**4


def test_torch_capture_every_frozen_params_sgd_and_restart(tmp_path):
    torch = pytest.importorskip("torch")
    model, opt, x, y = tiny_setup(torch, optimizer="sgd")
    model[1].weight.requires_grad_(False)

    def train(cap, steps):
        for step in steps:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            cap.step(step, loss=loss.item(), lr=123.0 if step == 9 else None)  # after opt.step()

    with TorchCapture(model, tmp_path / "t", every=3, optimizer=opt) as cap:
        train(cap, range(0, 7))
    with pytest.warns(UserWarning, match="SGD keeps no update count and already has state"):
        resumed = TorchCapture(model, tmp_path / "t", every=3, optimizer=opt)  # a restarted job appends
    with resumed as cap:
        train(cap, range(7, 10))
        with pytest.raises(ValueError, match="steps must increase: the last step given was 9, got 9"):
            cap.step(9)
    t = open_trace(tmp_path / "t")
    assert t.steps == [0, 3, 6, 9]
    assert "1.weight" not in t.names("grad") and "1.weight" not in t.names("state.momentum_buffer")
    assert t.roles == ("grad", "state.momentum_buffer")
    assert t.lr(3) == 0.1 and t.lr(9) == 123.0
    # recorded after opt.step(): the update just done (step 0 is update 1); none after the restart
    assert [t.update(s) for s in t.steps] == [1, 4, 7, None]
    final = opt.state[model[0].weight]["momentum_buffer"]
    np.testing.assert_array_equal(t.read(t.entry(9, "0.weight", "state.momentum_buffer")), final.numpy())


def test_torch_capture_bfloat16_model_and_bad_arguments(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    model(torch.ones(5, 3, dtype=torch.bfloat16)).float().sum().backward()
    with TorchCapture(model, tmp_path / "t", params=True) as cap:
        cap.step(0)
    t = open_trace(tmp_path / "t")
    e = t.entry(0, "weight")
    assert e.dtype == "bfloat16" and t.read(e).dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(t.read(e).view(np.int16), model.weight.grad.view(torch.int16).numpy())
    assert t.loss(0) is None and t.lr(0) is None
    with pytest.raises(ValueError, match="every must be a positive int"):
        TorchCapture(model, tmp_path / "u", every=0)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        TorchCapture(object(), tmp_path / "u")


def test_capture_jax_pytrees(tmp_path):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    grads = {
        "dense1": {"kernel": jnp.arange(6.0).reshape(2, 3), "bias": jnp.ones(3, jnp.bfloat16)},
        "layers": [jnp.zeros(2), jnp.full((1,), 2.0)],
    }
    params = jax.tree_util.tree_map(lambda a: a + 1, grads)
    w = capture_jax(
        tmp_path / "t", 0, grads, params=params, loss=jnp.float32(0.5), lr=1e-3, states={"mu": grads}
    )
    assert isinstance(w, TraceWriter)
    assert capture_jax(w, 1, grads) is w
    t = open_trace(tmp_path / "t")
    assert t.steps == [0, 1] and t.roles == ("grad", "param", "state.mu")
    assert sorted(t.names()) == ["dense1/bias", "dense1/kernel", "layers/0", "layers/1"]
    assert t.loss(0) == 0.5 and t.lr(0) == 1e-3 and t.loss(1) is None
    bias = t.entry(0, "dense1/bias")
    assert bias.dtype == "bfloat16" and t.read(bias).dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(
        t.read(t.entry(0, "dense1/kernel", "param")), np.arange(6.0).reshape(2, 3) + 1
    )
    capture_jax(tmp_path / "single", 3, jnp.ones(2))
    assert open_trace(tmp_path / "single").names() == ["value"]
