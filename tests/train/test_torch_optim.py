"""fpsim.train.torch: the emulated optimizers in a live loop, against torch.optim (the oracle,
run in the test on this machine) and against the replay of the gradients they were given."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fpsim.replay import replay  # noqa: E402
from fpsim.replay.optim import AdamW as AdamWRule  # noqa: E402
from fpsim.trace import TorchCapture  # noqa: E402
from fpsim.train import torch as ftorch  # noqa: E402
from fpsim.train._core import unpack  # noqa: E402
from fpsim.train.torch import _as_numpy  # noqa: E402

X = torch.from_numpy(np.random.default_rng(0).standard_normal((512, 16)).astype(np.float32))
Y = torch.from_numpy(np.random.default_rng(1).integers(0, 4, 512))


def _model(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def _batch(s: int):
    i = (s * 32) % 512
    return X[i : i + 32], Y[i : i + 32]


def _loop(model, opt, steps: int, start: int = 0, scaler=None, sched=None, capture=None):
    losses = []
    for s in range(start, start + steps):
        x, y = _batch(s)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        if scaler is None:
            loss.backward()
            if capture is not None:
                capture.step(s + 1, loss=loss, lr=opt.param_groups[0]["lr"])
            opt.step()
        else:
            scaler.scale(loss * (1e6 if s % 4 == 1 else 1)).backward()  # overflows on these steps
            scaler.step(opt)
            scaler.update()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and bool((a.view(-1).view(torch.uint8) == b.view(-1).view(torch.uint8)).all())
    )


def test_fp32_adamw_equals_torch_adamw_over_300_steps():
    runs = []
    for make in (
        lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.05),
        lambda p: ftorch.AdamW(p, lr=3e-3, weight_decay=0.05, config="fp32", sqrt="torch"),
    ):
        m = _model()
        runs.append((_loop(m, make(m.parameters()), 300), list(m.parameters())))
    (la, pa), (lb, pb) = runs
    assert la == lb
    assert all(_same(a.detach(), b.detach()) for a, b in zip(pa, pb))
    assert la[-1] < la[0]  # it trained


@pytest.mark.parametrize(
    "torch_opt, ours",
    [
        (
            lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),
            lambda p: ftorch.Adam(p, lr=1e-2, weight_decay=0.1, sqrt="torch"),
        ),
        (
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
            lambda p: ftorch.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
        ),
        (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8), lambda p: ftorch.SGD(p, lr=0.05, momentum=0.8)),
    ],
    ids=["adam-l2", "sgd-nesterov", "sgd-momentum"],
)
def test_fp32_adam_and_sgd_equal_torch(torch_opt, ours):
    params = []
    for make in (torch_opt, ours):
        m = _model()
        _loop(m, make(m.parameters()), 40)
        params.append(list(m.parameters()))
    assert all(_same(a.detach(), b.detach()) for a, b in zip(*params))


def test_param_groups_and_lr_scheduler_equal_torch():
    params = []
    for cls, kw in ((torch.optim.AdamW, {}), (ftorch.AdamW, {"sqrt": "torch"})):
        m = _model()
        groups = [
            {"params": m[0].parameters(), "lr": 1e-2, "weight_decay": 0.1},
            {"params": m[2].parameters(), "betas": (0.8, 0.99)},
        ]
        opt = cls(groups, lr=3e-3, **kw)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
        _loop(m, opt, 30, sched=sched)
        params.append(list(m.parameters()))
    assert all(_same(a.detach(), b.detach()) for a, b in zip(*params))


def test_grad_scaler_skipped_steps_equal_torch():
    """A huge scale overflows the steps whose loss is boosted: the scaler skips them (no step()
    call), as with torch.optim.AdamW; the update counts stay equal."""
    runs = []
    for cls, kw in ((torch.optim.AdamW, {}), (ftorch.AdamW, {"sqrt": "torch"})):
        m = _model()
        opt = cls(m.parameters(), lr=3e-3, **kw)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=2)
        _loop(m, opt, 30, scaler=scaler)
        runs.append((m, opt, scaler.get_scale()))
    (ma, oa, sa), (mb, ob, sb) = runs
    assert sa == sb
    steps = [int(ob.state[p]["step"]) for p in mb.parameters()]
    assert steps == [int(oa.state[p]["step"]) for p in ma.parameters()] and 0 < steps[0] < 30
    assert all(_same(a.detach(), b.detach()) for a, b in zip(ma.parameters(), mb.parameters()))


@pytest.mark.parametrize(
    "config",
    ["int8-states", "bnb-8bit-all", "fp8-states", "bf16-master-sr", "bf16-master-kahan", "bf16-states"],
)
def test_state_after_each_step_equals_the_replay(tmp_path, config):
    """Record the gradients the emulated optimizer was given; the replay of steps 1..k gives its
    parameters and (decoded) states after step k, bit for bit, for every k."""
    m = _model()
    opt = ftorch.AdamW(m.named_parameters(), lr=1e-2, config=config, seed=7)
    names = [n for n, _ in m.named_parameters()]
    after = []
    with TorchCapture(m, tmp_path / "t", params=True) as cap:
        for k in range(5):
            _loop(m, opt, 1, start=k, capture=cap)
            after.append(_decoded(opt, m, names))
    for k, (params, states) in enumerate(after, start=1):
        res = replay(
            tmp_path / "t", [config], optimizer=AdamWRule(), steps=range(1, k + 1), seed=7, progress=False
        )
        for n in names:
            assert _bits_equal(res.final_params[config][n], params[n]), (k, n)
            for st, v in states[n].items():
                assert _bits_equal(res.final_states[config][n][st], v), (k, n, st)


def _decoded(opt, model, names):
    params, states = {}, {}
    for n, p in zip(names, model.parameters()):
        packed = {k: _as_numpy(v).copy() for k, v in opt.state[p].items() if k not in ("step", "kahan_comp")}
        stored = unpack(opt.config, n, p.numel(), packed, ("exp_avg", "exp_avg_sq"))
        from fpsim.replay.tensorstep import load_states

        states[n] = load_states(opt.config, n, p.numel(), stored, opt.backend)
        params[n] = p.detach().numpy().copy()
    return params, states


def _bits_equal(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(a)
    return a.shape == b.shape and bool(
        (nan == np.isnan(b)).all() and (a.view(np.uint32) == b.view(np.uint32))[~nan].all()
    )


@pytest.mark.parametrize("config", ["int8-states", "bf16-master-kahan", "bf16-states"])
def test_state_dict_resume_equals_uninterrupted(config):
    m = _model()
    opt = ftorch.AdamW(m.parameters(), lr=1e-2, config=config)
    _loop(m, opt, 20)
    whole = [p.detach().clone() for p in m.parameters()]

    m2 = _model()
    opt2 = ftorch.AdamW(m2.parameters(), lr=1e-2, config=config)
    _loop(m2, opt2, 10)
    buf = io.BytesIO()
    torch.save({"model": m2.state_dict(), "opt": opt2.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    m3 = _model(seed=5)
    m3.load_state_dict(saved["model"])
    opt3 = ftorch.AdamW(m3.parameters(), lr=1e-2, config=config)
    opt3.load_state_dict(saved["opt"])
    for p2, p3 in zip(m2.parameters(), m3.parameters()):
        assert opt2.state[p2].keys() == opt3.state[p3].keys()
        assert all(_same(opt2.state[p2][k], opt3.state[p3][k]) for k in opt2.state[p2])
    _loop(m3, opt3, 10, start=10)
    assert all(_same(a, b.detach()) for a, b in zip(whole, m3.parameters()))


@pytest.mark.parametrize("config", ["bf16-states", "int8-states", "msamp-o2"])
def test_state_and_parameter_replaced_between_steps_equal_uninterrupted(config):
    """The optimizer keeps numpy views of each parameter and state tensor between steps (and
    updates small codes in place): a parameter moved to new memory (``p.data = ...``), a
    state loaded into the same optimizer mid-run and state tensors moved to new memory are
    followed, bit for bit, in the parameters and in the state tensors."""
    m = _model()
    opt = ftorch.AdamW(m.parameters(), lr=1e-2, config=config)
    _loop(m, opt, 6)

    m2 = _model()
    opt2 = ftorch.AdamW(m2.parameters(), lr=1e-2, config=config)
    _loop(m2, opt2, 3)
    saved, params = copy.deepcopy(opt2.state_dict()), [p.detach().clone() for p in m2.parameters()]
    _loop(m2, opt2, 1, start=3)  # a step taken, then undone:
    for p, before in zip(m2.parameters(), params):
        p.data = before  # new memory: a kept view of the old one would go stale
    opt2.load_state_dict(saved)  # new state tensors, holding step 3's state
    _loop(m2, opt2, 1, start=3)
    for p in m2.parameters():  # the same state tensors moved to new memory (as .data swaps do)
        for v in opt2.state[p].values():
            v.data = v.data.clone()
    _loop(m2, opt2, 2, start=4)
    for p, p2 in zip(m.parameters(), m2.parameters()):
        assert _same(p.detach(), p2.detach())
        assert opt.state[p].keys() == opt2.state[p2].keys()
        assert all(_same(opt.state[p][k], opt2.state[p2][k]) for k in opt.state[p])


@pytest.mark.parametrize("config", ["bf16-states", "int8-states"])
def test_deepcopy_gives_an_optimizer_that_steps_like_the_original(config):
    """copy.deepcopy of model and optimizer after 3 steps (torch's Optimizer.__getstate__ keeps
    only its own fields: the emulation's settings must travel too): 3 more steps of each give the
    same parameters and states, bit for bit, and the copy holds its own tensors."""
    m = _model()
    opt = ftorch.AdamW(m.parameters(), lr=1e-2, config=config, seed=7)
    _loop(m, opt, 3)
    m2, opt2 = copy.deepcopy((m, opt))
    assert (opt2.config, opt2.seed, opt2.backend) == (opt.config, opt.seed, opt.backend)
    _loop(m, opt, 3, start=3)
    _loop(m2, opt2, 3, start=3)
    for p, p2 in zip(m.parameters(), m2.parameters()):
        assert p.data_ptr() != p2.data_ptr() and _same(p.detach(), p2.detach())
        assert all(_same(opt.state[p][k], opt2.state[p2][k]) for k in opt.state[p])


def test_load_state_dict_refuses_another_configs_state():
    m = _model()
    opt = ftorch.AdamW(m.parameters(), lr=1e-2)
    _loop(m, opt, 1)
    other = ftorch.AdamW(m.parameters(), lr=1e-2, config="int8-states")
    with pytest.raises(ValueError, match="stores .*exp_avg.codes"):
        other.load_state_dict(opt.state_dict())
    torch_opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    _loop(m, torch_opt, 1)
    opt.load_state_dict(torch_opt.state_dict())  # torch's own FP32 state is fp32's layout
    assert _same(opt.state[m[0].weight]["exp_avg"], torch_opt.state[m[0].weight]["exp_avg"])


def test_states_are_stored_as_codes():
    m = _model()
    opt = ftorch.AdamW(m.parameters(), lr=1e-2, config="int8-states")
    _loop(m, opt, 2)
    w = m[0].weight
    st = opt.state[w]
    assert st["exp_avg.codes"].dtype == torch.uint8 and st["exp_avg.codes"].shape == w.shape
    assert st["exp_avg.scales"].dtype == torch.int32 and st["exp_avg.scales"].numel() == -(-w.numel() // 256)
    assert "exp_avg" not in st
    fp32 = ftorch.AdamW(m.parameters(), lr=1e-2)
    _loop(m, fp32, 1)
    assert fp32.state[w]["exp_avg"].dtype == torch.float32


def test_stats_only_when_asked():
    m = _model()
    opt = ftorch.AdamW(m.parameters(), lr=1e-2, config="int8-states")
    _loop(m, opt, 2)
    assert opt.last_stats is None
    opt = ftorch.AdamW(m.parameters(), lr=1e-2, config="int8-states", stats=True)
    _loop(m, opt, 2)
    s = opt.last_stats
    assert s.states > 0 and 0 <= s.zero_share <= 1 and 0 < s.update_ratio < 1 and s.updates > 0
    assert set(s.per_tensor) == {"0.0", "0.1", "0.2", "0.3"}


def test_bad_arguments_are_refused():
    p = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(ValueError, match="unknown config 'nope'"):
        ftorch.AdamW(p, config="nope")
    with pytest.raises(ValueError, match="scales gradients"):
        ftorch.AdamW(p, config="fp16-grads-dynamic")
    with pytest.raises(ValueError, match="amsgrad"):
        ftorch.AdamW(p, amsgrad=True)
    with pytest.raises(ValueError, match="betas"):
        ftorch.AdamW(p, betas=(1.5, 0.9))
    with pytest.raises(ValueError, match="sqrt must be one of"):
        ftorch.Adam(p, sqrt="fast")
    q = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = ftorch.AdamW([q])
    q.grad = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="float32 parameters"):
        opt.step()


@pytest.mark.parametrize("config", ["int8-states", "bf16-master-sr"])
def test_kernel_path_equals_cpu_path(config):
    """The CUDA path's tensor-step (the Triton kernel, here in its CPU interpreter) gives the
    CPU path's bits."""
    from fpsim.replay.storage import master_seed
    from fpsim.train.cuda import kernel_step

    m = _model()
    opt = ftorch.AdamW(m.named_parameters(), lr=1e-2, config=config, seed=3)
    _loop(m, opt, 3)
    w = m[0].weight
    name, rule = "0.weight", opt._rule(opt.param_groups[0])
    state = {k: v.clone() for k, v in opt.state[w].items()}
    p = w.detach().clone()
    p.grad = w.grad.clone()
    t = int(state["step"]) + 1
    assert kernel_step(opt.config, rule, name, state, p, 1e-2, t, master_seed(3, t, name))
    opt.step()  # the CPU path, same gradient
    for k, v in opt.state[w].items():
        if k != "step":
            assert _same(v, state[k]), k
    assert _same(w.detach(), p)
