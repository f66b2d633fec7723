"""Loss scalers against their libraries, step by step over sequences of overflow (1) and clean
(0) steps that back off, grow, spend the hysteresis and reach the floor.

- torch: fpsim's LossScaler against torch itself, the kernel ``torch._amp_update_scale_``
  (aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp) and a real ``torch.amp.GradScaler("cpu")``
  over a tiny model whose input is made infinite on the overflow steps; ``inv_scale`` against
  ``scaler._scale.double().reciprocal().float()`` and the gradients ``unscale_`` leaves.
- DeepSpeed and Megatron-LM are not installed: each is transcribed below, literally (logging,
  ``dist`` and the CUDA device removed), from the cited file and lines.
"""

from __future__ import annotations

import doctest
from dataclasses import dataclass

import numpy as np
import pytest

from fpsim.emulate.blocks import BlockCodes
from fpsim.emulate.delayed import DelayedScaling, EncodedTensor, FP8ScalingPolicy
from fpsim.replay import lossscale
from fpsim.replay.lossscale import (
    DeepSpeedDynamicLossScaler,
    LossScaler,
    LossScalerPolicy,
    MegatronDynamicGradScaler,
)

FLT_MAX = float(np.finfo(np.float32).max)


def _random(seed: int, n: int = 60, p: float = 0.35) -> tuple[int, ...]:
    return tuple(int(b) for b in np.random.default_rng(seed).random(n) < p)


PATTERNS = {
    "clean": (0,) * 14,
    "overflows": (1,) * 14,
    "mixed": (0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0),
    "pairs": (1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0),
    **{f"random{seed}": _random(seed) for seed in range(3)},
}


def _run(scaler, pattern):
    """States of fpsim's scaler: the first, then the one after each step."""
    states = [scaler.init()]
    for overflow in pattern:
        states.append(scaler.update(states[-1], bool(overflow)))
    return states


# --- torch.amp.GradScaler ------------------------------------------------------------------

# (init_scale, growth_factor, backoff_factor, growth_interval): odd factors, factors near 1,
# scales near FLT_MAX (growth kept only when finite) and near the subnormals (backoff to 0).
TORCH_CASES = [
    (1700.0, 2.0, 0.3, 1),
    (1700.0, 1.7, 0.3, 2),
    (2.0**16, 2.0, 0.5, 3),
    (12345.678, 1.0001, 0.9999, 1),
    (0.1, 1.3, 0.7, 2),
    (3.0e38, 1.7, 0.3, 1),
    (FLT_MAX, 2.0, 0.5, 1),
    (FLT_MAX / 1.7, 1.7, 0.999, 2),
    (FLT_MAX / 1.0001, 1.0001, 0.9, 3),
    (1e-40, 1.0001, 0.1, 3),
]


def _torch_kernel(pattern, init, growth, backoff, interval):
    """(scale, inv_scale, growth_tracker) before every step and after the last, from torch:
    GradScaler's lazy init (``torch.full(..., float32)``), ``unscale_``'s inv_scale and
    ``update``'s call of ``torch._amp_update_scale_`` (torch/amp/grad_scaler.py)."""
    torch = pytest.importorskip("torch")
    scale = torch.full((), init, dtype=torch.float32)
    tracker = torch.full((), 0, dtype=torch.int32)
    out = []
    for overflow in (*pattern, None):
        out.append((scale.item(), scale.double().reciprocal().float().item(), tracker.item()))
        if overflow is not None:
            found_inf = torch.full((), float(overflow), dtype=torch.float32)
            torch._amp_update_scale_(scale, tracker, found_inf, growth, backoff, interval)
    return out


@pytest.mark.parametrize("pattern", PATTERNS.values(), ids=PATTERNS.keys())
@pytest.mark.parametrize("case", TORCH_CASES, ids=[f"{c[0]:.4g}-{c[1]}-{c[2]}-{c[3]}" for c in TORCH_CASES])
def test_torch_scaler_equals_amp_update_scale(case, pattern):
    init, growth, backoff, interval = case
    mine = LossScaler(init_scale=init, growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    got = [(s.scale, float(s.inv_scale), s.growth_tracker) for s in _run(mine, pattern)]
    assert got == _torch_kernel(pattern, init, growth, backoff, interval)


def test_torch_backoff_multiplies_by_the_double_factor():
    """Issue 16's example: float32(1700 * 0.3) rounded once is 510 exactly; with the factor
    rounded to float32 first it would be 510.0000305."""
    mine = LossScaler(init_scale=1700.0, backoff_factor=0.3)
    assert mine.update(mine.init(), True).scale == 510.0
    assert float(np.float32(1700) * np.float32(0.3)) == pytest.approx(510.0000305, abs=1e-7)
    assert _torch_kernel((1,), 1700.0, 2.0, 0.3, 2000)[1][0] == 510.0


def test_torch_growth_past_flt_max_keeps_the_scale():
    mine = LossScaler(init_scale=FLT_MAX, growth_interval=1)
    assert [s.scale for s in _run(mine, (0, 0, 1, 0))] == [FLT_MAX, FLT_MAX, FLT_MAX, FLT_MAX / 2, FLT_MAX]


REAL_CASES = [(1700.0, 1.7, 0.3, 1), (2.0**10, 2.0, 0.5, 3), (333.3, 1.0001, 0.9999, 2), (0.7, 3.1, 0.11, 2)]


@pytest.mark.parametrize("pattern", [PATTERNS["mixed"], PATTERNS["random1"]], ids=["mixed", "random1"])
@pytest.mark.parametrize("case", REAL_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in REAL_CASES])
def test_torch_scaler_equals_a_real_gradscaler(case, pattern):
    """A tiny linear model trained with a real GradScaler; on the overflow steps its input is
    inf. Per step: the same scale, the same inv_scale (``unscale_``'s, and the gradients
    unscale_ leaves are the scaled ones times it), the same skipped steps."""
    torch = pytest.importorskip("torch")
    init, growth, backoff, interval = case
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kw = dict(init_scale=init, growth_factor=growth, backoff_factor=backoff, growth_interval=interval)
    scaler = torch.amp.GradScaler("cpu", **kw)
    mine = LossScaler(**kw)
    state = mine.init()
    for overflow in pattern:
        x = torch.full((2, 3), float("inf")) if overflow else torch.randn(2, 3)
        opt.zero_grad()
        scaler.scale(model(x).square().mean()).backward()
        scaled = [p.grad.detach().numpy().copy() for p in model.parameters()]
        before = [p.detach().clone() for p in model.parameters()]
        assert state.scale == scaler._scale.item()
        assert state.inv_scale == scaler._scale.double().reciprocal().float().item()
        scaler.unscale_(opt)
        for g, p in zip(scaled, model.parameters()):
            np.testing.assert_array_equal(p.grad.numpy(), g * state.inv_scale)
        scaler.step(opt)
        scaler.update()
        skipped = all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))
        assert skipped == bool(overflow)
        state = mine.update(state, bool(overflow))
        assert state.scale == scaler.get_scale()


def test_static_scaler_never_changes():
    mine = LossScaler(dynamic=False, init_scale=1700.3)
    assert {s for s in _run(mine, PATTERNS["random0"])} == {mine.init()}
    assert mine.init().scale == float(np.float32(1700.3))


# --- DeepSpeed DynamicLossScaler -----------------------------------------------------------


class _DeepSpeedDynamicLossScaler:
    """deepspeed/runtime/fp16/loss_scaler.py, DeepSpeed commit edaa722 (0.19.6.dev):
    ``DynamicLossScaler.__init__`` (lines 213-233) and ``update_scale`` (lines 264-299), the
    logging and ``dist.get_rank()`` checks removed, ``dtype`` dropped."""

    def __init__(
        self,
        init_scale,
        scale_window,
        min_scale,
        delayed_shift,
        consecutive_hysteresis,
        raise_error_at_min_scale=True,
    ):
        self.cur_scale = init_scale  # LossScalerBase.__init__
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.dynamic = True

    # `overflow` is boolean indicating whether the gradient overflowed
    def update_scale(self, overflow):
        if overflow:
            # self.cur_scale /= self.scale_factor
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if (self.cur_scale == self.min_scale) and self.raise_error_at_min_scale:
                    raise Exception(
                        "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
                    )
                else:
                    next_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
                    self.cur_scale = next_scale
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift

            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if (stable_interval > 0) and (stable_interval % self.scale_window == 0):
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1


def _zero_step(ds, overflow, grad):
    """deepspeed/runtime/zero/stage_1_and_2.py (same commit) ``step`` (lines 2293-2294:
    ``prev_scale = self.loss_scale; self._update_scale(self.overflow)``, an overflow returns)
    then ``unscale_and_clip_grads`` (lines 2434-2449, ``clip_grad`` 0: ``combined_scale =
    self.loss_scale``; ``grad.data.mul_(1. / combined_scale)``). Returns the unscaled grad."""
    ds.update_scale(overflow)
    if overflow:
        return None
    combined_scale = ds.cur_scale
    grad.data.mul_(1.0 / combined_scale)
    return grad


# (init_scale, scale_window, min_scale, delayed_shift, consecutive_hysteresis, raise_error_at_min_scale)
DS_CASES = [
    (2**16, 1, 1, 1, False, False),
    (2**16, 2, 1, 2, False, False),
    (2**16, 3, 1, 3, True, False),
    (2**16, 2, 1, 2, True, True),
    (8, 2, 1, 2, False, True),
    (8, 1, 1, 1, False, False),
    (4, 1, 1, 1, False, True),
    (1700.5, 2, 3, 2, True, True),
    (1700.5, 1, 3, 1, False, False),
    (0.1, 1, 0.01, 1, False, False),
]


def _ds_reference(case, pattern):
    """(scale, cur_iter, last_overflow_iter, cur_hysteresis) before every step and after the
    last, or the step at which update_scale raises (then the list stops there)."""
    ds = _DeepSpeedDynamicLossScaler(*case)
    out = []
    for overflow in (*pattern, None):
        out.append((ds.cur_scale, ds.cur_iter, ds.last_overflow_iter, ds.cur_hysteresis))
        if overflow is not None:
            try:
                ds.update_scale(bool(overflow))
            except Exception as e:  # DeepSpeed raises a bare Exception
                return out, str(e)
    return out, None


def _ds_scaler(case):
    names = ("init_scale", "scale_window", "min_scale", "delayed_shift", "consecutive_hysteresis")
    return DeepSpeedDynamicLossScaler(**dict(zip(names, case[:5])), raise_error_at_min_scale=case[5])


@pytest.mark.parametrize("pattern", PATTERNS.values(), ids=PATTERNS.keys())
@pytest.mark.parametrize("case", DS_CASES, ids=["-".join(map(str, c)) for c in DS_CASES])
def test_deepspeed_scaler_equals_dynamic_loss_scaler(case, pattern):
    want, error = _ds_reference(case, pattern)
    mine = _ds_scaler(case)
    state, got = mine.init(), []
    for overflow in (*pattern, None):
        got.append((state.scale, state.cur_iter, state.last_overflow_iter, state.cur_hysteresis))
        if overflow is None or len(got) == len(want) and error:
            break
        state = mine.update(state, bool(overflow))
    assert got == want
    if error:
        with pytest.raises(RuntimeError, match="^" + error + "$"):
            mine.update(state, True)


def test_deepspeed_cases_reach_hysteresis_floor_error_and_growth():
    """The cases above do what they are there for: the hysteresis absorbs an overflow, the
    scale reaches min_scale, DeepSpeed raises there, and the scale grows."""
    absorbed = floor = raised = grew = False
    for case in DS_CASES:
        for pattern in PATTERNS.values():
            want, error = _ds_reference(case, pattern)
            raised |= error is not None
            floor |= any(s == case[2] for s, *_ in want)
            grew |= any(b[0] > a[0] for a, b in zip(want, want[1:]))
            absorbed |= any(b[3] < a[3] for a, b in zip(want, want[1:]))
    assert absorbed and floor and raised and grew


@pytest.mark.parametrize("case", DS_CASES[:4] + DS_CASES[7:], ids=lambda c: "-".join(map(str, c)))
def test_deepspeed_inv_scale_is_zeros_unscale_after_the_update(case):
    """ZeRO updates the scale before it unscales: on a clean step the gradients are
    multiplied by float32(1 / the updated scale) (torch casts the Python scalar to float32);
    on a step that grows the scale that is half the scale the loss was multiplied by."""
    torch = pytest.importorskip("torch")
    pattern = PATTERNS["random2"]
    ds, mine = _DeepSpeedDynamicLossScaler(*case[:5], False), _ds_scaler(case[:5] + (False,))
    state = mine.init()
    grads = np.random.default_rng(1).standard_normal(len(pattern)).astype(np.float32) * 1e3
    for overflow, g in zip(pattern, grads):
        loss_scale = ds.cur_scale
        unscaled = _zero_step(ds, bool(overflow), torch.tensor([g]))
        assert state.scale == loss_scale
        if unscaled is not None:
            assert np.float32(g) * state.inv_scale == unscaled.item()
        state = mine.update(state, bool(overflow))


def test_deepspeed_growth_step_unscales_by_the_grown_scale():
    mine = DeepSpeedDynamicLossScaler(init_scale=4.0, scale_window=1)
    states = _run(mine, (0, 0, 0))
    assert [s.scale for s in states] == [4.0, 4.0, 8.0, 16.0]
    assert [float(s.inv_scale) for s in states] == [0.25, 0.125, 0.0625, 0.03125]


def test_deepspeed_defaults_and_config():
    """The defaults of DeepSpeed's fp16 config (deepspeed/runtime/precision_config.py
    DeepSpeedFP16Config; constants.py FP16_*_DEFAULT) and its keys."""
    default = DeepSpeedDynamicLossScaler()
    assert (default.init_scale, default.scale_window, default.min_scale) == (2.0**16, 1000, 1)
    assert (default.delayed_shift, default.consecutive_hysteresis, default.raise_error_at_min_scale) == (
        2,
        False,
        True,
    )
    assert DeepSpeedDynamicLossScaler.from_config({"enabled": True, "loss_scale": 0}) == default
    cfg = {"initial_scale_power": 12, "loss_scale_window": 50, "hysteresis": 3, "min_loss_scale": 2}
    got = DeepSpeedDynamicLossScaler.from_config({**cfg, "consecutive_hysteresis": True})
    assert got == DeepSpeedDynamicLossScaler(2.0**12, 50, 2, 3, True)
    with pytest.raises(ValueError, match=r"unknown DeepSpeed fp16 keys \['hysterisis'\]"):
        DeepSpeedDynamicLossScaler.from_config({"hysterisis": 2})
    with pytest.raises(ValueError, match="static loss scaling"):
        DeepSpeedDynamicLossScaler.from_config({"loss_scale": 128})


# --- Megatron-LM DynamicGradScaler ---------------------------------------------------------


class _MegatronDynamicGradScaler:
    """megatron/core/optimizer/grad_scaler.py, Megatron-LM commit d98e8a6:
    ``MegatronGradScaler.__init__`` and ``inv_scale`` (lines 17-29), ``DynamicGradScaler``
    ``__init__`` (lines 84-129) and ``update`` (lines 131-153); ``device='cuda'`` -> the CPU
    (float32 multiplies and max are IEEE on both)."""

    def __init__(self, initial_scale, min_scale, growth_factor, backoff_factor, growth_interval, hysteresis):
        import torch

        assert initial_scale > 0.0
        self._scale = torch.tensor([initial_scale], dtype=torch.float)
        assert min_scale > 0.0
        assert min_scale <= initial_scale
        self.min_scale = torch.tensor([min_scale], dtype=torch.float)
        assert growth_factor > 1.0
        self.growth_factor = torch.tensor([growth_factor], dtype=torch.float)
        assert backoff_factor < 1.0
        assert backoff_factor > 0.0
        self.backoff_factor = torch.tensor([backoff_factor], dtype=torch.float)
        assert growth_interval > 0
        self.growth_interval = growth_interval
        assert hysteresis > 0
        self.hysteresis = hysteresis
        self._growth_tracker = 0
        self._hysteresis_tracker = self.hysteresis

    @property
    def inv_scale(self):
        return self._scale.double().reciprocal().float()

    def update(self, found_inf: bool):
        import torch

        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self._scale = torch.max(self._scale * self.backoff_factor, self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                self._scale = self._scale * self.growth_factor


# (initial_scale, min_scale, growth_factor, backoff_factor, growth_interval, hysteresis)
MEGATRON_CASES = [
    (2.0**32, 1.0, 2.0, 0.5, 1000, 2),
    (2.0**32, 1.0, 2.0, 0.5, 1, 2),
    (1700.0, 7.3, 1.7, 0.3, 2, 2),
    (1700.0, 7.3, 1.7, 0.3, 1, 1),
    (100.0, 99.9, 1.0001, 0.999, 3, 3),
    (12345.678, 0.1, 1.0001, 0.9999, 2, 1),
    (3.0e38, 1.0, 2.0, 0.5, 1, 1),
    (FLT_MAX / 1.7, 1e30, 1.7, 0.3, 2, 2),
    (1e-30, 1e-38, 1.3, 0.1, 1, 2),
]


@pytest.mark.parametrize("pattern", PATTERNS.values(), ids=PATTERNS.keys())
@pytest.mark.parametrize(
    "case", MEGATRON_CASES, ids=["-".join(f"{v:.4g}" for v in c) for c in MEGATRON_CASES]
)
def test_megatron_scaler_equals_dynamic_grad_scaler(case, pattern):
    pytest.importorskip("torch")
    ref = _MegatronDynamicGradScaler(*case)
    want = []
    for overflow in (*pattern, None):
        item = (ref._scale.item(), ref.inv_scale.item(), ref._growth_tracker, ref._hysteresis_tracker)
        want.append(item)
        if overflow is not None:
            ref.update(bool(overflow))
    got = [
        (s.scale, float(s.inv_scale), s.growth_tracker, s.hysteresis_tracker)
        for s in _run(MegatronDynamicGradScaler(*case), pattern)
    ]
    assert got == want


def test_megatron_backoff_is_float32_arithmetic_and_growth_may_reach_inf():
    """max(f32(1700 * f32(0.3)), f32(min)): 510.0000305 where torch's GradScaler gives 510;
    growth past FLT_MAX gives inf, which then stays (inf * 0.5 is inf)."""
    mine = MegatronDynamicGradScaler(initial_scale=1700.0, backoff_factor=0.3, hysteresis=1)
    assert mine.update(mine.init(), True).scale == float(np.float32(1700) * np.float32(0.3)) != 510.0
    big = MegatronDynamicGradScaler(initial_scale=3.0e38, growth_interval=1, hysteresis=1)
    assert [s.scale for s in _run(big, (0, 1, 1, 0))] == [float(np.float32(3.0e38)), *[np.inf] * 4]
    assert _run(big, (0,))[-1].inv_scale == 0


def test_megatron_defaults():
    """OptimizerConfig (megatron/core/optimizer/optimizer_config.py: initial_loss_scale 2**32,
    min_loss_scale 1.0, loss_scale_window 1000, hysteresis 2) and the factors 2.0 / 0.5 that
    _get_megatron_optimizer_based_on_param_groups (megatron/core/optimizer/__init__.py) passes."""
    assert MegatronDynamicGradScaler() == MegatronDynamicGradScaler(2.0**32, 1.0, 2.0, 0.5, 1000, 2)


# --- validation ----------------------------------------------------------------------------

BAD = [
    (LossScaler, "init_scale", 0.0),
    (LossScaler, "growth_factor", 1.0),
    (LossScaler, "backoff_factor", 1.0),
    (LossScaler, "backoff_factor", 0.0),
    (LossScaler, "growth_interval", 0),
    (LossScaler, "growth_interval", 2.0),
    (DeepSpeedDynamicLossScaler, "init_scale", float("inf")),
    (DeepSpeedDynamicLossScaler, "scale_window", 0),
    (DeepSpeedDynamicLossScaler, "min_scale", 0),
    (DeepSpeedDynamicLossScaler, "delayed_shift", 0),
    (DeepSpeedDynamicLossScaler, "scale_factor", 0.5),
    (MegatronDynamicGradScaler, "initial_scale", -1.0),
    (MegatronDynamicGradScaler, "min_scale", 0.0),
    (MegatronDynamicGradScaler, "min_scale", 2.0**33),
    (MegatronDynamicGradScaler, "growth_factor", 0.9),
    (MegatronDynamicGradScaler, "backoff_factor", 1.5),
    (MegatronDynamicGradScaler, "growth_interval", -3),
    (MegatronDynamicGradScaler, "hysteresis", 0),
    (MegatronDynamicGradScaler, "hysteresis", True),
]


@pytest.mark.parametrize(("cls", "name", "value"), BAD, ids=[f"{c.__name__}-{n}-{v}" for c, n, v in BAD])
def test_bad_argument_raises_naming_it(cls, name, value):
    with pytest.raises(ValueError, match=f"^{name} must"):
        cls(**{name: value})


# --- the Protocols -------------------------------------------------------------------------


def test_scalers_and_delayed_scaling_meet_their_protocols():
    for scaler in (LossScaler(), DeepSpeedDynamicLossScaler(), MegatronDynamicGradScaler()):
        assert isinstance(scaler, LossScalerPolicy)
        state = scaler.init()
        assert isinstance(state.scale, float) and isinstance(state.inv_scale, np.float32)
    ds = DelayedScaling(history_len=4)
    assert isinstance(ds, FP8ScalingPolicy)
    assert not isinstance(LossScaler(), FP8ScalingPolicy) and not isinstance(ds, LossScalerPolicy)
    codes, _ = ds.step(ds.init(), np.ones(3, np.float32))
    encoded: EncodedTensor = codes
    assert encoded.scales.view(np.float32)[0] == 1


def test_module_docstring_example_runs():
    assert doctest.testmod(lossscale, raise_on_error=True).attempted > 0


def _write_trace(path, grads):
    from fpsim.trace import TraceWriter

    with TraceWriter(path) as w:
        for s, g in enumerate(grads, 1):
            tensors = {"grad": {"w": g}, **({"param": {"w": np.ones_like(g)}} if s == 1 else {})}
            w.write_step(s, tensors, lr=1e-3)
    return path


def test_replay_drives_each_scaler_and_a_policy_of_ones_own(tmp_path):
    """replay() with each scaler (and an FP8 policy of one's own that wraps DelayedScaling): the
    recorded scale and skipped steps are the scaler's own trajectory over the steps whose
    gradient holds an inf, and the wrapped policy replays as DelayedScaling itself."""
    from fpsim.replay import ReplayConfig, replay

    pattern = (0, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0)
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(16).astype(np.float32) * 1e-3 for _ in pattern]
    for g, overflow in zip(grads, pattern):
        g[3] = np.inf if overflow else g[3]
    trace = _write_trace(tmp_path / "t", grads)
    scalers = {
        "torch": LossScaler(init_scale=2.0**10, growth_factor=1.7, backoff_factor=0.3, growth_interval=2),
        "deepspeed": DeepSpeedDynamicLossScaler(init_scale=2.0**10, scale_window=2),
        "megatron": MegatronDynamicGradScaler(initial_scale=2.0**10, growth_interval=2, backoff_factor=0.3),
    }

    @dataclass(frozen=True)
    class Wrapped:
        inner: DelayedScaling

        @property
        def element(self):
            return self.inner.element

        def init(self):
            return self.inner.init()

        def step(self, state, g):
            enc, new = self.inner.step(state, g)
            return BlockCodes(enc.codes, enc.scales), new

    delayed = DelayedScaling("float8_e5m2", history_len=3)
    configs = [ReplayConfig(n, grad="float16", loss_scaler=s) for n, s in scalers.items()]
    configs += [ReplayConfig("te", grad_delayed=delayed), ReplayConfig("mine", grad_delayed=Wrapped(delayed))]
    r = replay(trace, configs, progress=False)
    for name, scaler in scalers.items():
        per = r.per_step(name)
        assert [p["loss_scale"] for p in per] == [s.scale for s in _run(scaler, pattern)[:-1]]
        assert [p["skipped"] for p in per] == list(pattern)
    np.testing.assert_equal(r.per_step("mine"), r.per_step("te"))
