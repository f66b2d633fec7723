"""Write a trace folder step by step, crash-safely, one writer at a time.

A :class:`TraceWriter` first takes the folder's writer lock (:mod:`fpsim.trace.lock`): a
second writer, in this process or another, is refused naming the holder's pid, and the
lock of a writer that died is taken over. Each :meth:`TraceWriter.write_step` writes the
step's safetensors file under a fresh temporary name in the trace folder (``mkstemp``:
``O_CREAT | O_EXCL | O_NOFOLLOW``, so a planted symlink is never followed), fsyncs it,
renames it into place with :func:`os.replace`, then appends the step's line to the step log
``steps.jsonl`` in one ``write`` and fsyncs it (the format is in :mod:`fpsim.trace`). The
manifest is written only when the writer opens the folder (with new metadata, or to
convert a version 1 trace). A crash at any point leaves exactly the completed steps (those
whose :meth:`~TraceWriter.write_step` returned, and at most the one being written)
readable: a step file whose line was not (fully) appended is an unlisted file, and a torn
last line is an incomplete step; readers ignore both with a warning, and the next
:class:`TraceWriter` opened on the folder deletes them. A failed write (a full disk) raises
its :class:`OSError` naming the file, cuts a partial line off the log and closes the writer,
releasing the lock, so that a new writer can append after the completed steps.

A run resumed from a checkpoint at step ``S`` opens the folder with ``resume_from=S``: the
steps ``>= S`` are dropped by rewriting the log without them (a temporary file, fsynced and
renamed over the log) and only then deleting their files, so a crash at any point leaves
the old trace or the new one, and the log never lists a file that is gone. Without
``resume_from``, a step not after every step of the trace is refused naming them.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import warnings
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from .convert import to_numpy
from .errors import TraceError, add_note, steps_text, write_failure_note
from .files import read_small
from .jsonvalues import json_float
from .lock import LOCK_FILE, WriterLock
from .reader import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    STEP_FILE_RE,
    STEP_LOG,
    TRACE_VERSION,
    check_role,
    load_manifest_trace,
    read_manifest,
    step_file_name,
)
from .safetensors_io import dtype_code, write_safetensors

__all__ = ["TraceWriter", "check_next_step", "check_resume_from", "check_update"]

_TMP_SUFFIX = ".tmp"


class TraceWriter:
    """Write (or append to) a trace folder, one atomic step at a time.

    Opening an existing trace folder appends to it: its manifest and step log are
    validated, leftovers of an interrupted write (temporary files, step files the log does
    not list, a torn last log line) are deleted, and ``metadata`` (if given) is merged into
    the recorded metadata (new values win). A version 1 trace is converted to version 2 (its
    steps moved to the step log). A new or empty folder gets a manifest with no steps at
    once. Only one writer may work on a folder at a time: the writer holds the folder's
    lock until :meth:`close` (or the end of a ``with`` block, a failed write, or the process).

    Args:
        path: the trace folder (created if missing).
        metadata: free-form JSON-serializable metadata (model, data, seed, versions, ...).
        resume_from: the step a resumed run records from (the step of the checkpoint it
            restarted from): the trace's steps ``>= resume_from`` are dropped atomically (see
            the module docstring) and later steps must be ``>= resume_from``. None (the
            default) keeps every step, and a step not after them all is refused.

    Raises:
        TraceError: another writer holds the folder (naming its pid), or the folder is not
            a trace and not empty, or the trace in it is corrupt.
        ValueError: ``resume_from`` is not a non-negative int.

    Example:
        >>> with TraceWriter("run1", metadata={"model": "mlp"}) as w:  # doctest: +SKIP
        ...     w.write_step(0, {"grad": {"fc.weight": g}}, loss=2.3, lr=1e-3)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        metadata: Mapping[str, Any] | None = None,
        *,
        resume_from: int | None = None,
    ):
        self.path = Path(path)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping, got {type(metadata).__name__}")
        self.resume_from = check_resume_from(resume_from)
        self._failure: str | None = None
        if self.path.exists() and not self.path.is_dir():
            raise TraceError(f"{self.path}: a trace is a folder, but this is a file")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(e.errno, f"cannot create the trace folder: {e.strerror}", str(self.path)) from e
        self._closed = True
        self._pid = os.getpid()
        self._lock = WriterLock(self.path)
        try:
            self._open(metadata, self.resume_from)
        except BaseException:
            self._lock.release()
            raise
        self._closed = False

    def _open(self, metadata: Mapping[str, Any] | None, resume_from: int | None) -> None:
        if (self.path / MANIFEST).exists() or (self.path / MANIFEST).is_symlink():
            with warnings.catch_warnings():  # leftovers are deleted below, not reported
                warnings.simplefilter("ignore", RuntimeWarning)
                manifest = read_manifest(self.path)
                load_manifest_trace(self.path)  # full cross-check before deleting anything
            self._steps: list[dict[str, Any]] = list(manifest["steps"])
            self._clean({item["file"] for item in self._steps})  # (checked: dicts with a file name)
            version = manifest["fpsim_trace"]
            if version >= 2:
                self._cut_torn_tail()
            old = dict(manifest.get("metadata", {}))
        else:
            # A writer creates the log and manifest before any step file, so anything else
            # in a folder without a manifest is someone else's data: refuse rather than
            # overwrite or delete it.
            others = [p.name for p in self.path.iterdir() if not self._ours(p)]
            if others:
                raise TraceError(
                    f"{self.path}: not a trace folder (no {MANIFEST}) and not empty: {sorted(others)[:5]}"
                )
            self._clean(set())
            version, old, self._steps = 0, {}, []
        self._metadata = {**old, **(metadata or {})}
        try:
            json.dumps(self._metadata, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"metadata must be JSON-serializable (without NaN/Infinity): {e}") from e
        dropped = []
        if resume_from is not None:
            dropped = [item for item in self._steps if item["step"] >= resume_from]
            self._steps = [item for item in self._steps if item["step"] < resume_from]
        if version < 2 or dropped:  # (new, or version 1: the log first, then the manifest pointing at it)
            text = "".join(_log_line(item) for item in self._steps)
            self._atomic(self.path / STEP_LOG, lambda fd: _write_text(fd, text))
        if version < 2 or self._metadata != old:
            self._write_manifest()
        self._remove_files([item["file"] for item in dropped])  # no longer listed: now they may go
        counted = (item for item in reversed(self._steps) if item.get("update") is not None)
        self._last_update = next(((item["step"], item["update"]) for item in counted), None)
        log = self.path / STEP_LOG
        fd = os.open(
            log, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        )
        self._log_fd, self._log_size = fd, os.fstat(fd).st_size
        self._log_closer = weakref.finalize(self, os.close, fd)

    # -- public ----------------------------------------------------------------------------

    @property
    def steps(self) -> list[int]:
        """The steps written so far (including those found when the folder was opened)."""
        return [item["step"] for item in self._steps]

    @property
    def last_update(self) -> tuple[int, int] | None:
        """(step, update count) of the last step that has an update count, or None."""
        return self._last_update

    @property
    def failure(self) -> str | None:
        """Why a failed write closed the writer (``"writing step 4 failed: OSError: ..."``), or None."""
        return self._failure

    @property
    def closed(self) -> bool:
        """Whether the writer is closed (by :meth:`close`, or by a failed write)."""
        return self._closed

    def write_step(
        self,
        step: int,
        tensors: Mapping[str, Mapping[str, Any]],
        loss: float | None = None,
        lr: float | None = None,
        update: int | None = None,
        skipped: bool = False,
    ) -> Path:
        """Record one step atomically and return its file.

        Args:
            step: a non-negative integer greater than every step already in the trace (and
                not below ``resume_from``).
            tensors: role -> name -> array, e.g. ``{"grad": {"fc.weight": g}, "param": {...},
                "state.exp_avg": {...}}``. Roles are ``"grad"``, ``"param"`` and
                ``"state.<name>"``; arrays may be numpy (ml_dtypes included), torch or JAX,
                in float64/32/16, bfloat16, float8_e4m3fn, float8_e5m2 (integer and bool
                arrays are stored too). Bits are stored unchanged.
            loss: the step's loss (a number, a 0-d array/tensor, or None).
            lr: the step's learning rate (or None).
            update: the 1-based number of the optimizer update this step's gradients feed
                (updates done before it plus one), or None when not known.
            skipped: the run did not apply this update (a loss scaler found inf/NaN).

        Raises:
            ValueError: bad step number, role, name, update count or skipped flag (the
                writer stays open: nothing was written).
            TypeError: an array of a dtype safetensors cannot hold (e.g. complex).
            OSError: writing failed (e.g. a full disk), naming the file: the step is not in
                the trace, and the writer is closed (its lock released), as after any error
                raised while the step was being written; a note on the error says so
                (:func:`~fpsim.trace.errors.write_failure_note`).
        """
        if self._closed:
            why = f" ({self._failure})" if self._failure else ""
            raise ValueError(f"TraceWriter for {self.path} is closed{why}")
        self.check_process()
        step = check_next_step(step, self.steps, self.resume_from, self.path)
        update = check_update(update, self.last_update, self.path, step)
        if not isinstance(skipped, bool):
            raise ValueError(f"skipped must be True or False, got {skipped!r}")
        if not isinstance(tensors, Mapping):
            raise TypeError(f"tensors must map role -> name -> array, got {type(tensors).__name__}")
        arrays: dict[str, np.ndarray] = {}
        listing: list[dict[str, Any]] = []
        for role, named in tensors.items():
            check_role(role)
            if not isinstance(named, Mapping):
                raise TypeError(f"tensors[{role!r}] must map name -> array, got {type(named).__name__}")
            for name, value in named.items():
                if not isinstance(name, str) or not name:
                    raise ValueError(f"tensor names must be non-empty strings, got {name!r} in role {role!r}")
                key = f"{role}:{name}"
                try:
                    a = to_numpy(value)
                    dtype_code(a.dtype)
                except TypeError as e:
                    raise TypeError(f"tensor {key!r}: {e}") from None
                arrays[key] = a
                listing.append(
                    {"key": key, "name": name, "role": role, "shape": list(a.shape), "dtype": a.dtype.name}
                )
        loss_v, lr_v = json_float(_scalar(loss, "loss")), json_float(_scalar(lr, "lr"))
        fname = step_file_name(step)
        meta = {"fpsim_trace_step": str(step)}
        counts = (("update", update), ("skipped", skipped or None))
        meta.update({k: json.dumps(v) for k, v in (("loss", loss_v), ("lr", lr_v), *counts) if v is not None})
        final = self.path / fname
        item = {"step": step, "file": fname, "loss": loss_v, "lr": lr_v}
        item.update({k: v for k, v in counts if v is not None})
        item["tensors"] = listing
        try:
            self._atomic(final, lambda fd: write_safetensors(fd, arrays, meta, fsync=True))
            self._append_log(item)
        except BaseException as e:  # the trace keeps its completed steps; a new writer goes on
            self._failure = f"writing step {step} failed: {type(e).__name__}: {e}"
            self.close()
            add_note(e, write_failure_note(self.path, step, self.steps))
            raise
        self._steps.append(item)
        if update is not None:
            self._last_update = (step, update)
        return final

    def close(self) -> None:
        """Close the writer and release the folder's lock (every step is already on disk); idempotent.

        Raises:
            RuntimeError: in a child forked from the process that opened the writer (see
                :meth:`check_process`); the parent closes it.
        """
        if not self._closed:
            self.check_process()
            self._closed = True
            self._log_closer()
            self._lock.release()

    def check_process(self) -> None:
        """Raise RuntimeError where this open writer is used in a child forked from the process
        that opened it (``os.fork``, multiprocessing's fork start method): two processes must
        never write one trace, so the child may neither write nor close it (the lock stays the
        parent's; a new writer on another folder works in the child). Tested in tests/test_fork.py.
        """
        if not self._closed and os.getpid() != self._pid:
            raise RuntimeError(
                f"{self.path}: this trace was opened by process {self._pid} for writing; process "
                f"{os.getpid()}, forked from it, must not write or close it (two processes never write "
                "one trace): write from the parent, or open a TraceWriter or TorchCapture on another "
                "folder in the child"
            )

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TraceWriter({str(self.path)!r}, steps={len(self._steps)})"

    # -- internals -------------------------------------------------------------------------

    def _ours(self, p: Path) -> bool:
        """A leftover of a writer that stopped before its first manifest (safe to reuse)."""
        if p.name.startswith(".") and p.name.endswith(_TMP_SUFFIX) or p.name == LOCK_FILE:
            return True
        st = p.lstat()
        return p.name == STEP_LOG and stat.S_ISREG(st.st_mode) and st.st_size == 0

    def _clean(self, listed: set[Any]) -> None:
        """Delete stray temporaries and unlisted step files (links themselves, never their targets)."""
        for p in self.path.iterdir():
            stray_tmp = p.name.startswith(".") and p.name.endswith(_TMP_SUFFIX)
            orphan = STEP_FILE_RE.match(p.name) and p.name not in listed
            if (stray_tmp or orphan) and not stat.S_ISDIR(p.lstat().st_mode):
                p.unlink()

    def _remove_files(self, names: list[str]) -> None:
        """Delete step files (links themselves, never their targets) and fsync the folder."""
        for name in names:
            (self.path / name).unlink(missing_ok=True)
        if names:
            _fsync_dir(self.path)

    def _cut_torn_tail(self) -> None:
        """Cut an incomplete last line (an interrupted append) off the step log."""
        log = self.path / STEP_LOG
        data = read_small(log, "step log", self.path, MAX_MANIFEST_BYTES)
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            fd = os.open(log, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
            try:
                os.ftruncate(fd, keep)
                os.fsync(fd)
            finally:
                os.close(fd)

    def _append_log(self, item: dict[str, Any]) -> None:
        """Append one step's line to the log in one write, fsync it; on failure cut it off again."""
        line = _log_line(item).encode("utf-8")
        log = self.path / STEP_LOG
        try:
            done = 0
            while done < len(line):
                done += os.write(self._log_fd, line[done:])
            os.fsync(self._log_fd)
        except BaseException as e:  # (an interrupt between two writes too: no torn line stays)
            try:
                os.ftruncate(self._log_fd, self._log_size)
            except OSError:
                pass
            if not isinstance(e, OSError):
                raise
            raise OSError(
                e.errno, f"{e.strerror} (appending step {item['step']} to the step log)", str(log)
            ) from e
        self._log_size += len(line)

    def _write_manifest(self) -> None:
        text = _manifest_text(self._metadata)
        self._atomic(self.path / MANIFEST, lambda fd: _write_text(fd, text))

    def _atomic(self, final: Path, write: Callable[[int], None]) -> None:
        """Write ``final`` through a fresh temporary file (``mkstemp``), fsync, rename, fsync the folder.

        Raises:
            OSError: naming ``final`` (e.g. a full disk); the temporary file is removed.
        """
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=_TMP_SUFFIX, dir=self.path)
        except OSError as e:
            raise OSError(e.errno, f"{e.strerror} (creating a temporary file for it)", str(final)) from e
        try:
            write(fd)
            os.replace(tmp, final)
        except OSError as e:
            Path(tmp).unlink(missing_ok=True)
            raise OSError(e.errno, f"{e.strerror} (writing it)", str(final)) from e
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.path)


def _write_text(fd: int, text: str) -> None:
    with open(fd, "w", encoding="utf-8", closefd=True) as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _log_line(item: Mapping[str, Any]) -> str:
    """One step's line of the step log: its JSON object and a newline."""
    return json.dumps(item, allow_nan=False) + "\n"


def _manifest_text(metadata: Mapping[str, Any]) -> str:
    """The version 2 manifest: the version and the metadata (the steps are in the step log)."""
    meta = json.dumps(metadata, allow_nan=False, indent=1).replace("\n", "\n ")
    return f'{{\n "fpsim_trace": {TRACE_VERSION},\n "metadata": {meta}\n}}\n'


def check_resume_from(resume_from: Any) -> int | None:
    """``resume_from`` as an int (a step, >= 0) or None.

    Raises:
        ValueError: anything else.
    """
    if resume_from is None:
        return None
    if isinstance(resume_from, bool) or not isinstance(resume_from, (int, np.integer)) or resume_from < 0:
        raise ValueError(f"resume_from must be a non-negative int (a step) or None, got {resume_from!r}")
    return int(resume_from)


def check_next_step(step: Any, steps: list[int], resume_from: int | None, path: Path) -> int:
    """``step`` as an int, if it may be recorded next into the trace at ``path`` holding ``steps``.

    Raises:
        ValueError: not a non-negative integer; below ``resume_from``; or not after every
            step of the trace (naming them, and saying how a resumed run goes on).
    """
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    step = int(step)
    if resume_from is not None and step < resume_from:
        raise ValueError(
            f"step {step} comes before resume_from={resume_from}: the trace {path} was opened to record "
            f"from step {resume_from} on"
        )
    if steps and step <= max(steps):
        later = [s for s in steps if s >= step]
        raise ValueError(
            f"step {step}: the trace {path} already holds steps {steps_text(later)}, and steps must "
            f"increase. If the run resumed from a checkpoint at step {step}, open the trace with "
            f"resume_from={step} (TorchCapture, TraceWriter, capture_jax; TraceCallback(resume=True)) to "
            f"drop its steps from {step} on and record from there; else record into a new trace folder"
        )
    return step


def check_update(update: Any, last: tuple[int, int] | None, path: Path, step: int) -> int | None:
    """``update``, step ``step``'s count, as an int >= 1 (or None), not below ``last``, the
    (step, count) recorded last.

    Raises:
        ValueError: not an integer >= 1, or a count below the last recorded one (saying what
            a restarted run does about it).
    """
    if update is None:
        return None
    if isinstance(update, bool) or not isinstance(update, (int, np.integer)) or update < 1:
        raise ValueError(f"update must be an integer >= 1 (an update count) or None, got {update!r}")
    if last is not None and update < last[1]:
        raise ValueError(
            f"step {step}: update counts must not decrease: the trace {path} recorded update {last[1]} at "
            f"step {last[0]}, got {update}. A run restarted with a fresh optimizer counts from 1 again: "
            f"restore the optimizer's state from the checkpoint the run resumed from and open the trace with "
            f"resume_from=<its step>, or record into a new trace folder"
        )
    return int(update)


def _scalar(value: Any, what: str) -> float | None:
    if value is None:
        return None
    try:
        a = to_numpy(value)
        if a.size != 1:
            raise TypeError
        return float(a.reshape(()).astype(np.float64))
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a number, a one-element array or None, got {value!r}") from None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
