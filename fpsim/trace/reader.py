"""The :class:`Trace` object: steps, tensor entries and lazy reads, plus the manifest reader.

A :class:`Trace` is backed by one "source" per file. For the trace folder format (and plain
``.safetensors`` imports) the source reads the requested tensor's bytes only, with ``pread``
(no memory map, so a file truncated under a reader raises :class:`TraceError`, never
``SIGBUS``); the importers in :mod:`fpsim.trace.importers` add sources for ``.pt`` and
``.npz`` files. Manifests and step logs are read with the bounds of :mod:`fpsim.trace.files`.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .errors import TraceError
from .files import load_json, read_small
from .jsonvalues import parse_float
from .safetensors_io import (
    DTYPE_CODES,
    FLOAT_DTYPES,
    SafetensorsHeader,
    check_shape,
    read_header,
    read_tensor,
)
from .steplog import attach_step_log, parse_step_log

__all__ = [
    "MANIFEST",
    "OPERAND_ROLES",
    "STATS_ROLES",
    "STEP_LOG",
    "TRACE_VERSION",
    "ManifestStep",
    "TensorEntry",
    "Trace",
    "check_role",
    "load_manifest_trace",
    "manifest_entries",
    "manifest_steps",
    "parse_manifest",
    "parse_step_log",
    "step_metadata",
    "parse_update",
    "read_manifest",
    "step_file_name",
]

MANIFEST = "manifest.json"
STEP_LOG = "steps.jsonl"
TRACE_VERSION = 2
READABLE_VERSIONS = (1, 2)
MAX_MANIFEST_BYTES = 1 << 30
"""The largest manifest or step log read (1 GiB: about a million steps of a hundred tensors)."""
STEP_FILE_RE = re.compile(r"^step_(\d+)\.safetensors$")
_KNOWN_DTYPES = frozenset(DTYPE_CODES.values())


def step_file_name(step: int) -> str:
    """The file name of a step in a trace folder: ``step_000012.safetensors``."""
    return f"step_{step:06d}.safetensors"


OPERAND_ROLES = ("input", "grad_output")
"""The roles of GEMM operands: a matmul module's input, and the gradient of its output."""

STATS_ROLES = ("stats.input", "stats.grad_output")
"""Their statistics only (``operands="stats"``, :mod:`fpsim.trace.operand_stats`)."""


def check_role(role: Any) -> str:
    """Return ``role`` if it is ``"grad"``, ``"param"``, ``"state.<name>"``, an operand role
    (:data:`OPERAND_ROLES`) or a statistics role (:data:`STATS_ROLES`), else raise ValueError."""
    if role in ("grad", "param", *OPERAND_ROLES, *STATS_ROLES):
        return role
    if isinstance(role, str) and role.startswith("state.") and len(role) > 6 and ":" not in role:
        return role
    raise ValueError(
        "role must be 'grad', 'param' or 'state.<name>' (e.g. 'state.exp_avg'), or an operand role "
        f"('input', 'grad_output', 'stats.input', 'stats.grad_output'), got {role!r}"
    )


@dataclass(frozen=True)
class TensorEntry:
    """One recorded tensor of one step.

    Attributes:
        step: the training step.
        role: ``"grad"``, ``"param"`` or ``"state.<name>"`` (optimizer state, e.g.
            ``"state.exp_avg"``).
        name: the parameter name, e.g. ``"blocks.0.attn.qkv.weight"``.
        key: ``"<role>:<name>"``, the key in the step's safetensors file.
        shape: the tensor shape.
        dtype: the numpy/ml_dtypes dtype name, e.g. ``"float32"``, ``"bfloat16"``,
            ``"float8_e4m3fn"``; imported files may also hold integer or ``"bool"`` tensors,
            reported as such (see :attr:`is_float`).
        file: the file that holds the tensor.
    """

    step: int
    role: str
    name: str
    key: str
    shape: tuple[int, ...]
    dtype: str
    file: Path

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        """Whether :attr:`dtype` is a floating-point type."""
        return self.dtype in FLOAT_DTYPES


class Source(Protocol):
    """Reads the tensors of one file (internal)."""

    def read(self, entry: TensorEntry) -> np.ndarray: ...


class SafetensorsSource:
    """Reads tensors of one safetensors file with ``pread``; ``keys`` maps entry keys to file keys.

    Each read opens the file, checks it is still the file whose header was read (device,
    inode, size, modification time) and reads the tensor's bytes into a fresh array; no
    descriptor or map is held between reads.
    """

    def __init__(self, header: SafetensorsHeader, keys: Mapping[str, str] | None = None):
        self.header = header
        self.keys = dict(keys) if keys is not None else None

    def _key(self, entry: TensorEntry) -> str:
        return entry.key if self.keys is None else self.keys[entry.key]

    def read(self, entry: TensorEntry) -> np.ndarray:
        return read_tensor(self.header, self._key(entry))

    def read_flat(self, entry: TensorEntry, start: int, stop: int) -> np.ndarray:
        """Flat (C-order) elements ``start:stop`` of the tensor, reading only their bytes."""
        return read_tensor(self.header, self._key(entry), start, stop)


@dataclass
class StepRecord:
    """One step of a trace (internal)."""

    step: int
    loss: float | None
    lr: float | None
    entries: list[TensorEntry] = field(default_factory=list)
    update: int | None = None
    skipped: bool = False


class Trace:
    """A recorded sequence of training steps, read lazily.

    Make one with :func:`fpsim.trace.open_trace`. Tensors are read only when asked for;
    :meth:`read` returns a read-only array (read with ``pread`` for safetensors files) and
    :meth:`read_chunks` streams a tensor in flat pieces.

    Attributes:
        path: the folder or file the trace was opened from.
        metadata: free-form metadata recorded with the trace (a dict).
    """

    def __init__(
        self,
        path: Path,
        metadata: Mapping[str, Any],
        records: Sequence[StepRecord],
        sources: Mapping[Path, Source],
    ):
        self.path = Path(path)
        self.metadata: dict[str, Any] = dict(metadata)
        self._records = {r.step: r for r in sorted(records, key=lambda r: r.step)}
        self._sources = dict(sources)
        self._known = frozenset(e for r in self._records.values() for e in r.entries)

    def __repr__(self) -> str:
        return f"Trace({str(self.path)!r}, steps={len(self._records)}, roles={list(self.roles)})"

    @property
    def steps(self) -> list[int]:
        """The recorded steps, ascending."""
        return list(self._records)

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles present: ``"grad"``, ``"param"``, then the ``"state.*"`` roles sorted."""
        found = {e.role for r in self._records.values() for e in r.entries}
        order = [r for r in ("grad", "param") if r in found]
        return tuple(order + sorted(found - {"grad", "param"}))

    def _record(self, step: int) -> StepRecord:
        try:
            return self._records[step]
        except (KeyError, TypeError):
            steps = self.steps
            shown = ", ".join(map(str, steps[:8])) + (", ..." if len(steps) > 8 else "")
            raise ValueError(f"step {step!r} is not in trace {self.path} (steps: {shown})") from None

    def loss(self, step: int) -> float | None:
        """The loss recorded for ``step`` (None if none was recorded)."""
        return self._record(step).loss

    def lr(self, step: int) -> float | None:
        """The learning rate recorded for ``step`` (None if none was recorded)."""
        return self._record(step).lr

    def update(self, step: int) -> int | None:
        """The optimizer update count recorded for ``step`` (1-based; None if none was recorded)."""
        return self._record(step).update

    def skipped(self, step: int) -> bool:
        """Whether the recorded run skipped ``step``'s update (loss scaling found inf/NaN)."""
        return self._record(step).skipped

    def entries(self, step: int | None = None, role: str | None = None) -> list[TensorEntry]:
        """The tensor entries, by step then in file order, optionally of one step and/or role.

        Args:
            step: only this step (ValueError if the trace does not have it).
            role: only this role (``"grad"``, ``"param"``, ``"state.<name>"``); a valid role
                the trace lacks gives an empty list.
        """
        if role is not None:
            check_role(role)
        records = [self._record(step)] if step is not None else self._records.values()
        return [e for r in records for e in r.entries if role is None or e.role == role]

    def entry(self, step: int, name: str, role: str = "grad") -> TensorEntry:
        """The entry of one tensor; ValueError if the step has no such tensor."""
        for e in self.entries(step, role):
            if e.name == name:
                return e
        raise ValueError(f"trace {self.path} has no {role} tensor {name!r} at step {step}")

    def names(self, role: str = "grad") -> list[str]:
        """The tensor names of a role, in order of first appearance over the steps."""
        return list(dict.fromkeys(e.name for e in self.entries(role=role)))

    def read(self, entry: TensorEntry) -> np.ndarray:
        """Read one tensor as a read-only numpy array of its shape and dtype.

        For safetensors files (and uncompressed ``.npz``) only this tensor's bytes are read,
        with ``pread``, into an array of its own (no memory map and no open descriptor stays
        behind). A file that was replaced, truncated or rewritten since the trace was opened
        raises :class:`TraceError` naming it.
        """
        if not isinstance(entry, TensorEntry):
            raise TypeError(f"entry must be a TensorEntry (from Trace.entries or Trace.entry), got {entry!r}")
        source = self._sources.get(entry.file)
        if source is None or entry not in self._known:
            raise ValueError(f"{entry!r} does not belong to trace {self.path}")
        a = source.read(entry)
        if a.flags.writeable:
            a = a.view()
            a.flags.writeable = False
        return a

    def read_chunks(self, entry: TensorEntry, chunk_elements: int) -> Iterator[np.ndarray]:
        """Yield a tensor's elements in flat (C-order) chunks of ``chunk_elements``.

        For safetensors files and uncompressed ``.npz`` each chunk is read on its own, so a
        tensor larger than memory streams from disk (for ``.pt`` files and compressed
        ``.npz`` the tensor is loaded first); chunks are read-only, the last may be shorter,
        and a zero-size tensor yields nothing.
        """
        if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int) or chunk_elements < 1:
            raise ValueError(f"chunk_elements must be a positive int, got {chunk_elements!r}")
        if not isinstance(entry, TensorEntry):
            raise TypeError(f"entry must be a TensorEntry (from Trace.entries or Trace.entry), got {entry!r}")
        source = self._sources.get(entry.file)
        read_flat = getattr(source, "read_flat", None)
        if read_flat is not None and entry in self._known:
            for start in range(0, entry.size, chunk_elements):
                chunk = read_flat(entry, start, min(start + chunk_elements, entry.size))
                chunk.flags.writeable = False
                yield chunk
            return
        flat = self.read(entry).reshape(-1)
        for start in range(0, flat.size, chunk_elements):
            yield flat[start : start + chunk_elements]


# --- the manifest ---------------------------------------------------------------------------


def parse_manifest(data: bytes, where: str) -> dict[str, Any]:
    """Decode a trace manifest's bytes and validate its structure (version, metadata, steps).

    The one reader of the manifest format (see :mod:`fpsim.trace`), for local folders
    (:func:`read_manifest`) and remote ones (:mod:`fpsim.trace.remote`). A version 1
    manifest lists its ``"steps"``; a version 2 manifest has none, they are in the step log
    (:func:`parse_step_log`, attached with :func:`attach_step_log`). The items of
    ``"steps"`` are checked by :func:`manifest_steps`.

    Args:
        data: the file's bytes (UTF-8 JSON).
        where: the manifest's path or URL, for messages.

    Raises:
        TraceError: not valid (bounded) UTF-8 JSON, not a manifest, another version, or a
            bad ``"metadata"`` / ``"steps"`` field, naming ``where``.
    """
    manifest = load_json(data, where, "trace manifest")
    if not isinstance(manifest, dict) or "fpsim_trace" not in manifest:
        raise TraceError(f"{where}: not an fpsim trace manifest (no 'fpsim_trace' version field)")
    version = manifest["fpsim_trace"]
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise TraceError(
            f"{where}: unsupported trace version {version!r} (this fpsim reads {READABLE_VERSIONS})"
        )
    if not isinstance(manifest.get("metadata", {}), dict):
        raise TraceError(f"{where}: 'metadata' must be a JSON object")
    if version == 1 and not isinstance(manifest.get("steps"), list):
        raise TraceError(f"{where}: 'steps' must be a list")
    if version >= 2 and "steps" in manifest:
        raise TraceError(f"{where}: a version {version} manifest lists no 'steps' (they are in {STEP_LOG})")
    return manifest


def read_manifest(folder: Path) -> dict[str, Any]:
    """Parse and validate ``folder/manifest.json`` (and, for version 2, its step log).

    Both must be regular files inside the folder (no FIFO, no symlink leading out).

    Raises:
        TraceError: naming the manifest or the step log.
    """
    path = folder / MANIFEST
    manifest = parse_manifest(read_small(path, "trace manifest", folder, MAX_MANIFEST_BYTES), str(path))
    if manifest["fpsim_trace"] >= 2:
        log = folder / STEP_LOG
        if not log.exists() and not log.is_symlink():
            raise TraceError(f"{log}: the step log of the version 2 trace {path} is missing")
        attach_step_log(manifest, read_small(log, "step log", folder, MAX_MANIFEST_BYTES), str(log))
    return manifest


@dataclass(frozen=True)
class ManifestStep:
    """One item of a manifest's ``"steps"`` list, its step and file name checked.

    Attributes:
        where: ``"<manifest>: steps[i]"``, the prefix of messages about the item.
        step: the step number (non-negative, listed once).
        file: the step file's name (a plain name inside the trace folder, listed once).
        item: the item as parsed; :meth:`loss`, :meth:`lr` and :meth:`entries` check the rest.
    """

    where: str
    step: int
    file: str
    item: Mapping[str, Any]

    def loss(self) -> float | None:
        """The recorded loss (see :func:`~fpsim.trace.jsonvalues.parse_float`)."""
        return parse_float(self.item.get("loss"), self.where)

    def lr(self) -> float | None:
        """The recorded learning rate (see :func:`~fpsim.trace.jsonvalues.parse_float`)."""
        return parse_float(self.item.get("lr"), self.where)

    def update(self) -> int | None:
        """The recorded optimizer update count (an integer >= 1, or None when not recorded)."""
        return parse_update(self.item.get("update"), self.where)

    def skipped(self) -> bool:
        """The recorded ``skipped`` flag (absent: False)."""
        value = self.item.get("skipped", False)
        if not isinstance(value, bool):
            raise TraceError(f"{self.where}: 'skipped' must be true or false, got {value!r}")
        return value

    def entries(self, file: Path) -> list[TensorEntry]:
        """The listed tensors as entries held by ``file`` (see :func:`manifest_entries`)."""
        return manifest_entries(self.item.get("tensors"), self.where, self.step, file)


def parse_update(value: Any, where: str) -> int | None:
    """An optimizer update count from JSON: an integer >= 1, or null/absent (None).

    Raises:
        TraceError: anything else, prefixed with ``where``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TraceError(f"{where}: 'update' must be an integer >= 1 (an update count), got {value!r}")
    return value


def manifest_steps(manifest: Mapping[str, Any], where: str) -> Iterator[ManifestStep]:
    """The items of a manifest parsed by :func:`parse_manifest`, in order, each checked as it comes.

    Args:
        manifest: the parsed manifest.
        where: the manifest's path or URL, for messages.

    Raises:
        TraceError: an item that is not an object, a bad or repeated step, or a file name
            that is not a plain name inside the folder or is listed twice.
    """
    seen_steps: set[int] = set()
    seen_files: set[str] = set()
    for i, item in enumerate(manifest["steps"]):
        at = f"{where}: steps[{i}]"
        if not isinstance(item, dict):
            raise TraceError(f"{at} is not an object")
        step = item.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise TraceError(f"{at}: 'step' must be a non-negative integer, got {step!r}")
        if step in seen_steps:
            raise TraceError(f"{where}: step {step} is listed twice")
        seen_steps.add(step)
        fname = item.get("file")
        if (
            not isinstance(fname, str)
            or Path(fname).name != fname
            or fname in ("", ".", "..", MANIFEST, STEP_LOG)
        ):
            raise TraceError(f"{at}: 'file' must be a file name inside the trace folder, got {fname!r}")
        if fname in seen_files:
            raise TraceError(f"{where}: file {fname!r} is listed for two steps")
        seen_files.add(fname)
        yield ManifestStep(at, step, fname, item)


def load_manifest_trace(folder: Path) -> Trace:
    """Open a trace folder (manifest, step log, step files) and cross-check it with the files.

    Every listed file must be a regular file inside the folder, its safetensors header
    must hold exactly the listed keys with the listed shapes and dtypes, and its
    ``__metadata__`` (when written by fpsim) must agree with the listed step, loss, lr,
    update count and skipped flag. Step files not listed (left by an interrupted write)
    are ignored with a warning.

    Raises:
        TraceError: naming the manifest, step log or step file and the problem.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    listing = str(folder / (STEP_LOG if manifest["fpsim_trace"] >= 2 else MANIFEST))
    records: list[StepRecord] = []
    sources: dict[Path, Source] = {}
    for ms in manifest_steps(manifest, listing):
        file = folder / ms.file
        if not file.exists() and not file.is_symlink():
            raise TraceError(f"{file}: step file listed in {listing} (step {ms.step}) is missing")
        record = StepRecord(ms.step, ms.loss(), ms.lr(), update=ms.update(), skipped=ms.skipped())
        header = read_header(file, folder)
        record.entries = ms.entries(file)
        _check_header(file, header, record.entries)
        _check_step_metadata(file, header.metadata, record)
        records.append(record)
        sources[file] = SafetensorsSource(header)
    _warn_orphans(folder, {p.name for p in sources})
    return Trace(folder, manifest.get("metadata", {}), records, sources)


def step_metadata(
    meta: Mapping[str, str], where: str
) -> tuple[int | None, float | None, float | None, int | None, bool]:
    """(step, loss, lr, update, skipped) from a step file's ``__metadata__`` as TraceWriter writes it.

    Absent entries give None (False for ``skipped``).

    Raises:
        TraceError: an entry that is not what the writer writes, prefixed with ``where``.
    """
    step = meta.get("fpsim_trace_step")
    if step is not None:
        if not (step.isascii() and step.isdigit() and len(step) <= 18):
            raise TraceError(f"{where}: 'fpsim_trace_step' must be a non-negative integer, got {step[:40]!r}")
        step = int(step)

    def value(k: str) -> Any:
        return load_json(meta[k].encode("utf-8"), f"{where} {k}", "value") if k in meta else None

    loss = parse_float(value("loss"), f"{where} loss")
    lr = parse_float(value("lr"), f"{where} lr")
    update = parse_update(value("update"), f"{where} update")
    skipped = value("skipped")
    if skipped is None:
        skipped = False
    if not isinstance(skipped, bool):
        raise TraceError(f"{where}: 'skipped' must be true or false, got {skipped!r}")
    return step, loss, lr, update, skipped


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


def _check_step_metadata(file: Path, meta: Mapping[str, str], record: StepRecord) -> None:
    """A step file written by fpsim (its metadata has ``fpsim_trace_step``) agrees with the listing."""
    if "fpsim_trace_step" not in meta:
        return
    got = step_metadata(meta, f"{file}: __metadata__")
    want = (record.step, record.loss, record.lr, record.update, record.skipped)
    for name, g, w in zip(("step", "loss", "lr", "update", "skipped"), got, want, strict=True):
        if not _same(g, w):
            raise TraceError(
                f"{file}: {name} is {g!r} in the file's __metadata__ but {w!r} in the trace listing"
            )


def _check_header(file: Path, header: SafetensorsHeader, wanted: list[TensorEntry]) -> None:
    """The step file's header holds exactly the manifest's keys, shapes and dtypes."""
    for e in wanted:
        slot = header.tensors.get(e.key)
        if slot is None:
            raise TraceError(f"{file}: tensor {e.key!r} listed in the manifest is missing from the file")
        if slot.shape != e.shape or slot.dtype != e.dtype:
            raise TraceError(
                f"{file}: tensor {e.key!r} is {slot.dtype}{list(slot.shape)} in the file but "
                f"{e.dtype}{list(e.shape)} in the manifest"
            )
    extra = set(header.tensors) - {e.key for e in wanted}
    if extra:
        raise TraceError(f"{file}: tensors not listed in the manifest: {sorted(extra)}")


def _warn_orphans(folder: Path, listed: set[str]) -> None:
    orphans = sorted(p.name for p in folder.iterdir() if STEP_FILE_RE.match(p.name) and p.name not in listed)
    if orphans:
        warnings.warn(
            f"{folder}: step files not listed in the trace are ignored (left by an interrupted write?): "
            f"{', '.join(orphans)}",
            RuntimeWarning,
            stacklevel=4,
        )


def manifest_entries(tensors: Any, where: str, step: int, file: Path) -> list[TensorEntry]:
    """The ``"tensors"`` list of one manifest step, checked, as entries held by ``file``.

    Args:
        tensors: the list as parsed.
        where: the step's ``"<manifest>: steps[i]"``, for messages.
        step: the step number.
        file: the file the entries say holds them.

    Raises:
        TraceError: not a list of objects with a valid role, name, key, shape and dtype,
            or a key listed twice.
    """
    if not isinstance(tensors, list):
        raise TraceError(f"{where}: 'tensors' must be a list")
    out: list[TensorEntry] = []
    keys: set[str] = set()
    for j, t in enumerate(tensors):
        w = f"{where}.tensors[{j}]"
        if not isinstance(t, dict):
            raise TraceError(f"{w} is not an object")
        role, name, key, shape, dtype = (t.get(k) for k in ("role", "name", "key", "shape", "dtype"))
        try:
            check_role(role)
        except ValueError as e:
            raise TraceError(f"{w}: {e}") from None
        if not isinstance(name, str) or not name:
            raise TraceError(f"{w}: 'name' must be a non-empty string, got {name!r}")
        if key != f"{role}:{name}":
            raise TraceError(f"{w}: 'key' must be {role}:{name!s}, got {key!r}")
        if key in keys:
            raise TraceError(f"{w}: key {key!r} is listed twice")
        keys.add(key)
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise TraceError(f"{w}: 'shape' must be a list of non-negative integers, got {shape!r}")
        check_shape(shape, w)
        if not isinstance(dtype, str) or dtype not in _KNOWN_DTYPES:
            raise TraceError(f"{w}: unknown dtype {dtype!r}")
        out.append(TensorEntry(step, role, name, key, tuple(shape), dtype, file))
    return out
