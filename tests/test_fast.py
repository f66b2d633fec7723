"""The compiled loops of fpsim._fast (numba) give the numpy paths' bits, on hard inputs."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
from fpsim import _fast
from fpsim.optim import SGD, Adam, AdamW

pytest.importorskip("numba")


@pytest.fixture
def numpy_only(monkeypatch):
    """Run a block of code with the compiled paths switched off (the numpy reference)."""

    class Off:
        def __enter__(self):
            monkeypatch.setattr(_fast, "available", lambda: False)

        def __exit__(self, *exc):
            monkeypatch.undo()

    return Off()


def _special(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    """Values over 60 binades with zeros of both signs, subnormals, huge values, inf and NaN."""
    x = (rng.standard_normal(n) * scale * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    idx = rng.permutation(n)
    k = n // 40
    x[idx[:k]] = 0
    x[idx[k : 2 * k]] = -0.0
    x[idx[2 * k : 3 * k]] = (rng.standard_normal(k) * 2.0**-140).astype(np.float32)
    x[idx[3 * k : 4 * k]] = (rng.standard_normal(k) * 2.0**120).astype(np.float32)
    x[idx[-3:]] = [np.inf, -np.inf, np.nan]
    return x


def _same(got, want, what: str) -> None:
    got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    gb, wb = got.view(np.uint32), want.view(np.uint32)
    bad = (gb != wb) & ~(np.isnan(got) & np.isnan(want))
    first = [f"[{i}] got {gb[i]:#010x} want {wb[i]:#010x}" for i in np.flatnonzero(bad)[:5]]
    assert not bad.any(), f"{what}: {int(bad.sum())} differ; " + "; ".join(first)


OPTIMIZERS = [
    Adam(),
    Adam(weight_decay=0.1),
    AdamW(),
    AdamW(betas=(0.5, 0.95), eps=0.0),
    SGD(),
    SGD(weight_decay=0.01),
]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=repr)
def test_compiled_steps_equal_numpy_steps(optimizer, numpy_only):
    """Three updates (t = 1, 2, 9; SGD's first-step buffer) on special values, bit for bit."""
    rng = np.random.default_rng(0)
    n = 40_000
    p, g = _special(rng, n, 1.0), _special(rng, n, 1e-3)
    s = {"exp_avg": _special(rng, n, 1e-4), "exp_avg_sq": np.abs(_special(rng, n, 1e-7))}
    if isinstance(optimizer, SGD):
        s = {"momentum_buffer": _special(rng, n, 1e-3)}
    p_c, s_c, p_n, s_n = p, s, p, s
    with np.errstate(all="ignore"):
        for t, lr in [(1, 1e-3), (2, 3e-4), (9, 0.5)]:
            g_t = np.roll(g, t)
            p_c, s_c = optimizer.step(p_c, g_t, s_c, lr, t)
            with numpy_only:
                p_n, s_n = optimizer.step(p_n, g_t, s_n, lr, t)
            _same(p_c, p_n, f"param t={t}")
            for k in s_n:
                _same(s_c[k], s_n[k], f"{k} t={t}")


def test_compiled_fma_rounds_once(numpy_only):
    """SGD's ``fma(buf, -lr, p)`` where the product is a float32 midpoint and p is tiny: one
    rounding goes by p's sign, two roundings to even (the case must be there)."""
    rng = np.random.default_rng(1)
    n = 4096
    g = np.full(n, 1 + 2**-12, np.float32)
    p = (rng.choice([-1, 1], n) * 2.0 ** rng.integers(-70, -54, n)).astype(np.float32)
    lr = -(1 + 2**-12)
    got = SGD(momentum=0.0).step(p, g, {}, lr, 1)[0]
    with numpy_only:
        want = SGD(momentum=0.0).step(p, g, {}, lr, 1)[0]
    _same(got, want, "param")
    twice = (g * np.float32(-lr)).astype(np.float32) + p
    assert np.count_nonzero(twice != want) > n // 4


@pytest.mark.parametrize(
    "name", ["bnb_dynamic8_block256", "bnb_dynamic8u_block256", "bnb_dynamic8_block2048"]
)
def test_compiled_codebook_blocks_equal_numpy(name, numpy_only):
    """Codebook encode/decode (nearest, fmaxf absmax) on special values, ragged last block."""
    bf = fpsim.RECIPES[name]
    rng = np.random.default_rng(2)
    x = _special(rng, 300_001, 1.0)
    x[:512] = 0
    if "8u" in name:
        x = np.abs(x)
    got = fpsim.encode(x, bf)
    with numpy_only:
        want = fpsim.encode(x, bf)
        want_v = fpsim.decode(want, bf)
    np.testing.assert_array_equal(got.codes, want.codes)
    np.testing.assert_array_equal(got.scales, want.scales)
    _same(fpsim.decode(got, bf), want_v, "decoded")


def test_replay_with_and_without_compiled_loops(tmp_path, numpy_only):
    """The whole replay: final parameters and states bit for bit, counts exactly, float64
    statistics to rounding (they are summed in another order)."""
    from fpsim.replay import replay
    from fpsim.trace import TraceWriter

    rng = np.random.default_rng(3)
    shapes = {"big": (70_001,), "w": (37, 41)}
    p0 = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    trace = tmp_path / "t"
    with TraceWriter(trace) as w:
        for s in range(1, 4):
            g = {
                k: (rng.standard_normal(sh) * 10.0 ** rng.integers(-9, 0)).astype(np.float32)
                for k, sh in shapes.items()
            }
            w.write_step(s, {"grad": g, **({"param": p0} if s == 1 else {})}, lr=1e-3)
    configs = ["bnb-8bit-all", "bf16-master-sr", "fp16-grads-dynamic"]
    fast = replay(trace, configs, progress=False)
    with numpy_only:
        slow = replay(trace, configs, progress=False)
    for cfg, params in slow.final_params.items():
        for name, p in params.items():
            _same(fast.final_params[cfg][name], p, f"{cfg} {name}")
            for st, v in slow.final_states[cfg][name].items():
                _same(fast.final_states[cfg][name][st], v, f"{cfg} {name} {st}")
    for key, s in slow.stats.items():
        f = fast.stats[key]
        assert (f.n, f.updates, f.swamped, f.state_nonzero, f.state_zeroed) == (
            s.n,
            s.updates,
            s.swamped,
            s.state_nonzero,
            s.state_zeroed,
        ), key
        for name in ("p_err_sq", "p_ref_sq", "upd_dot", "upd_sq", "upd_ref_sq"):
            assert getattr(f, name) == pytest.approx(getattr(s, name), rel=1e-12, abs=1e-300), (key, name)
