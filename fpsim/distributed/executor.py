"""Analyse a trace on a Dask cluster: the same :class:`~fpsim.analysis.run.Analysis`, bit for bit.

:func:`analyze_distributed` splits the work of :func:`fpsim.analysis.run.analyze` by step x tensor
x canonical chunk (:func:`fpsim.analysis.metrics.chunk_slices`), runs it on Dask workers and merges
the mergeable partials on the client as they arrive.

Guarantee: the result equals ``analyze(...)`` run in one process with the same arguments,
exactly -- every count, every float sum (``sum_sq_err``, ``sum_sq_signal``,
``underflow_energy``, the swamping sums: exact rationals), every maximum, every histogram,
the keys and their order -- whatever the number of workers, threads, batches or the order
in which tasks finish. It holds because a worker measures exactly the canonical chunks
``analyze`` measures (same ranges, same shapes, same stochastic-rounding bits, which are
counter-based on the flat index), float sums are pairwise float64 inside a chunk and exact
rationals across chunks, maxima and integer counts do not depend on order, and the tensor
amax of per-tensor recipes and NVFP4 is a ``fmax`` reduction (exact, associative).

Data flow: the client reads only the trace index (the manifest, or for imported folders
the file headers). Tasks carry where a chunk lives -- the file as an fsspec path (a local
path, ``file://``, ``s3://``, ...), the tensor key and the flat element range -- and the
worker reads the safetensors header and that chunk's byte range itself with fsspec
``open`` + ``seek`` + ``read`` (no memory map, so a worker's resident memory does not grow
with the file size; the page cache stays the kernel's). Results are small (counts,
fractions, a 256-bin histogram per tensor), so nothing large passes through the client, and
at most a fixed window of batches is in flight, so client and scheduler memory do not grow
with the trace either.

Pass order: recipes that need the whole-tensor amax (per-tensor scaling, NVFP4) get it
from a first distributed pass over tensors of more than one chunk (per-chunk ``fmax``
reduced by a task whose result feeds the chunk tasks as a Dask dependency); for a tensor
that fits one chunk, the chunk task computes it itself.

Trace inputs: everything :func:`fpsim.trace.open_trace` opens. Local trace folders and
``.safetensors`` files are read by byte range; ``.pt`` and ``.npz`` inputs are read by the
worker through :func:`fpsim.trace.open_trace` (local files only). A URL with a remote
protocol (``s3://bucket/run1``, with ``storage_options`` for fsspec) must be a trace folder
with ``manifest.json``: the client reads the manifest, and workers check each tensor's dtype
and shape against its file's header when they read it. With a remote scheduler, local paths
must name the same files on the workers (a shared file system).

Workers: :func:`local_client` (what ``scheduler="local"`` uses) starts worker processes with
glibc malloc settings that let each chunk's temporaries reuse the heap instead of being
mapped and faulted in afresh (Dask's default ``MALLOC_TRIM_THRESHOLD_=65536`` made the
analysis 3x slower here, see :data:`_MALLOC_ENV`); for a cluster of your own, put the same
variables in ``distributed.nanny.pre-spawn-environ``.

:func:`replay_distributed` runs :func:`fpsim.replay.engine.replay` split by tensor (and by
configuration), with exactly the single-process result.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analysis.metrics import (
    CHUNK,
    Partial,
    SwampPartial,
    chunk_slices,
    chunk_view,
    measure_chunk,
    measure_swamping,
    needs_tensor_amax,
    tensor_amax,
)
from ..analysis.run import DEFAULT_FORMATS, Analysis
from ..formats import BlockFormat, Format, IntFormat, RoundMode, get_format
from ..trace.errors import TraceError

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client

    from ..trace import Trace

__all__ = ["analyze_distributed", "local_client", "replay_distributed"]

_BATCH_WORK = 1 << 22
"""Element x format measurements per task (small tensors are batched up to this)."""
_JOB_OVERHEAD = 1 << 13
"""The fixed cost of measuring one small tensor under one format, in element-equivalents."""
_AMAX_PART = CHUNK
"""Elements per task of the first (tensor amax) pass, for tensors of more than one chunk."""
_PRE_SPAWN = "distributed.nanny.pre-spawn-environ"
_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TRIM_THRESHOLD_": 64 << 20}
"""glibc malloc settings of the workers :func:`local_client` starts (see there)."""
_GOLDEN = 0x9E3779B97F4A7C15
_GOLDEN_INV = pow(_GOLDEN, -1, 1 << 64)


# --- what a task carries -----------------------------------------------------------------


@dataclass(frozen=True)
class _Src:
    """Where one tensor lives: enough for a worker to read any flat range of it.

    Attributes:
        url: the file, as a local path or an fsspec URL.
        key: the entry key ``"role:name"`` (for imported ``.safetensors`` files the file's
            key may be the bare name; the worker maps it as the importer does).
        shape: the tensor shape.
        dtype: the dtype name the index promised (checked against the file's header).
        local_trace: for tensors not in a safetensors file (``.pt``/``.npz``): the trace the
            worker opens with :func:`fpsim.trace.open_trace` to read it.
        step: the step (used with ``local_trace``).
    """

    url: str
    key: str
    shape: tuple[int, ...]
    dtype: str
    local_trace: str | None = None
    step: int = 0


@dataclass(frozen=True)
class _Swamp:
    """Swamping work attached to a gradient chunk: the parameter, the lr, the formats."""

    param: _Src
    lr: float
    formats: tuple[int, ...]  # indices into the run's format list (element formats only)


@dataclass(frozen=True)
class _Item:
    """One canonical chunk of one tensor and what to measure on it.

    Attributes:
        tensor: the client's index of the tensor.
        src: where the tensor lives.
        start: first flat index of the chunk.
        stop: one past the last.
        jobs: (format, rounding) pairs to measure, as ``format_index * n_modes + mode_index``
            (pair 0 also fills the histogram).
        amax: None (no job needs the tensor amax), -1 (the chunk is the whole tensor: compute
            it here) or the index of the batch argument holding the reduced amax.
        seed: the tensor's stochastic-rounding seed.
        swamp: swamping work on the same range, or None.
    """

    tensor: int
    src: _Src
    start: int
    stop: int
    jobs: tuple[int, ...]
    amax: int | None
    seed: int
    swamp: _Swamp | None = None

    @property
    def work(self) -> int:
        n = len(self.jobs) + (2 * len(self.swamp.formats) if self.swamp else 0)
        return n * (self.stop - self.start + _JOB_OVERHEAD)


# --- worker side ---------------------------------------------------------------------------


def _run_batch(
    items: Sequence[_Item],
    fmts: Sequence[Any],
    modes: Sequence[RoundMode],
    storage_options: Mapping[str, Any],
    *amaxes: float,
) -> list[tuple[list[Partial], list[SwampPartial]]]:
    """Measure a batch of chunks (runs on a worker); one (partials, swamp partials) per item."""
    out: list[tuple[list[Partial], list[SwampPartial]]] = []
    with _Reader(storage_options) as rd:
        for it in items:
            x = rd.read(it.src, it.start, it.stop)
            parts: list[Partial] = []
            if it.jobs:
                amax = None
                if it.amax is not None:
                    amax = tensor_amax(x) if it.amax < 0 else amaxes[it.amax]
                for j in it.jobs:
                    f, m = fmts[j // len(modes)], modes[j % len(modes)]
                    parts.append(
                        measure_chunk(
                            chunk_view(x, it.src.shape, 0, x.size, f),
                            f,
                            m,
                            offset=it.start,
                            seed=it.seed,
                            tensor_amax=amax if needs_tensor_amax(f) else None,
                            with_hist=j == 0,
                        )
                    )
            swamps: list[SwampPartial] = []
            if it.swamp is not None:
                theta = rd.read(it.swamp.param, it.start, it.stop)
                delta = (np.float32(-it.swamp.lr) * np.asarray(x, np.float32)).astype(np.float32)
                for fi in it.swamp.formats:
                    for m in (RoundMode.NEAREST_EVEN, RoundMode.STOCHASTIC):
                        swamps.append(_swamp_chunk(theta, delta, fmts[fi], m, it.seed, it.start))
            out.append((parts, swamps))
    return out


def _swamp_chunk(
    theta: np.ndarray, delta: np.ndarray, fmt: Any, mode: RoundMode, seed: int, offset: int
) -> SwampPartial:
    """:func:`~fpsim.analysis.metrics.measure_swamping` of one chunk (at most CHUNK elements) at ``offset``.

    ``measure_swamping`` draws the random bits of flat position ``i`` of its input, so for a
    chunk starting at ``offset`` the seed is shifted to give the bits of ``offset + i``:
    :func:`~fpsim.emulate.random.random_bits_at` hashes ``i + seed * G (mod 2**64)`` with ``G``
    odd, so ``seed' = seed + offset * G**-1 (mod 2**64)`` does exactly that.
    """
    if theta.size > CHUNK:
        raise ValueError(f"a swamping chunk holds at most {CHUNK} elements, got {theta.size}")
    shifted = (seed + offset * _GOLDEN_INV) % (1 << 64)
    return measure_swamping(theta, delta, fmt, mode, seed=shifted)


def _amax_part(src: _Src, start: int, stop: int, storage_options: Mapping[str, Any]) -> float:
    """The fmax of ``|x|`` over one flat range of a tensor (runs on a worker)."""
    with _Reader(storage_options) as rd:
        return tensor_amax(rd.read(src, start, stop))


def _fmax_reduce(*parts: float) -> float:
    """Combine per-chunk amaxes exactly as :func:`~fpsim.analysis.metrics.tensor_amax` does."""
    m = np.float32(0)
    for p in parts:
        m = np.fmax(m, np.float32(p))
    return float(m)


@dataclass
class _Open:
    file: Any
    slots: dict[str, Any]


class _Reader:
    """Reads flat element ranges of tensors with fsspec (explicit reads, no memory map)."""

    def __init__(self, storage_options: Mapping[str, Any]):
        self.storage_options = dict(storage_options)
        self._open: dict[str, _Open] = {}

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        for o in self._open.values():
            o.file.close()
        self._open.clear()

    def read(self, src: _Src, start: int, stop: int) -> np.ndarray:
        """Elements ``start:stop`` of the flattened tensor, read-only, in the file's dtype."""
        if src.local_trace is not None:
            return _read_via_trace(src, start, stop)
        from ..trace.importers import split_key
        from ..trace.safetensors_io import numpy_dtype

        o = self._file(src.url)
        slot = o.slots.get(src.key)
        if slot is None:  # an imported .safetensors file may store a gradient under its bare name
            role, name = src.key.split(":", 1)
            slot = next((s for k, s in o.slots.items() if split_key(k) == (role, name)), None)
        if slot is None:
            raise TraceError(f"{src.url}: tensor {src.key!r} is missing from the file")
        if slot.shape != src.shape or slot.dtype != src.dtype:
            raise TraceError(
                f"{src.url}: tensor {src.key!r} is {slot.dtype}{list(slot.shape)} in the file but "
                f"{src.dtype}{list(src.shape)} in the trace index (was the file rewritten?)"
            )
        dt = numpy_dtype(slot.dtype)
        nbytes = (stop - start) * dt.itemsize
        try:
            o.file.seek(slot.offset + start * dt.itemsize)
            buf = o.file.read(nbytes)
        except OSError as e:
            raise TraceError(f"{src.url}: cannot read tensor {src.key!r}: {e}") from e
        if len(buf) != nbytes:
            raise TraceError(
                f"{src.url}: truncated safetensors file: tensor {src.key!r} elements {start}:{stop} "
                f"need {nbytes} bytes, got {len(buf)}"
            )
        return np.frombuffer(buf, dtype=dt)

    def _file(self, url: str) -> _Open:
        o = self._open.get(url)
        if o is None:
            import fsspec

            try:
                fs, path = fsspec.core.url_to_fs(url, **self.storage_options)
                f = fs.open(path, "rb", cache_type="none")
            except (OSError, ValueError) as e:
                raise TraceError(f"{url}: cannot open safetensors file: {e}") from e
            try:
                slots = _read_slots(f, url)
            except BaseException:
                f.close()
                raise
            o = self._open[url] = _Open(f, slots)
        return o


def _read_slots(f: Any, url: str) -> dict[str, Any]:
    """The tensor slots of a safetensors file open in ``f``, validated like ``read_header``."""
    from ..trace.safetensors_io import read_header_from

    return dict(read_header_from(f, url).tensors)


@lru_cache(maxsize=2)
def _local_trace(path: str, mtime_ns: int) -> Trace:
    from ..trace import open_trace

    return open_trace(path)


def _read_via_trace(src: _Src, start: int, stop: int) -> np.ndarray:
    """A flat range of a tensor of a ``.pt``/``.npz`` file, through ``open_trace`` (a copy)."""
    try:
        mtime = os.stat(src.url).st_mtime_ns
    except OSError as e:
        raise TraceError(f"{src.url}: cannot read the file: {e}") from e
    tr = _local_trace(src.local_trace, mtime)
    role, name = src.key.split(":", 1)
    flat = tr.read(tr.entry(src.step, name, role)).reshape(-1)
    out = np.array(flat[start:stop])
    out.flags.writeable = False
    return out


# --- client side: the plan -----------------------------------------------------------------


@dataclass(frozen=True)
class _Tensor:
    step: int
    role: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    src: _Src

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class _Index:
    """The part of a trace the client needs: its entries, learning rates and where tensors live."""

    path: str
    tensors: list[_Tensor]
    lrs: dict[int, float | None]
    storage_options: dict[str, Any] = field(default_factory=dict)


def _index(trace: Any, storage_options: Mapping[str, Any]) -> _Index:
    from ..trace import Trace, open_trace, sample_trace_path

    if isinstance(trace, Trace):
        return _local_index(trace)
    if trace is None:
        return _local_index(open_trace(sample_trace_path()))
    text = os.fspath(trace) if isinstance(trace, os.PathLike) else trace
    if not isinstance(text, str):
        raise TypeError(f"trace must be a path, a URL, a Trace or None, got {type(trace).__name__}")
    if "://" not in text and "::" not in text:
        return _local_index(open_trace(text))
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, path = fsspec.core.url_to_fs(text, **storage_options)
    if isinstance(fs, LocalFileSystem):
        return _local_index(open_trace(path))
    return _remote_index(fs, path, text, dict(storage_options))


def _local_index(tr: Trace) -> _Index:
    root = str(Path(tr.path).absolute())
    tensors = []
    for e in tr.entries():
        url = str(Path(e.file).absolute())
        local = None if Path(e.file).suffix.lower() == ".safetensors" else root
        src = _Src(url, e.key, e.shape, e.dtype, local, e.step)
        tensors.append(_Tensor(e.step, e.role, e.name, e.shape, e.dtype, src))
    return _Index(str(tr.path), tensors, {s: tr.lr(s) for s in tr.steps})


def _remote_index(fs: Any, path: str, url: str, storage_options: dict[str, Any]) -> _Index:
    """Index a trace folder on an fsspec file system from its manifest (no tensor data read)."""
    from ..trace.reader import MANIFEST, TRACE_VERSION, _manifest_entries, parse_float

    root = path[: -len(MANIFEST)].rstrip("/") if path.endswith("/" + MANIFEST) else path.rstrip("/")
    mpath = f"{root}/{MANIFEST}"
    murl = fs.unstrip_protocol(mpath)
    try:
        with fs.open(mpath, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise TraceError(
            f"{murl}: no trace manifest; remote traces must be trace folders (manifest.json + step files)"
        ) from None
    except OSError as e:
        raise TraceError(f"{murl}: cannot read the trace manifest: {e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{murl}: corrupt trace manifest (not valid JSON: {e})") from e
    if not isinstance(manifest, dict) or manifest.get("fpsim_trace") != TRACE_VERSION:
        raise TraceError(f"{murl}: not an fpsim trace manifest of version {TRACE_VERSION}")
    if not isinstance(manifest.get("steps"), list):
        raise TraceError(f"{murl}: 'steps' must be a list")
    tensors, lrs = [], {}
    for i, item in enumerate(manifest["steps"]):
        where = f"{murl}: steps[{i}]"
        if not isinstance(item, dict):
            raise TraceError(f"{where} is not an object")
        step, fname = item.get("step"), item.get("file")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0 or step in lrs:
            raise TraceError(f"{where}: 'step' must be a new non-negative integer, got {step!r}")
        if not isinstance(fname, str) or "/" in fname or fname in ("", ".", ".."):
            raise TraceError(f"{where}: 'file' must be a file name inside the trace folder, got {fname!r}")
        lrs[step] = parse_float(item.get("lr"), where)
        furl = fs.unstrip_protocol(f"{root}/{fname}")
        for e in _manifest_entries(item.get("tensors"), where, step, Path(fname)):
            src = _Src(furl, e.key, e.shape, e.dtype, None, step)
            tensors.append(_Tensor(e.step, e.role, e.name, e.shape, e.dtype, src))
    rank = {s: i for i, s in enumerate(sorted(lrs))}
    tensors.sort(key=lambda t: rank[t.step])  # stable: file order within a step
    return _Index(url, tensors, dict(sorted(lrs.items())), storage_options)


@dataclass
class _Plan:
    """What to compute and how to assemble it into an :class:`Analysis`."""

    index: _Index
    fmts: list[Any]
    modes: list[RoundMode]
    tensors: list[_Tensor]  # the measured tensors, in analyze's order
    seeds: list[int]
    jobs: list[int]  # pair indices computed per tensor: 0 (histogram) + the last pair of each key
    last: dict[tuple[str, str], int]  # (format name, rounding) -> the pair whose result stands
    swamp: dict[int, _Swamp]  # measured tensor -> swamping work
    swamp_last: dict[str, int]  # element format name -> the format index whose result stands

    def units(self) -> Iterator[tuple[list[tuple[int, int]] | None, _Tensor, list[_Item]]]:
        """Per tensor: the amax ranges of the first pass (or None) and the chunk items."""
        for t, ten in enumerate(self.tensors):
            shape, n = ten.shape, ten.size
            groups: dict[tuple[int, bool], list[int]] = {}
            slices: dict[tuple[int, bool], list[tuple[int, int]]] = {}
            by_fmt: dict[int, list[tuple[int, int]]] = {}
            for j in self.jobs:
                fi = j // len(self.modes)
                if fi not in by_fmt:
                    by_fmt[fi] = chunk_slices(shape, self.fmts[fi])
                sl = by_fmt[fi]
                g = (sl[0][1] - sl[0][0] if sl else 0, needs_tensor_amax(self.fmts[fi]))
                groups.setdefault(g, []).append(j)
                slices[g] = sl
            two_pass = any(g[1] and (len(slices[g]) > 1 or n > _AMAX_PART) for g in groups)
            sw = self.swamp.get(t)
            flat = [(i, min(i + CHUNK, n)) for i in range(0, n, CHUNK)]
            if sw is not None and not any(slices[g] == flat and not g[1] for g in groups):
                groups[(-1, False)], slices[(-1, False)] = [], flat
            items, attached = [], sw is None
            for g, jobs in groups.items():
                amax = (0 if two_pass else -1) if g[1] else None
                with_swamp = not attached and not g[1] and slices[g] == flat
                attached = attached or with_swamp
                extra = sw if with_swamp else None
                for start, stop in slices[g]:
                    items.append(_Item(t, ten.src, start, stop, tuple(jobs), amax, self.seeds[t], extra))
            parts = [(i, min(i + _AMAX_PART, n)) for i in range(0, n, _AMAX_PART)]
            yield (parts if two_pass else None), ten, items

    def assemble(
        self, acc: dict[tuple[int, int], Partial], sacc: dict[tuple[int, int], SwampPartial]
    ) -> Analysis:
        """The Analysis ``analyze`` builds, from the merged partials (keys in its order)."""
        out = Analysis(self.index.path, [f.name for f in self.fmts], [m.value for m in self.modes])
        nm = len(self.modes)
        sw_modes = (RoundMode.NEAREST_EVEN, RoundMode.STOCHASTIC)
        for t, ten in enumerate(self.tensors):
            key = (ten.step, ten.role, ten.name)
            out.shapes[key] = tuple(ten.shape)
            if self.jobs:  # analyze keeps a histogram only when it measured something
                out.hist[key] = acc.get((t, 0), Partial()).hist
            for j in range(len(self.fmts) * nm):
                f, m = self.fmts[j // nm], self.modes[j % nm]
                out.results[(*key, f.name, m.value)] = acc.get((t, self.last[f.name, m.value]), Partial())
            if t in self.swamp:
                for f in self.fmts:
                    if isinstance(f, Format):
                        for mi, m in enumerate(sw_modes):
                            p = sacc.get((t, self.swamp_last[f.name] * 2 + mi), SwampPartial())
                            out.swamping[(ten.step, "param", ten.name, f.name, m.value)] = p
        return out


def _plan(
    trace: Any,
    formats: Sequence[Any],
    roundings: Sequence[Any],
    roles: Iterable[str],
    steps: Iterable[int] | None,
    swamping: bool,
    seed: int,
    storage_options: Mapping[str, Any],
) -> _Plan:
    """Validate the arguments as :func:`fpsim.analysis.run.analyze` does and lay out the work."""
    index = _index(trace, storage_options)
    fmts = [get_format(f) for f in formats]
    if not fmts:
        raise ValueError("analyze: give at least one format or recipe")
    modes = [RoundMode.parse(r) for r in roundings]
    roles = tuple(roles)
    wanted = None if steps is None else set(steps)
    tensors = [t for t in index.tensors if t.role in roles and (wanted is None or t.step in wanted)]
    if not tensors:
        raise ValueError(f"{index.path}: no tensors with roles {list(roles)} in the selected steps")
    for t in tensors:
        if not t.dtype.startswith(("float", "bfloat")):
            raise TypeError(
                f"{t.src.url}: tensor {t.src.key!r} has dtype {t.dtype}, not a float type; "
                f"fpsim analyses float tensors only"
            )
    pairs = [(f.name, m.value) for f in fmts for m in modes]
    last = {k: j for j, k in enumerate(pairs)}
    jobs = sorted({0, *last.values()}) if pairs else []
    seeds = [seed ^ zlib.crc32(f"{t.step}:{t.role}:{t.name}".encode()) for t in tensors]
    swamp: dict[int, _Swamp] = {}
    swamp_last = {f.name: fi for fi, f in enumerate(fmts) if isinstance(f, Format)}
    if swamping:
        params: dict[tuple[int, str], _Tensor] = {}
        for ten in index.tensors:
            if ten.role == "param":
                params.setdefault((ten.step, ten.name), ten)
        for t, ten in enumerate(tensors):
            p = params.get((ten.step, ten.name)) if ten.role == "grad" else None
            lr = index.lrs.get(ten.step)
            if lr is None or p is None:
                continue
            if tuple(p.shape) != tuple(ten.shape):  # analyze checks this even with no element format
                raise ValueError(
                    f"{p.src.url}: param {ten.name!r} has shape {tuple(p.shape)}, "
                    f"its gradient {tuple(ten.shape)}"
                )
            if swamp_last:
                swamp[t] = _Swamp(p.src, lr, tuple(sorted(swamp_last.values())))
    return _Plan(index, fmts, modes, tensors, seeds, jobs, last, swamp, swamp_last)


# --- client side: running it ---------------------------------------------------------------


def local_client(
    n_workers: int = 2, threads_per_worker: int = 1, memory_limit: str | int | float | None = None
) -> Client:
    """A client of the LocalCluster that ``analyze_distributed(scheduler="local")`` starts.

    Use it to keep one cluster for several analyses (pass it as ``scheduler``); close it with
    ``client.close(); client.cluster.close()``.

    Args:
        n_workers: worker processes.
        threads_per_worker: threads per worker process.
        memory_limit: per-worker memory limit (``"2GiB"``, bytes, 0 for none); None keeps
            Dask's default (the machine's memory shared evenly).

    Raises:
        ValueError: ``n_workers`` or ``threads_per_worker`` is not a positive int.
        ImportError: dask.distributed is not installed.
    """
    distributed = _import_distributed()
    import dask

    for name, v in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    # Dask spawns workers with MALLOC_TRIM_THRESHOLD_=65536, which also pins glibc's mmap
    # threshold at 128 KiB: every large numpy temporary of a chunk (a few MiB each) is then
    # mapped and faulted in afresh, and the kernel's page zeroing costs as much CPU as the
    # measurement (3x slower here). Serve them from the heap and keep up to 64 MiB of freed
    # heap: the temporaries of the next chunk reuse it (about +10 MiB resident per worker).
    with dask.config.set({_PRE_SPAWN: {**dask.config.get(_PRE_SPAWN), **_MALLOC_ENV}}):
        cluster = distributed.LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            memory_limit="auto" if memory_limit is None else memory_limit,
            dashboard_address=":0",
        )
    try:
        return distributed.Client(cluster)
    except BaseException:
        cluster.close()
        raise


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("analyze_distributed needs dask.distributed: pip install 'fpsim[dask]'") from e
    return distributed


def _connect(
    scheduler: Any, n_workers: int, threads_per_worker: int, memory_limit: Any
) -> tuple[Client, Callable[[], None]]:
    """A client for ``scheduler`` and how to release what was started for it."""
    distributed = _import_distributed()
    if isinstance(scheduler, distributed.Client):
        return scheduler, lambda: None
    if not isinstance(scheduler, str) or not scheduler:
        raise TypeError(
            f"scheduler must be 'local', a scheduler address or a distributed.Client, got {scheduler!r}"
        )
    if scheduler == "local":
        client = local_client(n_workers, threads_per_worker, memory_limit)

        def close() -> None:
            cluster = client.cluster
            client.close()
            cluster.close()

        return client, close
    client = distributed.Client(scheduler)
    return client, client.close


def _execute(
    client: Client, plan: _Plan, progress: bool
) -> tuple[dict[tuple[int, int], Partial], dict[tuple[int, int], SwampPartial]]:
    """Submit the plan in a bounded window of batches and merge the partials as they arrive."""
    from distributed import as_completed
    from tqdm.auto import tqdm

    acc: dict[tuple[int, int], Partial] = {}
    sacc: dict[tuple[int, int], SwampPartial] = {}
    opts = plan.index.storage_options
    threads = sum(client.nthreads().values()) or 1
    window = max(8, 4 * threads)
    ac = as_completed(loop=client.loop, with_results=True)  # not default_client(): may be another
    pending: dict[Any, list[_Item]] = {}
    total = sum(t.size for t in plan.tensors) * len(plan.jobs)  # element x (format, rounding)
    bar = tqdm(total=total, unit="el", unit_scale=True, disable=not progress, desc="analyze (dask)")

    def merge(fut: Any, result: list[tuple[list[Partial], list[SwampPartial]]]) -> None:
        items = pending.pop(fut)
        for it, (parts, swamps) in zip(items, result, strict=True):
            for j, p in zip(it.jobs, parts, strict=True):
                k = (it.tensor, j)
                acc[k] = acc.get(k, Partial()) + p
            if it.swamp is not None:
                ks = [(it.tensor, fi * 2 + mi) for fi in it.swamp.formats for mi in (0, 1)]
                for k, sp in zip(ks, swamps, strict=True):
                    sacc[k] = sacc.get(k, SwampPartial()) + sp
            if it.jobs:
                bar.update((it.stop - it.start) * len(it.jobs))

    def submit(items: list[_Item], amaxes: list[Any]) -> None:
        fut = client.submit(_run_batch, items, plan.fmts, plan.modes, opts, *amaxes, pure=False)
        pending[fut] = items
        ac.add(fut)
        while len(pending) >= window:
            merge(*next(ac))

    try:
        batch: list[_Item] = []
        work = 0
        for amax_ranges, ten, items in plan.units():
            amax_fut = None
            if amax_ranges is not None:
                parts = [client.submit(_amax_part, ten.src, a, b, opts, pure=False) for a, b in amax_ranges]
                amax_fut = client.submit(_fmax_reduce, *parts, pure=False)
            for it in items:
                if it.amax is not None and it.amax >= 0:  # needs the first pass: its own batch
                    submit([it], [amax_fut])
                    continue
                if batch and work + it.work > _BATCH_WORK:
                    submit(batch, [])
                    batch, work = [], 0
                batch.append(it)
                work += it.work
        if batch:
            submit(batch, [])
        for fut, result in ac:
            merge(fut, result)
    except BaseException:
        client.cancel(list(pending))
        raise
    finally:
        bar.close()
    return acc, sacc


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

    Returns:
        The :class:`~fpsim.analysis.run.Analysis` ``analyze`` returns for the same arguments.

    Raises:
        fpsim.trace.TraceError: a missing, truncated or inconsistent trace file (also when a
            worker finds it), naming the file.
        TypeError: a non-float tensor, naming its file and key; a bad ``scheduler``.
        ValueError: no formats, no tensors selected, a bad ``n_workers``.
        ImportError: dask.distributed is not installed.
    """
    plan = _plan(trace, formats, roundings, roles, steps, swamping, seed, storage_options or {})
    client, close = _connect(scheduler, n_workers, threads_per_worker, memory_limit)
    try:
        acc, sacc = _execute(client, plan, progress)
    finally:
        close()
    return plan.assemble(acc, sacc)


# --- replay, split by tensor -----------------------------------------------------------------


def _replay_part(
    path: str, names: Sequence[str] | None, configs: Sequence[Any], kw: Mapping[str, Any]
) -> Any:
    """Replay ``configs`` on the tensors ``names`` of the trace at ``path`` (runs on a worker)."""
    from ..replay.engine import replay
    from ..trace import open_trace

    return replay(open_trace(path), configs, tensors=names, progress=False, **kw)


def _groups(sizes: Mapping[str, int], k: int) -> list[list[str]]:
    """``sizes``' names in ``k`` groups of about equal total size (largest first, greedy)."""
    bins: list[tuple[int, int, list[str]]] = [(0, i, []) for i in range(min(k, len(sizes)))]
    for name in sorted(sizes, key=lambda n: -sizes[n]):
        total, i, names = min(bins)
        names.append(name)
        bins[bins.index((total, i, names))] = (total + sizes[name], i, names)
    return [names for _, _, names in bins if names]


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
) -> Any:
    """:func:`fpsim.replay.engine.replay` on a Dask cluster, split by tensor, with exactly the same result.

    Every tensor's replay (the FP32 reference, each configuration's master copy, states and
    per-step statistics) depends on that tensor alone, except through a loss scaler, whose
    overflow check spans all tensors of a step. So configurations without a loss scaler run
    as tasks over groups of tensors (about ``2 x`` the cluster's threads, balanced by size),
    and those with one run as one task over all tensors. Workers open the trace themselves
    (a local path, or one the workers share) and run :func:`~fpsim.replay.engine.replay` on their
    part; the client puts the parts together in replay's order. The result equals the
    single-process one exactly: statistics, loss scales, skips, final parameters and states,
    and the order of every dict (so the per-step sums of :meth:`ReplayResult.per_step` agree
    too).

    Args:
        trace: a trace path or :class:`fpsim.trace.Trace` (None: the bundled sample).
        configs: :class:`~fpsim.replay.engine.ReplayConfig` objects or preset names (None:
            replay's default).
        optimizer, lr, steps, seed: as for :func:`~fpsim.replay.engine.replay`.
        scheduler, n_workers, threads_per_worker, memory_limit: as for
            :func:`analyze_distributed`.
        progress: show a progress bar over the parts.

    Returns:
        The :class:`~fpsim.replay.engine.ReplayResult` ``replay`` returns for the same arguments.
    """
    import inspect

    from tqdm.auto import tqdm

    from ..replay.engine import PRESETS, ReplayConfig, ReplayResult, replay
    from ..trace import Trace, open_trace, sample_trace_path

    tr = trace if isinstance(trace, Trace) else open_trace(sample_trace_path() if trace is None else trace)
    if configs is None:
        configs = inspect.signature(replay).parameters["configs"].default
    cfgs = [PRESETS[c] if isinstance(c, str) and c in PRESETS else c for c in configs]
    for c in cfgs:
        if not isinstance(c, ReplayConfig):
            raise ValueError(f"unknown replay configuration {c!r}; presets: {', '.join(PRESETS)}")
    wanted = sorted(tr.steps if steps is None else set(steps))
    missing = [s for s in wanted if s not in tr.steps]
    if missing:
        raise ValueError(f"{tr.path}: steps {missing} are not in the trace (it has {tr.steps})")
    names = [e.name for e in tr.entries(step=wanted[0], role="grad")] if wanted else []
    sizes = {e.name: e.size for e in tr.entries(step=wanted[0], role="grad")} if wanted else {}
    kw = {"optimizer": optimizer, "lr": lr, "steps": wanted, "seed": seed, "threads": threads_per_worker}
    path = str(Path(tr.path).absolute())
    client, close = _connect(scheduler, n_workers, threads_per_worker, memory_limit)
    try:
        split = [c for c in cfgs if c.loss_scaler is None]
        whole = [c for c in cfgs if c.loss_scaler is not None]
        threads = sum(client.nthreads().values()) or 1
        parts: list[tuple[list[str] | None, list[Any], Any]] = []
        if split and names:
            for group in _groups(sizes, 2 * threads):
                parts.append((group, split, client.submit(_replay_part, path, group, split, kw, pure=False)))
        if whole or not names:
            rest = whole if names else cfgs
            parts.append((None, rest, client.submit(_replay_part, path, None, rest, kw, pure=False)))
        bar = tqdm(total=len(parts), disable=not progress, desc="replay (dask)", unit="part")
        done: list[tuple[list[str] | None, list[Any], Any]] = []
        try:
            futs = {f: (g, c) for g, c, f in parts}
            for fut, res in _as_completed(client, list(futs)):
                g, c = futs[fut]
                done.append((g, c, res))
                bar.update(1)
        finally:
            bar.close()
    finally:
        close()
    by: dict[tuple[str, str], Any] = {}  # (tensor, config) -> the part that replayed it
    ref: dict[str, Any] = {}
    for group, cs, res in done:
        for name in names if group is None else group:
            ref.setdefault(name, res)
            for c in cs:
                by[name, c.name] = res
    out = ReplayResult(str(tr.path), cfgs, wanted, sizes={n: int(sizes[n]) for n in names})
    first = {c.name: next(res for _, cs, res in done if any(c is x for x in cs)) for c in cfgs}
    for step in wanted:
        for c in cfgs:
            out.scale[step, c.name] = first[c.name].scale[step, c.name]
            out.skipped[step, c.name] = first[c.name].skipped[step, c.name]
            for name in names:
                out.stats[step, name, c.name] = by[name, c.name].stats[step, name, c.name]
    out.final_params["reference"] = {n: ref[n].final_params["reference"][n] for n in names}
    out.final_states["reference"] = {n: ref[n].final_states["reference"][n] for n in names}
    for c in cfgs:
        out.final_params[c.name] = {n: by[n, c.name].final_params[c.name][n] for n in names}
        out.final_states[c.name] = {n: by[n, c.name].final_states[c.name][n] for n in names}
    return out


def _as_completed(client: Client, futures: Sequence[Any]) -> Iterator[tuple[Any, Any]]:
    """(future, result) pairs as they finish, on ``client``'s own event loop."""
    from distributed import as_completed

    yield from as_completed(futures, loop=client.loop, with_results=True)
