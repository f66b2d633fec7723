"""No silent fallback: a case the compiled backend does not cover (an option, a state format, an
array layout) gives one :class:`fpsim.FallbackWarning` naming it, however often it runs, and
the numpy tier's bits; the numpy backend warns nothing."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import fpsim
from fpsim import Backend, _compiled
from fpsim.replay import ReplayConfig
from fpsim.replay.optim import SGD, Adam, AdamW
from fpsim.train import torch as ftorch

pytest.importorskip("numba")

COMPILED, NUMPY = Backend.COMPILED, Backend.NUMPY


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Every test starts with no case said yet in this process."""
    monkeypatch.setattr(_compiled, "_warned", set())


def _fallbacks(run) -> tuple[list[str], object]:
    """The FallbackWarning messages of ``run()`` and its result."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        with np.errstate(all="ignore"):
            out = run()
    return [str(w.message) for w in got if issubclass(w.category, fpsim.FallbackWarning)], out


def _bits(a) -> np.ndarray:
    a = np.asarray(a, np.float32).reshape(-1)
    return np.where(np.isnan(a), np.uint32(0x7FC00000), a.view(np.uint32))


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    p, g = rng.standard_normal(n).astype(np.float32), (rng.standard_normal(n) * 1e-3).astype(np.float32)
    g[::17] = np.nan
    return p, g, (g * np.float32(0.1)).astype(np.float32), (g * g).astype(np.float32)


@pytest.mark.parametrize(
    ("optimizer", "layout", "case"),
    [
        (AdamW(sqrt="torch"), "flat", "sqrt='torch'"),
        (SGD(momentum=0.9, nesterov=True), "flat", "nesterov=True"),
        (AdamW(), "strided", "not C-contiguous"),
        (SGD(momentum=0.9), "strided", "not C-contiguous"),
    ],
    ids=["adam-torch-sqrt", "sgd-nesterov", "adam-strided", "sgd-strided"],
)
def test_uncovered_optimizer_steps_warn_once(optimizer, layout, case):
    """Three steps of a case the loops do not take: one warning naming it, numpy's bits."""
    p, g, m, v = _data(2 * 301)
    states = {"exp_avg": m, "exp_avg_sq": v} if isinstance(optimizer, Adam) else {"momentum_buffer": m}
    if layout == "strided":
        p, g = p[::2], g[::2]
        states = {k: a[::2] for k, a in states.items()}

    def steps(backend):
        return [optimizer.step(p, g, states, 1e-3, t, backend=backend) for t in (2, 3, 4)]

    said, got = _fallbacks(lambda: steps(COMPILED))
    assert len(said) == 1 and case in said[0] and "numpy runs it" in said[0], said
    quiet, want = _fallbacks(lambda: steps(NUMPY))
    assert quiet == []
    for (gp, gs), (wp, ws) in zip(got, want):
        assert np.array_equal(_bits(gp), _bits(wp))
        assert all(np.array_equal(_bits(gs[k]), _bits(ws[k])) for k in ws)


def test_covered_steps_warn_nothing():
    p, g, m, v = _data(1000)
    said, _ = _fallbacks(
        lambda: AdamW().step(p, g, {"exp_avg": m, "exp_avg_sq": v}, 1e-3, 2, backend=COMPILED)
    )
    assert said == []


@pytest.mark.parametrize(
    ("config", "case"),
    [
        (ReplayConfig("mx-states", m="mxfp8_e4m3", v="mxfp8_e4m3"), "exp_avg stored in mxfp8_e4m3"),
        (ReplayConfig("mixed-blocks", m="int8_block2048", v="int8_block256"), "blocks of 2048 and 256"),
        (ReplayConfig("f16-kahan", master="float16", kahan=True), "master rounding to float16"),
    ],
    ids=["mx-states", "mixed-blocks", "kahan"],
)
def test_training_fallback_warns_once_per_case(config, case):
    """fpsim.train.torch.AdamW(backend="compiled") with a configuration the fused step or the
    compiled loops do not cover: one warning naming the case over two tensors and three steps,
    and the parameters and states of backend="numpy" bit for bit."""

    def train(backend):
        rng = np.random.default_rng(5)
        ps = [
            torch.nn.Parameter(torch.from_numpy(rng.standard_normal((64, 64)).astype(np.float32)))
            for _ in "ab"
        ]
        opt = ftorch.AdamW(ps, lr=1e-2, config=config, backend=backend)
        for _ in range(3):
            for p in ps:
                p.grad = torch.from_numpy((rng.standard_normal(p.shape) * 1e-3).astype(np.float32))
            opt.step()
        return ps, opt

    said, (ps_c, opt_c) = _fallbacks(lambda: train("compiled"))
    hits = [s for s in said if case in s]
    assert len(hits) == 1, said
    quiet, (ps_n, opt_n) = _fallbacks(lambda: train("numpy"))
    assert quiet == []
    for a, b in zip(ps_c, ps_n):
        assert np.array_equal(_bits(a.detach().numpy()), _bits(b.detach().numpy()))
        for k, t in opt_c.state[a].items():
            x, y = t.numpy(), opt_n.state[b][k].numpy()
            assert np.array_equal(_bits(x), _bits(y)) if x.dtype == np.float32 else np.array_equal(x, y), k


def test_the_warning_points_at_the_users_line():
    """The warning's location is the caller's line (here), not fpsim's internals or torch's
    optimizer wrapper: for a replay optimizer step and for ``opt.step()`` of fpsim.train."""
    p, g, m, v = _data(1000)
    p_t = torch.nn.Parameter(torch.from_numpy(p.copy()))
    opt = ftorch.AdamW([p_t], lr=1e-2, config="fp32", sqrt="torch", backend="compiled")
    p_t.grad = torch.from_numpy(np.nan_to_num(g))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        with np.errstate(all="ignore"):
            opt.step()
            _compiled._warned.clear()
            SGD(momentum=0.9, nesterov=True).step(p, g, {"momentum_buffer": m}, 1e-2, 1, backend=COMPILED)
    where = [(w.filename, w.lineno) for w in got if issubclass(w.category, fpsim.FallbackWarning)]
    assert [f for f, _ in where] == [__file__, __file__], where
