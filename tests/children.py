"""Children made with ``os.fork()`` for the tests (modules already imported: no interpreter
start-up): :func:`fork` runs a body in a child that leaves by ``os._exit``, never through
pytest, and :func:`wait` waits for it with a deadline, killing a child that hangs."""

from __future__ import annotations

import os
import signal
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path


def fork(body: Callable[[], object], report: Path | None = None) -> int:
    """Run ``body()`` in a child forked now; it exits 0 when ``body`` returns, 1 when it raises
    (the traceback printed, and written to ``report`` where given). Returns the child's pid."""
    with warnings.catch_warnings():  # (JAX, if loaded, warns about fork; the children never use it)
        warnings.simplefilter("ignore", RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            body()
            code = 0
        except BaseException:
            traceback.print_exc()
            if report is not None:
                report.write_text(traceback.format_exc())
        finally:
            os._exit(code)
    return pid


def wait(pid: int, timeout: float = 20.0) -> int:
    """The child's exit code (negative: killed by that signal); a child not done within
    ``timeout`` seconds is killed, and TimeoutError raised."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"child {pid} did not finish within {timeout} s (killed)")
        time.sleep(0.005)
