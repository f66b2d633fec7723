"""TorchCapture finds the torch optimizer inside the wrappers it is given (torch's schedulers and
swa_utils here; accelerate's in tests/trace/test_hf_trainer.py, Lightning's in
tests/train/test_frameworks.py) and says which wrapper hides what it cannot use."""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.trace import TorchCapture, open_trace
from fpsim.trace.wrappers import torch_optimizer

torch = pytest.importorskip("torch")


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def test_schedulers_and_swalr_are_unwrapped_to_their_optimizer(tmp_path):
    model, opt = _setup()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    swa = torch.optim.swa_utils.SWALR(opt, swa_lr=0.005)
    assert torch_optimizer(sched, model) is opt and torch_optimizer(swa, model) is opt
    assert torch_optimizer(opt, model) is opt
    x = torch.randn(16, 4)
    seen = {}
    with TorchCapture(model, tmp_path / "t", optimizer=sched) as cap:  # the scheduler given by mistake
        for step in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            cap.step(step)
            seen[step] = {
                n: opt.state[p]["exp_avg"].clone() for n, p in model.named_parameters() if p in opt.state
            }
            opt.step()
            sched.step()
    t = open_trace(tmp_path / "t")
    assert t.metadata["optimizer"] == "Adam" and [t.update(s) for s in t.steps] == [1, 2, 3]
    assert [t.lr(s) for s in t.steps] == [0.01, 0.005, 0.0025]
    assert t.entries(0, "state.exp_avg") == [] and seen[0] == {}
    for step in (1, 2):
        for name, want in seen[step].items():
            np.testing.assert_array_equal(t.read(t.entry(step, name, "state.exp_avg")), want.numpy())


def test_what_cannot_be_unwrapped_is_an_error_naming_the_wrappers(tmp_path):
    model, opt = _setup()
    with pytest.raises(TypeError, match="got object, which is not an initialized torch.optim.Optimizer"):
        TorchCapture(model, tmp_path / "t", optimizer=object())
    averaged = torch.optim.swa_utils.AveragedModel(model)  # a copy: not the optimizer's parameters
    swa = torch.optim.swa_utils.SWALR(opt, swa_lr=0.005)
    with pytest.raises(TypeError, match="the optimizer inside SWALR > Adam updates none of the model's"):
        TorchCapture(averaged, tmp_path / "t", optimizer=swa)
