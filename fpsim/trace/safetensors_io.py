"""A small, dependency-free reader and writer for the safetensors file format.

Layout of a file (https://github.com/huggingface/safetensors, "Format"):

* 8 bytes: ``N``, the length of the header, unsigned little-endian 64-bit;
* ``N`` bytes: a UTF-8 JSON object ``{key: {"dtype": "F32", "shape": [2, 3],
  "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}`` (padded with spaces);
* the data buffer: each tensor's raw little-endian, C-order bytes at
  ``8 + N + begin .. 8 + N + end``. The regions tile the buffer without holes or overlap.

Reading is lazy: :func:`read_header` parses and validates only the header (and the file
size); :func:`map_file` maps the file read-only (no bytes are read yet) and
:func:`tensor_view` views one tensor's byte range of that map, so only the pages of the
tensors actually used are ever read. One map serves every tensor of a file, so holding many
arrays costs one file descriptor per file, not one per array. bfloat16 and float8 tensors
are viewed with the ml_dtypes types.
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

import ml_dtypes
import numpy as np

from .errors import TraceError

__all__ = [
    "DTYPE_CODES",
    "FLOAT_DTYPES",
    "SafetensorsHeader",
    "TensorSlot",
    "dtype_code",
    "map_file",
    "read_header",
    "read_tensor",
    "tensor_view",
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


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a dtype name of :data:`DTYPE_CODES` (ml_dtypes for the small floats)."""
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
    """

    path: Path
    tensors: Mapping[str, TensorSlot]
    metadata: Mapping[str, str]
    size: int


def read_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Read and validate the header of a safetensors file without touching tensor data.

    Checks the header length against the file size, that the header is a JSON object, that
    every entry has a known dtype, a shape of non-negative integers and data offsets whose
    length equals ``prod(shape) * itemsize``, and that the regions tile the data buffer
    exactly (no holes, no overlap, nothing past the end: a truncated file fails here).

    Raises:
        TraceError: naming the file and the problem.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return read_header_from(f, path)
    except OSError as e:
        raise TraceError(f"{path}: cannot read safetensors file: {e}") from e


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
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{name}: corrupt safetensors header (not valid UTF-8 JSON: {e})") from e
    except KeyError as e:
        raise TraceError(f"{name}: corrupt safetensors header (key {e.args[0]!r} appears twice)") from None
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


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise KeyError(k)
        out[k] = v
    return out


def _slot(path: Path, key: str, info: Any, data_start: int) -> tuple[TensorSlot, int, int]:
    where = f"{path}: tensor {key!r}"
    if not isinstance(info, dict):
        raise TraceError(f"{where}: header entry is not an object")
    code = info.get("dtype")
    if code not in DTYPE_CODES:
        raise TraceError(f"{where}: unknown dtype {code!r}; known: {', '.join(DTYPE_CODES)}")
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise TraceError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    offsets = info.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
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


def map_file(header: SafetensorsHeader) -> mmap.mmap:
    """Map a file read-only (nothing is read until a view of it is used).

    Raises:
        TraceError: the file cannot be opened or its size changed since the header was read
            (reading a mapped file that shrank would crash the process).
    """
    try:
        with open(header.path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise TraceError(f"{header.path}: cannot map the file: {e}") from e
    size = len(mm)
    if size != header.size:
        mm.close()
        raise TraceError(
            f"{header.path}: the file changed size since it was opened ({header.size} -> {size})"
        )
    return mm


def tensor_view(header: SafetensorsHeader, key: str, mm: mmap.mmap) -> np.ndarray:
    """One tensor of a mapped file as a read-only array (its ``base`` is the map)."""
    slot = header.tensors[key]
    dt = numpy_dtype(slot.dtype)
    if slot.nbytes == 0:
        out = np.empty(slot.shape, dtype=dt)
        out.flags.writeable = False
        return out
    return np.ndarray(slot.shape, dtype=dt, buffer=mm, offset=slot.offset)


def read_tensor(header: SafetensorsHeader, key: str) -> np.ndarray:
    """One tensor of a file as a read-only array of a fresh memory map (one map per call)."""
    return tensor_view(header, key, map_file(header))


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
    *,
    fsync: bool = False,
) -> None:
    """Write numpy arrays to a safetensors file (keys in the given order).

    The header is padded with spaces to a multiple of 8 bytes, so every tensor starts
    8-byte aligned, as the safetensors library does. Output is deterministic.

    Args:
        path: the file to create or overwrite.
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
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, a in arrays:
            if a.nbytes:
                f.write(a.reshape(-1).view(np.uint8).data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
