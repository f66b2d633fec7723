"""Open a trace: a trace folder, a folder of per-step files, or one file.

Accepted inputs of :func:`open_trace`:

* a trace folder (it has ``manifest.json``; see :mod:`fpsim.trace`), or the manifest itself;
* a folder of per-step files, all of one kind: ``*.safetensors``, ``*.pt`` / ``*.pth``
  (``torch.save`` of a dict) or ``*.npz`` (``numpy.savez``). The step of each file is the
  last integer in its name (``grads_step120.pt`` -> 120); a file without one, two files of
  the same step, other files or sub-folders, and a mix of kinds are errors. Hidden files
  (``.name``) are ignored;
* a single such file: one step, numbered by the last integer in its name, else 0;
* a torch checkpoint file (``{"model": ..., "optimizer": ...}``) or a Hugging Face Trainer
  checkpoint folder (it has ``trainer_state.json``): see :mod:`fpsim.trace.checkpoints`.

Keys: ``"role:name"`` (``role`` one of ``grad``, ``param``, ``state.<name>``) keeps its role;
any other key is a gradient named by the key. In ``.pt`` files nested dicts are flattened:
a top-level ``"grad"``/``"grads"``/``"gradients"`` dict holds gradients,
``"param"``/``"params"``/``"parameters"`` parameters, ``"state.<name>"`` one optimizer state,
and ``"state"`` a dict ``{state_name: {param_name: tensor}}``; any other nested dict joins its
keys with dots (``{"fc": {"weight": g}}`` -> gradient ``fc.weight``). Top-level ``"loss"`` and
``"lr"`` entries holding one number (a Python number or a one-element tensor/array) become
the step's loss and learning rate, and a ``"step"`` integer must agree with the file name
(or numbers the step when the name has no integer). Anything else that is not a tensor is
an error, never skipped. In ``.safetensors`` files, ``__metadata__`` entries ``"loss"``,
``"lr"``, ``"update"`` and ``"skipped"`` (as :class:`~fpsim.trace.TraceWriter` writes them)
are read too.

Every file must be a regular file (a FIFO, device or folder is refused, never opened for
reading), and in a folder it must not be a symlink that leads outside the folder.
``.pt`` files are loaded only with ``torch.load(f, weights_only=True, map_location="cpu")``
(read into memory, never memory-mapped: a mapped file truncated under the reader would
kill the process with ``SIGBUS``), once when the trace is opened to index them
and again when a tensor is read (the last file stays cached); meta and sparse tensors are
refused. ``.npz`` arrays are read with ``pread`` when stored uncompressed (``numpy.savez``)
and decompressed one array at a time otherwise; a member whose declared array size does
not match its stored size is refused when the trace is opened.
The metadata of an imported trace is ``{"source": "<path>"}``.
numpy saves ml_dtypes arrays (bfloat16, float8) as raw bytes without their type, so such
``.npz`` arrays are rejected: store them as ``.safetensors`` or ``.pt``.
"""

from __future__ import annotations

import math
import os
import re
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import checkpoints
from .convert import is_torch_tensor, torch_to_numpy
from .errors import TraceError
from .files import file_identity, open_regular, read_exact
from .reader import (
    MANIFEST,
    STEP_LOG,
    SafetensorsSource,
    Source,
    StepRecord,
    TensorEntry,
    Trace,
    check_role,
    step_metadata,
)
from .reader import load_manifest_trace as _load_manifest_trace
from .safetensors_io import check_shape, fresh_array, read_header

__all__ = ["as_trace", "open_trace", "sample_trace_path", "split_key"]

_KINDS = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch", ".npz": "npz"}
_GROUPS = {
    "grad": "grad",
    "grads": "grad",
    "gradients": "grad",
    "param": "param",
    "params": "param",
    "parameters": "param",
}


def open_trace(path: str | os.PathLike[str]) -> Trace:
    """Open a recorded trace for reading (see the module docstring for what is accepted).

    Args:
        path: a trace folder, its ``manifest.json``, a folder of per-step ``.safetensors`` /
            ``.pt`` / ``.npz`` files, or one such file.

    Returns:
        A :class:`~fpsim.trace.Trace` that reads tensors lazily.

    Raises:
        TraceError: a missing, unknown, corrupt or inconsistent input, naming the file.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"path must be a str or os.PathLike (a trace folder or file), got {type(path).__name__}"
        )
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file or folder")
    if p.name == MANIFEST and not p.is_dir():
        p = p.parent
    if p.is_dir():
        if (p / MANIFEST).exists() or (p / MANIFEST).is_symlink():
            return _load_manifest_trace(p)
        if (p / checkpoints.TRAINER_STATE).exists():
            return checkpoints.open_checkpoint(p)
        return _open_folder(p)
    kind = _KINDS.get(p.suffix.lower())
    if kind is None:
        raise TraceError(f"{p}: unknown trace file type {p.suffix!r}; expected one of {sorted(_KINDS)}")
    if kind == "torch":
        trace = checkpoints.checkpoint_or_none(p)
        if trace is not None:
            return trace
    return _build(p, [(p, kind, _name_step(p))], None)


def sample_trace_path() -> Path:
    """The folder of the bundled sample trace (a small transformer trained on the CPU).

    It is generated by ``python -m fpsim.trace.sample`` (see :mod:`fpsim.trace.sample`).
    """
    return Path(__file__).parent / "data" / "sample_trace"


def as_trace(trace: Trace | str | os.PathLike[str] | None) -> Trace:
    """The trace an entry point was given: this trace, or the bundled sample when None.

    What ``analyze``, ``replay`` and their Dask executors accept as ``trace``.

    Args:
        trace: a :class:`~fpsim.trace.Trace` (returned as it is), None (the bundled sample
            trace, :func:`sample_trace_path`) or anything :func:`open_trace` opens.

    Raises:
        TraceError: as :func:`open_trace`.
    """
    if isinstance(trace, Trace):
        return trace
    return open_trace(sample_trace_path() if trace is None else trace)


def split_key(key: str) -> tuple[str, str]:
    """``"role:name"`` -> ``(role, name)`` for a valid role; any other key -> ``("grad", key)``."""
    role, sep, name = key.partition(":")
    if sep and name:
        try:
            return check_role(role), name
        except ValueError:
            pass
    return "grad", key


def _name_step(path: Path) -> int | None:
    numbers = re.findall(r"\d+", path.name[: -len(path.suffix)] if path.suffix else path.name)
    return int(numbers[-1]) if numbers else None


def _open_folder(folder: Path) -> Trace:
    files: list[tuple[Path, str, int | None]] = []
    unknown: list[str] = []
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or p.name == STEP_LOG:  # (a trace folder's step log, without its manifest)
            continue
        kind = _KINDS.get(p.suffix.lower())
        if kind is None or p.is_dir():
            unknown.append(p.name + ("/" if p.is_dir() else ""))
        else:
            files.append((p, kind, _name_step(p)))  # regular and inside: checked when indexed
    if unknown:
        raise TraceError(
            f"{folder}: not a trace folder (no {MANIFEST}) and it holds entries that are not "
            f".safetensors/.pt/.npz files: {unknown[:5]}"
        )
    if not files:
        raise TraceError(f"{folder}: empty folder: no {MANIFEST} and no .safetensors/.pt/.npz files")
    kinds = sorted({k for _, k, _ in files})
    if len(kinds) > 1:
        raise TraceError(f"{folder}: the folder mixes file kinds {kinds}; keep one kind per trace folder")
    for p, _, step in files:
        if step is None:
            raise TraceError(f"{p}: no step number in the file name (the step is the last integer in it)")
    return _build(folder, files, folder)


@dataclass
class _Indexed:
    tensors: list[tuple[str, str, tuple[int, ...], str]]  # role, name, shape, dtype
    loss: float | None
    lr: float | None
    step: int | None  # from the file's contents
    source: Source
    update: int | None = None
    skipped: bool = False


def _build(path: Path, files: list[tuple[Path, str, int | None]], folder: Path | None) -> Trace:
    records: dict[int, StepRecord] = {}
    owner: dict[int, Path] = {}
    sources: dict[Path, Source] = {}
    for file, kind, name_step in files:
        if kind != "safetensors":  # (read_header checks its file itself)
            os.close(open_regular(file, "trace file", folder))
        try:
            idx = {"safetensors": _index_safetensors, "torch": _index_torch, "npz": _index_npz}[kind](
                file, folder
            )
        except MemoryError:
            raise TraceError(
                f"{file}: not enough memory to index the file (does it declare absurd sizes?)"
            ) from None
        step = name_step
        if idx.step is not None:
            if step is not None and idx.step != step:
                raise TraceError(f"{file}: 'step' entry {idx.step} disagrees with step {step} in the name")
            step = idx.step
        step = 0 if step is None else step
        if step in owner:
            raise TraceError(f"{file}: step {step} is also the step of {owner[step].name}")
        owner[step] = file
        rec = StepRecord(step, idx.loss, idx.lr, update=idx.update, skipped=idx.skipped)
        seen: set[str] = set()
        for role, name, shape, dtype in idx.tensors:
            key = f"{role}:{name}"
            if key in seen:
                raise TraceError(f"{file}: two tensors map to {key!r} (e.g. 'x' and 'grad:x')")
            seen.add(key)
            rec.entries.append(TensorEntry(step, role, name, key, shape, dtype, file))
        records[step] = rec
        sources[file] = idx.source
    return Trace(path, {"source": str(path)}, list(records.values()), sources)


def _number(value: Any) -> float | None:
    """One number from a Python number, a one-element array or tensor; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    a = torch_to_numpy(value) if is_torch_tensor(value) else value if isinstance(value, np.ndarray) else None
    if (
        a is None
        or a.size != 1
        or not (a.dtype.kind in "iuf" or a.dtype.kind == "V" and a.dtype.type is not np.void)
    ):
        return None
    return float(a.reshape(()).astype(np.float64))


def _step_value(file: Path, value: Any) -> int:
    if isinstance(value, np.ndarray) and value.shape in ((), (1,)) and value.dtype.kind in "iu":
        value = int(value.reshape(()))
    elif is_torch_tensor(value) and value.numel() == 1 and not value.dtype.is_floating_point:
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(f"{file}: the 'step' entry must be a non-negative integer, got {value!r}")
    return value


# --- safetensors ----------------------------------------------------------------------------


def _index_safetensors(file: Path, folder: Path | None) -> _Indexed:
    header = read_header(file, folder)
    tensors, keys = [], {}
    for key, slot in header.tensors.items():
        role, name = split_key(key)
        tensors.append((role, name, slot.shape, slot.dtype))
        keys[f"{role}:{name}"] = key
    step, loss, lr, update, skipped = step_metadata(header.metadata, f"{file}: __metadata__")
    return _Indexed(tensors, loss, lr, step, SafetensorsSource(header, keys), update, skipped)


# --- torch .pt ------------------------------------------------------------------------------


def _torch_load(file: Path) -> Any:
    import torch

    try:
        return torch.load(file, weights_only=True, map_location="cpu")
    except Exception as e:  # torch raises many types for corrupt/unsafe files
        msg = f"{type(e).__name__}: {str(e)[:500]}"
        raise TraceError(f"{file}: cannot load with torch.load(weights_only=True): {msg}") from e


def _walk_torch(file: Path, obj: Any) -> tuple[dict[str, tuple[str, str, tuple[str, ...]]], dict[str, Any]]:
    """Flatten a loaded .pt object: key -> (role, name, path in obj), plus loss/lr/step values."""
    if not isinstance(obj, Mapping):
        raise TraceError(f"{file}: expected a dict of name -> tensor, got {type(obj).__name__}")
    found: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    extras: dict[str, Any] = {}

    def add(role: str, name: str, path: tuple[str, ...]) -> None:
        key = f"{role}:{name}"
        if key in found:
            raise TraceError(f"{file}: two tensors map to {key!r}")
        found[key] = (role, name, path)

    def walk(d: Mapping, path: tuple[str, ...], role: str, prefix: tuple[str, ...]) -> None:
        for k, v in d.items():
            here, top = (*path, k), not path
            if not isinstance(k, str):
                raise TraceError(f"{file}: key {k!r} at {'/'.join(path) or 'top level'} is not a string")
            if top and k in ("loss", "lr", "step") and _is_scalar(v):
                extras[k] = v
            elif is_torch_tensor(v):
                add(*(split_key(k) if top else (role, ".".join((*prefix, k)))), here)
            elif not isinstance(v, Mapping):
                raise TraceError(
                    f"{file}: {'/'.join(here)} holds a {type(v).__name__}, not a tensor (a .pt trace "
                    f"file maps names to tensors, plus optional 'loss', 'lr' and 'step' numbers)"
                )
            elif top and k in _GROUPS:
                walk(v, here, _GROUPS[k], ())
            elif top and k.startswith("state.") and _valid_role(k):
                walk(v, here, k, ())
            elif top and k == "state":
                for sk, sv in v.items():
                    if not isinstance(sv, Mapping) or not _valid_role(f"state.{sk}"):
                        raise TraceError(f"{file}: 'state' must map state names to dicts of tensors")
                    walk(sv, (*here, sk), f"state.{sk}", ())
            else:
                walk(v, here, role, (*prefix, k))

    walk(obj, (), "grad", ())
    return found, extras


def _is_scalar(v: Any) -> bool:
    if is_torch_tensor(v):
        return v.numel() == 1
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _valid_role(role: str) -> bool:
    try:
        check_role(role)
    except ValueError:
        return False
    return True


class _TorchSource:
    """Reads tensors of one .pt file, keeping the last loaded file in memory."""

    _cache: tuple[Path, Any] | None = None

    def __init__(self, file: Path, paths: Mapping[str, tuple[str, ...]]):
        self.file, self.paths = file, dict(paths)

    def read(self, entry: TensorEntry) -> np.ndarray:
        cache = _TorchSource._cache
        if cache is None or cache[0] != self.file:
            cache = (self.file, _torch_load(self.file))
            _TorchSource._cache = cache
        obj = cache[1]
        for part in self.paths[entry.key]:
            obj = obj[part]
        try:
            return torch_to_numpy(obj)
        except (RuntimeError, TypeError, ValueError, NotImplementedError, MemoryError) as e:
            raise TraceError(f"{self.file}: cannot read tensor {entry.key!r}: {type(e).__name__}: {e}") from e


def _index_torch(file: Path, folder: Path | None) -> _Indexed:
    obj = _torch_load(file)
    found, extras = _walk_torch(file, obj)
    tensors, paths = [], {}
    for key, (role, name, path) in found.items():
        t = obj
        for part in path:
            t = t[part]
        if t.device.type != "cpu" or t.layout is not _strided():
            raise TraceError(
                f"{file}: tensor {'/'.join(path)} is a {t.device.type} {t.layout} tensor; only dense tensors "
                f"with data (strided, on the CPU) can be read"
            )
        tensors.append((role, name, tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        paths[key] = path
    return _Indexed(tensors, *_extras(file, extras), _TorchSource(file, paths))


def _strided() -> Any:
    import torch

    return torch.strided


def _extras(file: Path, extras: Mapping[str, Any]) -> tuple[float | None, float | None, int | None]:
    out: list[float | None] = []
    for k in ("loss", "lr"):
        v = _number(extras[k]) if k in extras else None
        if k in extras and v is None:
            raise TraceError(f"{file}: '{k}' must hold one number, got {extras[k]!r}")
        out.append(v)
    step = _step_value(file, extras["step"]) if "step" in extras else None
    return out[0], out[1], step


# --- numpy .npz -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _NpyMember:
    member: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    offset: int | None  # absolute data offset for uncompressed members, else None


def _npz_members(file: Path) -> dict[str, _NpyMember]:
    out: dict[str, _NpyMember] = {}
    try:
        with zipfile.ZipFile(file) as zf, open(file, "rb") as raw:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise TraceError(f"{file}: member {info.filename!r} is not a .npy array")
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                    elif version == (2, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                    else:
                        raise TraceError(f"{file}: {info.filename!r} uses unsupported .npy version {version}")
                    data_pos = f.tell()
                check_shape(tuple(shape), f"{file}: {info.filename!r}")
                declared = data_pos + dtype.itemsize * math.prod(shape)
                if not dtype.hasobject and declared != info.file_size:  # (object arrays: refused below)
                    raise TraceError(
                        f"{file}: {info.filename!r} declares {declared} bytes (header and data) but the "
                        f"archive stores {info.file_size}"
                    )
                offset = None
                if info.compress_type == zipfile.ZIP_STORED:
                    raw.seek(info.header_offset + 26)
                    name_len, extra_len = struct.unpack("<HH", raw.read(4))
                    offset = info.header_offset + 30 + name_len + extra_len + data_pos
                key = info.filename[:-4]
                out[key] = _NpyMember(info.filename, tuple(shape), dtype, bool(fortran), offset)
    except TraceError:
        raise
    except (
        OSError,
        ValueError,
        zipfile.BadZipFile,
        struct.error,
        EOFError,
        RecursionError,
        SyntaxError,
    ) as e:
        raise TraceError(f"{file}: corrupt or truncated .npz file: {type(e).__name__}: {str(e)[:300]}") from e
    return out


class _NpzSource:
    """Reads arrays of one .npz file: uncompressed ones with ``pread``, compressed ones with numpy."""

    def __init__(self, file: Path, members: Mapping[str, _NpyMember], keys: Mapping[str, str], identity: Any):
        self.file, self.members, self.keys, self.identity = file, dict(members), dict(keys), identity

    def read(self, entry: TensorEntry) -> np.ndarray:
        key = self.keys[entry.key]
        m = self.members[key]
        if m.offset is not None and m.dtype.itemsize * math.prod(m.shape) > 0:
            # Fortran order: read the C-order array of the reversed shape; its transpose is the array
            out = fresh_array(math.prod(m.shape), m.dtype).reshape(m.shape[::-1] if m.fortran else m.shape)
            fd = open_regular(self.file, ".npz file")
            try:
                if file_identity(fd) != self.identity:
                    raise TraceError(
                        f"{self.file}: the file changed since the trace was opened; open it again"
                    )
                read_exact(fd, out, m.offset, f"{self.file}: array {key!r}")
            finally:
                os.close(fd)
            return out.T if m.fortran else out
        try:
            with np.load(self.file, allow_pickle=False) as z:
                return z[key]
        except (OSError, ValueError, zipfile.BadZipFile, EOFError, MemoryError) as e:
            raise TraceError(f"{self.file}: cannot read array {key!r}: {type(e).__name__}: {e}") from e


def _index_npz(file: Path, folder: Path | None) -> _Indexed:
    fd = open_regular(file, ".npz file", folder)
    identity = file_identity(fd)
    os.close(fd)
    members = _npz_members(file)
    src_keys: dict[str, str] = {}
    tensors = []
    extras: dict[str, Any] = {}
    for key, m in members.items():
        if m.dtype.hasobject:
            raise TraceError(f"{file}: array {key!r} has object dtype (pickles are not loaded)")
        if m.dtype.kind == "V":
            raise TraceError(
                f"{file}: array {key!r} has raw dtype {m.dtype.str} (numpy stores bfloat16/float8 arrays "
                f"this way, losing the type); save it as .safetensors or .pt instead"
            )
        if key in ("loss", "lr", "step") and math.prod(m.shape) == 1:
            extras[key] = _NpzSource(file, members, {key: key}, identity).read(
                TensorEntry(0, "grad", key, key, m.shape, m.dtype.name, file)
            )
            continue
        role, name = split_key(key)
        src_keys[f"{role}:{name}"] = key
        tensors.append((role, name, m.shape, m.dtype.name))
    return _Indexed(tensors, *_extras(file, extras), _NpzSource(file, members, src_keys, identity))
