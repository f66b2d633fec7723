"""Snapshots of a training step's tensors, written to a trace by a background thread.

The training thread only copies: :func:`snapshot` copies each tensor it is given (a torch
CPU tensor with ``clone``; a CUDA tensor with a non-blocking copy into a pinned host buffer,
then one CUDA event per device marks when the copies are done; numpy arrays with
``numpy.array(copy=True)``; JAX arrays, immutable, are kept as they are). The copy is the
value at the time of the call, whatever the loop does to the tensors afterwards
(``optimizer.step()`` updates parameters and states in place, ``zero_grad(set_to_none=False)``
zeroes gradients in place).

:class:`AsyncTraceWriter` hands the snapshots to one writer thread through a queue of at
most ``max_pending`` snapshots: :meth:`~AsyncTraceWriter.submit` blocks while the queue is
full, so the memory in flight is bounded. The thread waits for the snapshot's copies, then
calls :meth:`fpsim.trace.TraceWriter.write_step` (atomic per step, fsynced), so a crash or a
``SIGKILL`` leaves a valid trace of the steps written so far; the steps it loses are those
submitted and not yet written: the one the thread is writing and those in the queue, at
most ``max_pending + 1``. :meth:`~AsyncTraceWriter.flush` waits until the queue is written.

When a step fails, the thread closes the trace writer at once (releasing the folder's lock;
the trace keeps the steps written before) and drops the steps submitted after it. The
error is raised once, by the next :meth:`~AsyncTraceWriter.submit`,
:meth:`~AsyncTraceWriter.flush` or :meth:`~AsyncTraceWriter.close`: the thread's own
exception (an :class:`OSError` stays an ``OSError`` with its ``errno``), with a note naming
the lost steps (:func:`fpsim.trace.errors.write_failure_note`); the writer is then closed.
``close`` waits for every step; a second ``close`` does nothing. A writer that is never
closed is drained when the interpreter exits.
The thread exists in the process that made the writer only: in a child forked from it,
every method but :meth:`~AsyncTraceWriter.raise_error` raises RuntimeError
(:meth:`fpsim.trace.TraceWriter.check_process`) instead of waiting forever for it.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .convert import is_torch_tensor
from .errors import add_note, steps_text, write_failure_note
from .writer import TraceWriter

__all__ = ["AsyncTraceWriter", "StepSnapshot", "cuda_events", "snapshot", "snapshot_tensor"]


@dataclass
class StepSnapshot:
    """What one recorded step writes: role -> name -> copied tensor, and the step's numbers.

    ``events`` are CUDA events to wait for before the copies may be read (none on CPU).
    """

    step: int
    tensors: dict[str, dict[str, Any]]
    loss: Any = None
    lr: float | None = None
    update: int | None = None
    skipped: bool = False
    events: list[Any] = field(default_factory=list)

    def wait(self) -> None:
        """Block until every copy of the snapshot has landed in host memory."""
        for event in self.events:
            event.synchronize()

    def nbytes(self) -> int:
        """The bytes the snapshot's tensors hold."""
        total = 0
        for named in self.tensors.values():
            for t in named.values():
                total += t.numel() * t.element_size() if is_torch_tensor(t) else np.asarray(t).nbytes
        return total


def snapshot_tensor(value: Any, devices: set[Any] | None = None) -> Any:
    """A copy of ``value`` that later changes to ``value`` do not reach.

    Args:
        value: a torch tensor (CPU or CUDA; sparse ones are made dense), a numpy array, a JAX
            array or a Python number.
        devices: where a CUDA copy is started, its device is added (the caller records one
            event per device once every copy of the step has been issued).
    """
    if is_torch_tensor(value):
        import torch

        t = value.detach()
        if t.is_sparse:
            t = t.to_dense()
        if t.device.type == "cuda":
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            buf.copy_(t, non_blocking=True)
            if devices is not None:
                devices.add(t.device)
            return buf
        if t.device.type != "cpu":
            return t.to("cpu")
        return t.clone(memory_format=torch.contiguous_format)
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True)
    return value  # JAX arrays are immutable; numbers are values


def snapshot(
    step: int,
    tensors: Mapping[str, Mapping[str, Any]],
    loss: Any = None,
    lr: float | None = None,
    update: int | None = None,
    skipped: bool = False,
    *,
    taken: Mapping[str, Mapping[str, Any]] | None = None,
    devices: set[Any] | None = None,
) -> StepSnapshot:
    """Copy every tensor of a step (see :func:`snapshot_tensor`) into a :class:`StepSnapshot`.

    Args:
        step, loss, lr, update, skipped: as :meth:`fpsim.trace.TraceWriter.write_step` takes them.
        tensors: role -> name -> tensor, copied here.
        taken: role -> name -> copies made earlier with :func:`snapshot_tensor` (operands),
            added as they are.
        devices: the CUDA devices those earlier copies were started on.
    """
    devices = set(devices or ())
    copied = {
        role: {n: snapshot_tensor(v, devices) for n, v in named.items()} for role, named in tensors.items()
    }
    for role, named in (taken or {}).items():
        copied.setdefault(role, {}).update(named)
    loss = snapshot_tensor(loss, devices) if loss is not None else None
    return StepSnapshot(int(step), copied, loss, lr, update, skipped, cuda_events(devices))


def cuda_events(devices: set[Any]) -> list[Any]:
    """One CUDA event per device, recorded on its current stream (none without devices)."""
    if not devices:
        return []
    import torch

    events = []
    for device in devices:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        events.append(event)
    return events


class AsyncTraceWriter:
    """Write :class:`StepSnapshot` objects to a :class:`~fpsim.trace.TraceWriter` in a thread.

    Args:
        writer: the trace writer (used by the thread only, from now on).
        max_pending: how many snapshots may wait in the queue (>= 1); :meth:`submit` blocks
            while it is full.
    """

    def __init__(self, writer: TraceWriter, max_pending: int = 2):
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be a positive int, got {max_pending!r}")
        self.writer = writer
        self._queue: queue.Queue[StepSnapshot | None] = queue.Queue(maxsize=max_pending)
        self._state = _State()
        self._thread = threading.Thread(
            target=_drain, args=(self._queue, writer, self._state), name="fpsim-trace-writer", daemon=True
        )
        self._thread.start()
        self._closed = False
        self._reported = False  # the thread's error was raised (it is raised once)
        self._finalizer = weakref.finalize(self, _stop, self._queue, self._thread)

    @property
    def written(self) -> list[int]:
        """The steps the thread has written so far (on disk, in the trace)."""
        self.writer.check_process()
        with self._state.lock:
            return list(self._state.written)

    @property
    def failure(self) -> tuple[int, BaseException] | None:
        """(step, exception) of the write that failed in the thread, or None."""
        return self._state.error

    def submit(self, snap: StepSnapshot) -> None:
        """Queue one step (blocking while ``max_pending`` are waiting).

        Raises:
            Exception: the writer thread's error on an earlier step, once (see the module
                docstring); the writer is closed then.
            RuntimeError: the writer is closed, or this is a child forked from the
                process that made it.
        """
        if self._closed:
            error = self._state.error
            why = f" (writing step {error[0]} failed: {type(error[1]).__name__}: {error[1]})" if error else ""
            raise RuntimeError(f"the trace writer of {self.writer.path} is closed{why}")
        self.writer.check_process()
        self.raise_error()
        self._queue.put(snap)

    def flush(self) -> None:
        """Wait until every submitted step is written (fsynced); raise the thread's error if any."""
        self.writer.check_process()
        if not self._closed:
            self._queue.join()
        self.raise_error()

    def raise_error(self) -> None:
        """Raise the writer thread's error if it failed and it was not raised yet, closing the writer."""
        error = self._state.error
        if error is None or self._reported:
            return
        self._reported = True
        self.close()  # the thread drops what is queued; the trace writer is closed already
        step, exc = error
        dropped = self._state.dropped
        if self.writer.failure is None:  # failed before writing (e.g. a dtype): no note from the writer
            add_note(exc, write_failure_note(self.writer.path, step, self.writer.steps, dropped))
        elif dropped:
            add_note(
                exc, f"fpsim: steps {steps_text(dropped)}, given after step {step}, were not written either"
            )
        raise exc

    def close(self) -> None:
        """Write every queued step, stop the thread, close the trace writer; raise the thread's
        error if it failed and it was not raised yet (a second ``close`` does nothing)."""
        if not self._closed:
            self.writer.check_process()
            self._closed = True
            self._finalizer()
            self.writer.close()
        self.raise_error()


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.written: list[int] = []
        self.error: tuple[int, BaseException] | None = None
        self.dropped: list[int] = []  # steps submitted after the failed one


def _drain(q: queue.Queue, writer: TraceWriter, state: _State) -> None:
    while True:
        snap = q.get()
        try:
            if snap is None:
                return
            if state.error is not None:
                state.dropped.append(snap.step)
                continue
            try:
                snap.wait()
                writer.write_step(
                    snap.step,
                    snap.tensors,
                    loss=snap.loss,
                    lr=snap.lr,
                    update=snap.update,
                    skipped=snap.skipped,
                )
            except BaseException as e:  # surfaced by the training thread
                state.error = (snap.step, e)
                writer.close()  # release the folder's lock now: a new writer may go on
            else:
                with state.lock:
                    state.written.append(snap.step)
        finally:
            q.task_done()


def _stop(q: queue.Queue, thread: threading.Thread) -> None:
    """Let the thread write what is queued, then end it (close, or interpreter exit)."""
    if thread.is_alive():
        q.put(None)
        thread.join()
