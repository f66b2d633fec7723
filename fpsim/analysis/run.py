"""Analyse a gradient trace: every tensor of every step under every format and recipe.

:func:`analyze` streams a trace (tensor by tensor, chunk by chunk; the chunks of several small
tensors at once on the thread pool) through
:mod:`fpsim.analysis.metrics` and returns an :class:`Analysis` holding the mergeable partials, from
which :meth:`Analysis.table` builds the tidy pandas table (one row per step x tensor x
format x rounding x metric) and :meth:`Analysis.summary` the totals per format.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._compiled import Backend
from ..emulate.element import pool
from ..formats import BlockFormat, Format, IntFormat, RoundMode, get_format
from ..trace import as_trace, json_safe
from .metrics import (
    CHUNK,
    Partial,
    SwampPartial,
    chunk_slices,
    chunk_view,
    needs_tensor_amax,
    not_covered,
    swamping_chunk,
    tally_jobs,
    tensor_amax,
)

__all__ = [
    "Analysis",
    "analyze",
    "DEFAULT_FORMATS",
    "REPR_ROWS",
    "SWAMP_MODES",
    "resolve_formats",
    "select_entries",
    "skip_reason",
    "tensor_seed",
]

DEFAULT_FORMATS = (
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "e4m3_tensor",
    "mxfp8_e4m3",
    "nvfp4",
    "int8_block256",
)
"""What ``fpsim analyze`` measures when given no ``--format``/``--recipe``."""

REPR_ROWS = 12
"""The most format rows the repr of an :class:`Analysis` shows (the rest as ``...``)."""

SWAMP_MODES = (RoundMode.NEAREST_EVEN, RoundMode.STOCHASTIC)
"""The rounding modes :func:`analyze` measures swamping with, in this order."""

Key = tuple[int, str, str, str, str]  # step, role, tensor, format, rounding
SkipKey = tuple[int, str, str, str]  # step, role, tensor, format


@dataclass
class Analysis:
    """Partial metrics of a trace, keyed by (step, role, tensor, format, rounding).

    ``skipped`` holds, per (step, role, tensor, recipe), the tensor's element count and why
    the recipe does not apply to its shape (:func:`fpsim.analysis.metrics.not_covered`):
    those elements are in no partial of that recipe, and the tables and the summary say so.
    """

    trace: str
    formats: list[str]
    roundings: list[str]
    results: dict[Key, Partial] = field(default_factory=dict)
    swamping: dict[Key, SwampPartial] = field(default_factory=dict)
    hist: dict[tuple[int, str, str], np.ndarray] = field(default_factory=dict)
    shapes: dict[tuple[int, str, str], tuple[int, ...]] = field(default_factory=dict)
    skipped: dict[SkipKey, tuple[int, str]] = field(default_factory=dict)
    interrupted: str | None = None
    """Set when the run was stopped (Ctrl-C) with ``keep_on_interrupt``: what was measured."""

    def merge(self, other: Analysis) -> Analysis:
        """Combine two analyses of disjoint (or identical-key, to be summed) parts."""
        out = Analysis(self.trace, self.formats, self.roundings)
        for name in ("results", "swamping", "hist"):
            mine, theirs = getattr(self, name), getattr(other, name)
            merged = dict(mine)
            for k, v in theirs.items():
                merged[k] = merged[k] + v if k in merged else v
            setattr(out, name, merged)
        out.shapes = {**self.shapes, **other.shapes}
        out.skipped = {**self.skipped, **other.skipped}
        out.interrupted = self.interrupted or other.interrupted
        return out

    def absorb(self, part: Analysis) -> None:
        """Take in ``part``'s entries (keys not in this analysis: one more tensor measured)."""
        for name in ("results", "swamping", "hist", "shapes", "skipped"):
            getattr(self, name).update(getattr(part, name))

    COLUMNS = ("step", "role", "tensor", "format", "rounding", "metric", "value")
    """The columns of :meth:`rows` and :meth:`table`."""

    def table(self):
        """Tidy DataFrame of :meth:`rows`: step, role, tensor, format, rounding, metric, value."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=list(self.COLUMNS))

    def rows(self) -> list[tuple]:
        """The tidy rows, one per step x role x tensor x format x rounding x metric, in
        :attr:`COLUMNS` order (metrics.csv, without pandas)."""
        rows = []
        for (step, role, tensor, fmt, rnd), p in sorted(self.results.items()):
            for metric, value in p.totals().items():
                rows.append((step, role, tensor, fmt, rnd, metric, value))
        for (step, role, tensor, fmt, rnd), sp in sorted(self.swamping.items()):
            for metric, value in sp.totals().items():
                rows.append((step, role, tensor, fmt, rnd, f"swamping_{metric}", value))
        for (step, role, tensor, fmt), (n, _) in sorted(self.skipped.items()):
            for rnd in self.roundings:
                rows.append((step, role, tensor, fmt, rnd, "elements_not_covered", n))
        return rows

    def totals(self) -> dict[tuple[str, str], Partial]:
        """Partials summed over the whole trace, per (format, rounding)."""
        out: dict[tuple[str, str], Partial] = {}
        for (_, _, _, fmt, rnd), p in self.results.items():
            out[fmt, rnd] = out[fmt, rnd] + p if (fmt, rnd) in out else p
        return out

    def swamping_totals(self) -> dict[tuple[str, str], SwampPartial]:
        out: dict[tuple[str, str], SwampPartial] = {}
        for (_, _, _, fmt, rnd), p in self.swamping.items():
            out[fmt, rnd] = out[fmt, rnd] + p if (fmt, rnd) in out else p
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary: one entry per format/recipe and rounding under ``results``."""
        totals, swamp = self.totals(), self.swamping_totals()
        results = []
        not_covered = {}
        for (_, _, _, fmt), (n, _) in self.skipped.items():
            not_covered[fmt] = not_covered.get(fmt, 0) + n
        for fmt in self.formats:
            for rnd in self.roundings:
                if (fmt, rnd) not in totals and fmt not in not_covered:
                    continue
                measured = totals.get((fmt, rnd), Partial()).totals()
                entry = {"format": fmt, "rounding": rnd, **json_safe(measured)}
                entry["elements_not_covered"] = not_covered.get(fmt, 0)
                for srnd in sorted({r for f, r in swamp if f == fmt}):
                    entry[f"swamping_{srnd}"] = json_safe(swamp[fmt, srnd].totals())
                results.append(entry)
        steps = sorted({k[0] for k in self.shapes})
        tensors = sorted({(k[1], k[2]) for k in self.shapes})
        skipped = [
            {"step": st, "role": ro, "tensor": te, "format": fmt, "elements": n, "reason": why}
            for (st, ro, te, fmt), (n, why) in sorted(self.skipped.items())
        ]
        out = {
            "trace": self.trace,
            "steps": len(steps),
            "tensors": len(tensors),
            "results": results,
            "not_covered": skipped,
        }
        if self.interrupted:
            out["interrupted"] = self.interrupted
        return out

    def summary_table(self):
        """:meth:`summary` as a pandas DataFrame: one row per format/recipe and rounding, the
        swamping estimates flattened into columns (``swamping_nearest_even_swamped_share``)."""
        import pandas as pd

        df = pd.json_normalize(self.summary()["results"], sep="_")
        for col in df.columns.drop(["format", "rounding"], errors="ignore"):
            df[col] = pd.to_numeric(df[col])  # json_safe's "inf" / "nan" back to floats
        return df

    def _headline(self) -> str:
        steps = len({k[0] for k in self.results})
        tensors = len({(k[1], k[2]) for k in self.results})
        roles = ", ".join(sorted({k[1] for k in self.results})) or "none"
        return (
            f"Analysis of {self.trace!r}: {_count(steps, 'step')} x {_count(tensors, 'tensor')} "
            f"(roles {roles}), "
            f"{_count(len(self.formats), 'format')} x {_count(len(self.roundings), 'rounding')}"
        )

    def _brief(self):
        """The columns :meth:`__repr__` and :meth:`_repr_html_` show, with underflow in percent."""
        df = self.summary_table()
        if df.empty:
            return df
        nonzero = df["nonzero"].where(df["nonzero"] > 0)
        df["underflow_%"] = 100 * df["underflow"] / nonzero
        keep = ["format", "rounding", "elements", "underflow_%", "overflow", "saturated"]
        keep += ["sqnr_db", "rel_l2_error", "swamping_nearest_even_swamped_share"]
        return df[[c for c in keep if c in df.columns]].rename(
            columns={"swamping_nearest_even_swamped_share": "swamped (RNE)"}
        )

    def __repr__(self) -> str:
        """The headline and the totals per format (at most :data:`REPR_ROWS` rows): a few
        lines, not the partials (a full analysis holds megabytes of them)."""
        brief = self._brief()
        if brief.empty:
            return self._headline()
        return (
            self._headline()
            + "\n"
            + brief.to_string(index=False, max_rows=REPR_ROWS, float_format="{:.4g}".format)
        )

    def _repr_html_(self) -> str:
        """The headline and the totals per format as an HTML table (Jupyter)."""
        from html import escape

        brief = self._brief()
        table = (
            ""
            if brief.empty
            else brief.to_html(index=False, max_rows=REPR_ROWS, float_format="{:.4g}".format)
        )
        return f"<p><b>{escape(self._headline())}</b></p>{table}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def analyze(
    trace: Any = None,
    formats: Sequence[str | Format | IntFormat | BlockFormat] = DEFAULT_FORMATS,
    *,
    roundings: Sequence[RoundMode | str] = (RoundMode.NEAREST_EVEN,),
    roles: Iterable[str] = ("grad",),
    steps: Iterable[int] | None = None,
    swamping: bool = True,
    seed: int = 0,
    progress: bool = True,
    backend: Backend | str = "auto",
    keep_on_interrupt: bool = False,
) -> Analysis:
    """Measure every tensor of ``trace`` under every format and rounding mode.

    Args:
        trace: a trace folder, a folder of per-step dump files, a single dump file, a
            :class:`fpsim.trace.Trace`, or None for the bundled sample trace.
        formats: element formats and block recipes (objects or names).
        roundings: rounding modes to measure (stochastic uses counter-based random bits
            seeded per step and tensor, so results are reproducible).
        roles: tensor roles to measure ("grad", "param", "state.exp_avg", ...).
        steps: only these steps (default: all).
        swamping: where the trace has the parameter and the learning rate of a step,
            also measure swamping of the update ``-lr * grad`` (an SGD-style estimate) with
            the parameters stored in each element format, for nearest-even and stochastic
            rounding.
        seed: base seed of stochastic rounding.
        progress: show a progress bar (tqdm.auto: terminal or notebook).
        backend: where the hot loops run (:class:`~fpsim.Backend` or ``"auto"``,
            ``"numpy"``, ``"compiled"``): compiled, each chunk is encoded, decoded and
            tallied in one pass per format (:mod:`fpsim.analysis.compiled`), chunks run on
            all cores; the partials are the same on every backend, bit for bit. ``"auto"``
            runs a trace of fewer than :data:`fpsim._compiled.COMPILED_FROM` elements on numpy.
        keep_on_interrupt: on Ctrl-C (KeyboardInterrupt), return what was measured instead of
            raising: every tensor finished in full, none in part, and ``interrupted`` says how
            many of how many (``fpsim analyze`` writes that report and exits 130). Tensors
            already queued on the thread pool (at most :data:`WINDOW` elements) are finished
            first; a second Ctrl-C drops them. No signal handler is installed: an ignored
            SIGINT (``nohup``, a background job) stays ignored.

    Raises:
        fpsim.trace.TraceError: for missing, truncated or inconsistent trace files.
        TypeError: for a non-float tensor, naming its file and key.
    """
    from tqdm.auto import tqdm

    tr = as_trace(trace)
    fmts, modes = resolve_formats(formats, roundings)
    entries = select_entries(tr, roles, steps)
    backend = Backend.resolve(backend, elements=sum(e.size for e in entries))
    out = Analysis(str(tr.path), [f.name for f in fmts], [m.value for m in modes])
    bar = tqdm(
        total=sum(e.size for e in entries) * len(fmts) * len(modes),
        unit="el",
        unit_scale=True,
        disable=not progress,
        desc="analyze",
    )
    done = 0
    inflight: deque[tuple[Analysis, list[_Tasks], int]] = deque()  # submitted, in trace order

    def finish_oldest() -> None:
        nonlocal done
        part, tasks, _ = inflight.popleft()
        for t in tasks:
            t.finish()
        out.absorb(part)
        done += 1

    try:
        for e in entries:
            part = Analysis(out.trace, out.formats, out.roundings)  # one tensor, whole or not at all
            x = tr.read(e)
            e_seed = tensor_seed(seed, e.step, e.role, e.name)
            tasks = [_measure_entry(e, x, fmts, modes, backend, e_seed, bar.update, part)]
            if swamping and e.role == "grad":
                tasks.append(_swamping(tr, e, x, fmts, e_seed, backend, part))
            inflight.append((part, tasks, x.size))
            while len(inflight) > 1 and sum(n for _, _, n in inflight) > WINDOW:
                finish_oldest()
        while inflight:
            finish_oldest()
    except KeyboardInterrupt:
        try:  # the tensors already submitted (at most WINDOW elements) are finished in full
            while inflight and keep_on_interrupt:
                finish_oldest()
        finally:  # (not kept, or a second Ctrl-C: the queued work is dropped)
            for _, tasks, _ in inflight:
                for t in tasks:
                    t.cancel()
        if not keep_on_interrupt:
            raise
        out.interrupted = f"interrupted after {done} of {len(entries)} tensors; the results hold those {done}"
    finally:
        bar.close()
    return out


WINDOW = 8 * CHUNK
"""Elements of the tensors whose chunks may be queued on the thread pool at once: small
tensors (biases, norms, the layers of a small model) overlap each other instead of each
leaving all but one core idle; the results are still taken in the trace's order."""


class _Tasks:
    """Work items of one tensor: on the thread pool (compiled backend, run as soon as a thread
    is free) or run at once (numpy); :meth:`finish` waits for them in order and hands the
    results to ``collect``."""

    def __init__(self, backend: Backend, fn: Any, items: list, collect: Any):
        self.items, self.collect = items, collect
        if backend is Backend.COMPILED and items:
            self.futures = [pool().submit(fn, i) for i in items]
            self.results = None
        else:
            self.futures, self.results = [], [fn(i) for i in items]

    def finish(self) -> None:
        results = self.results if self.results is not None else [f.result() for f in self.futures]
        self.collect(self.items, results)

    def cancel(self) -> None:
        for f in self.futures:
            f.cancel()


def resolve_formats(
    formats: Sequence[str | Format | IntFormat | BlockFormat], roundings: Sequence[RoundMode | str]
) -> tuple[list[Any], list[RoundMode]]:
    """The formats and rounding modes of an analysis, names resolved (as :func:`analyze` takes them).

    Args:
        formats: element formats and block recipes (objects or names).
        roundings: rounding modes (objects or names).

    Returns:
        The formats (:func:`fpsim.formats.get_format`) and the modes (:meth:`RoundMode.parse`).

    Raises:
        ValueError: no formats, or an unknown name.
    """
    fmts = [get_format(f) for f in formats]
    if not fmts:
        raise ValueError("analyze: give at least one format or recipe")
    return fmts, [RoundMode.parse(r) for r in roundings]


def select_entries(trace: Any, roles: Iterable[str], steps: Iterable[int] | None) -> list[Any]:
    """The tensors :func:`analyze` measures: of these roles and steps, float tensors only.

    Args:
        trace: a :class:`fpsim.trace.Trace` (its :class:`~fpsim.trace.TensorEntry` objects are
            selected) or a :class:`fpsim.trace.remote.TraceIndex` (its
            :class:`~fpsim.trace.remote.TensorLocation` objects).
        roles: tensor roles to keep.
        steps: steps to keep (None: all).

    Returns:
        The selected entries (or locations), in the trace's order.

    Raises:
        ValueError: nothing is selected.
        TypeError: a selected tensor is not a float tensor, naming its file (for a location,
            its URL) and key.
    """
    from ..trace.remote import TraceIndex

    if isinstance(trace, TraceIndex):
        items = [(t, t.entry, t.url) for t in trace.tensors]
    else:
        items = [(e, e, e.file) for e in trace.entries()]
    roles, wanted = tuple(roles), None if steps is None else set(steps)
    chosen = [it for it in items if it[1].role in roles and (wanted is None or it[1].step in wanted)]
    if not chosen:
        raise ValueError(f"{trace.path}: no tensors with roles {list(roles)} in the selected steps")
    for _, e, file in chosen:
        if not e.dtype.startswith(("float", "bfloat")):
            raise TypeError(
                f"{file}: tensor {e.key!r} has dtype {e.dtype}, not a float type; "
                f"fpsim analyses float tensors only"
            )
    return [it[0] for it in chosen]


def tensor_seed(seed: int, step: int, role: str, name: str) -> int:
    """The stochastic-rounding seed of one tensor of an analysis.

    Args:
        seed: the analysis' base seed.
        step: the tensor's step.
        role: its role.
        name: its name.

    Returns:
        ``seed ^ crc32("<step>:<role>:<name>")``: the tensor draws the same bits wherever,
        and in whatever order, it is measured.
    """
    return seed ^ zlib.crc32(f"{step}:{role}:{name}".encode())


def skip_reason(e: Any, why: str) -> str:
    """The reason a recipe skips tensor entry ``e``, naming the tensor."""
    return f"{e.role} {e.name!r} (step {e.step}, shape {tuple(e.shape)}): {why}"


def _measure_entry(
    e: Any,
    x: np.ndarray,
    fmts: list,
    modes: list[RoundMode],
    backend: Backend,
    seed: int,
    progress: Any,
    out: Analysis,
) -> _Tasks:
    """Submit the partials of one tensor under every format and mode; finishing the returned
    tasks puts them into ``out`` (the histogram with the first), recipes that do not apply
    to its shape into ``out.skipped`` at once.

    Formats cut alike (all element formats, flattened recipes) share each chunk: it is read
    once and measured under each of them; chunks run on the thread pool (compiled backend).
    """
    key = (e.step, e.role, e.name)
    shape, flat = tuple(x.shape), x.reshape(-1)
    out.shapes[key] = shape
    groups: dict[tuple, list[int]] = {}  # chunk slices -> positions in fmts
    for i, f in enumerate(fmts):
        why = not_covered(shape, f)
        if why is not None:
            out.skipped[(*key, f.name)] = (x.size, skip_reason(e, why))
            continue
        slices = tuple(chunk_slices(shape, f))
        view = chunk_view(flat, shape, *slices[0], f).shape[1:] if slices else ()  # rows or flat
        groups.setdefault((slices, view), []).append(i)
    measured = sorted(i for g in groups.values() for i in g)
    amax = tensor_amax(flat) if any(needs_tensor_amax(fmts[i]) for i in measured) else None
    # one item per (group, chunk): the chunk's slice and the group's (format, mode) jobs
    items = [
        (sl, [(i, mi) for i in group for mi in range(len(modes))])
        for (slices, _), group in groups.items()
        for sl in slices
    ]

    def task(item: tuple) -> list[Partial]:
        (start, stop), jobs = item
        part = chunk_view(flat, shape, start, stop, fmts[jobs[0][0]])  # one view per group
        todo = [(fmts[i], modes[mi], (i, mi) == (measured[0], 0)) for i, mi in jobs]
        return tally_jobs(part, todo, backend, offset=start, seed=seed, tensor_amax=amax)

    def collect(items: list, results: list) -> None:
        found: dict[tuple[int, int], Partial] = {}  # (format position, mode position)
        for ((start, stop), jobs), parts in zip(items, results):
            for k, p in zip(jobs, parts):
                found[k] = found[k] + p if k in found else p
            progress((stop - start) * len(jobs))
        if not measured:
            return
        for i in measured:
            for mi, m in enumerate(modes):
                out.results[(*key, fmts[i].name, m.value)] = found.get((i, mi), Partial())
        out.hist[key] = found.get((measured[0], 0), Partial()).hist

    return _Tasks(backend, task, items, collect)


def _swamping(
    tr: Any, e: Any, grad: np.ndarray, fmts: list, seed: int, backend: Backend, out: Analysis
) -> _Tasks:
    """Submit the swamping of one gradient's update (both rounding modes, every element
    format) where the trace has its parameter and learning rate; finishing the returned
    tasks puts the totals into ``out.swamping``."""
    lr = tr.lr(e.step)
    params = [p for p in tr.entries(step=e.step, role="param") if p.name == e.name]
    elems = list({f.name: f for f in fmts if isinstance(f, Format)}.values())  # each name once
    if lr is None or not params or not elems:
        return _Tasks(backend, None, [], lambda items, results: None)
    theta = tr.read(params[0])
    if tuple(theta.shape) != tuple(grad.shape):
        raise ValueError(
            f"{params[0].file}: param {e.name!r} has shape {tuple(theta.shape)}, "
            f"its gradient {tuple(grad.shape)}"
        )
    t_flat, g_flat = theta.reshape(-1), grad.reshape(-1)

    def task(start: int) -> list[tuple[SwampPartial, SwampPartial]]:
        t = np.asarray(t_flat[start : start + CHUNK], np.float32)
        g = np.asarray(g_flat[start : start + CHUNK], np.float32)
        return [swamping_chunk(t, g, f, backend, seed=seed, scale=-lr, offset=start) for f in elems]

    def collect(items: list, results: list) -> None:
        total: dict[tuple[str, str], SwampPartial] = {}
        for parts in results:
            for f, pair in zip(elems, parts):
                for m, sp in zip(SWAMP_MODES, pair):
                    k = (f.name, m.value)
                    total[k] = total[k] + sp if k in total else sp
        for f in elems:
            for m in SWAMP_MODES:
                out.swamping[(e.step, "param", e.name, f.name, m.value)] = total.get(
                    (f.name, m.value), SwampPartial()
                )

    return _Tasks(backend, task, list(range(0, t_flat.size, CHUNK)), collect)
