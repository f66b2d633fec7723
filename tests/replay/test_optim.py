"""Optimizer math: the exact fma, and agreement with torch.optim on recorded steps."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from fpsim.emulate.reference import encode_scalar
from fpsim.replay.optim import SGD, Adam, AdamW, Sqrt, fma32, get_optimizer


def test_fma32_is_one_rounding_of_the_exact_value():
    """Against exact rationals rounded by the scalar reference tier, incl. cancellation, ties
    and huge exponent gaps (where a float64 sum alone would round twice)."""
    rng = np.random.default_rng(0)
    n = 6000
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    c = (rng.standard_normal(n) * np.exp(rng.normal(0, 12, n))).astype(np.float32)
    c[:1500] = -(a[:1500].astype(np.float64) * b[:1500]).astype(np.float32)  # near-cancellation
    # products at the midpoint of two float32 values plus a tiny c: the tie must break by c
    a[1500:2000] = np.float32(1 + 2**-12)
    b[1500:2000] = np.float32(1 + 2**-12)  # a*b = 1 + 2**-11 + 2**-24: a float32 tie
    c[1500:2000] = (rng.choice([-1, 1], 500) * 2.0 ** rng.integers(-60, -30, 500)).astype(np.float32)
    got = fma32(a, b, c)
    want = [
        encode_scalar(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)), "float32")
        for x, y, z in zip(a, b, c)
    ]
    np.testing.assert_array_equal(got.view(np.uint32), np.array(want, np.uint32))
    naive = (a.astype(np.float64) * b + c).astype(np.float32)
    assert np.count_nonzero(naive != got) > 0  # the cases where float64 alone rounds twice


def test_get_optimizer_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown optimizer 'lion'; allowed: adam, adamw, sgd"):
        get_optimizer("lion")


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in float32 units in the last place (sign-magnitude order)."""
    ia, ib = (x.view(np.int32).astype(np.int64) for x in (a, b))
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.abs(ia - ib).max(initial=0))


def test_sqrt_choice_resolves_names():
    """``sqrt`` takes a Sqrt or its name, resolved when the optimizer is made; other names are
    refused by name; optimizers without a square root ignore the choice."""
    assert Adam(sqrt="torch").sqrt is Sqrt.TORCH and AdamW().sqrt is Sqrt.IEEE
    assert AdamW().with_sqrt(Sqrt.TORCH) == AdamW(sqrt="torch")
    assert SGD().with_sqrt(Sqrt.TORCH) == SGD()
    with pytest.raises(ValueError, match="sqrt must be one of ieee, torch; got 'fast'"):
        Adam(sqrt="fast")


def test_numpy_sqrt_is_correctly_rounded():
    """fpsim's optimizers take float32 square roots with ``np.sqrt``, which IEEE 754 (section
    5.4.1) requires to be correctly rounded; checked against float64 sqrt rounded once (exact
    for sqrt: float64 has more than 2 * 24 + 2 bits), on random values, subnormals and the
    neighbours of perfect squares. (torch's CPU sqrt is not correctly rounded, and how often
    it misrounds depends on the SIMD kernel it picks: the tests compare with torch's result on
    the machine at hand, never with a count.)"""
    rng = np.random.default_rng(0)
    sq = np.arange(1, 4097, dtype=np.float32) ** 2
    x = np.concatenate(
        [
            np.abs(rng.standard_normal(100_000)).astype(np.float32),
            rng.integers(1, 1 << 23, 10_000).astype(np.uint32).view(np.float32),  # subnormals
            np.nextafter(sq, np.float32(0)),
            sq,
            np.nextafter(sq, np.float32(np.inf)),
        ]
    )
    exact = np.sqrt(x.astype(np.float64)).astype(np.float32)
    mismatch = np.flatnonzero(np.sqrt(x).view(np.uint32) != exact.view(np.uint32))
    assert mismatch.size == 0, x[mismatch[:5]]


def _torch_step(opt, p, g, states, lr, t):
    import torch

    tp = torch.from_numpy(p.copy()).requires_grad_()
    tp.grad = torch.from_numpy(g.copy())
    if opt.name == "sgd":
        topt = torch.optim.SGD(
            [tp], lr=lr, momentum=opt.momentum, weight_decay=opt.weight_decay, foreach=False
        )
        topt.state[tp] = {"momentum_buffer": torch.from_numpy(states["momentum_buffer"].copy())}
    else:
        cls = torch.optim.AdamW if opt.name == "adamw" else torch.optim.Adam
        topt = cls([tp], lr=lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay, foreach=False)
        topt.state[tp] = {
            "step": torch.tensor(float(t - 1)),
            "exp_avg": torch.from_numpy(states["exp_avg"].copy()),
            "exp_avg_sq": torch.from_numpy(states["exp_avg_sq"].copy()),
        }
    topt.step()
    return tp.detach().numpy(), {k: topt.state[tp][k].numpy() for k in opt.states}


OPTS = [Adam(), Adam(weight_decay=0.1), AdamW(weight_decay=0.1), SGD(), SGD(weight_decay=0.01)]


@pytest.mark.parametrize("opt", OPTS, ids=repr)
def test_one_step_against_torch(opt):
    """States bit-identical to torch; parameters too with torch's sqrt (``Sqrt.TORCH``, on
    either backend: the compiled loop declines it; so the only difference is the correctly
    rounded sqrt). With fpsim's own sqrt the parameters
    differ by at most 2 ulps of the larger of the update and the new value (measured on
    100k elements; plain ulps of the result grow where p + update cancels)."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    n = 100_000
    p = rng.standard_normal(n).astype(np.float32)
    g = (rng.standard_normal(n) * np.exp(rng.normal(-5, 3, n))).astype(np.float32)
    states = {
        "exp_avg": (g * 0.3 + rng.standard_normal(n).astype(np.float32) * 1e-4).astype(np.float32),
        "exp_avg_sq": (g * g * 2).astype(np.float32),
        "momentum_buffer": g[::-1].copy(),
    }
    t, lr = 7, 3e-3
    mine = {k: states[k] for k in opt.states}
    want_p, want_s = _torch_step(opt, p, g, states, lr, t)
    new_p, new_s = opt.step(p.copy(), g, mine, lr, t)
    for k in opt.states:
        assert ulps(new_s[k], want_s[k]) == 0, k
    q = np.abs(want_p.astype(np.float64) - p).astype(np.float32)
    unit = np.maximum(np.spacing(q), np.spacing(np.abs(want_p)))
    assert np.max(np.abs(new_p.astype(np.float64) - want_p) / unit) <= (0 if opt.name == "sgd" else 2)
    for backend in ("compiled", "numpy"):
        new_p, _ = opt.with_sqrt(Sqrt.TORCH).step(p.copy(), g, mine, lr, t, backend=backend)
        assert ulps(new_p, want_p) == 0, backend


def _torch_run(trace, first, last, opt):
    """torch.optim run here, on this machine, from the params and states recorded at ``first``
    over the recorded gradients of steps first..last-1 (each update at its recorded lr)."""
    pytest.importorskip("torch")
    out = {}
    for name in trace.names("param"):
        p = trace.read(trace.entry(first, name, "param"))
        states = {k: trace.read(trace.entry(first, name, f"state.{k}")) for k in opt.states}
        for t in range(first, last):
            g = trace.read(trace.entry(t, name, "grad"))
            p, states = _torch_step(opt, p, g, states, trace.lr(t), t)
        out[name] = p, states
    return out


def _replay_vs_torch(trace, first, last, opt):
    """The FP32 replay of steps first..last-1 against torch run on this machine: states bit for
    bit, and parameters bit for bit once the replay uses torch's sqrt (torch's CPU float32 sqrt
    is not correctly rounded, and how it misrounds depends on the CPU's SIMD width, so with
    fpsim's correctly rounded sqrt the parameters differ in the last bits)."""
    from fpsim.replay import replay

    want = _torch_run(trace, first, last, opt)
    for sqrt in ("ieee", "torch"):
        r = replay(trace, ["fp32"], optimizer=opt, steps=range(first, last), progress=False, sqrt=sqrt)
        for name, (p, states) in want.items():
            assert np.array_equal(r.final_params["fp32"][name], r.final_params["reference"][name])
            for k in opt.states:
                assert ulps(r.final_states["reference"][name][k], states[k]) == 0, (sqrt, name, k)
            if sqrt == "torch":
                assert ulps(r.final_params["reference"][name], p) == 0, name


def test_fp32_replay_reproduces_torch_adam_on_the_bundled_trace():
    """Steps 191..199 of the sample trace (Adam, recorded every step), 9 updates."""
    from fpsim.trace import open_trace, sample_trace_path

    trace = open_trace(sample_trace_path())
    _replay_vs_torch(trace, 191, 200, Adam())
    # The states the recorded run (on whatever CPU made the sample) reached, bit for bit too:
    # they do not depend on sqrt.
    from fpsim.replay import replay

    r = replay(trace, ["fp32"], optimizer=Adam(), steps=range(191, 200), progress=False)
    for name in trace.names("param"):
        for k in ("exp_avg", "exp_avg_sq"):
            got = r.final_states["reference"][name][k]
            assert ulps(got, trace.read(trace.entry(200, name, f"state.{k}"))) == 0, (name, k)


def test_fp32_replay_reproduces_torch_adamw_on_a_cnn_captured_mid_training(tmp_path):
    """A small CNN trained with AdamW(weight_decay=0.05); capture starts at step 30 (optimizer
    state already warm) and every step is recorded up to 40. The replay equals torch's run."""
    torch = pytest.importorskip("torch")
    from fpsim.trace import TorchCapture, open_trace

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3), torch.nn.GELU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 5)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05, foreach=False)
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 5, (32,))
    with TorchCapture(model, tmp_path / "cnn", params=True, optimizer=opt) as cap:
        for step in range(1, 41):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if step >= 30:
                cap.step(step, lr=2e-3)
            opt.step()
    trace = open_trace(tmp_path / "cnn")
    _replay_vs_torch(trace, 30, 40, AdamW(weight_decay=0.05))
    # and the recorded run itself (the same torch, on this machine), bit for bit
    here = _torch_run(trace, 30, 40, AdamW(weight_decay=0.05))
    for name, (p, _) in here.items():
        assert ulps(p, trace.read(trace.entry(40, name, "param"))) == 0, name


def test_step_writes_into_out_and_checks_it():
    """``out=`` gives the same values as a plain step, written into the given arrays; arrays
    of the wrong dtype or shape are refused by name."""
    rng = np.random.default_rng(9)
    p, g = (
        rng.standard_normal((3, 70000)).astype(np.float32),
        rng.standard_normal((3, 70000)).astype(np.float32),
    )
    states = {"exp_avg": g * np.float32(0.1), "exp_avg_sq": g * g}
    want_p, want_s = AdamW().step(p, g, states, 1e-3, 4)
    out = (np.empty_like(p), {k: np.empty_like(p) for k in states})
    got_p, got_s = AdamW().step(p, g, states, 1e-3, 4, out=out)
    assert got_p is not None and np.shares_memory(got_p, out[0])
    np.testing.assert_array_equal(got_p.view(np.uint32), want_p.view(np.uint32))
    for k in states:
        np.testing.assert_array_equal(out[1][k].view(np.uint32), want_s[k].view(np.uint32))
    with pytest.raises(ValueError, match=r"out: need float32 arrays of shape \(3, 70000\), got float64"):
        SGD().step(p, g, {}, 0.1, 1, out=(p.astype(np.float64), {"momentum_buffer": np.empty_like(p)}))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Adam(betas=(1.0, 0.999)), "betas must be two numbers in"),
        (lambda: Adam(betas=(0.9,)), "betas must be two numbers in"),
        (lambda: AdamW(eps=-1e-8), "eps must be a finite number >= 0"),
        (lambda: AdamW(weight_decay=float("nan")), "weight_decay must be a finite number >= 0"),
        (lambda: SGD(momentum=-0.1), "momentum must be a finite number >= 0"),
    ],
)
def test_bad_hyper_parameters_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()
    assert Adam(betas=[0.8, 0.99]).betas == (0.8, 0.99)


def test_kept_scalars_tell_signed_zeros_and_types_apart():
    """Adam's scalars are kept per (optimizer, lr, t): values that compare equal but round
    otherwise (-0.0 and 0.0 as lr or eps; a float32 lr, computed in float32) get their own,
    as Python computes them here (the oracle: the documented float64 formula, rounded once)."""
    for lr in (0.0, -0.0, 0.0, np.float32(0.5), 0.5):
        for eps in (0.0, -0.0, 1e-8):
            opt = AdamW(eps=eps)
            sc = opt.scalars(lr, 3)
            want_step = np.float32(-(lr / (1 - 0.9**3)))
            assert sc.neg_step.tobytes() == want_step.tobytes(), (lr, eps)
            assert sc.eps.tobytes() == np.float32(eps).tobytes(), (lr, eps)
            assert sc.decay.tobytes() == np.float32(1 - lr * 0.01).tobytes(), (lr, eps)
