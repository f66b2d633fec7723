"""The fused optimizer step (fpsim.kernels.optim): kernel against its emulator twin, twin
against the replay.

* ``adamw_step`` (Triton, CPU interpreter) against ``adamw_step_reference`` (numpy), bit for
  bit on every output (master codes, state codes, scale bits), several steps from realistic
  states: state recipes x master rounding x odd sizes, with zero blocks, tiny and huge
  gradients and inf/NaN gradients; NaNs compared by class.
* ``adamw_step_reference`` and ``adamw_step`` against :func:`fpsim.replay.engine.replay` on a
  trace written here (8-bit, FP8 and INT8 states, bfloat16 / float16 masters, nearest and
  stochastic rounding, a tensor below ``min_quantized_size``): the final parameters and
  states equal the replay's bit for bit, so twin == replay is proven, not assumed.
* The compiled kernel (sm_90 PTX, built on the CPU) keeps the float32 operations apart:
  the only fmas are the explicit ones, division and square root are the correctly rounded
  ``div.rn.f32`` / ``sqrt.rn.f32`` without flush-to-zero.
* The validation harness counts a wrong kernel's mismatches; bad arguments raise errors that
  name the argument and the allowed values.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from oracles import with_nans

import fpsim
from fpsim.formats import RoundMode
from fpsim.replay import ReplayConfig, replay
from fpsim.replay.optim import SGD, Adam, AdamW
from fpsim.trace import TraceWriter

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from fpsim.kernels import optim as kopt  # noqa: E402
from fpsim.kernels.validate.common import code_fields, f32_fields  # noqa: E402

BNB = ("bnb_dynamic8_block256", "bnb_dynamic8u_block256")
PAIRS = [
    BNB,
    ("int8_block256", "int8_block256"),
    ("fp8_e4m3_block256", "fp8_e4m3_block256"),
    ("bnb_dynamic8_block2048", "float32"),
    ("float32", "float32"),
]


# --- helpers ------------------------------------------------------------------------------------


def _t(a):
    """numpy -> torch (uint16 / uint32 through their bit patterns)."""
    if a is None:
        return None
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.uint16)
    if a.dtype == np.uint32:
        return torch.from_numpy(a.view(np.int32).copy()).view(torch.uint32)
    return torch.from_numpy(a.copy())


def _u(a) -> np.ndarray:
    """Codes / bit patterns as int64 (float32 values as their bits)."""
    if isinstance(a, torch.Tensor):
        a = a.contiguous()
        a = (a.view(torch.int32) if a.dtype == torch.float32 else a).to(torch.int64).numpy()
        return a.reshape(-1) & 0xFFFFFFFF
    a = np.asarray(a).reshape(-1)
    return (a.view(np.uint32) if a.dtype == np.float32 else a).astype(np.int64)


def _fmt_of(name: str, kw: dict):
    if name == "p":
        return fpsim.get_format(kw["master"])
    bf = kopt.state_recipe(f"{name[0]}_recipe", kw[f"{name[0]}_recipe"])
    return None if bf is None or name.endswith("scales") else bf.element


def _describe(code: int, fmt) -> str:
    if fmt is None:
        return f32_fields(code)
    if isinstance(fmt, fpsim.Codebook):
        return f"entry {code}"
    return code_fields(code, fmt)


def _is_nan(codes: np.ndarray, fmt) -> np.ndarray:
    if fmt is None:
        return np.isnan(codes.astype(np.uint32).view(np.float32))
    if isinstance(fmt, fpsim.Format):
        return np.isnan(fpsim.decode(codes.astype(fmt.code_dtype), fmt))
    return np.zeros(codes.shape, bool)


def assert_same(want: kopt.AdamStep, got: kopt.AdamStep, kw: dict, where: str = "") -> None:
    """Every output equal as integer codes (NaN by class); else fail listing the first
    mismatches with sign, exponent and mantissa fields."""
    lines = []
    for name, w, g in zip(kopt.AdamStep._fields, want, got):
        if w is None:
            assert g is None, f"{where} {name}: kernel returned a tensor, twin None"
            continue
        wi, gi = _u(w), _u(g)
        assert wi.shape == gi.shape, f"{where} {name}: {gi.shape} != {wi.shape}"
        fmt = _fmt_of(name, kw)
        bad = (wi != gi) & ~(_is_nan(wi, fmt) & _is_nan(gi, fmt))
        for i in np.flatnonzero(bad)[:4]:
            lines.append(f"{name}[{i}]: want {_describe(wi[i], fmt)}\n{' ' * 12}got  {_describe(gi[i], fmt)}")
        if bad.any():
            lines.append(f"{name}: {int(bad.sum())} of {bad.size} differ")
    assert not lines, f"{where}: kernel != twin\n" + "\n".join(lines)


def _states(n: int, m_recipe: str, v_recipe: str) -> list:
    out = []
    for rec in (m_recipe, v_recipe):
        if rec == "float32":
            out += [np.zeros(n, np.float32), None]
        else:
            enc = fpsim.encode(np.zeros(n, np.float32), rec)
            out += [enc.codes, enc.scales]
    return out


def _grad(rng, n: int, step: int) -> np.ndarray:
    g = (rng.standard_normal(n) * np.exp2(rng.integers(-24, 8, n))).astype(np.float32)
    g[: min(n, 300) // 2] = 0  # a zero block (with zero parameters below)
    if step == 2 and n > 300:
        g[-3:] = [np.inf, -np.inf, np.nan]
        g[200:210] = np.float32(3e-23)  # the second moment quantizes to zero
        g = with_nans(g, start=n // 2, spacing=7, rounds=1)  # NaNs of every kind, one block
    if step == 3 and n > 300:
        g[-40:-30] = np.float32(1e21)  # g * g overflows
    return g


def _run_steps(n, m_recipe, v_recipe, master="bfloat16", rounding="nearest_even", optimizer=None, steps=3):
    rng = np.random.default_rng([n, len(m_recipe), steps])
    p0 = (rng.standard_normal(n) * 0.1).astype(np.float32)
    p0[: min(n, 300) // 2] = 0
    p = fpsim.encode(p0, master)
    state = _states(n, m_recipe, v_recipe)
    for t in range(1, steps + 1):
        g = _grad(rng, n, t)
        kw = dict(lr=1e-3 * t, step=t, optimizer=optimizer, m_recipe=m_recipe, v_recipe=v_recipe)
        kw.update(master=master, rounding=rounding)
        tkw = dict(kw)
        if rounding == "stochastic":
            kw["random_bits"] = rng.integers(0, 2**32, n, dtype=np.uint32)
            tkw["random_bits"] = _t(kw["random_bits"])
        want = kopt.adamw_step_reference(p, g, *state, **kw)
        got = kopt.adamw_step(_t(p), _t(g), *[_t(a) for a in state], **tkw)
        assert_same(want, got, kw, f"step {t}")
        p, state = want[0], list(want[1:])
    return p, state


# --- kernel vs twin -----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 255, 257, 1023])
@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}+{p[1]}")
def test_kernel_equals_twin(pair, rounding, n):
    _run_steps(n, *pair, rounding=rounding)


@pytest.mark.parametrize(
    "master,optimizer",
    [("float16", Adam(weight_decay=0.1)), ("float32", AdamW(weight_decay=0.0)), ("bfloat16", Adam())],
)
def test_kernel_equals_twin_masters_and_adam(master, optimizer):
    _run_steps(700, "fp8_e4m3_block256", "int8_block256", master=master, optimizer=optimizer)
    _run_steps(700, *BNB, master=master, rounding="stochastic", optimizer=optimizer, steps=2)


def test_seed_is_philox_and_inplace():
    n = 600
    rng = np.random.default_rng(3)
    p = fpsim.encode(rng.standard_normal(n).astype(np.float32), "bfloat16")
    g = rng.standard_normal(n).astype(np.float32)
    state = _states(n, *BNB)
    kw = dict(lr=1e-2, step=1, m_recipe=BNB[0], v_recipe=BNB[1], rounding="stochastic", seed=2**40 + 7)
    want = kopt.adamw_step_reference(p, g, *state, **kw)
    args = [_t(p).view(torch.bfloat16), _t(g)] + [_t(a) for a in state]
    got = kopt.adamw_step(*args, **kw, inplace=True)
    assert all(a is b for a, b in zip(got, args[:1] + args[2:]))  # the tensors passed in
    assert got.p.dtype == torch.bfloat16
    assert_same(want, kopt.AdamStep(got.p.view(torch.uint16), *got[1:]), dict(kw, master="bfloat16"))


def test_bfloat16_gradients_widen_exactly():
    n = 300
    rng = np.random.default_rng(4)
    p = fpsim.encode(rng.standard_normal(n).astype(np.float32), "bfloat16")
    gb = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
    state = _states(n, "int8_block256", "int8_block256")
    kw = dict(lr=1e-2, step=4, m_recipe="int8_block256", v_recipe="int8_block256")
    want = kopt.adamw_step_reference(p, gb.float().numpy(), *state, **kw)
    got = kopt.adamw_step(_t(p), gb, *[_t(a) for a in state], **kw)
    assert_same(want, got, dict(kw, master="bfloat16"))


# --- twin (and kernel) vs replay --------------------------------------------------------------


def _write_trace(path, steps: int = 4) -> dict:
    rng = np.random.default_rng(11)
    shapes = {"w": (7, 100), "b": (30,), "e": (3, 257)}
    p0 = {k: rng.standard_normal(s).astype(np.float32) * 0.2 for k, s in shapes.items()}
    m0 = {"e": (rng.standard_normal(shapes["e"]) * 1e-3).astype(np.float32)}
    v0 = {"e": (rng.random(shapes["e"]) * 1e-6).astype(np.float32)}
    with TraceWriter(path) as w:
        for s in range(1, steps + 1):
            grads = {
                k: (rng.standard_normal(sh) * np.exp2(rng.integers(-16, 2, sh))).astype(np.float32)
                for k, sh in shapes.items()
            }
            tensors = {"grad": grads}
            if s == 1:
                tensors.update({"param": p0, "state.exp_avg": m0, "state.exp_avg_sq": v0})
            w.write_step(s, tensors, lr=1e-3 / s)
    return {"shapes": shapes, "p0": p0, "m0": m0, "v0": v0}


REPLAY_CONFIGS = [
    ReplayConfig(
        "bnb-sr", m=BNB[0], v=BNB[1], min_quantized_size=64, master="bfloat16", master_rounding="stochastic"
    ),
    ReplayConfig("fp8", m="fp8_e4m3_block256", v="fp8_e4m3_block256", master="bfloat16"),
    ReplayConfig(
        "int8-f16", m="int8_block256", v="int8_block256", master="float16", master_rounding="stochastic"
    ),
]


@pytest.mark.parametrize(
    "optimizer", [AdamW(weight_decay=0.05), Adam(weight_decay=0.01)], ids=["adamw", "adam"]
)
def test_twin_and_kernel_equal_replay(tmp_path, optimizer):
    info = _write_trace(tmp_path / "trace")
    seed = 1234
    res = replay(tmp_path / "trace", REPLAY_CONFIGS, optimizer=optimizer, seed=seed, progress=False)
    from fpsim.trace import open_trace

    tr = open_trace(tmp_path / "trace")
    for cfg in REPLAY_CONFIGS:
        for name, shape in info["shapes"].items():
            n = int(np.prod(shape))
            quantized = n >= cfg.min_quantized_size  # else the replay keeps FP32 states
            recs = [cfg.m if quantized else "float32", cfg.v if quantized else "float32"]
            p = fpsim.encode(info["p0"][name], cfg.master)  # the replay's initial master copy
            state = []
            for rec, init in zip(recs, (info["m0"], info["v0"])):
                x = init.get(name, np.zeros(shape, np.float32))
                if rec == "float32":
                    state += [x, None]
                else:
                    enc = fpsim.encode(x, rec)
                    state += [enc.codes, enc.scales]
            twin_p, twin_state = p, state
            kern = [_t(p)] + [_t(a) for a in state]
            for step in tr.steps:
                g = np.asarray(tr.read(tr.entry(step, name, "grad")), np.float32)
                kw = dict(lr=tr.lr(step), step=step, optimizer=optimizer, m_recipe=recs[0], v_recipe=recs[1])
                kw.update(master=cfg.master, rounding=cfg.master_rounding)
                if RoundMode.parse(cfg.master_rounding) is RoundMode.STOCHASTIC:
                    kw["random_bits"] = kopt.replay_random_bits(seed, step, name, shape)
                out = kopt.adamw_step_reference(twin_p, g, *twin_state, **kw)
                twin_p, twin_state = out[0], list(out[1:])
                tkw = dict(kw)
                if "random_bits" in kw:
                    tkw["random_bits"] = _t(kw["random_bits"])
                kern = list(kopt.adamw_step(kern[0], _t(g), *kern[1:], **tkw))
                assert_same(out, kopt.AdamStep(*kern), kw, f"{cfg.name} {name} step {step}")
            want_p = res.final_params[cfg.name][name]
            got_p = fpsim.decode(twin_p, cfg.master)
            np.testing.assert_array_equal(
                got_p.view(np.uint32), want_p.view(np.uint32), err_msg=f"{cfg.name} {name}"
            )
            for (st, rec), codes, scales in zip(
                zip(("exp_avg", "exp_avg_sq"), recs), twin_state[0::2], twin_state[1::2]
            ):
                got_s = codes if rec == "float32" else fpsim.decode(fpsim.BlockCodes(codes, scales), rec)
                want_s = res.final_states[cfg.name][name][st]
                np.testing.assert_array_equal(
                    got_s.view(np.uint32), want_s.view(np.uint32), err_msg=f"{cfg.name} {name} {st}"
                )
            assert not np.array_equal(got_p, fpsim.decode(p, cfg.master))  # the steps did move p


# --- the compiled kernel ------------------------------------------------------------------------


def _compile_sm90(fusion: bool = False, **over):
    """The compiled kernel for sm_90 (PTX built on the CPU); ``over`` changes constexprs
    (state kinds, master source and rounding, ... as named below), specialised as a launch."""
    triton = pytest.importorskip("triton")
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend, GPUTarget
        from triton.compiler import ASTSource
    except ImportError:  # pragma: no cover - older triton
        pytest.skip("this triton has no ASTSource/GPUTarget")
    from fpsim.formats import RECIPES
    from fpsim.kernels import optim_args
    from fpsim.kernels._loader import kernel_module

    fn = kernel_module("_optim_kernel", interpret=False).adam_kernel
    c = dict(DECAY=1, P_SRC=2, G_SRC=0, RAND=1, P_MODE=5, M_KIND=1, V_KIND=3, B=256, BP=256, K=8, I64=False)
    c.update(over)
    kinds = {0: None, 1: RECIPES["bnb_dynamic8_block256"], 2: RECIPES["int8_block256"]}
    kinds[3] = RECIPES["fp8_e4m3_block256"]  # FLOAT, encoding FN
    master = fpsim.get_format({0: "float32", 1: "float16", 2: "bfloat16"}[c["P_SRC"]])
    mode = {0: RoundMode.NEAREST_EVEN, 5: RoundMode.STOCHASTIC}[c["P_MODE"]]
    p_fmt, p_paths = optim_args.master_paths(master, mode, c["RAND"])
    m_args, m_paths = optim_args.state_args(kinds[c["M_KIND"]])
    v_args, v_paths = optim_args.state_args(kinds[c["V_KIND"]])
    _, step = optim_args.adam_args(AdamW(weight_decay=0.01), 1e-3, 3)  # runtime floats
    consts = dict(P=p_paths, M=m_paths, V=v_paths, G_SRC=c["G_SRC"], DECAY=c["DECAY"])
    consts.update(B=c["B"], BP=c["BP"], K=c["K"], I64=c["I64"])
    pt = "*i32" if c["P_SRC"] == 0 else "*i16"
    mt, vt = ("*i32" if c[k] == 0 else "*u8" for k in ("M_KIND", "V_KIND"))
    types = {"g_ptr": "*i32" if c["G_SRC"] == 0 else "*i16", "p_io": optim_args.MasterTensors(pt, pt, "*i32")}
    types["m_io"] = optim_args.StateTensors(mt, "*i32", mt, "*i32", "*fp32", "*fp32")
    types["v_io"] = optim_args.StateTensors(vt, "*i32", vt, "*i32", "*fp32", "*fp32")
    names = fn.arg_names
    cidx = {(names.index(k),): v for k, v in consts.items()}
    for name, value in dict(step=step, p_fmt=p_fmt, m_args=m_args, v_args=v_args).items():
        ty, keys = native_specialize_impl(BaseBackend, value, False, True, True)  # as a launch
        types[name] = ty
        cidx.update({path: k for path, k in _paths(names.index(name), ty, keys) if k is not None})
    sig = {a: ("constexpr" if a in consts else types.get(a, "i32")) for a in names}
    try:
        return triton.compile(
            ASTSource(fn=fn, signature=sig, constexprs=cidx),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4, "enable_fp_fusion": fusion},
        )
    except RuntimeError as e:  # no ptxas / CUDA backend in this triton build
        if "ptxas" in str(e).lower():
            pytest.skip(f"cannot assemble for sm_90 here: {e}")
        raise


def _paths(i, ty, keys, prefix=()):
    """(argument path, specialisation key) of each leaf of a tuple argument; a key that is
    not a string is a field specialised into a constant."""
    for j, (t, k) in enumerate(zip(ty, keys)):
        if isinstance(t, tuple):
            yield from _paths(i, t, k, prefix + (j,))
        else:
            yield (i, *prefix, j), (k if t == "constexpr" else None)


def test_compiled_kernel_has_no_contracted_fma_and_exact_div_sqrt():
    k = _compile_sm90(fusion=False)
    ptx = k.asm["ptx"]
    ops = set(re.findall(r"\b(?:add|sub|mul|fma|div|sqrt|rcp|min|max)(?:\.[a-z0-9]+)*\.f32\b", ptx))
    assert {"div.rn.f32", "sqrt.rn.f32", "fma.rn.f32"} <= ops, ops
    assert not any(".ftz" in o or "approx" in o or "full" in o for o in ops), ops
    # every fma in the PTX is one of the kernel's two explicit tl.fma (m and v; AdamW has no
    # third), once per element a thread holds: 8 x 256 elements over 4 warps of 32 threads
    explicit = len(re.findall(r"\bmath\.fma\b", k.asm["ttgir"]))
    per_thread = 8 * 256 // (4 * 32)
    assert explicit == 2 and len(re.findall(r"\bfma\.rn\.f32\b", ptx)) == explicit * per_thread
    # ... while the same source with fp fusion on contracts more mul + add pairs into fmas
    fused = _compile_sm90(fusion=True).asm["ptx"]
    assert len(re.findall(r"\bfma\.rn(?:\.ftz)?\.f32\b", fused)) > explicit * per_thread


@pytest.mark.parametrize(
    "over",
    [
        dict(M_KIND=0, V_KIND=2, P_SRC=0, RAND=2, P_MODE=0, DECAY=2, I64=True),
        dict(M_KIND=2, V_KIND=0, P_SRC=1, G_SRC=2, RAND=0, P_MODE=0, DECAY=0, B=2048, BP=2048, K=1),
    ],
)
def test_other_specialisations_compile(over):
    """FP32 / integer states, float32 and float16 masters, Philox, L2 decay, 64-bit offsets."""
    k = _compile_sm90(**over)
    assert "div.rn.f32" in k.asm["ptx"] and ".ftz" not in k.asm["ptx"]


# --- validation harness and errors -------------------------------------------------------------


def test_validation_harness_passes_and_counts_a_wrong_kernel(monkeypatch):
    from fpsim.formats import RECIPES
    from fpsim.kernels.validate import optim as validate_optim

    bf = RECIPES["fp8_e4m3_block256"]
    cases = validate_optim.run(
        bf, RoundMode.NEAREST_EVEN, cases="quick", device="cpu", name="optim.adamw_step"
    )
    assert len(cases) == 1 and cases[0].ok and cases[0].compared > 10_000

    real = kopt.adamw_step

    def off_by_one_ulp(*args, **kw):  # a kernel whose master copy is one code off in places
        out = real(*args, **kw)
        p = out.p.clone()
        p.view(torch.int16)[::97] += 1
        return kopt.AdamStep(p, *out[1:])

    monkeypatch.setattr(kopt, "adamw_step", off_by_one_ulp)
    (case,) = validate_optim.run(bf, RoundMode.NEAREST_EVEN, cases="quick", device="cpu", name="x")
    assert not case.ok and case.mismatches > 20 and case.first
    m = case.first[0]
    assert m.inputs.endswith(" p") and m.got == m.expected + 1 and "s=" in m.expected_fields


def _args(n=10, m="int8_block256", v="int8_block256"):
    p = _t(fpsim.encode(np.ones(n, np.float32), "bfloat16"))
    return [p, torch.ones(n)] + [_t(a) for a in _states(n, m, v)]


@pytest.mark.parametrize(
    "kw,exc,words",
    [
        (dict(m_recipe="mxfp8_e4m3"), ValueError, ["m_recipe", "fp8_e4m3_block256", "float32"]),
        (dict(v_recipe="bnb_dynamic8_block2048"), ValueError, ["same block size", "2048"]),
        (dict(master="float8_e4m3fn"), ValueError, ["master", "bfloat16, float16, float32"]),
        (dict(rounding="toward_zero"), ValueError, ["rounding", "nearest_even or stochastic"]),
        (dict(rounding="stochastic"), ValueError, ["random_bits", "seed"]),
        (dict(seed=3), ValueError, ["seed", "rounding='stochastic' only"]),
        (dict(optimizer=SGD()), TypeError, ["optimizer", "Adam"]),
        (dict(optimizer=AdamW(sqrt="torch")), ValueError, ["sqrt='ieee'", "'torch'"]),
        (dict(step=0), ValueError, ["step", "1-based"]),
    ],
)
def test_bad_arguments_name_the_argument(kw, exc, words):
    base = dict(lr=1e-3, step=1, m_recipe="int8_block256", v_recipe="int8_block256")
    base.update(kw)
    with pytest.raises(exc) as info:
        kopt.adamw_step(*_args(), **base)
    for w in words:
        assert w in str(info.value)
    if "v_recipe" not in kw:  # the twin refuses the same arguments
        a = _args()
        np_args = [None if x is None else x.numpy() for x in a]
        np_args[0] = a[0].view(torch.int16).numpy().view(np.uint16)
        with pytest.raises(exc):
            kopt.adamw_step_reference(*np_args, **base)


def test_bad_tensors():
    kw = dict(lr=1e-3, step=1, m_recipe="int8_block256", v_recipe="int8_block256")
    a = _args()
    with pytest.raises(TypeError, match="p must hold bfloat16"):
        kopt.adamw_step(a[0].to(torch.int32), *a[1:], **kw)
    with pytest.raises(ValueError, match="m_codes must have p's shape"):
        kopt.adamw_step(a[0], a[1], a[2][:5], *a[3:], **kw)
    with pytest.raises(ValueError, match="m_scales must hold 1"):
        kopt.adamw_step(a[0], a[1], a[2], torch.zeros(2, dtype=torch.int32), *a[4:], **kw)
    with pytest.raises(TypeError, match="g must be float32"):
        kopt.adamw_step(a[0], a[1].double(), *a[2:], **kw)
    with pytest.raises(TypeError, match="FP32 state m"):
        kopt.adamw_step(*a, **dict(kw, m_recipe="float32"))


def test_kernel_equals_twin_on_tiny_and_zero_absmax_codebook_states():
    """beta1 = 0 makes m the gradient: bitsandbytes first-moment blocks whose absmax is
    subnormal (3e-39, 5e-39: 1/absmax finite; 2**-128, 1e-40: 1/absmax inf), zero, or 1 with
    the map's float32 midpoints (ties to the even entry); the second moment underflows to zero
    blocks (codes 0). Kernel equals twin, and the m codes are the codebook encode of g."""
    book = fpsim.Codebook.bnb_dynamic(True).table
    mid = ((book[:-1] + book[1:]) * np.float32(0.5)).astype(np.float32)
    rows = [np.float32(a) * book for a in (3e-39, 5e-39, 2.0**-128, 1e-40, 0.0)]
    rows.append(np.concatenate([[np.float32(1)], mid]))
    g = np.concatenate(rows).astype(np.float32)
    p = fpsim.encode(np.zeros_like(g), "bfloat16")
    state = _states(g.size, *BNB)
    kw = dict(lr=1e-3, step=1, optimizer=AdamW(betas=(0.0, 0.999)), m_recipe=BNB[0], v_recipe=BNB[1])
    want = kopt.adamw_step_reference(p, g, *state, **kw)
    np.testing.assert_array_equal(want[1], fpsim.encode(g, BNB[0]).codes)
    assert (want[1][4 * 256 : 5 * 256] == 0).all()  # the zero block: 0 * inf = NaN -> entry 0
    got = kopt.adamw_step(_t(p), _t(g), *[_t(a) for a in state], **kw)
    assert_same(want, got, dict(kw, master="bfloat16"))


@pytest.mark.parametrize("recipe", ["int8_block256", "fp8_e4m3_block256", "bnb_dynamic8_block256"])
def test_kernel_equals_twin_on_rounding_ties(recipe):
    """beta1 = 0 makes m the gradient: every block's elements sit exactly on the ties of
    the element cast (kernels/validate/optim.py ``_ties``), where ``x / s`` and
    ``x * (1 / s)`` or ``<`` and ``<=`` give different codes."""
    from fpsim.formats import RECIPES
    from fpsim.kernels.validate.optim import _ties

    g = _ties(RECIPES[recipe], np.random.default_rng(5))
    p = fpsim.encode(np.zeros_like(g), "bfloat16")
    state = _states(g.size, recipe, recipe)
    kw = dict(lr=1e-3, step=1, optimizer=AdamW(betas=(0.0, 0.999)), m_recipe=recipe, v_recipe=recipe)
    want = kopt.adamw_step_reference(p, g, *state, **kw)
    assert np.array_equal(fpsim.decode(fpsim.BlockCodes(*want[1:3]), recipe)[1:5] != 0, [True] * 4)
    got = kopt.adamw_step(_t(p), _t(g), *[_t(a) for a in state], **kw)
    assert_same(want, got, dict(kw, master="bfloat16"))
