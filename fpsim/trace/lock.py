"""The exclusive writer lock of a trace folder: one :class:`~fpsim.trace.TraceWriter` at a time.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on the file ``.fpsim_writer.lock`` in the trace
folder, which holds the pid and host of the writer that took it. The kernel drops the lock
when its holder exits, however it exits (a ``SIGKILL`` included), so a lock file left by a
crashed writer (a stale pid) is simply taken over by the next one; while a writer is alive,
another (in the same process or another) is refused with a :class:`TraceError` naming the
holder's pid. After taking the lock, the writer checks that the lock file it holds is still
the one at the path (a writer that was releasing it may have just unlinked it), and retries
otherwise. The lock file is opened with ``O_NOFOLLOW``, so a symlink planted there is refused.
A child forked while a writer holds the lock (a DataLoader worker, multiprocessing's fork start
method) would inherit the open lock file, and with it the lock (``flock`` belongs to the open
file, not to the process): a writer that crashed would then stay "alive" for as long as its
children live, and its trace could not be taken over. So every child closes its copies of the
lock files right after the fork (an ``os.register_at_fork`` hook, registered with the first
lock): the lock stays the process's that took it, and only that process removes the lock file.
"""

from __future__ import annotations

import os
import socket
import stat
import weakref
from pathlib import Path

from .errors import TraceError

__all__ = ["LOCK_FILE", "WriterLock"]

LOCK_FILE = ".fpsim_writer.lock"

_HELD: weakref.WeakSet[WriterLock] = weakref.WeakSet()
"""The locks this process holds (a forked child closes its copies of them)."""

_HOOKED = False


def _close_in_child() -> None:
    """In a child just forked: close the inherited lock files, which leaves the locks with the
    parent (the child's writers refuse to write anyway, see ``TraceWriter``)."""
    for lock in list(_HELD):
        lock._finalizer.detach()
        _HELD.discard(lock)
        try:
            os.close(lock._fd)
        except OSError:
            pass


def _release(fd: int, path: str, owner: int) -> None:
    """Close ``fd``; in the process ``owner`` that took the lock, first remove the lock file (a
    child forked from it only closes its copy: the lock, and the file, stay the owner's)."""
    try:
        if os.getpid() == owner:
            st, now = os.fstat(fd), os.lstat(path)
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)


class WriterLock:
    """Hold the writer lock of ``folder`` until :meth:`release` (or until garbage collected).

    Raises:
        TraceError: another live writer holds it (naming its pid), or the lock file is not a
            regular file.
    """

    def __init__(self, folder: Path):
        self.path = Path(folder) / LOCK_FILE
        import fcntl

        flags = (
            os.O_RDWR
            | os.O_CREAT
            | os.O_NONBLOCK
            | getattr(os, "O_NOFOLLOW", 0)
            | getattr(os, "O_CLOEXEC", 0)
        )
        for _ in range(100):
            try:
                fd = os.open(self.path, flags, 0o644)
            except OSError as e:
                raise TraceError(f"{self.path}: cannot open the writer lock: {e.strerror or e}") from e
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise TraceError(f"{self.path}: the writer lock is not a regular file; refused")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
                os.close(fd)
                if len(holder) >= 2 and holder[0].isdigit():
                    who = f"pid {holder[0]} on {holder[1][:64]}"
                else:
                    who = "a writer whose pid the lock file does not say yet"
                raise TraceError(
                    f"{folder}: the trace folder is being written by another TraceWriter ({who}; lock file "
                    f"{self.path}); only one writer at a time may append to a trace"
                ) from None
            except OSError as e:  # e.g. a file system without locks
                os.close(fd)
                raise TraceError(f"{self.path}: cannot take the writer lock: {e.strerror or e}") from e
            try:
                now = os.lstat(self.path)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                os.close(fd)  # the previous holder unlinked it while we took it: take the new one
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
            self._fd = fd
            self._finalizer = weakref.finalize(self, _release, fd, str(self.path), os.getpid())
            global _HOOKED
            if not _HOOKED and hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_close_in_child)
                _HOOKED = True
            _HELD.add(self)
            return
        raise TraceError(f"{self.path}: could not take the writer lock (it keeps being replaced)")

    def release(self) -> None:
        """Drop the lock and remove the lock file (idempotent; nothing in a forked child, whose
        copy was closed at the fork)."""
        _HELD.discard(self)
        self._finalizer()
