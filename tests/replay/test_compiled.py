"""The compiled loops of fpsim._compiled (numba, ``Backend.COMPILED``) give the numpy paths'
bits (``Backend.NUMPY``), on hard inputs (NaNs of every kind among them)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from oracles import scaling as R
from oracles import with_nans

import fpsim
from fpsim import Backend, _compiled
from fpsim._compiled.kinds import SCALED_STATES, scaled_state
from fpsim.emulate.blocks import compiled_codebook, encode_decode_blocks
from fpsim.formats import RECIPES, BlockFormat, Codebook
from fpsim.replay import fused as _fused
from fpsim.replay.optim import SGD, Adam, AdamW
from fpsim.replay.stats import _state_sums, _zero_counts

pytestmark = pytest.mark.dispatch  # .ci/run reruns these with the SIMD dispatch masked

pytest.importorskip("numba")

COMPILED, NUMPY = Backend.COMPILED, Backend.NUMPY


def _nearest_codebook(x: np.ndarray, bf: BlockFormat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Oracle of nearest-entry codebook blocks along the flattened tensor (bitsandbytes' CUDA
    ``kQuantizeBlockwise``, :func:`oracles.scaling.bnb_kernel_codes`): per block the absmax
    (fmaxf, NaN skipped), ``v = x * f32(1 / absmax)`` (no clamp: absmax 0 gives inf), the
    code of ``dQuantize<0>`` (ties to the even entry, NaN to entry 0), the value
    ``table[code] * absmax``. Returns codes (x's shape), absmaxes (float32) and values."""
    table, b = np.asarray(bf.element.table, np.float32), bf.block[0]
    flat = x.reshape(-1)
    blocks = np.zeros(-(-flat.size // b) * b, np.float32)
    blocks[: flat.size] = flat
    blocks = blocks.reshape(-1, b)
    codes, amax = R.bnb_kernel_codes(blocks, table)
    amax = amax[:, 0]
    with np.errstate(invalid="ignore", over="ignore"):
        values = table[codes] * amax[:, None]
    n = flat.size
    return codes.reshape(-1)[:n].reshape(x.shape), amax, values.reshape(-1)[:n].reshape(x.shape)


def _numpy_codes(x: np.ndarray, bf: BlockFormat) -> np.ndarray:
    """Block codes of ``x`` without any compiled loop: the oracle for codebooks (which the
    emulator encodes by a compiled loop where numba is installed), the emulator otherwise."""
    if isinstance(bf.element, Codebook):
        return _nearest_codebook(x, bf)[0]
    return fpsim.encode(x, bf).codes


def _special(rng: np.random.Generator, n: int, scale: float) -> np.ndarray:
    """Values over 60 binades with zeros of both signs, subnormals, huge values, inf and NaN,
    and the NaN patterns of every kind (quiet and signaling, both signs) from the middle on."""
    x = (rng.standard_normal(n) * scale * np.exp2(rng.integers(-30, 30, n))).astype(np.float32)
    idx = rng.permutation(n)
    k = n // 40
    x[idx[:k]] = 0
    x[idx[k : 2 * k]] = -0.0
    x[idx[2 * k : 3 * k]] = (rng.standard_normal(k) * 2.0**-140).astype(np.float32)
    x[idx[3 * k : 4 * k]] = (rng.standard_normal(k) * 2.0**120).astype(np.float32)
    x[idx[-3:]] = [np.inf, -np.inf, np.nan][: min(n, 3)]
    return with_nans(x, start=n // 2, rounds=1)


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
def test_compiled_steps_equal_numpy_steps(optimizer):
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
            p_c, s_c = optimizer.step(p_c, g_t, s_c, lr, t, backend="compiled")
            p_n, s_n = optimizer.step(p_n, g_t, s_n, lr, t, backend="numpy")
            _same(p_c, p_n, f"param t={t}")
            for k in s_n:
                _same(s_c[k], s_n[k], f"{k} t={t}")


def test_compiled_fma_rounds_once():
    """SGD's ``fma(buf, -lr, p)`` where the product is a float32 midpoint and p is tiny: one
    rounding goes by p's sign, two roundings to even (the case must be there)."""
    rng = np.random.default_rng(1)
    n = 4096
    g = np.full(n, 1 + 2**-12, np.float32)
    p = (rng.choice([-1, 1], n) * 2.0 ** rng.integers(-70, -54, n)).astype(np.float32)
    lr = -(1 + 2**-12)
    got = SGD(momentum=0.0).step(p, g, {}, lr, 1, backend=COMPILED)[0]
    want = SGD(momentum=0.0).step(p, g, {}, lr, 1, backend=NUMPY)[0]
    _same(got, want, "param")
    twice = (g * np.float32(-lr)).astype(np.float32) + p
    assert np.count_nonzero(twice != want) > n // 4


@pytest.mark.parametrize(
    "name", ["bnb_dynamic8_block256", "bnb_dynamic8u_block256", "bnb_dynamic8_block2048"]
)
def test_compiled_codebook_blocks_equal_numpy(name):
    """Codebook encode/decode (nearest, fmaxf absmax), compiled and numpy backends, against the
    numpy oracle of bitsandbytes' blockwise quantization, on special values,
    ragged last block."""
    bf = fpsim.RECIPES[name]
    rng = np.random.default_rng(2)
    x = _special(rng, 300_001, 1.0)
    x[:512] = 0
    if "8u" in name:
        x = np.abs(x)
    want_codes, want_amax, want_v = _nearest_codebook(x, bf)
    for backend in (COMPILED, NUMPY):
        got = fpsim.encode(x, bf, backend=backend)
        np.testing.assert_array_equal(got.codes, want_codes)
        np.testing.assert_array_equal(got.scales, want_amax.view(np.uint32))
        _same(fpsim.decode(got, bf, backend=backend), want_v, f"decoded ({backend.value})")


@pytest.mark.parametrize("name", ["bnb_dynamic8_block256", "bnb_dynamic8u_block256"])
def test_compiled_codebook_ties_and_tiny_absmax(name):
    """The compiled codebook loop and the numpy tier on the hard blocks of the nearest rule
    (oracles.scaling.bnb_hard_blocks: every float32 midpoint and its neighbours, absmaxes
    from 1.1e-38 down to 2**-149 and 0, inf and NaN): codes, absmaxes and decoded values bit
    for bit, equal to the kernel transcription."""
    bf = fpsim.RECIPES[name]
    x = R.bnb_hard_blocks(bf.element.table, "8u" not in name)
    want_codes, want_amax, want_v = _nearest_codebook(x, bf)
    for backend in (COMPILED, NUMPY):
        got = fpsim.encode(x, bf, backend=backend)
        np.testing.assert_array_equal(got.codes, want_codes)
        np.testing.assert_array_equal(got.scales, want_amax.view(np.uint32))
        _same(fpsim.decode(got, bf, backend=backend), want_v, f"decoded ({backend.value})")
    assert compiled_codebook(bf, fpsim.RoundMode.NEAREST_EVEN, (x.size // 256,), COMPILED)  # the loop ran


def test_replay_with_and_without_compiled_loops(tmp_path, monkeypatch):
    """The whole replay (the fused 8-bit step included, with skipped steps): final parameters
    and states bit for bit, counts exactly, float64 statistics to rounding (they are summed
    in another order)."""
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
    from fpsim.replay import PRESETS, LossScaler, ReplayConfig

    # 8-bit states with FP16 gradients and a loss scale that overflows: skipped steps
    scaled = ReplayConfig(
        "bnb-fp16",
        m=PRESETS["bnb-8bit"].m,
        v=PRESETS["bnb-8bit"].v,
        grad="float16",
        loss_scaler=LossScaler(init_scale=2.0**23, growth_interval=1),
    )
    configs = [
        "bnb-8bit-all",
        "bnb-8bit",
        "int8-states",
        "fp8-states",
        "bf16-master-sr",
        "fp16-grads-dynamic",
    ]
    configs.append(scaled)
    fused = []
    finish = _fused.finish

    def spy(*args):
        fused.append(len(args[1]))  # pieces
        return finish(*args)

    monkeypatch.setattr(_fused, "finish", spy)
    monkeypatch.setattr(_fused, "PIECE", 1 << 14)  # "big" in 5 pieces
    fast = replay(trace, configs, progress=False, backend="compiled")
    # bnb-8bit-all, int8-states and fp8-states every step, "big" of bnb-8bit
    # (min_quantized_size 4096) every step, both tensors of bnb-fp16 in its one step that
    # is not skipped; "big" in pieces, "w" in one
    assert len(fused) == 3 * 3 * 2 + 3 + 2 and sorted(set(fused)) == [1, 5], fused
    assert [fast.skipped[s, "bnb-fp16"] for s in (1, 2, 3)] == [False, True, True]
    slow = replay(trace, configs, progress=False, backend="numpy")
    assert len(fused) == 3 * 3 * 2 + 3 + 2, "the numpy backend must not take the fused step"
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


_BLOCK100 = replace(RECIPES["bnb_dynamic8_block256"], name="bnb_dynamic8_block100", block=(100,))
_BLOCK100U = replace(RECIPES["bnb_dynamic8u_block256"], name="bnb_dynamic8u_block100", block=(100,))
FUSED_RECIPES = [
    ("bnb_dynamic8_block256", "bnb_dynamic8u_block256"),
    ("bnb_dynamic8_block2048", "bnb_dynamic8_block2048"),
    (_BLOCK100, _BLOCK100U),  # tiles of 4000: blocks that do not divide 2^12
    ("int8_block256", "int8_block256"),
    ("int8_block2048", "bnb_dynamic8_block2048"),
    ("fp8_e4m3_block256", "fp8_e4m3_block256"),
    ("fp8_e4m3_block256", "bnb_dynamic8u_block256"),
    ("e4m3_tensor_pow2", "e4m3_tensor"),  # Transformer Engine per-tensor scaling: one block
]


def _same_codes(got, want, bf, what: str) -> None:
    """Equal element codes, NaN codes by class (the sign of a NaN that a division or product
    passes on is not specified by IEEE 754, and numpy's SIMD loops may take either operand's)."""
    el = bf.element
    table = el.table if isinstance(el, Codebook) else fpsim.decode(np.arange(256, dtype=np.uint8), el)
    nan = np.isnan(table[got]) & np.isnan(table[want])
    bad = np.flatnonzero((got != want) & ~nan)
    assert bad.size == 0, f"{what}: {bad.size} differ; " + "; ".join(
        f"[{i}] got {got[i]:#04x} want {want[i]:#04x}" for i in bad[:5]
    )


def _same_bits(got, want, what: str) -> None:
    """Equal float32 scale bits, NaN scales included: every tier's block amax gives NaN as the
    canonical quiet NaN (fpsim.formats.amax), which the division by the element's max keeps."""
    g, w = np.asarray(got, np.uint32).reshape(-1), np.asarray(want, np.uint32).reshape(-1)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, f"{what}: {bad.size} differ; " + "; ".join(
        f"[{i}] got {g[i]:#010x} want {w[i]:#010x}" for i in bad[:5]
    )


def _finite(x: np.ndarray) -> np.ndarray:
    """x without inf, NaN and the values so large that their squares overflow."""
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(x) < 2.0**60, x, np.float32(0)).astype(np.float32)


@pytest.mark.parametrize("optimizer", [o for o in OPTIMIZERS if isinstance(o, Adam)], ids=repr)
@pytest.mark.parametrize("recipes", FUSED_RECIPES, ids=lambda r: fpsim.get_format(r[0]).name)
@pytest.mark.parametrize("n", [3, 257, 4097, 70_001])
@pytest.mark.parametrize("finite", [False, True], ids=["inf-nan", "finite"])
def test_fused_step_equals_generic_path(optimizer, recipes, n, finite):
    """The fused Adam step with codebook moments against Adam.step + encode_decode_blocks
    (compiled and numpy): parameters, codes and scale bits equal over three steps of special
    values (zero blocks, subnormals; with huge values, inf and NaN, or without), zero counts
    exact, error sums to rounding (finite ones in the finite variant)."""
    fm, fv = (fpsim.get_format(r) for r in recipes)
    formats = {"exp_avg": fm, "exp_avg_sq": fv}
    rng = np.random.default_rng(n)
    special = (lambda *a: _finite(_special(*a))) if finite else _special
    p = special(rng, n, 1.0)
    stored = {"exp_avg": fpsim.encode(special(rng, n, 1e-4), fm)}
    stored["exp_avg_sq"] = fpsim.encode(np.abs(special(rng, n, 1e-7)), fv)
    if n > 512:
        p[:300] = 0  # whole zero blocks
    with np.errstate(all="ignore"):
        for t, lr in [(1, 1e-3), (2, 3e-4), (9, 0.5)]:
            g = special(rng, n, 1e-3)
            ref = {"exp_avg": special(rng, n, 1e-4), "exp_avg_sq": np.abs(special(rng, n, 1e-7))}
            loaded = {st: fpsim.decode(e, formats[st]) for st, e in stored.items()}
            p_want, exact = optimizer.step(p, g, loaded, lr, t, backend=COMPILED)
            want = {st: encode_decode_blocks(v, formats[st]) for st, v in exact.items()}
            p_numpy, exact_numpy = optimizer.step(p, g, loaded, lr, t, backend=NUMPY)
            want_numpy = {st: _numpy_codes(v, formats[st]) for st, v in exact_numpy.items()}
            got = _fused.adam_block_step(optimizer, formats, stored, p, g, lr, t, ref, backend=COMPILED)
            assert got is not None, "the fused step must apply to these recipes"
            _same(got.p, p_want, f"param t={t}")
            _same(got.p, p_numpy, f"param (numpy) t={t}")
            for st, (enc, val) in want.items():
                _same_codes(got.states[st].codes, enc.codes, formats[st], f"{st} codes t={t}")
                _same(
                    got.states[st].scales.view(np.float32), enc.scales.view(np.float32), f"{st} scales t={t}"
                )
                _same_bits(got.states[st].scales, enc.scales, f"{st} scale bits t={t}")
                _same_codes(want_numpy[st], enc.codes, formats[st], f"{st} numpy codes t={t}")
                nonzero, zeroed, err, tot = got.stats[st]
                assert (nonzero, zeroed) == _zero_counts(exact[st], val), (st, t)
                want_err, want_tot = _state_sums(val, ref[st])
                assert np.isfinite(want_err) == finite or n < 4, (st, t)
                approx = {"rel": 1e-12, "abs": 1e-300, "nan_ok": True}
                assert err == pytest.approx(want_err, **approx), (st, t)
                assert tot == pytest.approx(want_tot, **approx), (st, t)
            p, stored = got.p, got.states
    for st, e in stored.items():  # the replay's state encoder and decoder
        x = fpsim.decode(e, formats[st])
        (enc, values), want = _fused.encode_state(formats[st], x, COMPILED), fpsim.encode(x, formats[st])
        _same_codes(enc.codes, want.codes, formats[st], f"{st} encode_state")
        _same(enc.scales.view(np.float32), want.scales.view(np.float32), f"{st} encode_state scales")
        _same_bits(enc.scales, want.scales, f"{st} encode_state scale bits")
        _same(values, fpsim.decode(want, formats[st]), f"{st} encode_state values")
        _same(_fused.decode_state(formats[st], e, COMPILED), x, f"{st} decode_state")
        assert _fused.encode_state(formats[st], x, NUMPY) is None
        assert _fused.decode_state(formats[st], e, NUMPY) is None


def test_every_scaled_state_kind_is_checked_against_numpy():
    """Each kind of the table the fused step reads (SCALED_STATES) has a recipe in
    FUSED_RECIPES, so test_fused_step_equals_generic_path compares it with the numpy tier."""
    recipes = [fpsim.get_format(r) for pair in FUSED_RECIPES for r in pair]
    checked = {
        scaled_state(bf, bf.block is None and not bf.flatten)
        for bf in recipes
        if not isinstance(bf.element, Codebook)
    }
    assert {k for s in SCALED_STATES.values() for k in (s.kind, s.pow2_kind)} <= checked


def test_fused_step_declines_what_it_does_not_cover():
    """Other block sizes per moment, other scale rules (MX, Transformer Engine), SGD,
    torch's square root, the numpy backend: None (the replay then
    takes the generic path)."""
    n = 1000
    p = g = np.zeros(n, np.float32)
    ref = {"exp_avg": p, "exp_avg_sq": p}

    def attempt(m, v, optimizer=None, backend=COMPILED):
        optimizer = optimizer or AdamW()
        formats = {"exp_avg": fpsim.get_format(m), "exp_avg_sq": fpsim.get_format(v)}
        stored = {st: fpsim.encode(p, f) for st, f in formats.items()}
        return _fused.adam_block_step(optimizer, formats, stored, p, g, 1e-3, 1, ref, backend=backend)

    assert attempt("bnb_dynamic8_block256", "bnb_dynamic8u_block256") is not None
    assert attempt("bnb_dynamic8_block256", "int8_block256") is not None
    assert attempt("bnb_dynamic8_block2048", "bnb_dynamic8u_block256") is None
    assert attempt("int8_block2048", "fp8_e4m3_block256") is None
    assert attempt("mxfp8_e4m3", "mxfp8_e4m3") is None
    assert attempt("e4m3_block128", "e4m3_block128") is None
    assert attempt("mxint8", "int8_block256") is None
    assert attempt("e5m2_tensor", "e4m3_tensor") is None  # TE with an element the loops lack
    cpu = fpsim.replay.PRESETS["bnb-8bit-cpu"]
    assert attempt(cpu.m, cpu.v) is not None  # the lookup table: tests/replay/test_compiled_states.py
    assert attempt("bnb_dynamic8_block256", "bnb_dynamic8u_block256", SGD()) is None
    assert attempt("bnb_dynamic8_block256", "bnb_dynamic8u_block256", AdamW(sqrt="torch")) is None
    assert attempt("bnb_dynamic8_block256", "bnb_dynamic8u_block256", backend=NUMPY) is None


@pytest.mark.parametrize("n", [1, 4095, 4096, 4097, 100_003])
def test_compiled_statistics_equal_numpy(n):
    """tensor_stats / state_stats (tile sums in SIMD lanes) against the numpy statistics:
    counts exactly, float64 sums to rounding."""
    from fpsim.replay.stats import _param_sums, _update_counts

    rng = np.random.default_rng(n)
    old, ref, ref_old = (_special(rng, n, 1.0) for _ in range(3))
    new = old.copy()
    new[::3] += np.float32(1e-3)
    f = new.copy()
    f[::7] += np.float32(1e-9)  # intended but swallowed
    finite = np.isfinite(old) & np.isfinite(ref) & np.isfinite(ref_old) & np.isfinite(new)
    for a in (old, ref, ref_old, new, f):
        a[~finite] = 0
    sums = np.zeros(5)
    counts = _compiled.load().tensor_stats(f, old, new, ref, ref_old, sums)
    assert counts == _update_counts(f, old, new)
    np.testing.assert_allclose(sums, _param_sums(new, ref, old, ref_old), rtol=1e-12, atol=1e-300)
    sums = np.zeros(2)
    assert _compiled.load().state_stats(f, new, ref, sums) == _zero_counts(f, new)
    np.testing.assert_allclose(sums, _state_sums(new, ref), rtol=1e-12, atol=1e-300)


def test_fused_e4m3_cast_equals_the_emulator():
    """The kernel's float32 -> float8_e4m3fn cast (nearest-even, saturating) against
    fpsim.encode(..., saturate=True) and torch's saturating cast on every 61st float32 bit
    pattern and the special points (ties, the subnormal/normal boundary, 448 and its
    neighbours, inf, NaN)."""
    import numba
    from oracles import special_points

    cast = _compiled.load().e4m3_code

    @numba.njit
    def many(x, out):
        for i in range(x.size):
            out[i] = cast(x[i])

    bits = np.arange(0, 1 << 32, 61, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), special_points("float8_e4m3fn")])
    got = np.empty(x.size, np.uint8)
    many(x, got)
    want = fpsim.encode(x, "float8_e4m3fn", saturate=True)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(x[i : i + 1].view(np.uint32)[0]), got[i], want[i]) for i in bad[:5]]
    torch = pytest.importorskip("torch")  # torch's cast saturates too (NaN by class)
    theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    nan = ((got & 0x7F) == 0x7F) & ((theirs & 0x7F) == 0x7F)
    bad = np.flatnonzero((got != theirs) & ~nan)
    assert bad.size == 0, [(hex(x[i : i + 1].view(np.uint32)[0]), got[i], theirs[i]) for i in bad[:5]]


@pytest.mark.parametrize(
    "recipes",
    [r for r in FUSED_RECIPES if fpsim.get_format(r[0]).block is not None],  # (per tensor: one piece)
    ids=lambda r: fpsim.get_format(r[0]).name,
)
def test_fused_pieces_change_nothing_but_the_sum_order(recipes, monkeypatch):
    """A tensor updated in pieces of whole tiles gives the bits of one piece: parameters,
    codes, scales and counts equal, error sums to rounding."""
    formats = dict(zip(("exp_avg", "exp_avg_sq"), (fpsim.get_format(r) for r in recipes)))
    rng = np.random.default_rng(11)
    n = 50_003
    p, g = _finite(_special(rng, n, 1.0)), _finite(_special(rng, n, 1e-3))
    ref = {st: np.abs(_finite(_special(rng, n, 1e-4))) for st in formats}

    def run(piece):
        monkeypatch.setattr(_fused, "PIECE", piece)
        stored = {st: fpsim.encode(ref[st], f) for st, f in formats.items()}
        pl = _fused.plan(AdamW(), formats, stored, p, g, ref, COMPILED)
        parts = _fused.pieces(pl)
        return len(parts), _fused.finish(pl, [_fused.run_piece(pl, s, AdamW(), 1e-3, 3) for s in parts])

    (k1, one), (k2, many) = run(1 << 20), run(1)
    assert (k1, k2 > 10) == (1, True)
    _same(many.p, one.p, "param")
    for st in formats:
        np.testing.assert_array_equal(many.states[st].codes, one.states[st].codes)
        np.testing.assert_array_equal(many.states[st].scales, one.states[st].scales)
        assert many.stats[st][:2] == one.stats[st][:2]
        assert many.stats[st][2:] == pytest.approx(one.stats[st][2:], rel=1e-12)


@pytest.mark.parametrize(
    "fmt,mode", [("bfloat16", "nearest_even"), ("bfloat16", "stochastic"), ("float16", "nearest_even")]
)
@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_fast_master_and_state_rounding_equals_the_emulator(fmt, mode, seed):
    """The replay's compiled roundings to bfloat16 (stochastic with SplitMix64 bits in the
    loop) and float16 against fpsim.quantize (with random_bits_at): every
    element on special values (subnormals, ties, values that carry into the exponent or
    overflow to inf, inf, NaN; NaN by class)."""
    from fpsim.emulate.random import random_bits_at
    from fpsim.replay.storage import quantize

    rng = np.random.default_rng(seed % 1000)
    x = _special(rng, 100_003, 1.0)
    x[:50] = np.float32(3.4e38) if fmt == "bfloat16" else np.float32(65519.0)  # up to inf, or not
    x[50:60] = np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x7FC00001, 0xFFFFFFFF, 0x7F800001] * 2, np.uint32).view(
        np.float32
    )
    ties = [0x3F808000, 0x3F818000, 0x00008000, 0x80018000, 0x7F7F8000]  # bfloat16 ties
    if fmt == "float16":
        ties = [0x3F801000, 0x3F803000, 0x33000000, 0xB3C00000, 0x477FF000]  # float16 ties
    x[60:70] = np.array(ties * 2, np.uint32).view(np.float32)
    x[70:80] = (rng.standard_normal(10) * 2.0**-20).astype(np.float32)  # float16 subnormals
    x[80:85] = [65520.0, -65520.0, 65536.0, 1e6, -1e6]  # float16 overflow (65520: a tie, to inf)
    got = quantize(x, fpsim.get_format(fmt), fpsim.RoundMode(mode), COMPILED, seed)
    kw = {"random_bits": random_bits_at(seed, 0, x.size)} if mode == "stochastic" else {}
    want = fpsim.quantize(x, fmt, rounding=mode, **kw)
    _same(got, want, f"{fmt} {mode}")
    assert np.isinf(got[:50]).any() == (fmt == "bfloat16")
    assert mode == "nearest_even" or np.isfinite(got[:50]).any()


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_fast_nearest_rounding_on_strided_float32_patterns(fmt):
    """The compiled nearest-even roundings against fpsim.quantize on every 61st float32 bit
    pattern (NaN by class)."""
    from fpsim.replay.storage import quantize

    x = np.arange(0, 1 << 32, 61, dtype=np.uint64).astype(np.uint32).view(np.float32)
    got = quantize(x, fpsim.get_format(fmt), fpsim.RoundMode.NEAREST_EVEN, COMPILED)
    _same(got, fpsim.quantize(x, fmt), fmt)
