"""Write a trace folder step by step, crash-safely.

Each :meth:`TraceWriter.write_step` writes the step's safetensors file under a temporary
name in the trace folder, fsyncs it, renames it into place with :func:`os.replace`, then
rewrites ``manifest.json`` the same way. A reader therefore sees either the trace before the
step or after it: a crash in between leaves the completed steps readable, plus a stray
temporary or unlisted step file that readers ignore (with a warning) and that the next
:class:`TraceWriter` opened on the folder deletes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from .convert import to_numpy
from .errors import TraceError
from .jsonvalues import json_float
from .reader import (
    MANIFEST,
    STEP_FILE_RE,
    TRACE_VERSION,
    check_role,
    load_manifest_trace,
    read_manifest,
    step_file_name,
)
from .safetensors_io import dtype_code, write_safetensors

__all__ = ["TraceWriter"]

_TMP_SUFFIX = ".tmp"


class TraceWriter:
    """Write (or append to) a trace folder, one atomic step at a time.

    Opening an existing trace folder appends to it: its manifest is validated, leftovers of
    an interrupted write (temporary files, step files the manifest does not list) are
    deleted, and ``metadata`` (if given) is merged into the recorded metadata (new values
    win). A new or empty folder gets a manifest with no steps at once. Only one writer
    may work on a folder at a time.

    Args:
        path: the trace folder (created if missing).
        metadata: free-form JSON-serializable metadata (model, data, seed, versions, ...).

    Example:
        >>> with TraceWriter("run1", metadata={"model": "mlp"}) as w:  # doctest: +SKIP
        ...     w.write_step(0, {"grad": {"fc.weight": g}}, loss=2.3, lr=1e-3)
    """

    def __init__(self, path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise TraceError(f"{self.path}: a trace is a folder, but this is a file")
        self.path.mkdir(parents=True, exist_ok=True)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping, got {type(metadata).__name__}")
        if (self.path / MANIFEST).exists():
            manifest = read_manifest(self.path)
            self._clean({item.get("file") for item in manifest["steps"] if isinstance(item, dict)})
            load_manifest_trace(self.path)  # full cross-check with the files
            self._metadata = dict(manifest.get("metadata", {}))
            self._steps: list[dict[str, Any]] = list(manifest["steps"])
        else:
            # A writer creates the manifest before any step file, so step files without a
            # manifest are someone else's data: refuse rather than overwrite or delete them.
            others = [
                p.name
                for p in self.path.iterdir()
                if not (p.name.startswith(".") and p.name.endswith(_TMP_SUFFIX))
            ]
            if others:
                raise TraceError(
                    f"{self.path}: not a trace folder (no {MANIFEST}) and not empty: {sorted(others)[:5]}"
                )
            self._clean(set())
            self._metadata, self._steps = {}, []
        self._metadata.update(metadata or {})
        try:
            json.dumps(self._metadata)
        except (TypeError, ValueError) as e:
            raise TypeError(f"metadata must be JSON-serializable: {e}") from e
        self._closed = False
        self._write_manifest(self._steps)

    # -- public ----------------------------------------------------------------------------

    @property
    def steps(self) -> list[int]:
        """The steps written so far (including those found when the folder was opened)."""
        return [item["step"] for item in self._steps]

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
            step: a non-negative integer greater than every step already in the trace.
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
            ValueError: bad step number, role, name, update count or skipped flag.
            TypeError: an array of a dtype safetensors cannot hold (e.g. complex).
        """
        if self._closed:
            raise ValueError(f"TraceWriter for {self.path} is closed")
        step = _check_step(step, self.steps)
        update = _check_update(update, self._steps)
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
        self._atomic(final, lambda tmp: write_safetensors(tmp, arrays, meta, fsync=True))
        item = {"step": step, "file": fname, "loss": loss_v, "lr": lr_v}
        item.update({k: v for k, v in counts if v is not None})
        item["tensors"] = listing
        self._write_manifest([*self._steps, item])
        self._steps.append(item)
        return final

    def close(self) -> None:
        """Mark the writer closed (every step is already on disk)."""
        self._closed = True

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TraceWriter({str(self.path)!r}, steps={len(self._steps)})"

    # -- internals -------------------------------------------------------------------------

    def _clean(self, listed: set[Any]) -> None:
        for p in self.path.iterdir():
            stray_tmp = p.name.startswith(".") and p.name.endswith(_TMP_SUFFIX)
            orphan = STEP_FILE_RE.match(p.name) and p.name not in listed
            if (stray_tmp or orphan) and p.is_file():
                p.unlink()

    def _write_manifest(self, steps: list[dict[str, Any]]) -> None:
        text = _manifest_text(self._metadata, steps)

        def write(tmp: Path) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())

        self._atomic(self.path / MANIFEST, write)

    def _atomic(self, final: Path, write: Any) -> None:
        tmp = self.path / f".{final.name}.{os.getpid()}{_TMP_SUFFIX}"
        try:
            write(tmp)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.path)


def _manifest_text(metadata: Mapping[str, Any], steps: list[dict[str, Any]]) -> str:
    """The manifest as JSON with one line per tensor (readable, and compact for many steps)."""

    def dumps(obj: Any, **kw: Any) -> str:
        return json.dumps(obj, allow_nan=False, **kw)

    meta = dumps(metadata, indent=1).replace("\n", "\n ")
    items = []
    for item in steps:
        head = dumps({k: v for k, v in item.items() if k != "tensors"})[:-1]
        tensors = ",\n   ".join(dumps(t) for t in item["tensors"])
        items.append(f'  {head}, "tensors": [\n   {tensors}]}}' if tensors else f'  {head}, "tensors": []}}')
    body = ",\n".join(items)
    return f'{{\n "fpsim_trace": {TRACE_VERSION},\n "metadata": {meta},\n "steps": [\n{body}\n ]\n}}\n'


def _check_step(step: Any, existing: list[int]) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    step = int(step)
    if step in existing:
        raise ValueError(f"step {step} is already in the trace")
    if existing and step < max(existing):
        raise ValueError(f"steps must increase: the last step in the trace is {max(existing)}, got {step}")
    return step


def _check_update(update: Any, written: list[dict[str, Any]]) -> int | None:
    """``update`` as an int >= 1 (or None), not below the last recorded step's count."""
    if update is None:
        return None
    if isinstance(update, bool) or not isinstance(update, (int, np.integer)) or update < 1:
        raise ValueError(f"update must be an integer >= 1 (an update count) or None, got {update!r}")
    last = next((item["update"] for item in reversed(written) if item.get("update") is not None), None)
    if last is not None and update < last:
        raise ValueError(f"update counts must not decrease: the last recorded one is {last}, got {update}")
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
