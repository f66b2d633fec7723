"""Validation of the fused optimizer step (:mod:`fpsim.kernels.validate`).

:func:`run` compares the fused step :func:`fpsim.kernels.optim.adamw_step` with its emulator
twin :func:`fpsim.kernels.optim.adamw_step_reference` (which the tests compare with
:func:`fpsim.replay.engine.replay`) for one state recipe and one master rounding mode, zero
tolerance: the master codes, the state codes and the scale bits, every step. NaNs are
compared by class (any NaN code of the format equals any other: a GPU's arithmetic NaN is
0x7FFFFFFF where numpy keeps a sign and payload; in the interpreter even the NaN bits agree).
Each problem runs a few steps; every step
starts from the twin's previous outputs, so a mismatch does not cascade. Problems:

* ``random``: parameters over 8 binades, gradients over 40 binades, several steps (the
  states of the later steps come from the earlier ones);
* ``ties``: with beta1 = 0 the first moment is the gradient, chosen on the rounding ties
  of the element cast (and their float32 neighbours): the division ``x / s`` and the
  codebook's midpoint comparison must be exact there;
* ``zero blocks``: blocks whose parameters, gradients and states stay zero;
* ``tiny v``: gradients so small that the second moment underflows or quantizes to zero
  next to one large element per block;
* ``large``: gradients near and beyond sqrt(FLT_MAX) (the second moment overflows);
* ``inf/nan``: +-inf and NaN gradients in some blocks, then finite steps on those states;
* ``size n``: odd sizes 1, 255, 257, 1023 (ragged last blocks);
* ``trace step s``: the bundled sample trace's parameters, gradients, states, lr and step.

Variants (one :class:`~fpsim.kernels.validate.Case` each): both states in the recipe (the
bitsandbytes signed map pairs with the unsigned map for the second moment), AdamW, bfloat16
master; stochastic rounding also with the in-kernel Philox stream (``seed``). The full set
adds Adam (L2 decay) with a float16 master, and FP32 second moments with a float32 master.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fpsim.emulate import decode, encode
from fpsim.formats import RECIPES, BlockFormat, Codebook, Format, IntFormat, RoundMode, get_format
from fpsim.replay.optim import Adam, AdamW

from .common import (
    SHOWN,
    Case,
    Mismatch,
    check_cases,
    code_fields,
    f32_fields,
    guard,
    is_nan_code,
    random_words,
    torch_module,
)

_F32 = np.float32


def applies(bf: BlockFormat, mode: RoundMode) -> bool:
    """Whether the kernel has a row for this recipe and master rounding mode."""
    from ..optim import STATE_RECIPES

    return bf.name in STATE_RECIPES and mode in (RoundMode.NEAREST_EVEN, RoundMode.STOCHASTIC)


# --- problems ---------------------------------------------------------------------------------


def _mag(rng: np.random.Generator, n: int, lo: int, hi: int) -> np.ndarray:
    """Signed values with exponents uniform in [lo, hi)."""
    return np.ldexp(rng.standard_normal(n), rng.integers(lo, hi, n)).astype(_F32)


@dataclass(frozen=True)
class _Problem:
    """Initial parameters (float32, rounded to the master), the gradient of each step, initial
    states (None: zeros), lr, the first step's number and optionally other betas."""

    name: str
    p0: np.ndarray
    grads: list
    m0: np.ndarray | None = None
    v0: np.ndarray | None = None
    lr: float = 1e-3
    first: int = 1
    betas: tuple[float, float] | None = None


def _ties(bf: BlockFormat, rng: np.random.Generator) -> np.ndarray:
    """Gradients that are, with beta1 = 0 (then m = g), first moments on the rounding ties of
    the state's element cast: one element per block is the amax, the others are exact
    float32 multiples of the element format's midpoints (codebooks: the float32 midpoints
    themselves, scale 1), so ``x / s`` lands exactly on a tie (``x * (1 / s)`` would not)."""
    el, block = bf.element, bf.block[0]
    if isinstance(el, Codebook):
        c = el.table
        ties, amax = (c[:-1] + c[1:]) / _F32(2), _F32(1)
    else:
        vals = np.unique(np.abs(_element_values(el)))
        ties = ((vals[:-1].astype(np.float64) + vals[1:]) / 2 * 3).astype(_F32)  # exact: few bits
        amax = _F32(3 * bf.elem_max)
    ties = np.concatenate([ties, np.nextafter(ties, _F32(np.inf)), np.nextafter(ties, _F32(-np.inf))])
    n = 2 * block + 37
    g = rng.choice(ties, n) * rng.choice(np.array([-1, 1], _F32), n)
    g[::block] = amax
    return g.astype(_F32)


def _element_values(el: Any) -> np.ndarray:
    """Finite values of every code of an element format of at most 8 bits."""

    v = decode(np.arange(1 << el.bits, dtype=np.uint8), el)
    return v[np.isfinite(v)]


def _problems(bf: BlockFormat, quick: bool, seed: int = 0) -> Iterator[_Problem]:
    """Every problem of the module docstring for the state recipe ``bf``."""
    rng = np.random.default_rng(seed)
    steps = 3 if quick else 5
    n = 1000 if quick else 4099
    yield _Problem("random", _mag(rng, n, -4, 4), [_mag(rng, n, -20, 20) for _ in range(steps)], lr=1e-2)

    g = _ties(bf, rng)
    yield _Problem("ties", np.zeros_like(g), [g], betas=(0.0, 0.999))

    p = _mag(rng, 1024, -2, 2)
    p[:512] = 0
    grads = []
    for _ in range(2):
        g = _mag(rng, 1024, -8, 0)
        g[:512] = 0
        grads.append(g)
    yield _Problem("zero blocks", p, grads)

    grads = []
    for e in (-75, -68, -64):  # v = 0.001 * g**2 underflows or lands far below the block's amax
        g = _mag(rng, 600, e - 2, e + 2)
        g[::256] = 1.0
        grads.append(g)
    yield _Problem("tiny v", _mag(rng, 600, -2, 2), grads)

    grads = [_mag(rng, 700, 60, 66), _mag(rng, 700, 90, 127), _mag(rng, 700, -4, 4)]
    yield _Problem("large", _mag(rng, 700, -2, 2), grads)

    g = _mag(rng, 800, -6, 2)
    g[3], g[300], g[301], g[600], g[601] = np.inf, -np.inf, np.nan, np.nan, np.inf
    yield _Problem("inf/nan", _mag(rng, 800, -2, 2), [_mag(rng, 800, -6, 2), g, _mag(rng, 800, -6, 2)])

    for size in (1, 255, 257, 1023):
        grads = [_mag(rng, size, -12, 4) for _ in range(2)]
        yield _Problem(f"size {size}", _mag(rng, size, -4, 4), grads, lr=3e-4)

    for name, p0, g, m0, v0, lr, step in _trace_problems(quick):
        yield _Problem(name, p0, [g], m0, v0, lr, step)


@functools.cache
def _trace_problems(quick: bool) -> tuple:
    """The bundled sample trace's steps (those :func:`fpsim.kernels.validate.common.trace_tensors`
    picks), every tensor flattened and concatenated per role."""
    from fpsim.trace import open_trace, sample_trace_path

    trace = open_trace(sample_trace_path())
    steps = trace.steps
    picked = [steps[-1]] if quick else sorted({steps[0], steps[len(steps) // 2], steps[-1]})
    out = []
    for step in picked:
        names = [e.name for e in trace.entries(step=step, role="grad")]

        def cat(role: str, names=names, step=step) -> np.ndarray:
            arrays = [np.asarray(trace.read(trace.entry(step, nm, role)), _F32).reshape(-1) for nm in names]
            return np.concatenate(arrays)

        out.append(
            (
                f"trace step {step}",
                cat("param"),
                cat("grad"),
                cat("state.exp_avg"),
                cat("state.exp_avg_sq"),
                float(trace.lr(step)),
                int(step),
            )
        )
    return tuple(out)


# --- variants ---------------------------------------------------------------------------------


def _second_moment_recipe(bf: BlockFormat) -> BlockFormat:
    """The bitsandbytes signed map's partner for the second moment (same block), else ``bf``."""
    if isinstance(bf.element, Codebook) and bf.element.name == "bnb_dynamic8":
        for other in RECIPES.values():
            el = other.element
            if isinstance(el, Codebook) and el.name == "bnb_dynamic8u" and other.block == bf.block:
                return other
    return bf


def _variants(bf: BlockFormat, mode: RoundMode, quick: bool) -> list[dict[str, Any]]:
    base = {
        "m": bf,
        "v": _second_moment_recipe(bf),
        "master": "bfloat16",
        "optimizer": AdamW(weight_decay=0.01),
    }
    out = [dict(base, random="bits")]
    if mode is RoundMode.STOCHASTIC:
        out.append(dict(base, random="seed"))
    if not quick:
        out.append(dict(base, master="float16", optimizer=Adam(weight_decay=0.01), random="bits"))
        out.append(dict(base, v="float32", master="float32", random="bits"))
    return out


def _describe(opts: dict[str, Any]) -> dict[str, Any]:
    opt = opts["optimizer"]
    return {
        "m": getattr(opts["m"], "name", opts["m"]),
        "v": getattr(opts["v"], "name", opts["v"]),
        "master": opts["master"],
        "optimizer": f"{opt.name}(wd={opt.weight_decay:g})",
        "random": opts["random"],
        "nan_by_class": True,
    }


# --- running ------------------------------------------------------------------------------------


def _initial_state(x: np.ndarray, recipe: Any) -> tuple[np.ndarray, np.ndarray | None]:

    if getattr(recipe, "name", recipe) == "float32":
        return x.copy(), None
    enc = encode(x, recipe)
    return enc.codes, enc.scales


def _to_torch(torch: Any, a: np.ndarray | None, device: str) -> Any:
    if a is None:
        return None
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.uint16).to(device)
    if a.dtype == np.uint32:
        return torch.from_numpy(a.view(np.int32).copy()).view(torch.uint32).to(device)
    return torch.from_numpy(a.copy()).to(device)


def _as_int64(torch: Any, t: Any) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.float32:
        t = t.view(torch.int32)
    if t.dtype in (torch.uint16, torch.uint32):
        t = t.to(torch.int64)
    a = t.numpy().reshape(-1)
    return a.view(np.uint32).astype(np.int64) if a.dtype == np.int32 else a.astype(np.int64)


def _ref_int64(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a).reshape(-1)
    return (a.view(np.uint32) if a.dtype == _F32 else a).astype(np.int64)


def _nan_mask(codes: np.ndarray, fmt: Any) -> np.ndarray:
    """Which int64 codes are NaN in ``fmt`` (an element format; None: float32 bits)."""
    if fmt is None:
        return np.isnan(codes.astype(np.uint32).view(_F32))
    if isinstance(fmt, (Format, IntFormat)):
        return is_nan_code(codes, fmt)
    return np.zeros(codes.shape, bool)  # codebook codes are indices


def _fields(code: int, fmt: Any) -> str:
    if fmt is None:
        return f32_fields(code)
    if isinstance(fmt, Codebook):
        return (
            f"0x{code:02x} (entry {code}) = {float(fmt.table[code]) if code < len(fmt.values) else 'invalid'}"
        )
    return code_fields(code, fmt)


def _outputs(opts: dict[str, Any]) -> list[tuple[str, Any, int]]:
    """(output name, format of its codes (None: float32 bits), elements per output element)
    in AdamStep order."""
    from ..optim import state_recipe

    out: list[tuple[str, Any, int]] = [("p", get_format(opts["master"]), 1)]
    for which in ("m", "v"):
        bf = state_recipe(f"{which}_recipe", opts[which])
        out.append((f"{which}_codes", None if bf is None else bf.element, 1))
        out.append((f"{which}_scales", None, 1 if bf is None else bf.block[0]))
    return out


def run(fmt: BlockFormat, rounding: RoundMode, *, cases: str, device: str, name: str) -> list[Case]:
    """One :class:`~fpsim.kernels.validate.Case` per variant comparing the kernel with its
    twin on every problem (see the module docstring); codes and scales counted together."""
    torch = torch_module()
    quick = check_cases(cases)
    out = []
    for opts in _variants(fmt, rounding, quick):
        case = Case(name, fmt.name, rounding.value, _describe(opts))
        rng = np.random.default_rng([11, len(out)])
        try:
            for k, pr in enumerate(_problems(fmt, quick)):
                _run_problem(case, _Step(torch, opts, rounding, device, rng), pr, k)
        except Exception as e:  # noqa: BLE001 - reported in the case
            case.error = f"{type(e).__name__}: {e}"
        out.append(case)
    return out


@dataclass(frozen=True)
class _Step:
    """What every step of one variant shares: torch, the variant's options, the master
    rounding, the device and the random words' generator."""

    torch: Any
    opts: dict[str, Any]
    rounding: RoundMode
    device: str
    rng: np.random.Generator

    def random_kwargs(self, p: np.ndarray, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The twin's and the kernel's random source for one step (empty unless stochastic)."""
        if self.rounding is not RoundMode.STOCHASTIC:
            return {}, {}
        if self.opts["random"] == "seed":
            return {"seed": seed}, {"seed": seed}
        words = random_words(p.size, self.rng).reshape(p.shape)
        return {"random_bits": words}, {
            "random_bits": _to_torch(self.torch, words, self.device).view(self.torch.int32)
        }


def _run_problem(case: Case, st: _Step, pr: _Problem, k: int) -> None:
    """Every step of problem ``k``, kernel against twin, each from the twin's previous outputs."""

    from .. import optim as kernel  # looked up at the call: the tests replace adamw_step

    opts = st.opts
    opt = opts["optimizer"] if pr.betas is None else replace(opts["optimizer"], betas=pr.betas)
    kw0 = {"optimizer": opt, "m_recipe": opts["m"], "v_recipe": opts["v"]}
    kw0.update(master=opts["master"], rounding=st.rounding, lr=pr.lr)
    p = encode(pr.p0, opts["master"])
    state = [*_initial_state(np.zeros_like(pr.p0) if pr.m0 is None else pr.m0, opts["m"])]
    state += [*_initial_state(np.zeros_like(pr.p0) if pr.v0 is None else pr.v0, opts["v"])]
    outputs = _outputs(opts)
    for i, g in enumerate(pr.grads):
        rkw, tkw = st.random_kwargs(p, 1000 * k + 17 * i + 5)
        kw = dict(kw0, step=pr.first + i)
        want = kernel.adamw_step_reference(p, g, *state, **kw, **rkw)
        args = [_to_torch(st.torch, a, st.device) for a in (p, g, *state)]
        with guard(st.device):
            got = kernel.adamw_step(*args, **kw, **tkw)
        where = f"{pr.name} step {pr.first + i}"
        for (oname, ofmt, per), w, gt in zip(outputs, want, got):
            _tally(case, f"{where} {oname}", ofmt, per, g, w, gt, st.torch)
        p, state = want[0], list(want[1:])


def _tally(
    case: Case, where: str, ofmt: Any, per: int, g: np.ndarray, want: Any, got: Any, torch: Any
) -> None:
    """Count one output's mismatches; keep the first with the gradient element (for a
    scale: the block's first) as the input."""
    if want is None:
        if got is not None:
            raise TypeError(f"{where}: the kernel returned a tensor where the twin has None")
        return
    w, gt = _ref_int64(want), _as_int64(torch, got)
    if w.shape != gt.shape:
        raise ValueError(f"{where}: the kernel returned {gt.size} elements, the twin {w.size}")
    bad = w != gt
    if bad.any():
        bad &= ~(_nan_mask(w, ofmt) & _nan_mask(gt, ofmt))
    case.compared += int(w.size)
    case.mismatches += int(bad.sum())
    gflat = np.asarray(g, _F32).reshape(-1)
    for i in np.flatnonzero(bad)[: max(0, SHOWN - len(case.first))]:
        j = min(int(i) * per, gflat.size - 1)
        gv = gflat[j : j + 1]
        case.first.append(
            Mismatch(
                where,
                int(i),
                f"0x{int(gv.view(np.uint32)[0]):08x}",
                float(gv[0]),
                int(w[i]),
                int(gt[i]),
                _fields(int(w[i]), ofmt),
                _fields(int(gt[i]), ofmt),
            )
        )
