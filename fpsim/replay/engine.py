"""Replay a recorded gradient sequence through emulated low-precision optimizers.

:func:`replay` runs, side by side, an FP32 reference of the optimizer and each
:class:`ReplayConfig` (states stored in a format or block recipe, master weights in a format
with nearest or stochastic rounding and optional Kahan compensation, gradients in a format with
static/dynamic loss scaling or FP8 scaling) on the same recorded gradients, and measures per
step and tensor how far each drifts from the reference.

Semantics, per recorded step ``s`` in order. Which updates run, and the update count ``t`` of
each (Adam's bias correction), come from :mod:`.schedule`: the trace's recorded counts, else
its step numbers; ``mode="sequence"`` (the default) replays consecutive updates and refuses
gaps, ``mode="each"`` replays every recorded step as one update from its own recorded values.
A step the recorded run skipped (loss scaling) updates nothing, for the reference and every
configuration. Each configuration counts its own updates: a step its loss scaler skips does
not advance its count, as in torch.

1. Gradient: ``g`` as recorded (float32). A config with gradient format ``G`` and loss scale
   ``S`` sees ``q = quantize(f32(g * S), G)``; any inf/NaN in any tensor skips the step for
   that config (GradScaler) and updates the scaler; otherwise ``g' = f32(q * f32(1/S))``
   (the optimizer works in FP32 on unscaled gradients). FP8 gradients take a block recipe
   (``e5m2_tensor`` = current scaling) or :class:`fpsim.DelayedScaling` per tensor.
2. Update in FP32 (:mod:`fpsim.replay.optim`) on the dequantized states and the master value.
3. States are re-encoded in their formats (nearest-even), per tensor as
   :meth:`ReplayConfig.state_storage` says: its ``state_overrides`` by name, and FP32 for
   tensors under ``min_quantized_size`` elements (bitsandbytes' ``min_8bit_size``) or, without
   ``quantize_ragged``, whose size the block does not divide (torchao).
4. The master copy is rounded once from the FP32 result to its format (``master_rounding``);
   with ``kahan`` the rounding error is carried in a compensation buffer of the same format.

Initial parameters and states come from the trace's first replayed step ("param",
"state.exp_avg", ...; optax's "state.mu"/"state.nu" are read as Adam's states), or with
``start=`` from another trace or a checkpoint (a Trainer's ``checkpoint-N`` folder: the state
a sparse gradient trace lacks). The parameters must be recorded; states may be missing only
at update 1 (torch creates them then, at zero). A recorded state the optimizer does not use
is an error.

Where the pieces are: the configurations in :mod:`.config`, the statistics and the result in
:mod:`.stats`, the storage of states and master copies in :mod:`.storage`, the fused 8-bit
step in :mod:`.fused`, one configuration's tensor-step (also the training optimizers' step,
:mod:`fpsim.train`) in :mod:`.tensorstep`; this module runs the steps. :func:`replay` resolves its ``backend``
(:class:`fpsim.Backend`) and ``sqrt`` (:class:`fpsim.replay.optim.Sqrt`) once and passes them down.
"""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._compiled import Backend
from ..formats import Format, RoundMode
from ..trace import as_trace
from . import fused as _fused
from .config import DEFAULT_CONFIGS, PRESETS, ReplayConfig, memory_table, resolve_configs
from .interrupt import deferred_sigint
from .lossscale import ScalerState
from .optim import AdamW, Optimizer, Sqrt
from .schedule import Mode, Planned, plan_updates, select_steps
from .stats import ReplayResult, Stats, state_stats, sum_sq, tensor_stats
from .storage import is_quantized, master_seed, quantize, store_and_load
from .tensorstep import load_states, seen_grad, tensor_step

# ReplayConfig, PRESETS, memory_table (.config) and ReplayResult (.stats) are re-exported here
# for the modules that import them from fpsim.replay.engine; fpsim.replay has them all.
__all__ = ["Mode", "ReplayConfig", "ReplayResult", "replay", "select_steps", "PRESETS", "memory_table"]

_F32 = np.float32


@dataclass(frozen=True)
class _Env:
    """What every step of one replay shares: the optimizer, where the loops run, the base seed
    of stochastic rounding and the thread pool."""

    optimizer: Optimizer
    backend: Backend
    seed: int
    pool: Any
    stop: list[bool] = field(default_factory=lambda: [False])
    """Set by Ctrl-C under ``keep_on_interrupt``: the replay ends after the step in progress."""


@dataclass
class _Run:
    """One configuration's replay: its master copies (and their formats), compensations,
    stored states (and their float32 values; None: not decoded yet, see :func:`_loaded`), loss
    scaler and delayed scaling states, by tensor."""

    cfg: ReplayConfig
    master_format: dict[str, Format] = field(default_factory=dict)
    master: dict[str, np.ndarray] = field(default_factory=dict)  # stored values (float32)
    comp: dict[str, np.ndarray] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> state -> encoded
    loaded: dict[str, dict[str, np.ndarray] | None] = field(default_factory=dict)
    scaler: ScalerState | None = None
    delayed: dict[str, Any] = field(default_factory=dict)
    updates: int = 0  # updates applied so far (counting those before the first replayed step)


def replay(
    trace: Any = None,
    configs: Sequence[ReplayConfig | str] = DEFAULT_CONFIGS,
    *,
    optimizer: Optimizer | None = None,
    lr: float | None = None,
    steps: Iterable[int] | None = None,
    seed: int = 0,
    tensors: Iterable[str] | None = None,
    progress: bool = True,
    threads: int | None = None,
    backend: Backend | str = "auto",
    sqrt: Sqrt | str | None = None,
    mode: Mode | str = "sequence",
    first_update: int | None = None,
    keep_on_interrupt: bool = False,
    start: Any = None,
) -> ReplayResult:
    """Replay ``trace``'s gradients through ``configs`` next to an FP32 reference.

    Args:
        trace: trace path or :class:`fpsim.trace.Trace` (None: the bundled sample).
        configs: :class:`ReplayConfig` objects or names of :data:`PRESETS`
            (default :data:`~fpsim.replay.config.DEFAULT_CONFIGS`).
        optimizer: :class:`fpsim.replay.optim.Adam`, ``AdamW`` or ``SGD`` (default AdamW()).
        lr: learning rate for every step; None uses the trace's recorded lr per step.
        steps: the recorded steps to replay (default all), replayed in increasing order.
        seed: base seed of stochastic rounding (counter-based, per step and tensor).
        tensors: replay only the tensors matching these names or fnmatch patterns (default
            all); each must match one. A loss scaler then sees only their gradients.
        progress: show a progress bar.
        threads: worker threads (default: the CPUs this process may use). Tensors, and
            pieces of large tensors in elementwise optimizer steps, are updated in parallel
            (numpy releases the GIL); the result does not depend on the number of threads.
        backend: where the hot loops run, ``"auto"``, ``"numpy"`` or ``"compiled"``
            (:meth:`fpsim.Backend.resolve`; ``"auto"`` replays fewer than
            :data:`fpsim._compiled.COMPILED_FROM` gradient elements, steps times tensors, on
            numpy); the same result on each, up to the summation order of the float64 statistics.
        sqrt: the square root of Adam's denominator, ``"ieee"`` (correctly rounded) or
            ``"torch"`` (torch's CPU sqrt: the parameters of torch.optim on this machine), see
            :class:`fpsim.replay.optim.Sqrt`; None keeps the optimizer's own. The compiled and fused
            steps take ``"ieee"`` only; with ``"torch"`` the updates run on numpy.
        mode: ``"sequence"`` (consecutive updates from the first step's recorded values; a gap
            in the update counts is an error) or ``"each"`` (every recorded step one update
            from its own recorded values, loss scalers from their initial scale), see
            :class:`~fpsim.replay.schedule.Mode`.
        keep_on_interrupt: Ctrl-C (SIGINT, caught in the main thread only) ends the replay after
            the step in progress instead of raising: the result holds the steps done, whole,
            with the final values after the last of them, and ``interrupted`` says how many of
            how many (``fpsim replay`` writes that report and exits 130). SIGINT's handler is
            replaced for the replay and put back after it; an ignored SIGINT (``nohup``, a
            background job) stays ignored.
        first_update: the update count of the first replayed step (default: the trace's
            recorded count, else its step number); the other steps keep their distance to it.
        start: where the initial parameters and states come from instead of the first
            replayed step: a trace or checkpoint (anything :func:`fpsim.trace.as_trace` opens,
            e.g. a Trainer's ``checkpoint-N`` folder), its only step or its step numbered as
            the first replayed one, whose update count (where both have one) must be the
            first replayed step's. Sequence mode only.

    Raises:
        ValueError: an unknown configuration, step, tensor, backend, sqrt or mode; a negative
            or non-finite lr; update
            counts below 1 or (sequence) with gaps; a missing parameter or state, or a state
            the optimizer does not use; a gradient of the wrong shape; or a step without a
            recorded lr when ``lr`` is None; a ``start`` that does not fit the first replayed
            step. Each message names the steps and tensors.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    requested = backend
    Backend.resolve(backend, elements=0)  # a bad name fails before the trace is read ("auto": below)
    mode = Mode.resolve(mode)
    if lr is not None and (
        isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 <= lr < math.inf
    ):
        raise ValueError(f"replay: lr must be a finite number >= 0 (or None: the trace's), got {lr!r}")
    optimizer = optimizer or AdamW()
    if sqrt is not None:
        optimizer = optimizer.with_sqrt(Sqrt.resolve(sqrt))
    tr = as_trace(trace)
    cfgs = resolve_configs(configs)
    plan = plan_updates(tr, select_steps(tr, steps), mode, first_update)
    names = _tensor_names(tr, plan[0].step, tensors)
    backend = Backend.resolve(
        requested, elements=len(plan) * sum(tr.entry(plan[0].step, n).size for n in names)
    )
    origin = None if start is None else _origin(as_trace(start), plan[0], mode)
    runs_of = [plan] if mode is Mode.SEQUENCE else [[p] for p in plan if not p.skipped]
    steps_run = [p.step for p in plan] if mode is Mode.SEQUENCE else [g[0].step for g in runs_of]
    result = ReplayResult(str(tr.path), cfgs, steps_run, mode=mode.value)
    result.trace_skipped = [p.step for p in plan if p.skipped]
    n_threads = _threads(threads)
    pool = ThreadPoolExecutor(max_workers=n_threads) if n_threads > 1 else _InThread()
    env = _Env(optimizer, backend, seed, pool)
    bar = tqdm(total=len(plan) * len(names), disable=not progress, desc="replay", unit="tensor-step")
    done: list[int] = []
    try:
        with deferred_sigint(env.stop, keep_on_interrupt):
            for group in runs_of:
                done += _run_updates(tr, group, names, lr, cfgs, result, env, bar, origin)
                if env.stop[0]:
                    break
    finally:
        pool.shutdown()
        bar.close()
    if env.stop[0]:
        result.interrupted = (
            f"interrupted after {len(done)} of {len(steps_run)} steps; the results hold those "
            f"{len(done)}, and the final values are those after step {done[-1] if done else None}"
        )
        result.steps = [s for s in steps_run if s in set(done)]
    return result


def _run_updates(
    tr, plan: list[Planned], names, lr, cfgs, result: ReplayResult, env: _Env, bar, origin=None
) -> list[int]:
    """Consecutive updates ``plan`` from the recorded values at its first step (or at
    ``origin``, a trace and its step), into ``result``; returns the steps done (all of them,
    unless ``env.stop`` ended the run after one)."""
    params, ref_states = _initial_values(tr, plan[0], names, env.optimizer, origin)
    result.sizes = {n: int(params[n].size) for n in names}
    runs = [_start(c, params, ref_states, env) for c in cfgs]
    for run in runs:
        run.updates = plan[0].t - 1
    spare = _Spare()
    done = []
    for planned in plan:
        _replay_step(tr, planned, names, lr, params, ref_states, runs, result, env, spare)
        bar.update(len(names))
        done.append(planned.step)
        if env.stop[0]:
            break
    _finish(result, names, params, ref_states, runs, env)
    return done


def _tensor_names(tr: Any, first: int, tensors: Iterable[str] | None) -> list[str]:
    """The tensors to replay, in the trace's order: those matching a name or fnmatch pattern."""
    names = [e.name for e in tr.entries(step=first, role="grad")]
    if tensors is None:
        return names
    patterns = [tensors] if isinstance(tensors, str) else list(tensors)
    unmatched = [p for p in patterns if p not in names and not fnmatch.filter(names, p)]
    if unmatched:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise ValueError(f"{tr.path}: tensors {unmatched} match no gradient at step {first} (it has {shown})")
    return [n for n in names if any(n == p or fnmatch.fnmatchcase(n, p) for p in patterns)]


def _origin(start: Any, first: Planned, mode: Mode) -> tuple[Any, int]:
    """The trace and step of ``replay(start=...)`` (see there).

    Raises:
        ValueError: mode ``each``, no step to start from, or one of another update count.
    """
    if mode is not Mode.SEQUENCE:
        raise ValueError(
            "start= gives the values of one sequence replay; mode='each' starts each step from its own"
        )
    if len(start.steps) == 1:
        step = start.steps[0]
    elif first.step in start.steps:
        step = first.step
    else:
        raise ValueError(
            f"{start.path}: start= needs one step, or the first replayed step {first.step}; has {start.steps}"
        )
    update = start.update(step)
    if update is not None and update != first.t:
        raise ValueError(
            f"{start.path}: step {step} holds the values before update {update}, but the first replayed step "
            f"{first.step} is update {first.t}: start from the checkpoint saved just before that step"
        )
    return start, step


def _initial_values(
    tr: Any, first: Planned, names: list[str], optimizer: Optimizer, origin: tuple[Any, int] | None = None
) -> tuple[dict, dict]:
    """The recorded parameters and states at the first replayed step, or at ``origin`` (a trace
    and its step); states at zero only where the optimizer has none yet, update 1.

    Raises:
        ValueError: a missing parameter or state, or a recorded state the optimizer does not use.
    """
    src, step = origin or (tr, first.step)
    where = f"{src.path}: step {step} (update {first.t})"
    recorded = {e.role[len("state.") :] for e in src.entries(step) if e.role.startswith("state.")}
    own = {st: st for st in optimizer.states} | optimizer.other_names
    unused = sorted(recorded - set(own))
    if unused:
        raise ValueError(
            f"{where} records optimizer states {unused}, which {optimizer.name} does not use (it keeps "
            f"{list(optimizer.states)}): replay with the optimizer that recorded them"
        )
    role_of = {}
    for rec in sorted(recorded):
        if own[rec] in role_of:
            raise ValueError(f"{where} records {own[rec]} twice: state.{role_of[own[rec]]} and state.{rec}")
        role_of[own[rec]] = rec
    params, ref_states = {}, {}
    no_param, no_state = [], []
    for name in names:
        shape = tr.entry(first.step, name, "grad").shape
        params[name] = _recorded(src, step, name, "param", shape, no_param)
        ref_states[name] = {}
        for st in optimizer.states:
            role = f"state.{role_of.get(st, st)}"
            need = optimizer.needs_states(first.t)
            ref_states[name][st] = _recorded(src, step, name, role, shape, no_state if need else None)
    if no_param:
        raise ValueError(
            f"{where} has no recorded parameter for tensors {no_param[:5]}: the replay starts from the "
            "recorded parameters (record them: TorchCapture(params=True), capture_jax(params=...))"
        )
    if no_state:
        raise ValueError(
            f"{where} has no recorded {'/'.join(optimizer.states)} for tensors {no_state[:5]}: at an update "
            "after the first, starting from zero states would not be the optimizer's run (record them: "
            "TorchCapture(optimizer=...); or replay from the first update)"
        )
    return params, ref_states


def _recorded(tr: Any, step: int, name: str, role: str, shape: tuple, missing: list | None) -> np.ndarray:
    """The recorded tensor as float32, or zeros when it is not recorded (appending ``name`` to
    ``missing``, where that is an error)."""
    try:
        entry = tr.entry(step, name, role)
    except ValueError:
        if missing is not None:
            missing.append(name)
        return np.zeros(shape, _F32)
    a = np.array(tr.read(entry), _F32)
    if a.shape != shape:
        raise ValueError(f"{tr.path}: step {step} {role} {name!r} has shape {a.shape}, its gradient {shape}")
    return a


def _finish(result: ReplayResult, names, params, ref_states, runs: list[_Run], env: _Env) -> None:
    """The final values of the reference and of every configuration, into ``result``."""
    result.final_params["reference"] = params
    result.final_states["reference"] = ref_states
    for run in runs:
        result.final_params[run.cfg.name] = run.master
        states = env.pool.map(lambda name, run=run: _loaded(run, name, env.backend), names)
        result.final_states[run.cfg.name] = dict(zip(names, states))


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


def _replay_step(tr, planned: Planned, names, lr, params, ref_states, runs, result, env: _Env, spare) -> None:
    """One recorded step: the FP32 reference, then each configuration, tensors in parallel."""
    step = planned.step
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
    for name, sq in zip(names, env.pool.map(lambda n: sum_sq(grads[n]), names)):
        result.grad_sq[step, name] = sq
    if planned.skipped:  # the recorded run did not update: nor does the reference
        ref_new = {name: (params[name], ref_states[name]) for name in names}
    else:
        ref_new = _reference_step(env, names, params, grads, ref_states, lr_s, planned.t, spare)
    for run in runs:
        _step_config(run, env, planned, lr_s, grads, params, ref_new, result)
    for name in names:
        params[name], ref_states[name] = ref_new[name]
    if not planned.skipped:
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


def _reference_step(env: _Env, names, params, grads, states, lr, step, spare) -> dict[str, tuple]:
    """``optimizer.step`` on every tensor; elementwise steps write into recycled arrays, large
    tensors in pieces of :data:`_PIECE` elements (one task each)."""
    optimizer, backend = env.optimizer, env.backend
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
            return task, optimizer.step(p, g, s, lr, step, backend=backend)
        flat = {st: v.reshape(-1)[part] for st, v in s.items() if v is not None}
        o_p, o_s = out[name]
        o_flat = (o_p.reshape(-1)[part], {st: o_s[st].reshape(-1)[part] for st in o_s})
        optimizer.step(p.reshape(-1)[part], g.reshape(-1)[part], flat, lr, step, out=o_flat, backend=backend)
        return task, None

    for (name, part), res in env.pool.map(run, tasks):
        if part is None:
            out[name] = res
    return out


def _start(cfg: ReplayConfig, params, ref_states, env: _Env) -> _Run:
    """A configuration's run: master copies rounded from the initial parameters, states stored."""
    run = _Run(cfg, scaler=cfg.loss_scaler.init() if cfg.loss_scaler else None)
    run.master_format = {name: cfg.master_format(name) for name in params}
    backend = env.backend

    def first(name: str) -> tuple:
        p, fmt = params[name], run.master_format[name]
        exact = fmt.name == "float32" and not np.isnan(p).any()  # (quantize makes NaNs quiet)
        master = p.copy() if exact else quantize(p, fmt, RoundMode.NEAREST_EVEN, backend)
        states = {
            st: store_and_load(cfg.state_storage(st, name, p.size), ref_states[name][st], backend)
            for st in env.optimizer.states
        }
        return master, states

    for name, (master, states) in zip(params, env.pool.map(first, list(params))):
        run.master[name] = master
        run.states[name] = {st: enc for st, (enc, _) in states.items()}
        run.loaded[name] = {st: val for st, (_, val) in states.items()}
        if cfg.kahan:
            run.comp[name] = np.zeros_like(master)
        if cfg.grad_delayed is not None:
            run.delayed[name] = cfg.grad_delayed.init()
    return run


def _grad(run: _Run, name: str, g: np.ndarray, backend: Backend) -> tuple[np.ndarray, bool]:
    """The gradient the optimizer sees, and whether it holds inf/NaN (:func:`.tensorstep.seen_grad`)."""
    q, inf, delayed = seen_grad(run.cfg, g, run.scaler, run.delayed.get(name), backend)
    if run.cfg.grad_delayed is not None:
        run.delayed[name] = delayed
    return q, inf


def _step_config(run: _Run, env: _Env, planned: Planned, lr: float, grads, params, ref_new, result) -> None:
    """One configuration's step on every tensor: gradients, loss scaler, updates, statistics.
    Its update count advances only when it applies the update."""
    cfg, step = run.cfg, planned.step
    found_inf = False
    unscaled = {}
    done = env.pool.map(lambda n: _grad(run, n, grads[n], env.backend), list(grads))
    for name, (q, inf) in zip(grads, done):
        unscaled[name] = q
        found_inf |= inf
    skip = planned.skipped or (found_inf and run.scaler is not None)
    result.scale[step, cfg.name] = run.scaler.scale if run.scaler is not None else 1.0
    result.skipped[step, cfg.name] = skip
    if run.scaler is not None:
        run.scaler = cfg.loss_scaler.update(run.scaler, found_inf)
    t = run.updates + 1
    run.updates += not skip
    fused = {} if skip else _fused_steps(run, env, t, lr, unscaled, ref_new)

    def update(name: str) -> Stats:
        refs = (params[name], ref_new[name])
        return _update_tensor(run, env, name, (step, t), lr, unscaled[name], refs, skip, fused.get(name))

    for name, stats in zip(grads, env.pool.map(update, list(grads))):  # in order: sums stay reproducible
        result.stats[step, name, cfg.name] = stats


def _fused_steps(run: _Run, env: _Env, t: int, lr: float, grads, ref_new) -> dict[str, _fused.FusedStep]:
    """The fused compiled updates (:mod:`fpsim.replay.fused`) of the tensors they cover (update
    number ``t``), piece by piece in the thread pool (a large tensor is not left to one thread)."""
    plans = {}
    for name, g in grads.items():
        formats = {st: run.cfg.state_storage(st, name, g.size) for st in run.states[name]}
        if all(is_quantized(f) for f in formats.values()):
            stored, p, ref = run.states[name], run.master[name], ref_new[name][1]
            pl = _fused.plan(env.optimizer, formats, stored, p, g, ref, env.backend)
            if pl is not None:
                plans[name] = pl
    jobs = [(name, part) for name, pl in plans.items() for part in _fused.pieces(pl)]
    run_piece = _fused.run_piece
    done = list(env.pool.map(lambda job: run_piece(plans[job[0]], job[1], env.optimizer, lr, t), jobs))
    return {
        name: _fused.finish(pl, [res for (n, _), res in zip(jobs, done) if n == name])
        for name, pl in plans.items()
    }


def _update_tensor(run: _Run, env: _Env, name, at: tuple[int, int], lr, g, refs, skip, fused) -> Stats:
    """One configuration's update of one tensor at ``at`` = (recorded step, update count)
    (``fused``: its fused update, already done), and its statistics against the reference
    (``refs``: its old parameter and new values)."""
    step, t = at
    p_old = run.master[name]
    p_ref_old, (p_ref, s_ref) = refs
    s = Stats(n=p_old.size)
    if skip:
        p_f32 = p_new = p_old
        for st, v in _loaded(run, name, env.backend).items():
            state_stats(s, st, None, v, s_ref[st], env.backend)
    else:
        out = tensor_step(
            run.cfg, env.optimizer, name, p_old, run.states[name], g, lr, t,
            seed=master_seed(env.seed, step, name), backend=env.backend,
            master_format=run.master_format[name],
            comp=run.comp.get(name), loaded=run.loaded.get(name), fused=fused, try_fused=False,
            ref_states=s_ref, stats=s,
        )  # fmt: skip
        p_f32, p_new = out.p_f32, out.master
        run.states[name], run.loaded[name] = out.states, out.loaded
        if run.cfg.kahan:
            run.comp[name] = out.comp
    run.master[name] = p_new
    tensor_stats(s, p_f32, p_old, p_new, p_ref, p_ref_old, env.backend)
    return s


def _loaded(run: _Run, name: str, backend: Backend) -> dict[str, np.ndarray]:
    """The float32 values of a tensor's stored states (decoded when the fused step left only
    the codes)."""
    if run.loaded.get(name) is None:
        run.loaded[name] = load_states(run.cfg, name, run.master[name].size, run.states[name], backend)
    return run.loaded[name]
