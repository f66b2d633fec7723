"""Ctrl-C at a step boundary: while a replay runs with ``keep_on_interrupt``, SIGINT sets a
flag that the replay reads between steps instead of raising in the middle of one, so the
result holds whole steps only. A SIGINT that is ignored (``nohup``, a background job) stays
ignored, and the handler that was there before is put back, the same object. Tested in
``tests/cli/test_cli_edges.py`` with real signals, from every starting handler.
"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["deferred_sigint"]


@contextlib.contextmanager
def deferred_sigint(stop: list[bool], enabled: bool):
    """While active (``enabled``, in the main thread), Ctrl-C sets ``stop[0]`` instead of
    raising, so that the replay ends at a step boundary with consistent values; the handler
    that was there (Python's, ``SIG_DFL`` or another callable) is put back, the same object,
    on the way out. No handler is installed where SIGINT is ignored (``SIG_IGN``: a job started
    with ``nohup`` or ``&`` asked not to be interrupted, and no Ctrl-C can arrive) or where its
    handler was set outside Python (``getsignal`` gives None: it could not be put back)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    if before is signal.SIG_IGN or before is None:
        yield
        return

    def handler(signum, frame):
        stop[0] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
