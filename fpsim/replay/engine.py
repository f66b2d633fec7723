"""Replay a recorded gradient sequence through emulated low-precision optimizers.

:func:`replay` runs, side by side, an FP32 reference of the optimizer and each
:class:`ReplayConfig` (states stored in a format or block recipe, master weights in a format
with nearest or stochastic rounding and optional Kahan compensation, gradients in a format with
static/dynamic loss scaling or FP8 scaling) on the same recorded gradients, and measures per
step and tensor how far each drifts from the reference.

Semantics, per recorded step ``s`` in order (steps are replayed as consecutive updates; Adam's
update count is the trace's step number, which fpsim's capture records as the optimizer's
1-based update count):

1. Gradient: ``g`` as recorded (float32). A config with gradient format ``G`` and loss scale
   ``S`` sees ``q = quantize(f32(g * S), G)``; any inf/NaN in any tensor skips the step for
   that config (GradScaler) and updates the scaler; otherwise ``g' = f32(q * f32(1/S))``
   (the optimizer works in FP32 on unscaled gradients). FP8 gradients take a block recipe
   (``e5m2_tensor`` = current scaling) or :class:`fpsim.DelayedScaling` per tensor.
2. Update in FP32 (:mod:`fpsim.optim`) on the dequantized states and the master value.
3. States are re-encoded in their formats (nearest-even); tensors with fewer than
   ``min_quantized_size`` elements keep FP32 states (bitsandbytes' ``min_8bit_size``).
4. The master copy is rounded once from the FP32 result to its format (``master_rounding``);
   with ``kahan`` the rounding error is carried in a compensation buffer of the same format.

Initial parameters and states come from the trace's first replayed step when recorded
("param", "state.exp_avg", ...), else zeros.
"""

from __future__ import annotations

import fnmatch
import math
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import _compiled
from ..emulate import decode, encode
from ..emulate import element as emulate
from ..emulate.blocks import encode_decode_blocks
from ..emulate.delayed import DelayedScaling
from ..emulate.random import random_bits_at
from ..formats import RECIPES, BlockFormat, Codebook, Format, RoundMode, get_format
from ..optim import AdamW, Optimizer
from . import fused as _fused
from .lossscale import LossScaler, ScalerState

__all__ = ["ReplayConfig", "ReplayResult", "replay", "PRESETS", "memory_table"]

_F32 = np.float32
_STATE_FIELDS = {"exp_avg": "m", "exp_avg_sq": "v", "momentum_buffer": "momentum"}


@dataclass(frozen=True)
class ReplayConfig:
    """One low-precision training configuration to replay.

    Args:
        name: label in the tables.
        m, v, momentum: storage of Adam's first/second moment and SGD's momentum: an element
            format or block recipe (name or object), e.g. ``"bnb_dynamic8_block256"``.
        min_quantized_size: tensors with fewer elements keep FP32 states.
        master: format of the optimizer's parameter copy (``"float32"``, ``"bfloat16"``, ...).
        master_rounding: rounding of that copy (nearest_even or stochastic).
        kahan: carry the master rounding error in a compensation buffer (Kahan summation).
        master_overrides: ``(pattern, format)`` pairs; tensors whose name matches the
            fnmatch pattern keep their master copy in that format (first match wins), e.g.
            ``(("embed*", "float32"),)``.
        weights: format of a separate forward copy of the weights, counted in the memory
            table only (None: the master copy is the weights).
        grad: gradient format or block recipe (``"float16"``, ``"e5m2_tensor"``, ...).
        loss_scaler: static or dynamic loss scaling of the gradients.
        grad_delayed: FP8 delayed scaling of the gradients (one state per tensor).
    """

    name: str
    m: Any = "float32"
    v: Any = "float32"
    momentum: Any = "float32"
    min_quantized_size: int = 0
    master: Any = "float32"
    master_rounding: RoundMode | str = RoundMode.NEAREST_EVEN
    kahan: bool = False
    master_overrides: tuple[tuple[str, Any], ...] = ()
    weights: Any = None
    grad: Any = "float32"
    loss_scaler: LossScaler | None = None
    grad_delayed: DelayedScaling | None = None

    def state_format(self, state: str) -> Any:
        return get_format(getattr(self, _STATE_FIELDS[state]))

    def master_format(self, tensor: str) -> Format:
        for pattern, fmt in self.master_overrides:
            if fnmatch.fnmatchcase(tensor, pattern):
                return get_format(fmt)
        return get_format(self.master)


PRESETS: dict[str, ReplayConfig] = {
    c.name: c
    for c in (
        ReplayConfig("fp32"),
        ReplayConfig("bf16-master", master="bfloat16"),
        ReplayConfig("bf16-master-sr", master="bfloat16", master_rounding="stochastic"),
        ReplayConfig("bf16-master-kahan", master="bfloat16", kahan=True),
        ReplayConfig("bf16-states", m="bfloat16", v="bfloat16"),
        ReplayConfig("int8-states", m="int8_block256", v="int8_block256"),
        ReplayConfig("fp8-states", m="fp8_e4m3_block256", v="fp8_e4m3_block256"),
        ReplayConfig(
            "bnb-8bit", m="bnb_dynamic8_block256", v="bnb_dynamic8u_block256", min_quantized_size=4096
        ),
        ReplayConfig("bnb-8bit-all", m="bnb_dynamic8_block256", v="bnb_dynamic8u_block256"),
        ReplayConfig(
            "bnb-8bit-cpu",
            m=replace(RECIPES["bnb_dynamic8_block256"], element=Codebook.bnb_dynamic(True, lut_bins=65536)),
            v=replace(RECIPES["bnb_dynamic8u_block256"], element=Codebook.bnb_dynamic(False, lut_bins=65536)),
            min_quantized_size=4096,
        ),
        ReplayConfig("msamp-o2", m="e4m3_tensor_pow2", v="float16", master="float16"),
        ReplayConfig("fp16-grads-dynamic", grad="float16", loss_scaler=LossScaler()),
        ReplayConfig("fp8-grads-delayed", grad_delayed=DelayedScaling("float8_e5m2", history_len=16)),
    )
}
"""Named configurations for ``fpsim replay --config NAME``."""


@dataclass
class _Stats:
    """Per step x tensor x config sums, so that global metrics can be formed exactly."""

    n: int = 0
    p_err_sq: float = 0.0
    p_ref_sq: float = 0.0
    upd_dot: float = 0.0
    upd_sq: float = 0.0
    upd_ref_sq: float = 0.0
    updates: int = 0
    swamped: int = 0
    state_nonzero: int = 0
    state_zeroed: int = 0
    state_err_sq: dict[str, float] = field(default_factory=dict)
    state_ref_sq: dict[str, float] = field(default_factory=dict)


@dataclass
class ReplayResult:
    """Per (step, tensor, config) statistics plus per (step, config) loss scale and skips.

    ``final_params[config][tensor]`` and ``final_states[config][tensor][state]`` hold the
    values after the last replayed step (float32, dequantized); config ``"reference"`` is the
    FP32 reference.
    """

    trace: str
    configs: list[ReplayConfig]
    steps: list[int]
    stats: dict[tuple[int, str, str], _Stats] = field(default_factory=dict)
    scale: dict[tuple[int, str], float] = field(default_factory=dict)
    skipped: dict[tuple[int, str], bool] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    final_params: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    final_states: dict[str, dict[str, dict[str, np.ndarray]]] = field(default_factory=dict)

    def table(self):
        """Tidy DataFrame: step, tensor, config, metric, value."""
        import pandas as pd

        rows = []
        for (step, tensor, cfg), s in sorted(self.stats.items()):
            for metric, value in _metrics(s).items():
                rows.append((step, tensor, cfg, metric, value))
        for (step, cfg), scale in sorted(self.scale.items()):
            rows.append((step, "*", cfg, "loss_scale", scale))
            rows.append((step, "*", cfg, "skipped", float(self.skipped[step, cfg])))
        return pd.DataFrame(rows, columns=["step", "tensor", "config", "metric", "value"])

    def per_step(self, config: str) -> list[dict[str, float]]:
        """Metrics over all tensors, one dict per step."""
        out = []
        for step in self.steps:
            total = _sum(s for (st, _, c), s in self.stats.items() if st == step and c == config)
            out.append(
                {
                    "step": step,
                    **_metrics(total),
                    "loss_scale": self.scale.get((step, config), 1.0),
                    "skipped": float(self.skipped.get((step, config), False)),
                }
            )
        return out

    def summary(self) -> dict[str, Any]:
        """One entry per configuration under ``results`` (JSON-ready)."""
        mem = {r["config"]: r for r in memory_table(self.configs, self.sizes)}
        results = []
        for cfg in self.configs:
            per_step = self.per_step(cfg.name)
            total = _sum(s for (_, _, c), s in self.stats.items() if c == cfg.name)
            cos = [r["update_cosine"] for r in per_step if not math.isnan(r["update_cosine"])]
            results.append(
                {
                    "config": cfg.name,
                    "steps": len(self.steps),
                    "final_param_rel_error": per_step[-1]["param_rel_error"] if per_step else 0.0,
                    "mean_update_cosine": float(np.mean(cos)) if cos else float("nan"),
                    "swamped_share": total.swamped / total.updates if total.updates else 0.0,
                    "zero_state_share": total.state_zeroed / total.state_nonzero
                    if total.state_nonzero
                    else 0.0,
                    "skipped_steps": sum(self.skipped.get((s, cfg.name), False) for s in self.steps),
                    "final_loss_scale": per_step[-1]["loss_scale"] if per_step else 1.0,
                    "bytes_per_param": mem[cfg.name]["total"],
                }
            )
        return {"trace": self.trace, "parameters": sum(self.sizes.values()), "results": _json_safe(results)}


def _json_safe(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
        for r in rows
    ]


def _sum(stats: Iterable[_Stats]) -> _Stats:
    out = _Stats()
    for s in stats:
        for name in (
            "n",
            "p_err_sq",
            "p_ref_sq",
            "upd_dot",
            "upd_sq",
            "upd_ref_sq",
            "updates",
            "swamped",
            "state_nonzero",
            "state_zeroed",
        ):
            setattr(out, name, getattr(out, name) + getattr(s, name))
        for name in ("state_err_sq", "state_ref_sq"):
            d = getattr(out, name)
            for k, v in getattr(s, name).items():
                d[k] = d.get(k, 0.0) + v
    return out


def _metrics(s: _Stats) -> dict[str, float]:
    out = {
        "param_rel_error": math.sqrt(s.p_err_sq / s.p_ref_sq) if s.p_ref_sq else math.sqrt(s.p_err_sq),
        "update_cosine": s.upd_dot / math.sqrt(s.upd_sq * s.upd_ref_sq)
        if s.upd_sq and s.upd_ref_sq
        else float("nan"),
        "swamped_share": s.swamped / s.updates if s.updates else 0.0,
        "zero_state_share": s.state_zeroed / s.state_nonzero if s.state_nonzero else 0.0,
    }
    for k, err in s.state_err_sq.items():
        ref = s.state_ref_sq.get(k, 0.0)
        out[f"{k}_rel_error"] = math.sqrt(err / ref) if ref else math.sqrt(err)
    return out


# --- memory ------------------------------------------------------------------------------


def _bytes(fmt: Any) -> float:
    fmt = get_format(fmt)
    return fmt.bytes_per_element


def memory_table(configs: Sequence[ReplayConfig], sizes: dict[str, int], optimizer: Optimizer | None = None):
    """Bytes per parameter of each configuration: weights, grads, states, master copy, total.

    Block recipes count their scales (``BlockFormat.bytes_per_element``); tensors below
    ``min_quantized_size`` count FP32 states; per-tensor master overrides are weighted by size.
    """
    optimizer = optimizer or AdamW()
    total = sum(sizes.values()) or 1
    rows = []
    for c in configs:
        master = sum(_bytes(c.master_format(n)) * k for n, k in sizes.items()) / total
        states = 0.0
        for st in optimizer.states:
            fmt = c.state_format(st)
            states += (
                sum((_bytes(fmt) if k >= c.min_quantized_size else 4.0) * k for k in sizes.values()) / total
            )
        grad = (
            _bytes(c.grad) if c.grad_delayed is None else get_format(c.grad_delayed.element).bytes_per_element
        )
        weights = _bytes(c.weights) if c.weights is not None else 0.0
        comp = master if c.kahan else 0.0
        rows.append(
            {
                "config": c.name,
                "weights": weights,
                "master": master,
                "grads": grad,
                "states": states,
                "kahan_buffer": comp,
                "total": weights + master + grad + states + comp,
            }
        )
    return rows


# --- the replay ---------------------------------------------------------------------------


@dataclass
class _Run:
    cfg: ReplayConfig
    master: dict[str, np.ndarray] = field(default_factory=dict)  # stored values (float32)
    comp: dict[str, np.ndarray] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> state -> encoded
    loaded: dict[str, dict[str, np.ndarray] | None] = field(default_factory=dict)  # their values (None:
    # not decoded yet, see _loaded)
    scaler: ScalerState | None = None
    delayed: dict[str, Any] = field(default_factory=dict)


def replay(
    trace: Any = None,
    configs: Sequence[ReplayConfig | str] = ("bf16-master", "bnb-8bit-all", "fp8-states"),
    *,
    optimizer: Optimizer | None = None,
    lr: float | None = None,
    steps: Iterable[int] | None = None,
    seed: int = 0,
    tensors: Iterable[str] | None = None,
    progress: bool = True,
    threads: int | None = None,
) -> ReplayResult:
    """Replay ``trace``'s gradients through ``configs`` next to an FP32 reference.

    Args:
        trace: trace path or :class:`fpsim.trace.Trace` (None: the bundled sample).
        configs: :class:`ReplayConfig` objects or names of :data:`PRESETS`.
        optimizer: :class:`fpsim.optim.Adam`, ``AdamW`` or ``SGD`` (default AdamW()).
        lr: learning rate for every step; None uses the trace's recorded lr per step.
        steps: the recorded steps to replay (default all), replayed in increasing order.
        seed: base seed of stochastic rounding (counter-based, per step and tensor).
        tensors: replay only these tensors (names as recorded; default all). A loss scaler
            then sees only their gradients.
        progress: show a progress bar.
        threads: worker threads (default: the CPUs this process may use). Tensors, and
            pieces of large tensors in elementwise optimizer steps, are updated in parallel
            (numpy releases the GIL); the result does not depend on the number of threads.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    from ..trace import Trace, open_trace, sample_trace_path

    tr = trace if isinstance(trace, Trace) else open_trace(sample_trace_path() if trace is None else trace)
    optimizer = optimizer or AdamW()
    cfgs = [PRESETS[c] if isinstance(c, str) and c in PRESETS else c for c in configs]
    for c in cfgs:
        if not isinstance(c, ReplayConfig):
            raise ValueError(f"unknown replay configuration {c!r}; presets: {', '.join(PRESETS)}")
    wanted = sorted(tr.steps if steps is None else set(steps))
    missing = [s for s in wanted if s not in tr.steps]
    if missing:
        raise ValueError(f"{tr.path}: steps {missing} are not in the trace (it has {tr.steps})")
    names = [e.name for e in tr.entries(step=wanted[0], role="grad")]
    if tensors is not None:
        keep = list(tensors)
        unknown = sorted(set(keep) - set(names))
        if unknown:
            raise ValueError(f"{tr.path}: tensors {unknown} have no gradient at step {wanted[0]}")
        names = [n for n in names if n in set(keep)]
    first = wanted[0]
    params, ref_states = {}, {}
    for name in names:
        g = tr.entry(first, name, "grad")
        params[name] = _initial(tr, first, name, "param", g.shape)
        ref_states[name] = {st: _initial(tr, first, name, f"state.{st}", g.shape) for st in optimizer.states}
    result = ReplayResult(str(tr.path), cfgs, wanted, sizes={n: int(params[n].size) for n in names})
    n_threads = _threads(threads)
    spare = _Spare()
    pool = ThreadPoolExecutor(max_workers=n_threads) if n_threads > 1 else _InThread()
    bar = tqdm(total=len(wanted) * len(names), disable=not progress, desc="replay", unit="tensor-step")
    try:
        runs = [_start(c, params, ref_states, optimizer, pool) for c in cfgs]
        for step in wanted:
            _replay_step(tr, step, names, lr, optimizer, params, ref_states, runs, seed, result, pool, spare)
            bar.update(len(names))
        result.final_params["reference"] = params
        result.final_states["reference"] = ref_states
        for run in runs:
            result.final_params[run.cfg.name] = run.master
            states = pool.map(lambda name, run=run: _loaded(run, name), names)
            result.final_states[run.cfg.name] = dict(zip(names, states))
    finally:
        pool.shutdown()
        bar.close()
    return result


class _InThread:
    """The executor interface, run in the calling thread (one thread: nothing to hand over)."""

    def map(self, fn, items):
        return map(fn, items)

    def shutdown(self) -> None:
        pass


def _threads(threads: int | None) -> int:
    if threads is None:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"replay: threads must be a positive integer, got {threads!r}")
    return threads


_PIECE = 1 << 19  # elements per task of an elementwise optimizer step


def _replay_step(tr, step, names, lr, optimizer, params, ref_states, runs, seed, result, pool, spare) -> None:
    """One recorded step: the FP32 reference, then each configuration, tensors in parallel."""
    lr_s = lr if lr is not None else tr.lr(step)
    if lr_s is None:
        raise ValueError(f"{tr.path}: step {step} has no recorded lr; pass lr=")
    grads = {}
    for name in names:
        g = np.asarray(tr.read(tr.entry(step, name, "grad")), _F32)
        if g.shape != params[name].shape:
            raise ValueError(
                f"{tr.path}: step {step} gradient {name!r} has shape {g.shape}, expected {params[name].shape}"
            )
        grads[name] = g
    ref_new = _reference_step(optimizer, names, params, grads, ref_states, lr_s, step, pool, spare)
    for run in runs:
        _step_config(run, optimizer, step, lr_s, grads, params, ref_new, seed, result, pool)
    for name in names:
        params[name], ref_states[name] = ref_new[name]
    spare.step_done()


class _Spare:
    """Recycles the reference's output arrays: the arrays a step wrote are free again once the
    next step has replaced them (nothing else holds them), and reusing them spares the page
    faults of fresh memory (as costly as the optimizer's arithmetic)."""

    def __init__(self) -> None:
        self.free: dict[tuple, list[np.ndarray]] = {}
        self.lent: list[np.ndarray] = []  # handed out this step
        self.held: list[np.ndarray] = []  # handed out last step: in params / ref_states now

    def take(self, shape: tuple) -> np.ndarray:
        pool = self.free.get(shape)
        a = pool.pop() if pool else np.empty(shape, _F32)
        self.lent.append(a)
        return a

    def step_done(self) -> None:
        for a in self.held:
            self.free.setdefault(a.shape, []).append(a)
        self.held, self.lent = self.lent, []


def _reference_step(optimizer, names, params, grads, states, lr, step, pool, spare) -> dict[str, tuple]:
    """``optimizer.step`` on every tensor; elementwise steps write into recycled arrays, large
    tensors in pieces of :data:`_PIECE` elements (one task each)."""
    tasks, out = [], {}
    for name in names:
        p, n = params[name], params[name].size
        if not optimizer.elementwise:
            tasks.append((name, None))
            continue
        out[name] = (spare.take(p.shape), {st: spare.take(p.shape) for st in optimizer.states})
        tasks += [(name, slice(i, min(i + _PIECE, n))) for i in range(0, max(n, 1), _PIECE)]

    def run(task):
        name, part = task
        p, g, s = params[name], grads[name], states[name]
        if part is None:
            return task, optimizer.step(p, g, s, lr, step)
        flat = {st: v.reshape(-1)[part] for st, v in s.items() if v is not None}
        o_p, o_s = out[name]
        o_flat = (o_p.reshape(-1)[part], {st: o_s[st].reshape(-1)[part] for st in o_s})
        optimizer.step(p.reshape(-1)[part], g.reshape(-1)[part], flat, lr, step, out=o_flat)
        return task, None

    for (name, part), res in pool.map(run, tasks):
        if part is None:
            out[name] = res
    return out


def _initial(tr: Any, step: int, name: str, role: str, shape: tuple) -> np.ndarray:
    try:
        entry = tr.entry(step, name, role)
    except (KeyError, LookupError, ValueError):
        return np.zeros(shape, _F32)
    return np.array(tr.read(entry), _F32)


def _is_quantized(cfg: ReplayConfig, fmt: Any, size: int) -> bool:
    return size >= cfg.min_quantized_size and not (isinstance(fmt, Format) and fmt.name == "float32")


def _store_and_load(cfg: ReplayConfig, st: str, x: np.ndarray) -> tuple[Any, np.ndarray]:
    """The stored form of a state and its float32 values, in one pass: block recipes as
    codes (by the fused step's own encoder where it covers the recipe), element formats as
    their float32 values (exact in the format)."""
    fmt = cfg.state_format(st)
    if not _is_quantized(cfg, fmt, x.size):
        return x, x
    if isinstance(fmt, BlockFormat):
        return _fused.encode_state(fmt, x) or encode_decode_blocks(x, fmt)
    if isinstance(fmt, Format):
        q = _quantize(x, fmt, RoundMode.NEAREST_EVEN)
        return q, q
    stored = encode(x, fmt)
    return stored, decode(stored, fmt)


def _load_state(cfg: ReplayConfig, st: str, stored: Any) -> np.ndarray:
    fmt = cfg.state_format(st)
    if isinstance(stored, np.ndarray) and stored.dtype == _F32:
        return stored
    out = _fused.decode_state(fmt, stored)
    return decode(stored, fmt) if out is None else out


def _start(cfg: ReplayConfig, params, ref_states, optimizer, pool) -> _Run:
    run = _Run(cfg, scaler=cfg.loss_scaler.init() if cfg.loss_scaler else None)

    def first(name: str) -> tuple:
        p, fmt = params[name], cfg.master_format(name)
        exact = fmt.name == "float32" and not np.isnan(p).any()  # (quantize makes NaNs quiet)
        master = p.copy() if exact else _quantize(p, fmt, RoundMode.NEAREST_EVEN)
        return master, {st: _store_and_load(cfg, st, ref_states[name][st]) for st in optimizer.states}

    for name, (master, states) in zip(params, pool.map(first, list(params))):
        run.master[name] = master
        run.states[name] = {st: enc for st, (enc, _) in states.items()}
        run.loaded[name] = {st: val for st, (_, val) in states.items()}
        if cfg.kahan:
            run.comp[name] = np.zeros_like(master)
        if cfg.grad_delayed is not None:
            run.delayed[name] = cfg.grad_delayed.init()
    return run


def _grad(run: _Run, name: str, g: np.ndarray) -> tuple[np.ndarray, bool]:
    """The gradient the optimizer sees, and whether it holds inf/NaN (looked at only where a
    loss scaler will act on it)."""
    cfg = run.cfg
    if cfg.grad_delayed is not None:
        enc, run.delayed[name] = cfg.grad_delayed.step(run.delayed[name], g)
        return (emulate.decode(enc.codes, cfg.grad_delayed.element) * _F32(enc.scales.view(_F32)[0])), False
    fmt = get_format(cfg.grad)
    if isinstance(fmt, BlockFormat):
        q = decode(encode(g, fmt), fmt)
    elif fmt.name == "float32" and run.scaler is None:
        q = g
    else:
        scale = _F32(run.scaler.scale) if run.scaler else _F32(1)
        with np.errstate(over="ignore", invalid="ignore"):
            q = emulate.quantize(g * scale, fmt)
            if run.scaler:
                inf = not bool(np.isfinite(q).all())
                return q * run.scaler.inv_scale, inf
    return q, run.scaler is not None and not bool(np.isfinite(q).all())


def _step_config(run, optimizer, step, lr, grads, params, ref_new, seed, result, pool) -> None:
    cfg = run.cfg
    found_inf = False
    unscaled = {}
    for name, (q, inf) in zip(grads, pool.map(lambda n: _grad(run, n, grads[n]), list(grads))):
        unscaled[name] = q
        found_inf |= inf
    scale = run.scaler.scale if run.scaler else 1.0
    skip = found_inf and run.scaler is not None
    result.scale[step, cfg.name] = scale
    result.skipped[step, cfg.name] = skip
    if run.scaler is not None:
        run.scaler = cfg.loss_scaler.update(run.scaler, found_inf)
    mode = RoundMode.parse(cfg.master_rounding)
    fused = {} if skip else _fused_steps(run, optimizer, step, lr, unscaled, ref_new, pool)

    def update(name: str) -> _Stats:
        return _update_tensor(
            run, optimizer, name, step, lr, unscaled[name], params[name], ref_new[name], skip, mode, seed,
            fused.get(name),
        )  # fmt: skip

    for name, stats in zip(grads, pool.map(update, list(grads))):  # in order: sums stay reproducible
        result.stats[step, name, cfg.name] = stats


def _fused_steps(run, optimizer, step, lr, grads, ref_new, pool) -> dict[str, _fused.FusedStep]:
    """The fused compiled updates (:mod:`fpsim.replay.fused`) of the tensors they cover, piece by
    piece in the thread pool (a large tensor is not left to one thread)."""
    plans = {}
    for name, g in grads.items():
        formats = {st: run.cfg.state_format(st) for st in run.states[name]}
        if all(_is_quantized(run.cfg, f, g.size) for f in formats.values()):
            pl = _fused.plan(optimizer, formats, run.states[name], run.master[name], g, ref_new[name][1])
            if pl is not None:
                plans[name] = pl
    jobs = [(name, part) for name, pl in plans.items() for part in _fused.pieces(pl)]
    done = list(pool.map(lambda job: _fused.run_piece(plans[job[0]], job[1], optimizer, lr, step), jobs))
    return {
        name: _fused.finish(pl, [res for (n, _), res in zip(jobs, done) if n == name])
        for name, pl in plans.items()
    }


def _update_tensor(run, optimizer, name, step, lr, g, p_ref_old, ref_new, skip, mode, seed, fused) -> _Stats:
    """One configuration's update of one tensor (``fused``: its fused update, already done),
    and its statistics against the reference."""
    cfg = run.cfg
    p_old = run.master[name]
    p_ref, s_ref = ref_new
    s = _Stats(n=p_old.size)
    if skip:
        p_f32 = p_new = p_old
        for st, v in _loaded(run, name).items():
            _state_stats(s, st, None, v, s_ref[st])
    else:
        if fused is not None:
            p_f32, run.states[name], run.loaded[name] = fused.p, fused.states, None
            for st, (nonzero, zeroed, err, tot) in fused.stats.items():
                s.state_nonzero += nonzero
                s.state_zeroed += zeroed
                s.state_err_sq[st], s.state_ref_sq[st] = err, tot
        else:
            p_f32, exact = optimizer.step(p_old, g, _loaded(run, name), lr, step)
            stored = {st: _store_and_load(cfg, st, v) for st, v in exact.items()}
            run.states[name] = {st: enc for st, (enc, _) in stored.items()}
            run.loaded[name] = {st: val for st, (_, val) in stored.items()}
            for st, v in run.loaded[name].items():
                rounded = v is not exact[st]  # stored as float32: nothing was rounded
                _state_stats(s, st, exact[st] if rounded else None, v, s_ref[st])
        p_new = _round_master(run, name, p_old, p_f32, mode, seed ^ zlib.crc32(f"{step}:{name}".encode()))
    run.master[name] = p_new
    _tensor_stats(s, p_f32, p_old, p_new, p_ref, p_ref_old)
    return s


def _loaded(run: _Run, name: str) -> dict[str, np.ndarray]:
    """The float32 values of a tensor's stored states (decoded when the fused step left only
    the codes)."""
    if run.loaded.get(name) is None:
        run.loaded[name] = {st: _load_state(run.cfg, st, enc) for st, enc in run.states[name].items()}
    return run.loaded[name]


def _tensor_stats(s: _Stats, p_f32, p_old, p_new, p_ref, p_ref_old) -> None:
    """Update counts (changed by the optimizer; of those, swallowed by the master rounding) and
    the float64 sums of the parameter error and of the two updates, into ``s``."""
    flat = _compiled.flat32(p_f32, p_old, p_new, p_ref, p_ref_old) if _compiled.available() else None
    if flat is not None:
        sums = np.zeros(5)
        s.updates, s.swamped = _compiled.load().tensor_stats(*flat, sums)
    else:
        s.updates, s.swamped = _update_counts(p_f32, p_old, p_new)
        sums = _param_sums(p_new, p_ref, p_old, p_ref_old)
    s.p_err_sq, s.p_ref_sq, s.upd_dot, s.upd_sq, s.upd_ref_sq = (float(x) for x in sums)


def _state_stats(s: _Stats, st: str, exact, stored, ref) -> None:
    """Zero counts (``exact`` given: the state was rounded) and the float64 error sums."""
    flat = (
        _compiled.flat32(stored if exact is None else exact, stored, ref) if _compiled.available() else None
    )
    if flat is not None:
        sums = np.zeros(2)
        nonzero, zeroed = _compiled.load().state_stats(*flat, sums)
        err, tot = float(sums[0]), float(sums[1])
    else:
        nonzero, zeroed = _zero_counts(exact, stored) if exact is not None else (0, 0)
        err, tot = _state_sums(stored, ref)
    if exact is not None:
        s.state_nonzero += nonzero
        s.state_zeroed += zeroed
    s.state_err_sq[st], s.state_ref_sq[st] = err, tot


# Per-tensor statistics in cache-sized chunks (float64 temporaries of a whole tensor would be
# fresh memory, page-faulted in, costing more than the arithmetic); chunk sums are added in
# order, so the result depends on the tensor's size only.
_CHUNK = 1 << 15


def _chunks(*arrays: np.ndarray):
    flat = [a.reshape(-1) for a in arrays]
    for i in range(0, flat[0].size, _CHUNK):
        yield [a[i : i + _CHUNK] for a in flat]


def _update_counts(p_f32, p_old, p_new) -> tuple[int, int]:
    """Elements the optimizer changed, and those of them the master rounding swallowed."""
    updates = swamped = 0
    for f, o, n in _chunks(p_f32, p_old, p_new):
        intended = f != o
        updates += int(np.count_nonzero(intended))
        swamped += int(np.count_nonzero(intended & (n == o)))
    return updates, swamped


def _zero_counts(exact, stored) -> tuple[int, int]:
    """Nonzero state elements, and those of them stored as zero."""
    nonzero = zeroed = 0
    for v, q in _chunks(exact, stored):
        nz = v != 0
        nonzero += int(np.count_nonzero(nz))
        zeroed += int(np.count_nonzero(nz & (q == 0)))
    return nonzero, zeroed


def _param_sums(p_new, p_ref, p_old, p_ref_old) -> tuple[float, ...]:
    """sum (new - ref)^2, sum ref^2, and the dot products of the two updates (float64)."""
    out = np.zeros(5)
    for n, r, o, ro in _chunks(p_new, p_ref, p_old, p_ref_old):
        n, r = n.astype(np.float64), r.astype(np.float64)
        d = n - r
        u, ur = n - o, r - ro
        out += [_dot(d, d), _dot(r, r), _dot(u, ur), _dot(u, u), _dot(ur, ur)]
    return tuple(float(x) for x in out)


def _state_sums(v, ref) -> tuple[float, float]:
    """sum (v - ref)^2 and sum ref^2 (float64)."""
    err = tot = 0.0
    for a, r in _chunks(v, ref):
        r = r.astype(np.float64)
        e = a - r
        err += _dot(e, e)
        tot += _dot(r, r)
    return err, tot


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """Dot product in numpy's own loop: BLAS would start its own threads inside replay's, and
    its result can depend on how many it starts."""
    return float(np.einsum("i,i->", a, b))


def _quantize(x: np.ndarray, fmt: Format, mode: RoundMode, seed: int = 0) -> np.ndarray:
    """``emulate.quantize(x, fmt, rounding=mode)`` (stochastic: ``random_bits=random_bits_at(seed,
    0, n)``). bfloat16 (nearest-even or stochastic) and float16 (nearest-even) take compiled
    loops of :mod:`fpsim._compiled.loops` (tests/replay/test_compiled.py compares them with the
    emulator), their NaN inputs the emulator."""
    stochastic = mode is RoundMode.STOCHASTIC
    flat = _compiled.flat32(x) if _compiled.available() else None
    out = np.empty(x.shape, _F32)
    if flat is not None and fmt == get_format("float16") and mode is RoundMode.NEAREST_EVEN:
        nan = _compiled.load().f16_round(flat[0], out.reshape(-1)) > 0
    elif flat is not None and fmt == get_format("bfloat16") and mode in _BF16_MODES:
        mix = np.uint64((seed * 0x9E3779B97F4A7C15) % (1 << 64))
        nan = _compiled.load().bf16_round(flat[0], stochastic, mix, 0, out.reshape(-1)) > 0
    else:
        return emulate.quantize(x, fmt, rounding=mode, **_random_bits(x, mode, seed))
    if nan:  # (the stochastic words are drawn for all of x: the NaNs keep their own)
        where = np.isnan(x)
        kw = {k: v[where] for k, v in _random_bits(x, mode, seed).items()}
        out[where] = emulate.quantize(x[where], fmt, rounding=mode, **kw)
    return out


_BF16_MODES = (RoundMode.NEAREST_EVEN, RoundMode.STOCHASTIC)


def _random_bits(x: np.ndarray, mode: RoundMode, seed: int) -> dict[str, np.ndarray]:
    """The ``random_bits`` argument of a rounding of ``x`` in ``mode`` (none unless stochastic)."""
    if mode is not RoundMode.STOCHASTIC:
        return {}
    return {"random_bits": random_bits_at(seed, 0, x.size).reshape(x.shape)}


def _round_master(run: _Run, name: str, p_old, p_f32, mode: RoundMode, seed: int) -> np.ndarray:
    cfg = run.cfg
    fmt = cfg.master_format(name)
    if fmt.name == "float32" and not cfg.kahan:  # rounding float32 to float32 is exact in every mode
        return p_f32
    if not cfg.kahan:
        return _quantize(p_f32, fmt, mode, seed)
    kw: dict[str, Any] = {"rounding": mode, **_random_bits(p_f32, mode, seed)}
    # Kahan: y = update + carried error; new = fl(p + y); error = y - (new - p), stored in fmt
    y = (p_f32.astype(np.float64) - p_old) + run.comp[name]
    new = emulate.quantize(p_old.astype(np.float64) + y, fmt, **kw)
    run.comp[name] = emulate.quantize(y - (new.astype(np.float64) - p_old), fmt)
    return new
