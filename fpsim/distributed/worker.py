"""What a Dask worker runs for :func:`~fpsim.distributed.analyze.analyze_distributed`.

A task reads its chunks itself (:class:`fpsim.trace.remote.RangeReader`) and returns small
mergeable partials: the measurements of :func:`fpsim.analysis.metrics.measure_chunk` and
:func:`~fpsim.analysis.metrics.swamping_chunk` on exactly the canonical chunks ``analyze``
measures, with the same stochastic-rounding bits (counter-based on the flat index) and the same
compiled pass where the backend is compiled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._compiled import Backend
from ..analysis.metrics import (
    Partial,
    SwampPartial,
    chunk_view,
    measure_chunk,
    needs_tensor_amax,
    swamping_chunk,
    tensor_amax,
)
from ..formats import RoundMode
from ..trace.remote import RangeReader, TensorLocation
from .plan import ChunkTask

__all__ = ["amax_part", "fmax_reduce", "run_batch", "swamp_chunk"]


def run_batch(
    tasks: Sequence[ChunkTask],
    fmts: Sequence[Any],
    modes: Sequence[RoundMode],
    backend: Backend,
    storage_options: Mapping[str, Any],
    *amaxes: float,
) -> list[tuple[list[Partial], list[SwampPartial]]]:
    """Measure a batch of chunks; one (partials, swamp partials) per task, in order.

    Args:
        tasks: the chunks and what to measure on each.
        fmts: the run's formats, indexed by the tasks' jobs.
        modes: the run's rounding modes, indexed by the tasks' jobs.
        backend: where the measurements' hot loops run (the same partials on each).
        storage_options: fsspec options for the trace's URLs.
        *amaxes: the reduced tensor amaxes the tasks' ``amax`` indices point at.
    """
    out: list[tuple[list[Partial], list[SwampPartial]]] = []
    with RangeReader(storage_options) as rd:
        for task in tasks:
            x = rd.read(task.src, task.start, task.stop)
            parts = _measure(task, x, fmts, modes, backend, amaxes)
            swamps: list[SwampPartial] = []
            if task.swamp is not None:
                theta = rd.read(task.swamp.param, task.start, task.stop)
                for fi in task.swamp.formats:
                    swamps.extend(
                        swamp_chunk(theta, x, -task.swamp.lr, fmts[fi], task.seed, task.start, backend)
                    )
            out.append((parts, swamps))
    return out


def _measure(
    task: ChunkTask,
    x: np.ndarray,
    fmts: Sequence[Any],
    modes: Sequence[RoundMode],
    backend: Backend,
    amaxes: Sequence[float],
) -> list[Partial]:
    """The partials of ``task``'s (format, rounding) jobs on its chunk ``x``."""
    amax = None
    if task.jobs and task.amax is not None:
        amax = tensor_amax(x) if task.amax < 0 else amaxes[task.amax]
    parts = []
    for j in task.jobs:
        f, m = fmts[j // len(modes)], modes[j % len(modes)]
        view = chunk_view(x, task.src.entry.shape, 0, x.size, f)
        tamax = amax if needs_tensor_amax(f) else None
        kw = {"offset": task.start, "seed": task.seed, "tensor_amax": tamax, "with_hist": j == task.hist}
        parts.append(measure_chunk(view, f, m, backend=backend, **kw))
    return parts


def swamp_chunk(
    theta: np.ndarray, grad: np.ndarray, scale: float, fmt: Any, seed: int, offset: int, backend: Backend
) -> tuple[SwampPartial, SwampPartial]:
    """The swamping partials of one chunk (at most CHUNK elements) at ``offset``, for the
    modes of :data:`~fpsim.analysis.run.SWAMP_MODES` in order: what ``analyze`` computes there
    (:func:`~fpsim.analysis.metrics.swamping_chunk`, the update ``float32(scale * grad)``, the
    random words of the chunk's place in the tensor, both modes in one pass when compiled)."""
    return swamping_chunk(
        np.asarray(theta, np.float32),
        np.asarray(grad, np.float32),
        fmt,
        backend,
        seed=seed,
        scale=scale,
        offset=offset,
    )


def amax_part(src: TensorLocation, start: int, stop: int, storage_options: Mapping[str, Any]) -> float:
    """The fmax of ``|x|`` over one flat range of a tensor."""
    with RangeReader(storage_options) as rd:
        return tensor_amax(rd.read(src, start, stop))


def fmax_reduce(*parts: float) -> float:
    """Combine per-range amaxes exactly as :func:`~fpsim.analysis.metrics.tensor_amax` does."""
    return tensor_amax(np.asarray(parts, np.float32))
