"""A small, dependency-free reader and writer for the safetensors file format.

Layout of a file (https://github.com/huggingface/safetensors, "Format"):

* 8 bytes: ``N``, the length of the header, unsigned little-endian 64-bit;
* ``N`` bytes: a UTF-8 JSON object ``{key: {"dtype": "F32", "shape": [2, 3],
  "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}`` (padded with spaces);
* the data buffer: each tensor's raw little-endian, C-order bytes at
  ``8 + N + begin .. 8 + N + end``. The regions tile the buffer without holes or overlap.

Reading is explicit: :func:`read_header` parses and validates only the header (and the file
size); :func:`read_tensor` reads one tensor (or a flat range of its elements) into a fresh
array with ``pread`` (:func:`fpsim.trace.files.read_exact`), after checking that the file is
still the one whose header was read (same device, inode, size and modification time). No
file is memory-mapped, so a file truncated while in use gives a :class:`TraceError`, never
a ``SIGBUS``; and no descriptor stays open between reads. Large tensors are read into
huge-page-backed anonymous memory (:func:`fresh_array`). Header JSON is parsed with the
bounds of :func:`fpsim.trace.files.load_json`. bfloat16 and float8 tensors are read as the
ml_dtypes types.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import TraceError
from .files import file_identity, load_json, open_regular, read_exact

__all__ = [
    "DTYPE_CODES",
    "FLOAT_DTYPES",
    "SafetensorsHeader",
    "TensorSlot",
    "dtype_code",
    "read_header",
    "read_tensor",
    "write_safetensors",
]

#: safetensors dtype code -> numpy (or ml_dtypes) dtype name.
DTYPE_CODES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}
_CODE_OF_NAME = {name: code for code, name in DTYPE_CODES.items()}

#: The dtype names the trace layer treats as floating point (everything else is reported as is).
FLOAT_DTYPES = frozenset(
    {"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"}
    | {"float8_e4m3fnuz", "float8_e5m2fnuz"}  # these come only from imported .pt files
)

# The safetensors library refuses headers over 100 MB; a longer "length" is corruption.
_MAX_HEADER = 100 * 1024 * 1024


_NUMPY_NAMES = frozenset(DTYPE_CODES.values()) - {
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e8m0fnu",
}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a dtype name of :data:`DTYPE_CODES` (ml_dtypes for the small floats,
    imported only for them: its import costs more than a small trace's analysis)."""
    if name in _NUMPY_NAMES:
        return np.dtype(name)
    import ml_dtypes

    if hasattr(ml_dtypes, name):
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def dtype_code(dtype: np.dtype) -> str:
    """The safetensors code (``"F32"``, ``"BF16"``, ...) of a numpy dtype.

    Raises:
        TypeError: the dtype has no safetensors code (complex, object, float8_e4m3fnuz, ...).
    """
    dt = np.dtype(dtype)
    code = _CODE_OF_NAME.get(dt.name)
    if code is None:
        allowed = ", ".join(_CODE_OF_NAME)
        raise TypeError(f"dtype {dt.name!r} cannot be stored in a safetensors file; allowed: {allowed}")
    return code


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lives in a safetensors file.

    Attributes:
        dtype: the numpy/ml_dtypes dtype name (``"float32"``, ``"bfloat16"``, ``"int8"``, ...).
        shape: the tensor shape.
        offset: absolute byte offset of the first byte in the file.
        nbytes: length of the tensor's bytes.
    """

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """The parsed, validated header of a safetensors file.

    Attributes:
        path: the file.
        tensors: key -> :class:`TensorSlot`, in header order.
        metadata: the ``__metadata__`` mapping (empty when absent).
        size: the file size in bytes when the header was read.
        identity: (device, inode, size, modification time) of a local file when its header
            was read (:func:`fpsim.trace.files.file_identity`), None for remote files.
    """

    path: Path
    tensors: Mapping[str, TensorSlot]
    metadata: Mapping[str, str]
    size: int
    identity: tuple[int, int, int, int] | None = None


def read_header(
    path: str | os.PathLike[str], folder: str | os.PathLike[str] | None = None
) -> SafetensorsHeader:
    """Read and validate the header of a safetensors file without touching tensor data.

    Checks the header length against the file size, that the header is a JSON object, that
    every entry has a known dtype, a shape of non-negative integers and data offsets whose
    length equals ``prod(shape) * itemsize``, and that the regions tile the data buffer
    exactly (no holes, no overlap, nothing past the end: a truncated file fails here).

    Args:
        path: the file (a regular file: FIFOs, devices and folders are refused).
        folder: the trace folder the file must not leave (symlinks resolved), or None.

    Raises:
        TraceError: naming the file and the problem.
    """
    path = Path(path)
    fd = open_regular(path, "safetensors file", folder)
    identity = file_identity(fd)
    try:
        with os.fdopen(fd, "rb") as f:
            header = read_header_from(f, path)
    except OSError as e:
        raise TraceError(f"{path}: cannot read safetensors file: {e}") from e
    return SafetensorsHeader(header.path, header.tensors, header.metadata, header.size, identity)


def read_header_from(f: Any, name: str | os.PathLike[str]) -> SafetensorsHeader:
    """:func:`read_header` for an open, seekable binary file object (local or fsspec).

    ``name`` (a path or URL) is what error messages and ``SafetensorsHeader.path`` show.
    """
    try:
        size = f.seek(0, 2)
        f.seek(0)
        head = f.read(8)
        if len(head) < 8:
            raise TraceError(f"{name}: truncated safetensors file ({size} bytes, no 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or n > size - 8:
            raise TraceError(
                f"{name}: corrupt or truncated safetensors file: header length {n} "
                f"does not fit in the file of {size} bytes"
            )
        raw = f.read(n)
    except OSError as e:
        raise TraceError(f"{name}: cannot read safetensors file: {e}") from e
    header = load_json(raw, str(name), "safetensors header")
    if not isinstance(header, dict):
        raise TraceError(f"{name}: corrupt safetensors header (a JSON object is required)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise TraceError(f"{name}: corrupt safetensors header (__metadata__ must map str to str)")
    data_start = 8 + n
    tensors: dict[str, TensorSlot] = {}
    regions: list[tuple[int, int, str]] = []
    for key, info in header.items():
        slot, begin, end = _slot(name, key, info, data_start)
        tensors[key] = slot
        regions.append((begin, end, key))
    _check_regions(name, regions, size - data_start)
    return SafetensorsHeader(path=name, tensors=tensors, metadata=dict(metadata), size=size)


def _slot(path: Path, key: str, info: Any, data_start: int) -> tuple[TensorSlot, int, int]:
    where = f"{path}: tensor {key!r}"
    if not isinstance(info, dict):
        raise TraceError(f"{where}: header entry is not an object")
    code = info.get("dtype")
    if not isinstance(code, str) or code not in DTYPE_CODES:
        raise TraceError(f"{where}: unknown dtype {code!r}; known: {', '.join(DTYPE_CODES)}")
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise TraceError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    check_shape(shape, where)
    offsets = info.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise TraceError(f"{where}: data_offsets {offsets!r} are not [begin, end] with 0 <= begin <= end")
    name = DTYPE_CODES[code]
    nbytes = math.prod(shape) * numpy_dtype(name).itemsize
    begin, end = offsets
    if end - begin != nbytes:
        raise TraceError(
            f"{where}: data_offsets {offsets} hold {end - begin} bytes but shape {shape} of {name} "
            f"needs {nbytes}"
        )
    return TensorSlot(dtype=name, shape=tuple(shape), offset=data_start + begin, nbytes=nbytes), begin, end


def _check_regions(path: Path, regions: list[tuple[int, int, str]], available: int) -> None:
    pos = 0
    for begin, end, key in sorted(regions):
        if begin != pos:
            kind = "overlaps the previous tensor" if begin < pos else f"leaves a hole at byte {pos}"
            raise TraceError(f"{path}: corrupt safetensors file: tensor {key!r} {kind}")
        pos = end
    if pos > available:
        raise TraceError(
            f"{path}: truncated safetensors file: the header describes {pos} data bytes "
            f"but only {available} follow it"
        )
    if pos < available:
        raise TraceError(f"{path}: corrupt safetensors file: {available - pos} bytes after the last tensor")


def check_shape(shape: list[int] | tuple[int, ...], where: str) -> None:
    """Raise :class:`TraceError` for a shape numpy cannot make (over 64 dims, or too many elements).

    numpy refuses shapes whose product, zero dimensions left out, exceeds ``2**63 - 1``, even
    for zero-size arrays, so a header with absurd dimensions is refused when it is read.
    """
    if len(shape) > 64:
        raise TraceError(f"{where}: shape has {len(shape)} dimensions; numpy allows at most 64")
    if math.prod(d for d in shape if d) >= 2**63:
        raise TraceError(f"{where}: shape {list(shape)} has too many elements for numpy")


_HUGE = 2 << 20  # a transparent huge page


def fresh_array(n: int, dtype: np.dtype) -> np.ndarray:
    """An uninitialized 1-D array of ``n`` elements to read a file's bytes into.

    Arrays of 2 MiB and more live in their own anonymous memory map with ``MADV_HUGEPAGE``
    (where the system has it): filling fresh memory costs a page fault per page, and huge
    pages make reading a large tensor 2-3 times faster than into ``np.empty`` on a VM
    (``benchmarks/bench_trace_read.py``). The map is anonymous (no file behind it), so it
    cannot raise ``SIGBUS``; it is freed with the array.
    """
    nbytes = n * dtype.itemsize
    if nbytes < _HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(n, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # (a kernel without transparent huge pages)
        pass
    return np.frombuffer(buf, dtype=dtype)


def read_tensor(header: SafetensorsHeader, key: str, start: int = 0, stop: int | None = None) -> np.ndarray:
    """One tensor of a file, read into a fresh array (or its flat elements ``start:stop``).

    Args:
        header: the file's header, from :func:`read_header`.
        key: the tensor's key.
        start, stop: a flat (C-order) element range; by default the whole tensor in its shape.

    Raises:
        TraceError: the file was replaced, truncated or changed since its header was read,
            or cannot be read (naming it).
    """
    slot = header.tensors[key]
    dt = numpy_dtype(slot.dtype)
    total = math.prod(slot.shape)
    stop = total if stop is None else stop
    if not 0 <= start <= stop <= total:
        raise ValueError(f"element range {start}:{stop} is outside tensor {key!r} of {total} elements")
    out = fresh_array(stop - start, dt)
    if start == 0 and stop == total:
        out = out.reshape(slot.shape)
    if out.nbytes:
        fd = open_regular(header.path, "safetensors file")
        try:
            now = file_identity(fd)
            if header.identity is not None and now != header.identity:
                raise TraceError(
                    f"{header.path}: the file changed since the trace was opened "
                    f"(size {header.identity[2]} -> {now[2]}, or replaced or rewritten); open the trace again"
                )
            read_exact(fd, out, slot.offset + start * dt.itemsize, str(header.path))
        finally:
            os.close(fd)
    return out


def write_safetensors(
    path: str | os.PathLike[str] | int,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
    *,
    fsync: bool = False,
) -> None:
    """Write numpy arrays to a safetensors file (keys in the given order).

    The header is padded with spaces to a multiple of 8 bytes, so every tensor starts
    8-byte aligned, as the safetensors library does. Output is deterministic.

    Args:
        path: the file to create or overwrite, or a descriptor open for writing (it is
            closed when done).
        tensors: key -> array (numpy or ml_dtypes dtypes of :data:`DTYPE_CODES`).
        metadata: optional ``__metadata__`` (str -> str).
        fsync: flush the file to disk before returning.

    Raises:
        TypeError: an array dtype has no safetensors code, or metadata is not str -> str.
    """
    arrays: list[tuple[str, np.ndarray]] = []
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("safetensors metadata must map str to str")
        header["__metadata__"] = dict(metadata)
    pos = 0
    for key, a in tensors.items():
        if not isinstance(key, str) or key == "__metadata__":
            raise TypeError(f"tensor key {key!r} is not allowed (a str other than '__metadata__')")
        a = np.asarray(a)
        code = dtype_code(a.dtype)
        if not a.flags.c_contiguous:
            a = a.copy(order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        header[key] = {"dtype": code, "shape": list(a.shape), "data_offsets": [pos, pos + a.nbytes]}
        pos += a.nbytes
        arrays.append((key, a))
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb", closefd=True) as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, a in arrays:
            if a.nbytes:
                f.write(a.reshape(-1).view(np.uint8).data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
