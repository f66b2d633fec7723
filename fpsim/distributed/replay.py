"""Replay a trace on a Dask cluster, split by tensor: the same :class:`~fpsim.replay.ReplayResult`.

Every tensor's replay (the FP32 reference, each configuration's master copy, states and
per-step statistics) depends on that tensor alone, except through a loss scaler, whose
overflow check spans all tensors of a step. So configurations without a loss scaler run as
tasks over groups of tensors (about ``2 x`` the cluster's threads, balanced by size), and
those with one run as one task over all tensors. Workers open the trace themselves (a local
path, or one the workers share) and run :func:`~fpsim.replay.replay` on their part;
the client puts the parts together in replay's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._compiled import Backend
from ..trace import Trace, as_trace
from .client import as_completed, connect, total_threads

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client

    from ..replay import ReplayConfig, ReplayResult

__all__ = ["replay_distributed", "tensor_groups"]


def replay_distributed(
    trace: Any = None,
    configs: Sequence[Any] | None = None,
    *,
    optimizer: Any = None,
    lr: float | None = None,
    steps: Iterable[int] | None = None,
    seed: int = 0,
    scheduler: str | Client = "local",
    n_workers: int = 2,
    threads_per_worker: int = 1,
    memory_limit: str | int | float | None = None,
    progress: bool = True,
    backend: Backend | str = "auto",
    sqrt: Any = None,
    mode: Any = "sequence",
    first_update: int | None = None,
) -> Any:
    """:func:`fpsim.replay.replay` on a Dask cluster, split by tensor, with exactly the same result.

    See the module docstring for how the work is split. The result equals the
    single-process one exactly: statistics, loss scales, skips, final parameters and states,
    and the order of every dict (so the per-step sums of :meth:`ReplayResult.per_step` agree
    too).

    Args:
        trace: a trace path or :class:`fpsim.trace.Trace` (None: the bundled sample).
        configs: :class:`~fpsim.replay.ReplayConfig` objects or preset names (None:
            :data:`~fpsim.replay.config.DEFAULT_CONFIGS`, replay's default).
        optimizer, lr, steps, seed, sqrt, mode, first_update: as for :func:`~fpsim.replay.replay`.
        scheduler, n_workers, threads_per_worker, memory_limit: as for
            :func:`~fpsim.distributed.analyze.analyze_distributed`.
        progress: show a progress bar over the parts.
        backend: where the workers' hot loops run (:meth:`fpsim.Backend.resolve`, resolved
            here, on the client, by the size of the whole replay), as for
            :func:`~fpsim.replay.replay`.

    Returns:
        The :class:`~fpsim.replay.ReplayResult` ``replay`` returns for the same arguments.
    """
    Backend.resolve(backend, elements=0)  # a bad name fails before the trace is read
    job = _job(as_trace(trace), configs, steps)
    backend = Backend.resolve(backend, elements=len(job.steps) * sum(job.sizes.values()))  # as replay's
    kw = {"optimizer": optimizer, "lr": lr, "steps": job.steps, "seed": seed, "threads": threads_per_worker}
    kw.update(backend=backend, sqrt=sqrt, mode=mode, first_update=first_update)
    client, close = connect(scheduler, n_workers, threads_per_worker, memory_limit)
    try:
        done = _run_parts(client, job, kw, progress)
    finally:
        close()
    return job.assemble(done)


def _replay_part(
    path: str, names: Sequence[str] | None, configs: Sequence[Any], kw: Mapping[str, Any]
) -> Any:
    """Replay ``configs`` on the tensors ``names`` of the trace at ``path`` (runs on a worker)."""
    from ..replay import replay
    from ..trace import open_trace

    return replay(open_trace(path), configs, tensors=names, progress=False, **kw)


def tensor_groups(sizes: Mapping[str, int], k: int) -> list[list[str]]:
    """``sizes``' names in ``k`` groups of about equal total size (largest first, greedy)."""
    bins: list[tuple[int, int, list[str]]] = [(0, i, []) for i in range(min(k, len(sizes)))]
    for name in sorted(sizes, key=lambda n: -sizes[n]):
        total, i, names = min(bins)
        names.append(name)
        bins[bins.index((total, i, names))] = (total + sizes[name], i, names)
    return [names for _, _, names in bins if names]


_Part = tuple["list[str] | None", "list[ReplayConfig]", Any]
"""(the tensors, None for all; the configurations; the future or the result)."""


@dataclass
class _Job:
    """A replay to split: the trace, the configurations, the steps and the tensors' sizes."""

    trace: Trace
    configs: list[ReplayConfig]
    steps: list[int]
    sizes: dict[str, int]  # the gradients of the first step, in file order

    @property
    def names(self) -> list[str]:
        return list(self.sizes)

    def assemble(self, done: list[_Part]) -> ReplayResult:
        """The result ``replay`` gives, from the replayed parts (keys in its order)."""
        from ..replay import ReplayResult

        names, cfgs = self.names, self.configs
        by: dict[tuple[str, str], Any] = {}  # (tensor, config) -> the part that replayed it
        ref: dict[str, Any] = {}
        for group, cs, res in done:
            for name in names if group is None else group:
                ref.setdefault(name, res)
                for c in cs:
                    by[name, c.name] = res
        some = done[0][2]  # every part replays the same steps in the same mode
        out = ReplayResult(str(self.trace.path), cfgs, some.steps, mode=some.mode, sizes=dict(self.sizes))
        out.trace_skipped = list(some.trace_skipped)
        first = {c.name: next(res for _, cs, res in done if any(c is x for x in cs)) for c in cfgs}
        for step in out.steps:
            for c in cfgs:
                out.scale[step, c.name] = first[c.name].scale[step, c.name]
                out.skipped[step, c.name] = first[c.name].skipped[step, c.name]
                for name in names:
                    out.stats[step, name, c.name] = by[name, c.name].stats[step, name, c.name]
        for step in out.steps:
            for name in names:
                out.grad_sq[step, name] = ref[name].grad_sq[step, name]
        for label, part in (("reference", ref), *((c.name, {n: by[n, c.name] for n in names}) for c in cfgs)):
            out.final_params[label] = {n: part[n].final_params[label][n] for n in names}
            out.final_states[label] = {n: part[n].final_states[label][n] for n in names}
        return out


def _job(tr: Trace, configs: Sequence[Any] | None, steps: Iterable[int] | None) -> _Job:
    """Resolve the configurations and steps as :func:`~fpsim.replay.replay` does."""
    from ..replay import DEFAULT_CONFIGS, resolve_configs, select_steps

    cfgs = resolve_configs(DEFAULT_CONFIGS if configs is None else configs)
    wanted = select_steps(tr, steps)
    sizes = {e.name: int(e.size) for e in tr.entries(step=wanted[0], role="grad")} if wanted else {}
    return _Job(tr, cfgs, wanted, sizes)


def _run_parts(client: Client, job: _Job, kw: Mapping[str, Any], progress: bool) -> list[_Part]:
    """Submit the parts of ``job`` and collect (tensors, configurations, result) as they finish."""
    from tqdm.auto import tqdm

    path = str(Path(job.trace.path).absolute())
    split = [c for c in job.configs if c.loss_scaler is None]
    whole = [c for c in job.configs if c.loss_scaler is not None]
    parts: dict[Any, tuple[list[str] | None, list[Any]]] = {}
    if split and job.names:
        for group in tensor_groups(job.sizes, 2 * total_threads(client)):
            parts[client.submit(_replay_part, path, group, split, kw, pure=False)] = (group, split)
    if whole or not job.names:
        rest = whole if job.names else job.configs
        parts[client.submit(_replay_part, path, None, rest, kw, pure=False)] = (None, rest)
    done: list[_Part] = []
    with tqdm(total=len(parts), disable=not progress, desc="replay (dask)", unit="part") as bar:
        for fut, res in as_completed(client, list(parts)):
            done.append((*parts[fut], res))
            bar.update(1)
    return done
