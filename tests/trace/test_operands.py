"""GEMM operands recorded by TorchCapture equal what the module hooks of torch see, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.analysis.metrics import measure
from fpsim.trace import TorchCapture, capture_jax, decode_stats, jax_operands, open_trace
from fpsim.trace.operand_stats import stats_vector

torch = pytest.importorskip("torch")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(3, 4, 3, padding=1)
        self.attn = torch.nn.MultiheadAttention(4, 2, batch_first=True)
        self.fc = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        h = self.conv(x).transpose(1, 2)  # (batch, seq, 4)
        h = h + self.attn(h, h, h, need_weights=False)[0]
        h = torch.relu(self.fc(h))
        h = self.fc(h)  # called twice: the second call is "fc#1"
        return self.head(h.mean(1))


def hooked_run(tmp_path, operands, steps=4, when=2):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 3, 7), torch.randint(0, 2, (5,))
    seen: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    current = {}

    def fwd(name):
        def hook(module, args, output):
            if not torch.is_grad_enabled():  # the evaluation pass
                return
            n = sum(k.split("#")[0] == name for k in current["input"])
            current["input"][name if n == 0 else f"{name}#{n}"] = args[0].detach().clone()

        return hook

    def bwd(name):
        def hook(module, grad_input, grad_output):
            current["grad_output"].setdefault(name, []).append(grad_output[0].clone())

        return hook

    for name in ("conv", "attn", "fc", "head"):
        module = model.get_submodule(name)
        module.register_forward_hook(fwd(name))
        module.register_full_backward_hook(bwd(name))
    with TorchCapture(model, tmp_path, when=when, operands=operands) as cap:
        for step in range(steps):
            current.update(input={}, grad_output={})
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            with torch.no_grad():
                model(x)  # an evaluation pass is not recorded
            cap.step(step)
            grads = {}  # backward meets the calls of a module in reverse: the last call first
            for name, arrived in current["grad_output"].items():
                for k, g in enumerate(reversed(arrived)):
                    grads[name if k == 0 else f"{name}#{k}"] = g
            seen[step] = {"input": dict(current["input"]), "grad_output": grads}
            opt.step()
    return open_trace(tmp_path), seen


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_operands_equal_the_hooks_bit_for_bit(tmp_path):
    trace, seen = hooked_run(tmp_path, operands=True)
    assert trace.steps == [0, 2]
    names = ["conv", "attn", "fc", "fc#1", "head"]
    for step in trace.steps:
        for role in ("input", "grad_output"):
            got = {e.name: trace.read(e) for e in trace.entries(step, role)}
            assert sorted(got) == sorted(names)
            backward_order = [e.name for e in trace.entries(step, "grad_output")]
            for name, want in seen[step][role].items():
                w = want.numpy()
                assert got[name].dtype == w.dtype and got[name].shape == w.shape
                assert np.array_equal(got[name].view(np.uint32), w.view(np.uint32)), (step, role, name)
        assert [e.name for e in trace.entries(step, "input")] == names  # forward order
        assert backward_order[0] == "head"
    assert trace.metadata["operands"] is True


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_operand_stats_match_the_tensors(tmp_path):
    trace, seen = hooked_run(tmp_path / "s", operands="stats", steps=3)
    assert trace.steps == [0, 2] and set(trace.roles) == {"grad", "stats.input", "stats.grad_output"}
    for step in trace.steps:
        for role in ("input", "grad_output"):
            entries = trace.entries(step, f"stats.{role}")
            assert len(entries) == 5
            for e in entries:
                x = seen[step][role][e.name].numpy()
                s = decode_stats(trace.read(e), e.key)
                ref = measure(x, "float32", with_hist=True)  # the analysis' own histogram and counts
                assert s.elements == x.size and s.nonzero == ref.nonzero and s.nan == 0 and s.inf == 0
                assert np.array_equal(s.hist, ref.hist)
                assert s.amax == float(np.abs(x).max())


def test_stats_vector_counts_nan_inf_subnormals_and_agrees_with_torch():
    from fpsim.trace.operands import torch_stats_vector

    x = np.array([0, -0.0, 1e-40, -3.0, np.nan, np.inf, -np.inf, 2.5, 65504.0], np.float32)
    v = stats_vector(x)
    s = decode_stats(v)
    assert (s.elements, s.nonzero, s.nan, s.inf) == (9, 4, 1, 2)
    assert s.amax == np.inf  # infinities count, NaN does not
    assert s.hist[0] == 1 and s.hist[127 + 1] == 2 and s.hist[127 + 15] == 1 and s.hist.sum() == 4
    np.testing.assert_array_equal(torch_stats_vector(torch.from_numpy(x)).numpy(), v)
    bf = torch.randn(64).to(torch.bfloat16)
    np.testing.assert_array_equal(torch_stats_vector(bf).numpy(), stats_vector(bf.float().numpy()))
    with pytest.raises(ValueError, match="float64\\[261\\]"):
        decode_stats(v[:-1])


def test_operands_need_consecutive_steps_and_matmul_modules(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model(torch.ones(1, 2)).sum().backward()
    with TorchCapture(model, tmp_path / "a", operands=True) as cap:
        cap.step(0)
        with pytest.raises(ValueError, match="consecutive"):
            cap.step(5)
    with pytest.raises(ValueError, match="has none"):
        TorchCapture(torch.nn.Sequential(torch.nn.ReLU()), tmp_path / "b", operands=True)
    with pytest.raises(ValueError, match="operands= must be"):
        TorchCapture(model, tmp_path / "c", operands="yes")


def test_jax_operands_are_the_layer_inputs_and_output_gradients(tmp_path):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w1": jax.random.normal(k1, (3, 5)), "w2": jax.random.normal(k2, (5, 2))}
    x, y = jax.random.normal(k3, (4, 3)), jnp.ones((4, 2))

    def loss_fn(params, taps, x, y):
        h = x @ params["w1"] + taps["fc1"]
        out = jax.nn.relu(h) @ params["w2"] + taps["fc2"]
        return jnp.mean((out - y) ** 2), {"fc1": x, "fc2": jax.nn.relu(h)}

    taps = {"fc1": jnp.zeros((4, 5)), "fc2": jnp.zeros((4, 2))}
    loss, grads, inputs, grad_outputs = jax_operands(loss_fn, params, taps, x, y)
    # oracle: the vjp of the loss with respect to each layer's output
    h = x @ params["w1"]
    out = jax.nn.relu(h) @ params["w2"]
    d_out = jax.grad(lambda o: jnp.mean((o - y) ** 2))(out)
    d_h = jax.vjp(lambda hh: jax.nn.relu(hh) @ params["w2"], h)[1](d_out)[0]
    np.testing.assert_array_equal(np.asarray(grad_outputs["fc2"]), np.asarray(d_out))
    np.testing.assert_array_equal(np.asarray(grad_outputs["fc1"]), np.asarray(d_h))
    w = capture_jax(tmp_path / "j", 0, grads, loss=loss, inputs=inputs, grad_outputs=grad_outputs)
    capture_jax(w, 1, grads, inputs=inputs, grad_outputs=grad_outputs, operand_stats=True)
    t = open_trace(tmp_path / "j")
    np.testing.assert_array_equal(t.read(t.entry(0, "fc2", "input")), np.asarray(inputs["fc2"]))
    s = decode_stats(t.read(t.entry(1, "fc1", "stats.grad_output")))
    assert s.amax == float(np.abs(np.asarray(d_h)).max())


def test_tensor_patterns_select_operand_modules_by_their_parameters(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    with TorchCapture(model, tmp_path, operands=True, tensors="1.*") as cap:
        model(torch.ones(4, 2)).sum().backward()
        cap.step(0)
    t = open_trace(tmp_path)
    assert t.names("input") == ["1"] and t.names("grad_output") == ["1"]
    assert t.names("grad") == ["1.weight", "1.bias"]
