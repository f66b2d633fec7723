"""Standard torch checkpoints and Trainer checkpoint folders open as traces; the Trainer callback."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from fpsim.trace import TraceCallback, TraceError, open_checkpoint, open_trace

torch = pytest.importorskip("torch")


def trained(groups=1, buffers=False, steps=3):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2)]
    if buffers:
        layers.insert(1, torch.nn.BatchNorm1d(8))
    model = torch.nn.Sequential(*layers)
    if groups == 1:
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    else:  # a Trainer's grouping: weight decay for matrices, none for biases and norms
        decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
        rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
        opt = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}], lr=0.01)
    x = torch.randn(16, 4)
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return model, opt


def check_state(trace, model, opt, step):
    named = dict(model.named_parameters())
    for name, p in named.items():
        np.testing.assert_array_equal(trace.read(trace.entry(step, name, "param")), p.detach().numpy())
        for key in ("exp_avg", "exp_avg_sq"):
            want = opt.state[p][key].numpy()
            np.testing.assert_array_equal(trace.read(trace.entry(step, name, f"state.{key}")), want)
    assert trace.update(step) == 4 and trace.lr(step) == 0.01


def test_standard_torch_checkpoint_opens(tmp_path):
    model, opt = trained()
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3, "epoch": 1}, ckpt)
    trace = open_trace(ckpt)  # the "key 0 at optimizer/state is not a string"
    assert trace.steps == [3] and trace.metadata["not_imported"] == ["epoch"]
    assert set(trace.roles) == {"param", "state.exp_avg", "state.exp_avg_sq"}
    check_state(trace, model, opt, 3)


def test_ambiguous_mappings_are_refused_and_param_names_resolve_them(tmp_path):
    model, opt = trained(groups=2)
    ckpt = tmp_path / "two.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, ckpt)
    with pytest.raises(TraceError, match="2 parameter groups: pass param_names="):
        open_trace(ckpt)
    order = [n for g in opt.param_groups for p in g["params"] for n, q in model.named_parameters() if q is p]
    check_state(open_checkpoint(ckpt, param_names=order, step=3), model, opt, 3)
    wrong = order[::-1]
    with pytest.raises(TraceError, match="has shape .* pass param_names="):
        open_checkpoint(ckpt, param_names=wrong)
    model, opt = trained(buffers=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "bn.pt")
    with pytest.raises(TraceError, match=r"float tensors \(buffers\?\)"):
        open_trace(tmp_path / "bn.pt")
    names = [n for n, _ in model.named_parameters()]
    assert open_checkpoint(tmp_path / "bn.pt", param_names=names).steps == [0]


def test_trainer_checkpoint_folder(tmp_path):
    from safetensors.torch import save_file

    model, opt = trained()
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    (folder / "training_args.bin").write_bytes(b"\x80\x04 a pickle that must never be loaded")
    log = [{"loss": 0.5, "step": 1}, {"loss": 0.25, "step": 3}]
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 3, "log_history": log}))
    with pytest.raises(TraceError, match="safetensors model .* pass param_names="):
        open_trace(folder)
    trace = open_checkpoint(folder, param_names=[n for n, _ in model.named_parameters()])
    assert trace.steps == [3] and trace.loss(3) == 0.25
    check_state(trace, model, opt, 3)
    (folder / "optimizer.pt").unlink()
    with pytest.raises(TraceError, match="optimizer.pt"):
        open_trace(folder)


def test_trace_callback_driven_as_the_trainer_does(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = torch.randn(16, 4)
    cb = TraceCallback(tmp_path / "t", when=2, states="first", operands="stats", params=True)
    args, control = SimpleNamespace(), SimpleNamespace()
    state = SimpleNamespace(global_step=0, max_steps=5)
    kw = {"model": model, "optimizer": opt, "lr_scheduler": None, "train_dataloader": None}
    cb.on_init_end(args, state, control, **kw)
    cb.on_train_begin(args, state, control, **kw)
    grads = {}
    for _ in range(state.max_steps):  # the order of Trainer._inner_training_loop
        cb.on_step_begin(args, state, control, **kw)
        model(x).square().mean().backward()
        cb.on_pre_optimizer_step(args, state, control, **kw)
        grads[state.global_step] = model[0].weight.grad.clone()
        opt.step()
        cb.on_optimizer_step(args, state, control, **kw)
        model.zero_grad()
        state.global_step += 1
        cb.on_step_end(args, state, control, **kw)
        cb.on_log(args, state, control, logs={}, **kw)
    cb.on_train_end(args, state, control, **kw)
    t = open_trace(tmp_path / "t")
    assert t.steps == [0, 2, 4] and t.metadata["trainer"] == "transformers.Trainer"
    for s in t.steps:
        np.testing.assert_array_equal(t.read(t.entry(s, "0.weight")), grads[s].numpy())
    assert [s for s in t.steps if t.entries(s, "state.exp_avg")] == [2]  # step 0 has no state yet
    assert t.names("stats.input") == ["0", "2"]
    old = TraceCallback(tmp_path / "u")
    old.on_train_begin(args, state, control, **kw)
    with pytest.raises(RuntimeError, match="on_pre_optimizer_step"):
        old.on_step_end(args, state, control, **kw)
