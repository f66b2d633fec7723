"""Analyse a trace on a Dask cluster: the same :class:`~fpsim.analysis.run.Analysis`, bit for bit.

:func:`analyze_distributed` splits the work of :func:`fpsim.analysis.run.analyze` by step x tensor
x canonical chunk (:func:`fpsim.analysis.metrics.chunk_slices`; the plan is
:mod:`fpsim.distributed.plan`), runs it on Dask workers (:mod:`fpsim.distributed.worker`) and
merges the mergeable partials on the client as they arrive.

Guarantee: the result equals ``analyze(...)`` run in one process with the same arguments,
exactly -- every count, every float sum (``sum_sq_err``, ``sum_sq_signal``,
``underflow_energy``, the swamping sums: exact rationals), every maximum, every histogram,
the keys and their order -- whatever the number of workers, threads, batches or the order
in which tasks finish. It holds because a worker measures exactly the canonical chunks
``analyze`` measures (same ranges, same shapes, same stochastic-rounding bits, which are
counter-based on the flat index), float sums are pairwise float64 inside a chunk and exact
rationals across chunks, maxima and integer counts do not depend on order, and the tensor
amax of per-tensor recipes and NVFP4 is a ``fmax`` reduction (exact, associative).

Data flow: the client reads only the trace index (:func:`fpsim.trace.remote.index_trace`:
the manifest, or for imported folders the file headers). Tasks carry where a chunk lives --
the file as an fsspec path (a local path, ``file://``, ``s3://``, ...), the tensor entry and
the flat element range -- and the worker reads that chunk's byte range itself
(:class:`fpsim.trace.remote.RangeReader`). Results are small (counts, fractions, a 256-bin
histogram per tensor), so nothing large passes through the client, and at most a fixed
window of batches is in flight, so client and scheduler memory do not grow with the trace
either.

Pass order: recipes that need the whole-tensor amax (per-tensor scaling, NVFP4) get it
from a first distributed pass over tensors of more than one chunk (per-range ``fmax``
reduced by a task whose result feeds the chunk tasks as a Dask dependency); for a tensor
that fits one chunk, the chunk task computes it itself.

Trace inputs: everything :func:`fpsim.trace.open_trace` opens. Local trace folders and
``.safetensors`` files are read by byte range; ``.pt`` and ``.npz`` inputs are read by the
worker through :func:`fpsim.trace.open_trace` (local files only). A URL with a remote
protocol (``s3://bucket/run1``, with ``storage_options`` for fsspec) must be a trace folder
with ``manifest.json``: the client reads the manifest, and workers check each tensor's dtype
and shape against its file's header when they read it. With a remote scheduler, local paths
must name the same files on the workers (a shared file system).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._compiled import Backend
from ..analysis.metrics import Partial, SwampPartial
from ..analysis.run import DEFAULT_FORMATS, Analysis
from ..formats import BlockFormat, Format, IntFormat, RoundMode
from .client import as_completed, connect, total_threads
from .plan import AnalysisPlan, ChunkTask, plan_analysis
from .worker import amax_part, fmax_reduce, run_batch

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client

__all__ = ["analyze_distributed"]

_BATCH_WORK = 1 << 22
"""Element x format measurements per task (small tensors are batched up to this)."""

_Merged = tuple[dict[tuple[int, int], Partial], dict[tuple[int, int], SwampPartial]]


def analyze_distributed(
    trace: Any = None,
    formats: Sequence[str | Format | IntFormat | BlockFormat] = DEFAULT_FORMATS,
    *,
    roundings: Sequence[RoundMode | str] = (RoundMode.NEAREST_EVEN,),
    roles: Iterable[str] = ("grad",),
    steps: Iterable[int] | None = None,
    swamping: bool = True,
    seed: int = 0,
    scheduler: str | Client = "local",
    n_workers: int = 2,
    threads_per_worker: int = 1,
    memory_limit: str | int | float | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    backend: Backend | str = "auto",
) -> Analysis:
    """:func:`fpsim.analysis.run.analyze` on a Dask cluster, with exactly the same result.

    The work is split by step x tensor x canonical chunk; workers read their chunks from the
    trace files themselves; the partials are merged on the client. See the module docstring
    for the equality guarantee and the data flow.

    Args:
        trace: a trace folder, a folder of per-step dump files or a single dump file (local
            path or ``file://`` URL), a remote trace folder as an fsspec URL (``s3://...``),
            a :class:`fpsim.trace.Trace`, or None for the bundled sample trace.
        formats: element formats and block recipes (objects or names).
        roundings: rounding modes to measure.
        roles: tensor roles to measure.
        steps: only these steps (default: all).
        swamping: also measure swamping where the trace has the parameter and the lr.
        seed: base seed of stochastic rounding.
        scheduler: ``"local"`` starts a LocalCluster of ``n_workers`` processes (closed
            afterwards); any other string is the address of a running scheduler
            (``"tcp://host:8786"``); a ``distributed.Client`` is used as is (not closed).
        n_workers: worker processes of a local cluster.
        threads_per_worker: threads per worker process of a local cluster.
        memory_limit: per-worker memory limit of a local cluster (``"2GiB"``, bytes, 0 for
            none); None keeps Dask's default (the machine's memory shared evenly).
        storage_options: fsspec options for remote URLs (credentials, endpoint, ...),
            used on the client and on the workers.
        progress: show a progress bar (tqdm.auto).
        backend: where the workers' hot loops run, ``"auto"``, ``"numpy"`` or ``"compiled"``
            (:meth:`fpsim.Backend.resolve`, resolved here, on the client); the same result
            on each.

    Returns:
        The :class:`~fpsim.analysis.run.Analysis` ``analyze`` returns for the same arguments.

    Raises:
        fpsim.trace.TraceError: a missing, truncated or inconsistent trace file (also when a
            worker finds it), naming the file.
        TypeError: a non-float tensor, naming its file and key; a bad ``scheduler``.
        ValueError: no formats, no tensors selected, a bad ``n_workers`` or ``backend``.
        ImportError: dask.distributed is not installed.
    """
    backend = Backend.resolve(backend)
    plan = plan_analysis(trace, formats, roundings, roles, steps, swamping, seed, storage_options or {})
    client, close = connect(scheduler, n_workers, threads_per_worker, memory_limit)
    try:
        acc, sacc = _Execution(client, plan, backend, progress).run()
    finally:
        close()
    return plan.assemble(acc, sacc)


class _Execution:
    """One run of a plan: batches submitted in a bounded window, partials merged as they arrive."""

    def __init__(self, client: Client, plan: AnalysisPlan, backend: Backend, progress: bool):
        from tqdm.auto import tqdm

        self.client, self.plan, self.backend = client, plan, backend
        self.acc: dict[tuple[int, int], Partial] = {}
        self.sacc: dict[tuple[int, int], SwampPartial] = {}
        self.window = max(8, 4 * total_threads(client))
        self.completed = as_completed(client)
        self.pending: dict[Any, list[ChunkTask]] = {}
        total = sum(t.entry.size for t in plan.tensors) * len(plan.jobs)  # element x (format, rounding)
        self.bar = tqdm(total=total, unit="el", unit_scale=True, disable=not progress, desc="analyze (dask)")

    def run(self) -> _Merged:
        """Submit every task, wait for all, and return the merged partials."""
        try:
            self._submit_all()
            for fut, result in self.completed:
                self._merge(fut, result)
        except BaseException:
            self.client.cancel(list(self.pending))
            raise
        finally:
            self.bar.close()
        return self.acc, self.sacc

    def _submit_all(self) -> None:
        """Batch small chunks up to ``_BATCH_WORK``; chunks that wait for a first pass go alone."""
        opts = self.plan.index.storage_options
        batch: list[ChunkTask] = []
        work = 0
        for amax_ranges, ten, tasks in self.plan.units():
            amax_fut = None
            if amax_ranges is not None:
                parts = [self.client.submit(amax_part, ten, a, b, opts, pure=False) for a, b in amax_ranges]
                amax_fut = self.client.submit(fmax_reduce, *parts, pure=False)
            for task in tasks:
                if task.amax is not None and task.amax >= 0:  # needs the first pass: its own batch
                    self._submit([task], [amax_fut])
                    continue
                if batch and work + task.work > _BATCH_WORK:
                    self._submit(batch, [])
                    batch, work = [], 0
                batch.append(task)
                work += task.work
        if batch:
            self._submit(batch, [])

    def _submit(self, tasks: list[ChunkTask], amaxes: list[Any]) -> None:
        plan = self.plan
        opts = plan.index.storage_options
        fut = self.client.submit(
            run_batch, tasks, plan.fmts, plan.modes, self.backend, opts, *amaxes, pure=False
        )
        self.pending[fut] = tasks
        self.completed.add(fut)
        while len(self.pending) >= self.window:
            self._merge(*next(self.completed))

    def _merge(self, fut: Any, result: list[tuple[list[Partial], list[SwampPartial]]]) -> None:
        for task, (parts, swamps) in zip(self.pending.pop(fut), result, strict=True):
            for j, p in zip(task.jobs, parts, strict=True):
                k = (task.tensor, j)
                self.acc[k] = self.acc.get(k, Partial()) + p
            if task.swamp is not None:
                ks = [(task.tensor, fi * 2 + mi) for fi in task.swamp.formats for mi in (0, 1)]
                for k, sp in zip(ks, swamps, strict=True):
                    self.sacc[k] = self.sacc.get(k, SwampPartial()) + sp
            if task.jobs:
                self.bar.update((task.stop - task.start) * len(task.jobs))
