"""Opening trace files from strangers: regular files inside the folder, explicit reads, bounded JSON.

A trace folder may come from someone else's run, a shared drive or a half-finished job, so
every reader of the trace layer goes through these helpers:

- :func:`open_regular` opens a file read-only without blocking (``O_NONBLOCK``: a FIFO never
  hangs the reader) and refuses anything that is not a regular file (FIFO, socket, device,
  folder); given the trace folder, it first refuses a path that leaves it (a symlink to a
  file outside the folder). Symlinks that stay inside the folder are followed.
- :func:`read_exact` reads a byte range into a preallocated array with ``pread``: a file
  truncated while it is read gives a short read, reported as :class:`TraceError`, never the
  ``SIGBUS`` a memory map of a shrinking file raises.
- :func:`load_json` parses JSON with bounds: nesting that exhausts the parser
  (``RecursionError``), integers of more than :data:`MAX_INT_DIGITS` digits, the non-standard
  ``NaN``/``Infinity`` literals, numbers that overflow to infinity and keys that appear twice
  are refused with a :class:`TraceError` naming the file.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any

import numpy as np

from .errors import TraceError

__all__ = [
    "MAX_INT_DIGITS",
    "check_inside",
    "file_identity",
    "load_json",
    "open_regular",
    "read_exact",
    "read_small",
]

#: The most digits an integer of a trace's JSON (header, manifest, step log) may have.
MAX_INT_DIGITS = 30

# One read(2) returns at most 0x7ffff000 bytes on Linux; read in pieces of 1 GiB.
_PIECE = 1 << 30

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check_inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> None:
    """Raise :class:`TraceError` if ``path`` (symlinks resolved) is not inside ``folder``."""
    real, base = os.path.realpath(path), os.path.realpath(folder)
    if real != base and os.path.commonpath([real, base]) == base:
        return
    raise TraceError(f"{path}: leads outside the trace folder {folder} (to {real}); refused")


def open_regular(
    path: str | os.PathLike[str], what: str, folder: str | os.PathLike[str] | None = None
) -> int:
    """A read-only descriptor of ``path``, which must be a regular file (inside ``folder`` if given).

    Args:
        path: the file.
        what: what the file is, for messages (``"trace manifest"``, ``"safetensors file"``).
        folder: the trace folder the file must stay in, or None for a file named by the user.

    Raises:
        TraceError: the file leaves ``folder``, cannot be opened, or is not a regular file.
    """
    if folder is not None:
        check_inside(path, folder)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TraceError(f"{path}: cannot open the {what}: {e.strerror or e}") from e
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
        raise TraceError(f"{path}: the {what} is {kind}, not a regular file; refused")
    return fd


def file_identity(fd: int) -> tuple[int, int, int, int]:
    """(device, inode, size, modification time in ns) of an open file: what must not change under a reader."""
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_small(
    path: str | os.PathLike[str], what: str, folder: str | os.PathLike[str] | None, limit: int
) -> bytes:
    """The whole of a small regular file (a manifest, a step log), at most ``limit`` bytes.

    Raises:
        TraceError: as :func:`open_regular`, or the file is larger than ``limit``.
    """
    fd = open_regular(path, what, folder)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise TraceError(f"{path}: the {what} is {size} bytes, more than the {limit} allowed")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(_PIECE, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise TraceError(f"{path}: cannot read the {what}: {e.strerror or e}") from e
    finally:
        os.close(fd)
    if total > limit:
        raise TraceError(f"{path}: the {what} grew past the {limit} bytes allowed while it was read")
    return b"".join(chunks)


def read_exact(fd: int, out: np.ndarray, offset: int, where: str) -> None:
    """Fill the C-contiguous array ``out`` with the file's bytes from ``offset`` (``pread``).

    Raises:
        TraceError: naming ``where``, when the file ends early (truncated while in use) or a
            read fails.
    """
    buf = memoryview(out.reshape(-1).view(np.uint8))
    pos, n = 0, len(buf)
    while pos < n:
        try:
            got = os.preadv(fd, [buf[pos : pos + _PIECE]], offset + pos)
        except OSError as e:
            raise TraceError(
                f"{where}: cannot read bytes {offset + pos}..{offset + n}: {e.strerror or e}"
            ) from e
        if got == 0:
            raise TraceError(
                f"{where}: the file ends at byte {offset + pos}, before the {n} bytes wanted from {offset} "
                f"(truncated while in use?)"
            )
        pos += got


class _Limit(Exception):
    """A JSON bound was exceeded (internal; turned into TraceError with the file name)."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Limit(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS} allowed)")
    return int(text)


def _parse_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _Limit(f"the number {text[:40]!r} overflows to infinity")
    return v


def _parse_constant(text: str) -> Any:
    raise _Limit(f"the non-standard literal {text} (JSON has no NaN or Infinity)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Limit(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def load_json(data: bytes, where: str, what: str) -> Any:
    """Parse UTF-8 JSON bytes with the bounds of the module docstring.

    Args:
        data: the bytes.
        where: the file (or ``"file, line 3"``), for messages.
        what: what is parsed (``"safetensors header"``, ``"trace manifest"``), for messages.

    Raises:
        TraceError: ``"<where>: corrupt <what> (...)"``.
    """
    try:
        return json.loads(
            data.decode("utf-8"),
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
            object_pairs_hook=_no_duplicates,
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{where}: corrupt {what} (not valid UTF-8 JSON: {e})") from None
    except _Limit as e:
        raise TraceError(f"{where}: corrupt {what} ({e})") from None
    except RecursionError:
        raise TraceError(f"{where}: corrupt {what} (JSON nested too deeply)") from None
    except (ValueError, OverflowError) as e:  # e.g. a number float() cannot take
        raise TraceError(f"{where}: corrupt {what} ({e})") from None
