"""Where a trace's tensors live, and reading flat element ranges of them from anywhere.

What a process needs to read part of a tensor of a trace it did not open itself (a Dask
worker, see :mod:`fpsim.distributed`):

- :func:`index_trace` lists a trace's tensors as :class:`TensorLocation` objects without
  reading any tensor data: for a local trace from :func:`~fpsim.trace.open_trace`, for a
  trace folder on another fsspec file system (``s3://bucket/run1``, ``memory://...``) from
  its manifest (and, for version 2, its step log) alone, parsed by the same
  :func:`~fpsim.trace.reader.parse_manifest`, :func:`~fpsim.trace.reader.attach_step_log` and
  :func:`~fpsim.trace.reader.manifest_steps` as a local folder;
- :class:`RangeReader` reads elements ``start:stop`` of a located tensor: from a
  safetensors file it reads the header and then that byte range only, with fsspec ``open`` +
  ``seek`` + ``read`` (no memory map, so a reader's resident memory does not grow with the
  file; the page cache stays the kernel's), and checks the tensor's dtype and shape against
  the header; a ``.pt``/``.npz`` tensor (local files only) it reads through
  :func:`~fpsim.trace.open_trace`.

fsspec is imported only when a URL or a safetensors file is actually opened.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .errors import TraceError
from .importers import as_trace, open_trace, split_key
from .reader import MANIFEST, STEP_LOG, TensorEntry, Trace, attach_step_log, manifest_steps, parse_manifest
from .safetensors_io import numpy_dtype, read_header_from

__all__ = ["RangeReader", "TensorLocation", "TraceIndex", "index_trace"]


@dataclass(frozen=True)
class TensorLocation:
    """Where one tensor lives: enough for any process to read any flat range of it.

    Attributes:
        url: the file, as an absolute local path or an fsspec URL.
        entry: the tensor's entry (its step, role, name, key, shape and dtype as the trace
            index promised them; for imported ``.safetensors`` files the file's key may be
            the bare name, which the reader maps as the importer does).
        trace: for tensors not in a safetensors file (``.pt``/``.npz``): the local trace
            :class:`RangeReader` opens with :func:`~fpsim.trace.open_trace` to read them.
    """

    url: str
    entry: TensorEntry
    trace: str | None = None


@dataclass
class TraceIndex:
    """The part of a trace a planner needs: where its tensors live and the learning rates.

    Attributes:
        path: the trace as it was named (path or URL).
        tensors: every tensor, by step then in file order (as :meth:`Trace.entries`).
        lrs: the recorded learning rate of each step (None where none was recorded).
        storage_options: the fsspec options its URLs need (empty for local files).
    """

    path: str
    tensors: list[TensorLocation]
    lrs: dict[int, float | None]
    storage_options: dict[str, Any] = field(default_factory=dict)


def index_trace(trace: Any, storage_options: Mapping[str, Any] | None = None) -> TraceIndex:
    """Index a trace: a :class:`Trace`, None (the sample), a local path or an fsspec URL.

    Args:
        trace: what :func:`~fpsim.trace.as_trace` takes, or a URL with a protocol
            (``file://``, ``s3://``, ...); a URL of a non-local file system must name a
            trace folder (``manifest.json`` + step files) or its manifest.
        storage_options: fsspec options for URLs (credentials, endpoint, ...).

    Raises:
        TraceError: a missing or inconsistent trace, or a remote URL without a manifest.
        TypeError: ``trace`` is none of these.
    """
    opts = dict(storage_options or {})
    if isinstance(trace, Trace) or trace is None:
        return _local_index(as_trace(trace))
    text = os.fspath(trace) if isinstance(trace, os.PathLike) else trace
    if not isinstance(text, str):
        raise TypeError(f"trace must be a path, a URL, a Trace or None, got {type(trace).__name__}")
    if "://" not in text and "::" not in text:
        return _local_index(open_trace(text))
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, path = fsspec.core.url_to_fs(text, **opts)
    if isinstance(fs, LocalFileSystem):
        return _local_index(open_trace(path))
    return _remote_index(fs, path, text, opts)


def _local_index(tr: Trace) -> TraceIndex:
    root = str(Path(tr.path).absolute())
    tensors = [
        TensorLocation(
            str(Path(e.file).absolute()), e, None if Path(e.file).suffix.lower() == ".safetensors" else root
        )
        for e in tr.entries()
    ]
    return TraceIndex(str(tr.path), tensors, {s: tr.lr(s) for s in tr.steps})


def _remote_index(fs: Any, path: str, url: str, storage_options: dict[str, Any]) -> TraceIndex:
    """Index a trace folder on an fsspec file system from its manifest (no tensor data read)."""
    root = path[: -len(MANIFEST)].rstrip("/") if path.endswith("/" + MANIFEST) else path.rstrip("/")
    mpath = f"{root}/{MANIFEST}"
    murl = fs.unstrip_protocol(mpath)
    try:
        with fs.open(mpath, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise TraceError(
            f"{murl}: no trace manifest; remote traces must be trace folders (manifest.json + step files)"
        ) from None
    except OSError as e:
        raise TraceError(f"{murl}: cannot read the trace manifest: {e}") from e
    manifest, listing = parse_manifest(data, murl), murl
    if manifest["fpsim_trace"] >= 2:
        listing = fs.unstrip_protocol(f"{root}/{STEP_LOG}")
        try:
            with fs.open(f"{root}/{STEP_LOG}", "rb") as f:
                attach_step_log(manifest, f.read(), listing)
        except OSError as e:
            raise TraceError(f"{listing}: cannot read the step log of the trace: {e}") from e
    tensors: list[TensorLocation] = []
    lrs: dict[int, float | None] = {}
    for ms in manifest_steps(manifest, listing):
        ms.loss()  # checked as in a local folder, though the index does not keep it
        lrs[ms.step] = ms.lr()
        furl = fs.unstrip_protocol(f"{root}/{ms.file}")
        tensors += [TensorLocation(furl, e) for e in ms.entries(Path(ms.file))]
    rank = {s: i for i, s in enumerate(sorted(lrs))}
    tensors.sort(key=lambda t: rank[t.entry.step])  # stable: file order within a step
    return TraceIndex(url, tensors, dict(sorted(lrs.items())), storage_options)


@dataclass
class _Open:
    file: Any
    slots: dict[str, Any]


class RangeReader:
    """Reads flat element ranges of located tensors (explicit reads, no memory map).

    A context manager: the files it opened stay open until it exits.

    Args:
        storage_options: fsspec options for the URLs it opens.
    """

    def __init__(self, storage_options: Mapping[str, Any] | None = None):
        self.storage_options = dict(storage_options or {})
        self._open: dict[str, _Open] = {}

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        for o in self._open.values():
            o.file.close()
        self._open.clear()

    def read(self, loc: TensorLocation, start: int, stop: int) -> np.ndarray:
        """Elements ``start:stop`` of the flattened tensor, read-only, in the file's dtype.

        Raises:
            TraceError: the file cannot be opened or read, is truncated, lacks the tensor,
                or holds it with another dtype or shape than the index says.
        """
        if loc.trace is not None:
            return _read_via_trace(loc, start, stop)
        o = self._file(loc.url)
        slot = _slot(o, loc)
        dt = numpy_dtype(slot.dtype)
        nbytes = (stop - start) * dt.itemsize
        try:
            o.file.seek(slot.offset + start * dt.itemsize)
            buf = o.file.read(nbytes)
        except OSError as e:
            raise TraceError(f"{loc.url}: cannot read tensor {loc.entry.key!r}: {e}") from e
        if len(buf) != nbytes:
            raise TraceError(
                f"{loc.url}: truncated safetensors file: tensor {loc.entry.key!r} elements {start}:{stop} "
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
                slots = dict(read_header_from(f, url).tensors)
            except BaseException:
                f.close()
                raise
            o = self._open[url] = _Open(f, slots)
        return o


def _slot(o: _Open, loc: TensorLocation) -> Any:
    """The header slot of ``loc``'s tensor, checked against the index."""
    e = loc.entry
    slot = o.slots.get(e.key)
    if slot is None:  # an imported .safetensors file may store a gradient under its bare name
        slot = next((s for k, s in o.slots.items() if split_key(k) == (e.role, e.name)), None)
    if slot is None:
        raise TraceError(f"{loc.url}: tensor {e.key!r} is missing from the file")
    if slot.shape != e.shape or slot.dtype != e.dtype:
        raise TraceError(
            f"{loc.url}: tensor {e.key!r} is {slot.dtype}{list(slot.shape)} in the file but "
            f"{e.dtype}{list(e.shape)} in the trace index (was the file rewritten?)"
        )
    return slot


@lru_cache(maxsize=2)
def _local_trace(path: str, mtime_ns: int) -> Trace:
    """The trace at ``path``, opened once while its file keeps its modification time."""
    return open_trace(path)


def _read_via_trace(loc: TensorLocation, start: int, stop: int) -> np.ndarray:
    """A flat range of a tensor of a ``.pt``/``.npz`` file, through ``open_trace`` (a copy)."""
    try:
        mtime = os.stat(loc.url).st_mtime_ns
    except OSError as e:
        raise TraceError(f"{loc.url}: cannot read the file: {e}") from e
    tr = _local_trace(loc.trace, mtime)
    e = loc.entry
    flat = tr.read(tr.entry(e.step, e.name, e.role)).reshape(-1)
    out = np.array(flat[start:stop])
    out.flags.writeable = False
    return out
