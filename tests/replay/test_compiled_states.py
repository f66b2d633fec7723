"""The compiled state encoders of torchao's formats (``StateKind.QMAP``) and of bitsandbytes'
CPU lookup table (``StateKind.CODEBOOK_LUT``) give the numpy reference's bits: the thresholds
against torchao's rule (:func:`fpsim.replay.qmap.encode_qmap`), the encoder and the fused Adam
step against ``encode_qmap`` / ``encode_decode_blocks`` on numpy and ``Adam.step`` on numpy,
over odd sizes and NaN/inf patterns; the compiled Kahan master rounding against the numpy one;
and the training optimizers of every preset on both backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracles import with_nans

import fpsim
from fpsim import Backend
from fpsim.emulate.blocks import encode_decode_blocks
from fpsim.replay import PRESETS
from fpsim.replay import fused as _fused
from fpsim.replay.optim import Adam, AdamW
from fpsim.replay.qmap import QMAP_RECIPES, QMapBlocks, decode_qmap, encode_qmap, qmap_thresholds
from fpsim.train import torch as ftorch

pytestmark = pytest.mark.dispatch

pytest.importorskip("numba")

COMPILED, NUMPY = Backend.COMPILED, Backend.NUMPY
PAIRS = {  # (exp_avg, exp_avg_sq) storage of the presets these kinds serve
    name: (PRESETS[name].m, PRESETS[name].v) for name in ("torchao-8bit", "torchao-4bit", "bnb-8bit-cpu")
}


def _reference(x: np.ndarray, fmt) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, scale bits and values of ``x`` by the numpy tier (no compiled loop: torchao's
    formats are encoded on numpy only, lookup-table codebooks likewise)."""
    if isinstance(fmt, QMapBlocks):
        enc = encode_qmap(x, fmt)
        return enc.codes, enc.scales, decode_qmap(enc, fmt)
    enc, val = encode_decode_blocks(x, fmt, backend=NUMPY)
    return enc.codes, enc.scales, val


def _bits(a: np.ndarray) -> np.ndarray:
    """float32 bits with every NaN as one class."""
    a = np.asarray(a, np.float32).reshape(-1)
    return np.where(np.isnan(a), np.uint32(0x7FC00000), a.view(np.uint32))


def _assert_same(got, want, what: str) -> None:
    g, w = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, f"{what}: {bad.size} differ; first at {bad[:5]}: got {g[bad[:5]]} want {w[bad[:5]]}"


def _special(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    """Values over 40 binades with zeros of both signs, subnormals, +-inf and the NaN patterns."""
    x = (rng.standard_normal(n) * scale * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    k = max(n // 30, 1)
    idx = rng.permutation(n)
    x[idx[:k]], x[idx[k : 2 * k]] = 0.0, -0.0
    x[idx[2 * k : 3 * k]] = np.float32(2.0**-140)
    x[idx[-2:]] = [np.inf, -np.inf][: min(n, 2)]
    return with_nans(x, start=n // 2, rounds=1)


@pytest.mark.parametrize("name", list(QMAP_RECIPES))
def test_qmap_thresholds_are_torchaos_rule(name):
    """At each threshold the numpy rule gives the lower code and one float32 above it the next
    (a block of absmax 1: scale 1, v = x), and the compiled encoder agrees there too."""
    fmt = QMAP_RECIPES[name]
    t = qmap_thresholds(fmt)
    vals = np.concatenate([t, np.nextafter(t, np.float32(np.inf)), fmt.table]).astype(np.float32)
    per = fmt.block - 1
    rest = np.zeros(-(-vals.size // per) * per, np.float32)
    rest[: vals.size] = vals
    x = np.concatenate([np.ones((rest.size // per, 1), np.float32), rest.reshape(-1, per)], axis=1)
    want = encode_qmap(x, fmt).codes[:, 1:].reshape(-1)[: vals.size]
    n = t.size
    assert np.array_equal(want[:n], np.arange(n)) and np.array_equal(want[n : 2 * n], np.arange(1, n + 1))
    got, _ = _fused.encode_state(fmt, x, COMPILED)
    _assert_same(got.codes, encode_qmap(x, fmt).codes, f"{name} codes at the thresholds")


@pytest.mark.parametrize("preset", list(PAIRS))
@pytest.mark.parametrize("n", [3, 257, 4096 + 128, 70_001])
def test_compiled_state_encoders_equal_numpy(preset, n):
    """encode_state / decode_state: codes, scale bits (NaN scales canonical on both tiers) and
    values equal the numpy tier's on special values, ragged last blocks included."""
    rng = np.random.default_rng(n)
    for fmt, x in zip(PAIRS[preset], (_special(rng, n, 1e-3), np.abs(_special(rng, n, 1e-6)))):
        with np.errstate(all="ignore"):
            codes, scales, values = _reference(x, fmt)
            (enc, got_values) = _fused.encode_state(fmt, x, COMPILED)
            decoded = _fused.decode_state(fmt, enc, COMPILED)
        _assert_same(enc.codes, codes, f"{fmt} codes")
        _assert_same(np.asarray(enc.scales, np.uint32), np.asarray(scales, np.uint32), f"{fmt} scale bits")
        _assert_same(_bits(got_values), _bits(values), f"{fmt} values")
        _assert_same(_bits(decoded), _bits(values), f"{fmt} decode_state")


@pytest.mark.parametrize("preset", list(PAIRS))
@pytest.mark.parametrize("optimizer", [Adam(weight_decay=0.1), AdamW(betas=(0.5, 0.95))], ids=repr)
@pytest.mark.parametrize("n", [257, 4096 + 128, 70_001])
def test_fused_step_equals_numpy(preset, optimizer, n):
    """The fused step with these moments against Adam.step on numpy and the numpy encoders,
    over three steps of special values: parameters, codes and scale bits equal."""
    formats = dict(zip(("exp_avg", "exp_avg_sq"), PAIRS[preset]))
    rng = np.random.default_rng(n + 1)
    p = _special(rng, n, 1.0)
    with np.errstate(all="ignore"):
        stored = {
            st: _fused.encode_state(f, x, COMPILED)[0]
            for (st, f), x in zip(formats.items(), (_special(rng, n, 1e-4), np.abs(_special(rng, n, 1e-7))))
        }
        for t, lr in [(1, 1e-3), (2, 3e-4), (9, 0.5)]:
            g = _special(rng, n, 1e-3)
            loaded = {st: _reference_decode(formats[st], e) for st, e in stored.items()}
            p_want, exact = optimizer.step(p, g, loaded, lr, t, backend=NUMPY)
            got = _fused.adam_block_step(optimizer, formats, stored, p, g, lr, t, None, backend=COMPILED)
            assert got is not None, "the fused step must cover these formats"
            _assert_same(_bits(got.p), _bits(p_want), f"param t={t}")
            for st, v in exact.items():
                codes, scales, _ = _reference(v, formats[st])
                _assert_same(got.states[st].codes, codes, f"{st} codes t={t}")
                _assert_same(np.asarray(got.states[st].scales, np.uint32), scales, f"{st} scale bits t={t}")
            p, stored = got.p, got.states


def _reference_decode(fmt, enc) -> np.ndarray:
    return decode_qmap(enc, fmt) if isinstance(fmt, QMapBlocks) else fpsim.decode(enc, fmt, backend=NUMPY)


def test_codes_past_a_short_table_are_refused():
    """A 4-bit torchao state holding a code past its 16 entries: a ValueError naming the format
    (the compiled decoder would otherwise read past the table)."""
    fmt = QMAP_RECIPES["torchao_dynamic4_block128"]
    enc, _ = _fused.encode_state(fmt, np.ones(256, np.float32), COMPILED)
    enc.codes[7] = 16
    with pytest.raises(ValueError, match="torchao_dynamic4_block128.*16"):
        _fused.decode_state(fmt, enc, COMPILED)


@pytest.mark.parametrize(
    "config", [c for c, v in PRESETS.items() if v.loss_scaler is None and v.grad_delayed is None]
)
def test_training_step_equals_on_both_backends(config):
    """fpsim.train.torch.AdamW(config=...) on the compiled tier and on numpy: the same
    parameters and packed states after three steps with NaN/inf gradients (odd shapes, tensors
    above and below the presets' minimum size, ragged blocks)."""
    shapes = [(33, 257), (4096 + 128,), (5,)]

    def run(backend):
        rng = np.random.default_rng(3)
        ps = [torch.nn.Parameter(torch.from_numpy(rng.standard_normal(s).astype(np.float32))) for s in shapes]
        opt = ftorch.AdamW(ps, lr=1e-2, config=config, backend=backend)
        for step in range(3):
            for p in ps:
                g = (rng.standard_normal(p.shape) * 1e-3).astype(np.float32)
                p.grad = torch.from_numpy(with_nans(g, start=11, rounds=1) if step == 1 else g)
            with np.errstate(all="ignore"):
                opt.step()
        return ps, opt

    (ps_c, opt_c), (ps_n, opt_n) = run(COMPILED), run(NUMPY)
    for pc, pn in zip(ps_c, ps_n):
        _assert_same(_bits(pc.detach().numpy()), _bits(pn.detach().numpy()), f"{config} param")
        sc, sn = opt_c.state[pc], opt_n.state[pn]
        assert sorted(sc) == sorted(sn)
        for k in sc:
            a, b = sc[k].numpy(), sn[k].numpy()
            _assert_same(
                _bits(a) if a.dtype == np.float32 else a, _bits(b) if b.dtype == np.float32 else b, k
            )


@pytest.mark.parametrize("n", [1, 1000, 70_001])
def test_compiled_kahan_rounding_equals_numpy(n):
    """The compiled Kahan master rounding to bfloat16 against the numpy tier (float64 sums
    rounded by the emulator): equal bits for masters and compensations over special values
    (huge updates that overflow bfloat16, subnormal and negative-underflow results, inf, NaN)."""
    from fpsim.replay import storage

    bf16 = fpsim.get_format("bfloat16")
    rng = np.random.default_rng(n)
    old = fpsim.quantize(_special(rng, n, 1.0), bf16)
    comp = fpsim.quantize(_special(rng, n, 2.0**-10), bf16)
    p = (old + _special(rng, n, 1e-3)).astype(np.float32)
    p[::7] = (rng.standard_normal(p[::7].size) * 2.0**-130).astype(np.float32)  # bf16 subnormal results
    old[1::11] = np.float32(3.38e38)  # next to bfloat16's largest value: overflow to inf
    p[1::11] = np.float32(3.4e38)
    with np.errstate(all="ignore"):
        got = storage._kahan_compiled(bf16, fpsim.RoundMode.NEAREST_EVEN, old, p, comp)
        want = storage._kahan(bf16, fpsim.RoundMode.NEAREST_EVEN, old, p, comp, 0, NUMPY)
    assert got is not None
    for g, w, what in zip(got, want, ("master", "compensation")):
        _assert_same(_bits(g), _bits(w), what)
