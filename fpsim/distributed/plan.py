"""The task plan of :func:`~fpsim.distributed.analyze.analyze_distributed`, and its assembly.

:func:`plan_analysis` checks the arguments as :func:`fpsim.analysis.run.analyze` does and
lays the work out as the canonical chunks ``analyze`` measures
(:func:`fpsim.analysis.metrics.chunk_slices`): per tensor, the chunks of each chunk geometry
with the (format, rounding) pairs measured on them, the swamping work attached to a gradient
chunk, and, where a recipe needs the whole-tensor amax of a tensor of more than one chunk,
the ranges of a first pass that computes it. :meth:`AnalysisPlan.assemble` puts the merged
partials back together as the :class:`~fpsim.analysis.run.Analysis` ``analyze`` builds,
keys in its order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..analysis.metrics import CHUNK, Partial, SwampPartial, chunk_slices, needs_tensor_amax, not_covered
from ..analysis.run import SWAMP_MODES, Analysis, resolve_formats, select_entries, skip_reason, tensor_seed
from ..formats import Format, RoundMode
from ..trace.remote import TensorLocation, TraceIndex, index_trace

__all__ = ["AMAX_PART", "AnalysisPlan", "ChunkTask", "SwampTask", "plan_analysis"]

_JOB_OVERHEAD = 1 << 13
"""The fixed cost of measuring one small tensor under one format, in element-equivalents."""
AMAX_PART = CHUNK
"""Elements per task of the first (tensor amax) pass, for tensors of more than one chunk."""


@dataclass(frozen=True)
class SwampTask:
    """Swamping work attached to a gradient chunk: the parameter, the lr, the formats.

    Attributes:
        param: where the parameter lives.
        lr: the step's learning rate.
        formats: indices into the run's format list (element formats only).
    """

    param: TensorLocation
    lr: float
    formats: tuple[int, ...]


@dataclass(frozen=True)
class ChunkTask:
    """One canonical chunk of one tensor and what to measure on it.

    Attributes:
        tensor: the plan's index of the tensor.
        src: where the tensor lives.
        start: first flat index of the chunk.
        stop: one past the last.
        jobs: (format, rounding) pairs to measure, as ``format_index * n_modes + mode_index``.
        amax: None (no job needs the tensor amax), -1 (the chunk is the whole tensor: compute
            it here) or the index of the batch argument holding the reduced amax.
        seed: the tensor's stochastic-rounding seed.
        swamp: swamping work on the same range, or None.
    """

    tensor: int
    src: TensorLocation
    start: int
    stop: int
    jobs: tuple[int, ...]
    amax: int | None
    seed: int
    swamp: SwampTask | None = None
    hist: int = -1
    """The job that also fills the histogram (the tensor's first measured pair), or -1."""

    @property
    def work(self) -> int:
        """The cost of the task in element-equivalents (what batches are sized by)."""
        n = len(self.jobs) + (2 * len(self.swamp.formats) if self.swamp else 0)
        return n * (self.stop - self.start + _JOB_OVERHEAD)


_Geometry = tuple[int, bool]
"""A chunk geometry: the chunk length (-1: the flat chunks of swamping alone), needs the amax."""


@dataclass
class AnalysisPlan:
    """What to compute and how to assemble it into an :class:`~fpsim.analysis.run.Analysis`.

    Attributes:
        index: the trace's index.
        fmts: the formats and recipes, resolved.
        modes: the rounding modes, resolved.
        tensors: the measured tensors, in ``analyze``'s order.
        seeds: each measured tensor's stochastic-rounding seed.
        jobs: pair indices computed per tensor: 0 (histogram) + the last pair of each key.
        last: (format name, rounding) -> the pair whose result stands.
        swamp: measured tensor -> its swamping work.
        swamp_last: element format name -> the format index whose result stands.
    """

    index: TraceIndex
    fmts: list[Any]
    modes: list[RoundMode]
    tensors: list[TensorLocation]
    seeds: list[int]
    jobs: list[int]
    last: dict[tuple[str, str], int]
    swamp: dict[int, SwampTask]
    swamp_last: dict[str, int]

    def units(self) -> Iterator[tuple[list[tuple[int, int]] | None, TensorLocation, list[ChunkTask]]]:
        """Per tensor: the amax ranges of the first pass (or None), the tensor, its chunk tasks."""
        for t, ten in enumerate(self.tensors):
            n = ten.entry.size
            groups = self._geometries(ten.entry.shape)
            hist = self.hist_job(ten.entry.shape)
            two_pass = any(g[1] and (len(sl) > 1 or n > AMAX_PART) for g, (_, sl) in groups.items())
            sw = self.swamp.get(t)
            flat = [(i, min(i + CHUNK, n)) for i in range(0, n, CHUNK)]
            if sw is not None and not any(sl == flat and not g[1] for g, (_, sl) in groups.items()):
                groups[(-1, False)] = ([], flat)
            tasks, attached = [], sw is None
            for g, (jobs, slices) in groups.items():
                amax = (0 if two_pass else -1) if g[1] else None
                with_swamp = not attached and not g[1] and slices == flat
                attached = attached or with_swamp
                extra = sw if with_swamp else None
                for start, stop in slices:
                    task = ChunkTask(t, ten, start, stop, tuple(jobs), amax, self.seeds[t], extra, hist)
                    tasks.append(task)
            parts = [(i, min(i + AMAX_PART, n)) for i in range(0, n, AMAX_PART)]
            yield (parts if two_pass else None), ten, tasks

    def _geometries(self, shape: tuple[int, ...]) -> dict[_Geometry, tuple[list[int], list[tuple[int, int]]]]:
        """The jobs grouped by chunk geometry, each group with its chunk ranges (job order kept)."""
        groups: dict[_Geometry, tuple[list[int], list[tuple[int, int]]]] = {}
        by_fmt: dict[int, list[tuple[int, int]]] = {}
        for j in self.jobs:
            fi = j // len(self.modes)
            if not_covered(shape, self.fmts[fi]) is not None:
                continue
            if fi not in by_fmt:
                by_fmt[fi] = chunk_slices(shape, self.fmts[fi])
            sl = by_fmt[fi]
            g = (sl[0][1] - sl[0][0] if sl else 0, needs_tensor_amax(self.fmts[fi]))
            jobs = groups.get(g, ([], sl))[0]
            jobs.append(j)
            groups[g] = (jobs, sl)
        return groups

    def hist_job(self, shape: tuple[int, ...]) -> int:
        """The first pair measured on a tensor of ``shape`` (it fills the histogram), or -1."""
        nm = len(self.modes)
        return next((j for j in self.jobs if not_covered(shape, self.fmts[j // nm]) is None), -1)

    def assemble(
        self, acc: Mapping[tuple[int, int], Partial], sacc: Mapping[tuple[int, int], SwampPartial]
    ) -> Analysis:
        """The Analysis ``analyze`` builds, from the merged partials (keys in its order).

        Args:
            acc: (tensor, pair) -> the merged partial of that pair on that tensor.
            sacc: (tensor, ``format_index * 2 + swamp_mode``) -> the merged swamping partial.
        """
        out = Analysis(self.index.path, [f.name for f in self.fmts], [m.value for m in self.modes])
        nm = len(self.modes)
        for t, ten in enumerate(self.tensors):
            e = ten.entry
            key = (e.step, e.role, e.name)
            out.shapes[key] = shape = tuple(e.shape)
            hist = self.hist_job(shape)
            if hist >= 0:  # analyze keeps a histogram only when it measured something
                out.hist[key] = acc.get((t, hist), Partial()).hist
            for j in range(len(self.fmts) * nm):
                f, m = self.fmts[j // nm], self.modes[j % nm]
                why = not_covered(shape, f)
                if why is not None:
                    out.skipped[(*key, f.name)] = (e.size, skip_reason(e, why))
                    continue
                out.results[(*key, f.name, m.value)] = acc.get((t, self.last[f.name, m.value]), Partial())
            if t in self.swamp:
                for f in self.fmts:
                    if isinstance(f, Format):
                        for mi, m in enumerate(SWAMP_MODES):
                            p = sacc.get((t, self.swamp_last[f.name] * 2 + mi), SwampPartial())
                            out.swamping[(e.step, "param", e.name, f.name, m.value)] = p
        return out


def plan_analysis(
    trace: Any,
    formats: Sequence[Any],
    roundings: Sequence[Any],
    roles: Iterable[str],
    steps: Iterable[int] | None,
    swamping: bool,
    seed: int,
    storage_options: Mapping[str, Any],
) -> AnalysisPlan:
    """Check the arguments as :func:`fpsim.analysis.run.analyze` does and lay out the work.

    Args:
        trace, formats, roundings, roles, steps, swamping, seed, storage_options: as for
            :func:`~fpsim.distributed.analyze.analyze_distributed`.

    Raises:
        ValueError: no formats, no tensors selected, a parameter of another shape than its
            gradient.
        TypeError: a non-float tensor, naming its file and key.
    """
    index = index_trace(trace, storage_options)
    fmts, modes = resolve_formats(formats, roundings)
    tensors = select_entries(index, roles, steps)
    pairs = [(f.name, m.value) for f in fmts for m in modes]
    last = {k: j for j, k in enumerate(pairs)}
    jobs = sorted({0, *last.values()}) if pairs else []
    seeds = [tensor_seed(seed, t.entry.step, t.entry.role, t.entry.name) for t in tensors]
    swamp_last = {f.name: fi for fi, f in enumerate(fmts) if isinstance(f, Format)}
    swamp = _swamp_tasks(index, tensors, tuple(sorted(swamp_last.values()))) if swamping else {}
    return AnalysisPlan(index, fmts, modes, tensors, seeds, jobs, last, swamp, swamp_last)


def _swamp_tasks(
    index: TraceIndex, tensors: list[TensorLocation], formats: tuple[int, ...]
) -> dict[int, SwampTask]:
    """Swamping work of each gradient whose step has an lr and the parameter (as ``analyze``)."""
    params: dict[tuple[int, str], TensorLocation] = {}
    for ten in index.tensors:
        if ten.entry.role == "param":
            params.setdefault((ten.entry.step, ten.entry.name), ten)
    out: dict[int, SwampTask] = {}
    for t, ten in enumerate(tensors):
        e = ten.entry
        p = params.get((e.step, e.name)) if e.role == "grad" else None
        lr = index.lrs.get(e.step)
        if lr is None or p is None:
            continue
        if tuple(p.entry.shape) != tuple(e.shape):  # analyze checks this even with no element format
            raise ValueError(
                f"{p.url}: param {e.name!r} has shape {tuple(p.entry.shape)}, its gradient {tuple(e.shape)}"
            )
        if formats:
            out[t] = SwampTask(p, lr, formats)
    return out
