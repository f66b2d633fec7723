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
for the copies; ``asynchronous=False`` writes in ``step()`` instead. What is recorded:
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

JAX (optax's Adam state: ``opt_state[0]`` of ``optax.adamw``, a ``ScaleByAdamState``)::

    grads = jax.grad(loss_fn)(params, batch)
    adam = opt_state[0]
    writer = capture_jax("runs/trace", step, grads, params=params, loss=loss,
                         states={"mu": adam.mu, "nu": adam.nu}, update=int(adam.count) + 1)

JAX has no module hooks: :func:`capture_jax` takes the operands as pytrees (``inputs=``,
``grad_outputs=``), which :func:`jax_operands` computes for a loss function written with
output taps (see there).

torch and jax are imported only inside the functions that use them.
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
from .operand_stats import stats_vector
from .schedule import CaptureSchedule
from .wrappers import torch_optimizer
from .writer import TraceWriter, _check_step

__all__ = ["TorchCapture", "capture_jax", "jax_operands"]


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
    updates counted by a step hook since the capture began, from an optimizer without state.
    Called after ``optimizer.step()`` (the gradients it just used still in place, as a step
    hook sees) the update is the one just done; before, the next one. A step skipped by a loss
    scaler does not advance the count, as in torch. No count is recorded without ``optimizer``,
    or for an optimizer that keeps no count but already has state (e.g. SGD resumed from a
    checkpoint: a warning says so); the replay then takes ``first_update=``.

    Tensors keep their dtype and bits (bfloat16/float8 via ml_dtypes). :meth:`step` copies
    them, so the trace holds their values at the time of the call; with ``asynchronous=True``
    (the default) a background thread writes the copies, at most ``max_pending`` steps
    waiting (then :meth:`step` blocks), an error of that thread is raised by the next
    :meth:`step` and by :meth:`close`, and :meth:`close` (or leaving the ``with`` block)
    waits until every step is on disk. Each step is written atomically: a crash leaves a
    valid trace of the steps written before it.

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
        first_step: the step number of the loop's first :meth:`step` call (with ``operands``).
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
        first_step: int = 0,
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
        self._hooked_updates = 0
        self._consumed: tuple[Any, int] | None = None  # the gradient the last update used
        self._hook = None if optimizer is None else optimizer.register_step_post_hook(self._count_update)
        self._countable = optimizer is not None and (_state_count(optimizer) > 0 or not optimizer.state)
        if optimizer is not None and not self._countable:
            warnings.warn(
                f"{type(optimizer).__name__} keeps no update count and already has state: the capture "
                "records no update counts (replay with first_update=)",
                stacklevel=2,
            )
        self.writer = TraceWriter(path, metadata=meta)
        self._trace_steps = self.writer.steps[-1:]
        self._async = AsyncTraceWriter(self.writer, max_pending) if asynchronous else None
        self._operands = None
        if operands:
            from .operands import OperandRecorder

            self._operands = OperandRecorder(model, self.schedule.selects, stats=operands == "stats")
            self._operands.arm(self.schedule.records(first_step))

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
                not the one the operands were recorded for).
            RuntimeError: the background writer failed on an earlier step.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ValueError(f"step must be an int, got {step!r}")
        step = int(step)
        if self._async is not None:
            self._async.raise_error()
        _check_step(step, self._trace_steps)  # against the trace's steps (as the writer will)
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"steps must increase: the last step given was {self._last_step}, got {step}")
        if self._operands is not None and step != self._next:
            raise ValueError(
                f"with operands=, step numbers must be consecutive (the operand hooks recorded the "
                f"forward/backward of step {self._next}), got step {step}"
            )
        self._last_step, self._next = step, step + 1
        if not self.schedule.records(step):
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
        update = None if self.optimizer is None else self._update_count()
        taken, devices = {}, set()
        if self._operands is not None:
            taken, devices = self._operands.collect(), self._operands.devices
        if self._async is not None:
            snap = snapshot(step, tensors, loss, lr, update, skipped, taken=taken, devices=devices)
            self._async.submit(snap)
        else:
            tensors.update(taken)
            if is_torch_tensor(loss):
                loss = loss.detach().float().cpu().item()
            StepSnapshot(step, tensors, events=cuda_events(devices)).wait()
            self.writer.write_step(step, tensors, loss=loss, lr=lr, update=update, skipped=skipped)
        self._recorded += 1
        self._trace_steps = [step]
        self._arm_operands()
        return True

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
        """Wait until every recorded step is on disk (raises the writer's error, if any)."""
        if self._async is not None:
            self._async.flush()

    def _update_count(self) -> int | None:
        """The number of the optimizer update this step's gradients feed (1-based), or None."""
        done = self._consumed_already()  # called after optimizer.step()
        counted = _state_count(self.optimizer)
        if counted:  # the optimizer's own count (Adam, AdamW): exact, also mid-run
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
        """Write every recorded step, drop the hooks; raise the writer's error, if any."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._operands is not None:
            self._operands.remove()
        if self._async is not None:
            self._async.close()
        else:
            self.writer.close()

    def __enter__(self) -> TorchCapture:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _state_count(optimizer: Any) -> int:
    """The largest ``step`` in the optimizer's per-parameter state (0 when none keeps one)."""
    counts = [
        int(state["step"].item() if is_torch_tensor(state["step"]) else state["step"])
        for state in optimizer.state.values()
        if isinstance(state, Mapping) and "step" in state
    ]
    return max(counts, default=0)


def capture_jax(
    writer_or_path: TraceWriter | str | os.PathLike[str],
    step: int,
    grads_pytree: Any,
    params: Any = None,
    loss: Any = None,
    lr: Any = None,
    states: Mapping[str, Any] | None = None,
    update: int | None = None,
    skipped: bool = False,
    *,
    inputs: Any = None,
    grad_outputs: Any = None,
    operand_stats: bool = False,
) -> TraceWriter:
    """Record one step of JAX gradients (a pytree) into a trace.

    Tensor names are the pytree paths joined with ``/``: ``{"dense1": {"kernel": g}}`` gives
    ``"dense1/kernel"``, list/tuple positions give their index, dataclass/namedtuple fields
    their attribute name; a bare array is named ``"value"``. Leaves are converted with
    :func:`numpy.asarray`, so bfloat16 stays bfloat16 (ml_dtypes). Writing is synchronous.

    Args:
        writer_or_path: a :class:`TraceWriter`, or a trace folder to open one on (appending).
            Pass the returned writer back in on later steps to avoid re-opening the folder.
        step: the step number (greater than every step already recorded).
        grads_pytree: the gradients (role ``"grad"``).
        params: optional parameter pytree of the same structure (role ``"param"``).
        loss: the step's loss (a number or 0-d array), or None.
        lr: the learning rate, or None.
        states: optional optimizer state, state name -> pytree, e.g.
            ``{"mu": adam_state.mu, "nu": adam_state.nu}`` (roles ``"state.mu"``, ``"state.nu"``;
            the replay reads optax's ``mu``/``nu`` as Adam's ``exp_avg``/``exp_avg_sq``).
        update: the optimizer update this step feeds, 1-based: ``int(adam_state.count) + 1``
            with optax's state from before the update (None: not recorded).
        skipped: the run did not apply this update (e.g. optax's ``apply_if_finite``).
        inputs: optional pytree of GEMM inputs (role ``"input"``), e.g. from :func:`jax_operands`.
        grad_outputs: optional pytree of the gradients of GEMM outputs (role ``"grad_output"``).
        operand_stats: store ``inputs`` / ``grad_outputs`` as statistics vectors (roles
            ``"stats.input"`` / ``"stats.grad_output"``, :mod:`fpsim.trace.operand_stats`).

    Returns:
        The writer used.
    """
    writer = writer_or_path if isinstance(writer_or_path, TraceWriter) else TraceWriter(writer_or_path)
    tensors = {"grad": _flatten_pytree(grads_pytree)}
    if params is not None:
        tensors["param"] = _flatten_pytree(params)
    for key, tree in (states or {}).items():
        tensors[f"state.{key}"] = _flatten_pytree(tree)
    for role, tree in (("input", inputs), ("grad_output", grad_outputs)):
        if tree is not None:
            named = _flatten_pytree(tree)
            if operand_stats:
                role, named = f"stats.{role}", {n: stats_vector(a) for n, a in named.items()}
            tensors[role] = named
    writer.write_step(step, tensors, loss=loss, lr=lr, update=update, skipped=skipped)
    return writer


def jax_operands(loss_fn: Callable[..., Any], params: Any, taps: Any, *args: Any) -> tuple[Any, ...]:
    """Loss, gradients and GEMM operands of a JAX loss written with output taps.

    JAX has no module hooks, so the model exposes its operands itself: ``loss_fn(params,
    taps, *args)`` adds ``taps[name]`` (zeros shaped like the output) to the output of each
    matmul it wants recorded and returns ``(loss, inputs)`` with ``inputs[name]`` the matmul's
    input. The gradient with respect to a tap is the gradient of that matmul's output, the
    ``grad_output`` of the backward pass::

        def loss_fn(params, taps, x, y):
            h = x @ params["w1"] + taps["fc1"]
            out = jax.nn.relu(h) @ params["w2"] + taps["fc2"]
            return jnp.mean((out - y) ** 2), {"fc1": x, "fc2": jax.nn.relu(h)}

        taps = {"fc1": jnp.zeros((batch, hidden)), "fc2": jnp.zeros((batch, classes))}
        loss, grads, inputs, grad_outputs = jax_operands(loss_fn, params, taps, x, y)
        capture_jax(writer, step, grads, loss=loss, inputs=inputs, grad_outputs=grad_outputs)

    Adding a zero tap changes no value (except that a ``-0.0`` output becomes ``+0.0``).

    Returns:
        ``(loss, grads, inputs, grad_outputs)``: the gradients with respect to ``params`` and
        to ``taps``.
    """
    import jax

    (loss, inputs), (grads, grad_outputs) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
        params, taps, *args
    )
    return loss, grads, inputs, grad_outputs


def _flatten_pytree(tree: Any) -> dict[str, np.ndarray]:
    import jax

    out: dict[str, np.ndarray] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "/".join(_path_part(k) for k in path) or "value"
        if name in out:
            raise ValueError(f"two pytree leaves are both named {name!r}")
        out[name] = np.asarray(leaf)
    return out


def _path_part(key: Any) -> str:
    for attr in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key).strip(".[]'\"")
