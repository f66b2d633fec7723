"""Record gradients, parameters, optimizer state and GEMM operands from a training loop.

PyTorch::

    with TorchCapture(model, "runs/trace", when=10, params=True, optimizer=opt) as cap:
        for step, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            cap.step(step, loss=loss)  # after backward(), before opt.step() and zero_grad()
            opt.step()

``step()`` copies what it records (from CUDA: non-blocking copies into pinned host memory)
and a background thread writes it (:mod:`fpsim.trace.capture_async`), so the loop waits only
for the copies; ``asynchronous=False`` writes in ``step()`` instead. ``cap.flush()`` waits
until every recorded step is on disk (e.g. before saving a checkpoint). A run resumed from a
checkpoint at step ``S`` opens the capture with ``resume_from=S``. What is recorded:
``when=`` (every N steps, a set/range of steps, or a callable), ``last=K`` with
``total_steps=``, ``tensors=`` (name patterns), ``states=`` ("every", "first" or a period)
and ``operands=`` (True or "stats": each ``nn.Linear``/``nn.Conv`` module's input and the
gradient of its output, :mod:`fpsim.trace.operands`); see :class:`TorchCapture`.

With a ``torch.amp.GradScaler``, pass ``scaler=scaler``: the recorded gradients are the
unscaled ones and a step the scaler skips is marked ``skipped``::

    scaler.scale(loss).backward()
    cap.step(step, loss=loss)  # unscales the gradients (scaler.unscale_) unless done already
    scaler.step(opt)
    scaler.update()

JAX loops record with :func:`fpsim.trace.capture_jax` (:mod:`fpsim.trace.jax_capture`).

torch is imported only inside the functions that use it.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from .capture_async import AsyncTraceWriter, StepSnapshot, cuda_events, snapshot
from .convert import is_torch_tensor
from .errors import add_note, write_failure_note
from .schedule import CaptureSchedule
from .wrappers import torch_optimizer
from .writer import TraceWriter, check_next_step, check_resume_from, check_update

__all__ = ["TorchCapture"]


class TorchCapture:
    """Record a PyTorch model's gradients (and more) into a trace folder on a schedule.

    Call :meth:`step` after ``loss.backward()`` and before ``optimizer.zero_grad()`` (the
    gradients must still be there). Where it sits relative to ``optimizer.step()`` decides
    what the other roles hold:

    * **before** ``optimizer.step()`` (recommended): ``"param"`` are the values the gradients
      were computed at, and ``"state.*"`` is the optimizer state before this step's update
      (none yet on the very first step, since PyTorch optimizers create state lazily), so
      the recorded step has exactly the inputs of the optimizer update;
    * **after** ``optimizer.step()``: ``"param"`` are the updated values and ``"state.*"``
      already includes this step's gradient.

    What is recorded at a step:

    * ``"grad"``: ``p.grad`` of every named parameter that has one (parameters whose
      ``.grad`` is None, e.g. frozen ones, are absent); sparse gradients are made dense;
    * ``"param"`` (with ``params=True``): every named parameter;
    * ``"state.<key>"`` (with ``optimizer``, at the steps ``states=`` says): every tensor of
      at least one dimension in ``optimizer.state[p]``, e.g. ``state.exp_avg``,
      ``state.exp_avg_sq`` (Adam) or ``state.momentum_buffer`` (SGD). 0-d scalars (Adam's
      ``step`` count) and non-tensor entries are not recorded. Parameters are named as in
      ``model.named_parameters()`` (an optimizer parameter the model does not have is named
      ``param_groups.<g>.<i>``);
    * ``"input"`` and ``"grad_output"`` (with ``operands=True``): the GEMM operands of the
      step's forward and backward passes, named by module (:mod:`fpsim.trace.operands`), or
      ``"stats.input"`` / ``"stats.grad_output"`` with ``operands="stats"`` (amax, counts and
      a log2 histogram per operand, :mod:`fpsim.trace.operand_stats`). The hooks copy the
      operands during the forward/backward of the step :meth:`step` is called with next, so
      with ``operands`` the loop's step numbers must be consecutive from ``first_step``.

    Each recorded step also gets the optimizer's update count (``update``: the number of the
    update this step's gradients feed, the ``t`` of Adam's bias correction, which the replay
    uses): the ``step`` of the optimizer's state where it keeps one (Adam, AdamW), else the
    updates counted by a step hook since the capture began (on from ``updates_done``), from an
    optimizer without state.
    Called after ``optimizer.step()`` (the gradients it just used still in place, as a step
    hook sees) the update is the one just done; before, the next one. A step skipped by a loss
    scaler does not advance the count, as in torch. No count is recorded without ``optimizer``,
    or for an optimizer that keeps no count but already has state (e.g. SGD with momentum
    resumed from a checkpoint: a warning says so) unless ``updates_done`` says where it
    stands; the replay then takes ``first_update=``.

    Tensors keep their dtype and bits (bfloat16/float8 via ml_dtypes). :meth:`step` copies
    them, so the trace holds their values at the time of the call; with ``asynchronous=True``
    (the default) a background thread writes the copies, at most ``max_pending`` steps
    waiting (then :meth:`step` blocks), and :meth:`close` (or leaving the ``with`` block)
    waits until every step is on disk. Each step is written atomically (fsynced). A crash
    (``SIGKILL`` included) leaves a valid trace of the steps written before it: with
    ``asynchronous=False`` every step whose :meth:`step` returned; with the background writer
    it can lose the last ``max_pending + 1`` steps whose :meth:`step` returned (the one being
    written and those queued), none of those recorded before the last :meth:`flush` returned.

    Errors: a step number that does not increase (or, with ``operands``, is not the next
    one) raises :class:`ValueError` and the capture stays open. A step that cannot be
    written (a full disk, in :meth:`step` or in the background thread) raises its own
    exception, once: an :class:`OSError` keeps its class, ``errno``, ``strerror`` and
    ``filename`` (the step's file), with a note naming the lost steps; the background
    writer's error is raised by the next :meth:`step`, :meth:`flush` or :meth:`close`. The
    capture is then closed, its hooks removed and the folder's writer lock released (at the
    failure): the trace keeps the steps written before, and a new ``TorchCapture`` on the
    folder (a notebook cell run again) appends after them. :meth:`close` after that does
    nothing; :meth:`step` raises :class:`RuntimeError` (closed).

    Resumed runs: :meth:`step` refuses, synchronously, a run the trace cannot take: a step
    the trace holds already (or a later one), a step before ``resume_from``, an update count
    below the last one recorded (a run restarted with a fresh optimizer counts from 1). The
    :class:`ValueError` names the steps or counts and what to do; nothing is written and the
    capture is closed, its lock released, so that a new one can be opened as it says. A run
    restarted from a checkpoint at step ``S`` (after a preemption the trace usually holds
    steps ``>= S`` already) passes ``resume_from=S``: the trace's steps ``>= S`` are dropped
    atomically when the capture opens (:class:`TraceWriter`), and the run records from ``S``.

    Args:
        model: the ``torch.nn.Module``.
        path: the trace folder (appended to if it holds a trace already).
        every: the older spelling of ``when=N`` (give one of them).
        params: also record parameter values.
        optimizer: record its state, and take the learning rate from
            ``optimizer.param_groups[0]["lr"]`` when :meth:`step` gets no ``lr``.
        metadata: extra free-form metadata; ``torch_version``, ``model``, ``optimizer``,
            ``every`` are added automatically, and ``states`` and ``operands`` when not the
            defaults.
        scaler: the loop's ``torch.amp.GradScaler`` (needs ``optimizer``): :meth:`step` calls
            ``scaler.unscale_(optimizer)`` unless the loop already did, records the unscaled
            gradients (torch's own, bit for bit) and marks the step ``skipped`` when the scaler
            found inf/NaN (then ``scaler.step`` will not call ``optimizer.step()``).
        when: which steps to record: an int N (steps divisible by N; default 1), a set or
            range of steps, or a callable ``step -> bool`` (:mod:`fpsim.trace.schedule`).
        last: also record the final ``last`` steps of the run (needs ``total_steps``).
        total_steps: the run length (steps ``0 .. total_steps - 1``).
        tensors: shell-style name patterns (``"layers.*.attn.*"``): only parameters (and
            operand modules) whose names match are recorded; a pattern matching nothing is
            an error.
        states: when recorded steps include the optimizer state: ``"every"`` one (default),
            the ``"first"`` one that has any (all the replay reads), or every k-th one (an int).
        operands: False, True (the operand tensors) or ``"stats"`` (their statistics).
        asynchronous: write in a background thread (default) or in :meth:`step`.
        max_pending: snapshots that may wait for the writer thread (default 2; with the one
            being written, at most ``max_pending + 1`` copies of a step are in memory).
        first_step: the step number of the loop's first :meth:`step` call (with ``operands``;
            default ``resume_from``, else 0).
        resume_from: the step the run resumes from (its checkpoint's): the trace's steps
            ``>= resume_from`` are dropped, and steps before it are refused. None (default):
            the trace keeps every step, and a step not after them is refused, naming them.
        updates_done: for an optimizer that keeps no update count (SGD): the optimizer
            updates done before this capture began, e.g. a resumed run's from its checkpoint
            (the Trainer's ``global_step``); the step hook counts on from it. Refused for an
            optimizer that keeps its own count (Adam's ``step`` state). None: 0 for an
            optimizer without state, else no count.
    """

    def __init__(
        self,
        model: Any,
        path: str | os.PathLike[str],
        every: int | None = None,
        params: bool = False,
        optimizer: Any = None,
        metadata: Mapping[str, Any] | None = None,
        scaler: Any = None,
        *,
        when: int | set[int] | range | Callable[[int], bool] | None = None,
        last: int | None = None,
        total_steps: int | None = None,
        tensors: str | list[str] | tuple[str, ...] | None = None,
        states: str | int = "every",
        operands: bool | str = False,
        asynchronous: bool = True,
        max_pending: int = 2,
        first_step: int | None = None,
        resume_from: int | None = None,
        updates_done: int | None = None,
    ):
        import torch

        if every is not None and when is not None:
            raise ValueError("give every= or when=, not both (every=N is when=N)")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"every must be a positive int, got {every!r}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None:  # accelerate's, Lightning's, a scheduler: the optimizer inside
            optimizer = torch_optimizer(optimizer, model)
        if operands not in (False, True, "stats"):
            raise ValueError(f"operands= must be False, True or 'stats', got {operands!r}")
        resume_from = check_resume_from(resume_from)
        if first_step is None:
            first_step = 0 if resume_from is None else resume_from
        if isinstance(first_step, bool) or not isinstance(first_step, int) or first_step < 0:
            raise ValueError(f"first_step must be a non-negative int, got {first_step!r}")
        self.schedule = CaptureSchedule.resolve(
            every if every is not None else 1 if when is None else when, last, total_steps, tensors, states
        )
        names = [n for n, _ in model.named_parameters()]
        if operands:
            from .operands import matmul_modules

            names += [n for n, _ in matmul_modules(model)]
        self.schedule.check_patterns(names, "model's parameter and module names")
        meta: dict[str, Any] = {
            "capture": "fpsim.trace.TorchCapture",
            "torch_version": torch.__version__,
            "model": type(model).__name__,
            "optimizer": None if optimizer is None else type(optimizer).__name__,
            "every": self.schedule.when if isinstance(self.schedule.when, int) else None,
        }
        meta.update(
            {k: v for k, v in (("states", states), ("operands", operands)) if v not in ("every", False)}
        )
        if scaler is not None and optimizer is None:
            raise ValueError("scaler= needs optimizer= (the scaler unscales that optimizer's gradients)")
        meta.update(metadata or {})
        self.model, self.params, self.optimizer = model, bool(params), optimizer
        self.every = self.schedule.when if isinstance(self.schedule.when, int) else None
        self.scaler = scaler
        self._recorded = 0
        self._with_states = 0  # recorded steps that hold optimizer state
        self._last_step: int | None = None
        self._next = first_step
        self._hooked_updates = _check_updates_done(updates_done, optimizer)
        self._updates_done = updates_done
        self._consumed: tuple[Any, int] | None = None  # the gradient the last update used
        self._countable = optimizer is not None and (
            _state_count(optimizer) > 0 or not optimizer.state or updates_done is not None
        )
        if optimizer is not None and not self._countable:
            warnings.warn(
                f"{type(optimizer).__name__} keeps no update count and already has state: the capture "
                "records no update counts (pass updates_done=, or replay with first_update=)",
                stacklevel=2,
            )
        self.writer = TraceWriter(path, metadata=meta, resume_from=resume_from)
        self._trace_steps = self.writer.steps  # (then only the last recorded one)
        self._last_update = self.writer.last_update  # (step, count) recorded or queued last
        self._closed = False
        self._failure: tuple[int, BaseException] | None = None  # the failed write, once raised
        self._hook = self._async = self._operands = None
        try:  # (a failure from here on leaves no hook behind and releases the folder)
            self._async = AsyncTraceWriter(self.writer, max_pending) if asynchronous else None
            if optimizer is not None:
                self._hook = optimizer.register_step_post_hook(self._count_update)
            if operands:
                from .operands import OperandRecorder

                self._operands = OperandRecorder(model, self.schedule.selects, stats=operands == "stats")
                self._operands.arm(self.schedule.records(first_step))
        except BaseException:
            self.close()
            raise

    def _count_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._hooked_updates += 1
        self._consumed = self._grad_mark()

    def _grad_mark(self) -> tuple[Any, int] | None:
        """The first parameter gradient (a weak reference: a new one may reuse a freed one's
        address) and its version (None: no gradient)."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    return weakref.ref(p.grad), p.grad._version
        return None

    def _consumed_already(self) -> bool:
        """Whether the gradients in place are those the last optimizer update used (unchanged)."""
        now = self._grad_mark()
        if self._consumed is None or now is None:
            return False
        (then_ref, then_version), (now_ref, now_version) = self._consumed, now
        return then_ref() is not None and then_ref() is now_ref() and then_version == now_version

    @property
    def path(self) -> Path:
        """The trace folder."""
        return self.writer.path

    def step(self, step: int, loss: Any = None, lr: float | None = None) -> bool:
        """Record ``step`` if the schedule says so; return whether it was recorded.

        Args:
            step: the training step (increasing from call to call; consecutive from
                ``first_step`` with ``operands``).
            loss: the step's loss (a float or a 0-d tensor), or None.
            lr: the learning rate; defaults to ``optimizer.param_groups[0]["lr"]``.

        Raises:
            ValueError: a step number that does not increase (or, with ``operands``, that is
                not the one the operands were recorded for): the capture stays open. A step
                the trace holds already (without ``resume_from``) or one before
                ``resume_from``; an update count below the trace's last one (a run restarted
                with a fresh optimizer): the capture is closed. Nothing is recorded.
            OSError: writing this step (``asynchronous=False``) or an earlier one (in the
                background) failed; other exceptions of the writer keep their type too. The
                capture is closed (see the class docstring).
            RuntimeError: the capture is closed, or this is a child forked from the process
                that opened it (two processes never write one trace: a new capture on another
                folder records in the child).
        """
        self.writer.check_process()
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ValueError(f"step must be an int, got {step!r}")
        step = int(step)
        self._check_open()
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"steps must increase: the last step given was {self._last_step}, got {step}")
        if self._operands is not None and step != self._next:
            raise ValueError(
                f"with operands=, step numbers must be consecutive (the operand hooks recorded the "
                f"forward/backward of step {self._next}), got step {step}"
            )
        records = self.schedule.records(step)
        update = None if self.optimizer is None or not records else self._update_count()
        try:
            check_next_step(step, self._trace_steps, self.writer.resume_from, self.path)
            self._check_update(step, update)
        except ValueError as refused:  # only a new capture can go on: release the folder
            add_note(refused, f"fpsim: this TorchCapture of {self.path} is closed (its writer lock released)")
            self.close()
            raise
        self._last_step, self._next = step, step + 1
        if not records:
            self._arm_operands()
            return False
        skipped = self._unscale() if self.scaler is not None else False
        named = [(name, p) for name, p in self.model.named_parameters() if self.schedule.selects(name)]
        tensors: dict[str, dict[str, Any]] = {
            "grad": {name: p.grad for name, p in named if p.grad is not None}
        }
        if self.params:
            tensors["param"] = {name: p for name, p in named}
        if self.optimizer is not None:
            if self.schedule.records_states(self._recorded, self._with_states):
                found = self._states()
                tensors.update(found)
                self._with_states += bool(found)
            if lr is None:
                lr = self.optimizer.param_groups[0]["lr"]
        taken, devices = {}, set()
        if self._operands is not None:
            taken, devices = self._operands.collect(), self._operands.devices
        if self._async is not None:
            snap = snapshot(step, tensors, loss, lr, update, skipped, taken=taken, devices=devices)
            self._writer_call(self._async.submit, snap)
        else:
            tensors.update(taken)
            if is_torch_tensor(loss):
                loss = loss.detach().float().cpu().item()
            StepSnapshot(step, tensors, events=cuda_events(devices)).wait()
            try:
                self.writer.write_step(step, tensors, loss=loss, lr=lr, update=update, skipped=skipped)
            except BaseException as e:
                self._failure = (step, e)
                self._shutdown()
                if self.writer.failure is None:  # failed before writing (e.g. a dtype): no note yet
                    self.writer.close()
                    add_note(e, write_failure_note(self.path, step, self.writer.steps))
                raise
        self._recorded += 1
        self._trace_steps = [step]
        if update is not None:
            self._last_update = (step, update)
        self._arm_operands()
        return True

    def _check_open(self) -> None:
        """Raise if the capture is closed, or the background writer's error (once, closing it)."""
        if self._closed:
            why = ""
            if self._failure is not None:
                why = f" (writing step {self._failure[0]} failed: {type(self._failure[1]).__name__}: "
                why += f"{self._failure[1]}; open a new TorchCapture on the folder to record again)"
            raise RuntimeError(f"this TorchCapture of {self.path} is closed{why}")
        if self._async is not None:
            self._writer_call(self._async.raise_error)

    def _writer_call(self, call: Callable[..., None], *args: Any) -> None:
        """``call(*args)``; when it raises the background writer's error, close the capture."""
        try:
            call(*args)
        except BaseException:
            if self._async is not None and self._async.failure is not None:
                self._failure = self._async.failure
                self._shutdown()
            raise

    def _check_update(self, step: int, update: int | None) -> None:
        """Refuse an update count below the last one recorded or queued (a fresh optimizer)."""
        if update is None or self._last_update is None or update >= self._last_update[1]:
            return
        if _state_count(self.optimizer) == 0:  # counted by the step hook, since the capture began
            last_step, last = self._last_update
            raise ValueError(
                f"step {step}: update counts must not decrease: the trace {self.path} recorded update "
                f"{last} at step {last_step}, but {type(self.optimizer).__name__} keeps no update count "
                f"(none yet: a fresh optimizer has no state), so this capture counts the updates it saw: "
                f"{update}. A run restarted with a fresh optimizer: restore the optimizer's state from the "
                f"checkpoint the run resumed from and pass resume_from=<its step>; for an optimizer that "
                f"keeps no count (SGD), also pass updates_done=<the updates done before it> (e.g. the "
                f"checkpoint's global step), or record into a new trace folder"
            )
        check_update(update, self._last_update, self.path, step)

    def _arm_operands(self) -> None:
        if self._operands is not None:
            self._operands.arm(self.schedule.records(self._next))

    def _states(self) -> dict[str, dict[str, Any]]:
        """``state.<key>`` -> parameter name -> tensor, for the selected parameters."""
        names = {id(p): name for name, p in self.model.named_parameters()}
        out: dict[str, dict[str, Any]] = {}
        for g, group in enumerate(self.optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                name = names.get(id(p), f"param_groups.{g}.{i}")
                if not self.schedule.selects(name):
                    continue
                for key, value in self.optimizer.state.get(p, {}).items():
                    if is_torch_tensor(value) and value.dim() > 0:
                        out.setdefault(f"state.{key}", {})[name] = value
        return out

    def flush(self) -> None:
        """Wait until every step whose :meth:`step` returned is written and fsynced.

        After it returns, a crash (``SIGKILL`` included) loses none of those steps; call it
        e.g. before saving a checkpoint. Without the background writer there is nothing to
        wait for; after :meth:`close` it does nothing.

        Raises:
            OSError: the background writer failed (its own exception, once; see the class
                docstring); the capture is closed then.
            RuntimeError: in a forked child, as :meth:`step`.
        """
        self.writer.check_process()
        if self._async is not None and not self._closed:
            self._writer_call(self._async.flush)

    def _update_count(self) -> int | None:
        """The number of the optimizer update this step's gradients feed (1-based), or None."""
        done = self._consumed_already()  # called after optimizer.step()
        counted = _state_count(self.optimizer)
        if counted:  # the optimizer's own count (Adam, AdamW): exact, also mid-run
            if self._updates_done is not None:
                raise _keeps_own_count(self._updates_done, self.optimizer, counted)
            return counted if done else counted + 1
        if not self._countable:
            return None
        return self._hooked_updates + (0 if done else 1)

    def _unscale(self) -> bool:
        """Unscale the gradients as the scaler does (unless the loop did); whether it found inf/NaN."""
        from torch.amp.grad_scaler import OptState

        if not self.scaler.is_enabled():
            return False
        state = self.scaler._per_optimizer_states[id(self.optimizer)]
        if state["stage"] is OptState.READY:
            self.scaler.unscale_(self.optimizer)
        found = state.get("found_inf_per_device", {})
        return bool(sum(float(v.item()) for v in found.values()))

    def close(self) -> None:
        """Write every recorded step, drop the hooks, release the folder's lock.

        Raises the background writer's error if it was not raised yet (once); a second
        ``close``, or one after the error was raised, does nothing. In a forked child,
        RuntimeError as :meth:`step` (the parent closes its capture).
        """
        self.writer.check_process()
        self._shutdown()
        if self._async is not None:
            self._async.close()
        else:
            self.writer.close()

    def _shutdown(self) -> None:
        """Mark the capture closed and remove its hooks (idempotent)."""
        self._closed = True
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._operands is not None:
            self._operands.remove()

    def __enter__(self) -> TorchCapture:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _check_updates_done(updates_done: Any, optimizer: Any) -> int:
    """``updates_done`` as the step hook's starting count (0 for None); refused where it is not an
    int >= 0, without ``optimizer``, or for an optimizer that keeps its own count."""
    if updates_done is None:
        return 0
    if isinstance(updates_done, bool) or not isinstance(updates_done, int) or updates_done < 0:
        raise ValueError(f"updates_done must be an int >= 0 (optimizer updates done), got {updates_done!r}")
    if optimizer is None:
        raise ValueError("updates_done= needs optimizer= (it is where the optimizer's update count stands)")
    if _state_count(optimizer) > 0:
        raise _keeps_own_count(updates_done, optimizer, _state_count(optimizer))
    return updates_done


def _keeps_own_count(updates_done: int, optimizer: Any, counted: int) -> ValueError:
    return ValueError(
        f"updates_done={updates_done}: {type(optimizer).__name__} keeps its own update count ({counted} in "
        "its state), which the capture records; updates_done is for optimizers without one (SGD)"
    )


def _state_count(optimizer: Any) -> int:
    """The largest ``step`` in the optimizer's per-parameter state (0 when none keeps one)."""
    counts = [
        int(state["step"].item() if is_torch_tensor(state["step"]) else state["step"])
        for state in optimizer.state.values()
        if isinstance(state, Mapping) and "step" in state
    ]
    return max(counts, default=0)
