"""What a Dask worker runs for :func:`~fpsim.distributed.analyze.analyze_distributed`.

A task reads its chunks itself (:class:`fpsim.trace.remote.RangeReader`) and returns small
mergeable partials: the measurements of :func:`fpsim.analysis.metrics.measure_chunk` and
:func:`~fpsim.analysis.metrics.measure_swamping` on exactly the canonical chunks ``analyze``
measures, with the same stochastic-rounding bits (counter-based on the flat index).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._compiled import Backend
from ..analysis.metrics import (
    CHUNK,
    Partial,
    SwampPartial,
    chunk_view,
    measure_chunk,
    measure_swamping,
    needs_tensor_amax,
    tensor_amax,
)
from ..analysis.run import SWAMP_MODES
from ..emulate.random import shifted_seed
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
                    for m in SWAMP_MODES:
                        swamps.append(
                            swamp_chunk(theta, x, -task.swamp.lr, fmts[fi], m, task.seed, task.start)
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
        kw = {"offset": task.start, "seed": task.seed, "tensor_amax": tamax, "with_hist": j == 0}
        parts.append(measure_chunk(view, f, m, backend=backend, **kw))
    return parts


def swamp_chunk(
    theta: np.ndarray, grad: np.ndarray, scale: float, fmt: Any, mode: RoundMode, seed: int, offset: int
) -> SwampPartial:
    """:func:`~fpsim.analysis.metrics.measure_swamping` of one chunk (at most CHUNK elements) at ``offset``.

    The update is ``float32(scale * grad)``, as ``analyze`` forms it (``scale = -lr``).
    ``measure_swamping`` draws the random bits of flat position ``i`` of its input, so for a
    chunk starting at ``offset`` the seed is shifted (:func:`fpsim.emulate.random.shifted_seed`)
    to give the bits of ``offset + i``.
    """
    if theta.size > CHUNK:
        raise ValueError(f"a swamping chunk holds at most {CHUNK} elements, got {theta.size}")
    return measure_swamping(theta, grad, fmt, mode, seed=shifted_seed(seed, offset), scale=scale)


def amax_part(src: TensorLocation, start: int, stop: int, storage_options: Mapping[str, Any]) -> float:
    """The fmax of ``|x|`` over one flat range of a tensor."""
    with RangeReader(storage_options) as rd:
        return tensor_amax(rd.read(src, start, stop))


def fmax_reduce(*parts: float) -> float:
    """Combine per-range amaxes exactly as :func:`~fpsim.analysis.metrics.tensor_amax` does."""
    return tensor_amax(np.asarray(parts, np.float32))
