"""Record gradients (and optionally parameters and optimizer state) from a training loop.

PyTorch::

    with TorchCapture(model, "runs/trace", every=10, params=True, optimizer=opt) as cap:
        for step, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            cap.step(step, loss=loss)  # after backward(), before opt.step() and zero_grad()
            opt.step()

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

torch and jax are imported only inside the functions that use them.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from .convert import is_torch_tensor
from .writer import TraceWriter

__all__ = ["TorchCapture", "capture_jax"]


class TorchCapture:
    """Record a PyTorch model's gradients into a trace folder every ``every`` steps.

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
    * ``"state.<key>"`` (with ``optimizer``): every tensor of at least one dimension in
      ``optimizer.state[p]``, e.g. ``state.exp_avg``, ``state.exp_avg_sq`` (Adam) or
      ``state.momentum_buffer`` (SGD). 0-d scalars (Adam's ``step`` count) and non-tensor
      entries are not recorded. Parameters are named as in ``model.named_parameters()``
      (an optimizer parameter the model does not have is named ``param_groups.<g>.<i>``).

    Each recorded step also gets the optimizer's update count (``update``: the number of the
    update this step's gradients feed, the ``t`` of Adam's bias correction, which the replay
    uses): the ``step`` of the optimizer's state where it keeps one (Adam, AdamW), else the
    updates counted by a step hook since the capture began, from an optimizer without state.
    Called after ``optimizer.step()`` (the gradients it just used still in place, as a step
    hook sees) the update is the one just done; before, the next one. A step skipped by a loss
    scaler does not advance the count, as in torch. No count is recorded without ``optimizer``,
    or for an optimizer that keeps no count but already has state (e.g. SGD resumed from a
    checkpoint: a warning says so); the replay then takes ``first_update=``.

    Tensors keep their dtype and bits (bfloat16/float8 via ml_dtypes) and are written
    synchronously, so the copy on disk is the value at the time of the call.

    Args:
        model: the ``torch.nn.Module``.
        path: the trace folder (appended to if it holds a trace already).
        every: record when ``step % every == 0``.
        params: also record parameter values.
        optimizer: record its state, and take the learning rate from
            ``optimizer.param_groups[0]["lr"]`` when :meth:`step` gets no ``lr``.
        metadata: extra free-form metadata; ``torch_version``, ``model``, ``optimizer`` and
            ``every`` are added automatically.
        scaler: the loop's ``torch.amp.GradScaler`` (needs ``optimizer``): :meth:`step` calls
            ``scaler.unscale_(optimizer)`` unless the loop already did, records the unscaled
            gradients (torch's own, bit for bit) and marks the step ``skipped`` when the scaler
            found inf/NaN (then ``scaler.step`` will not call ``optimizer.step()``).
    """

    def __init__(
        self,
        model: Any,
        path: str | os.PathLike[str],
        every: int = 1,
        params: bool = False,
        optimizer: Any = None,
        metadata: Mapping[str, Any] | None = None,
        scaler: Any = None,
    ):
        import torch

        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        meta: dict[str, Any] = {
            "capture": "fpsim.trace.TorchCapture",
            "torch_version": torch.__version__,
            "model": type(model).__name__,
            "optimizer": None if optimizer is None else type(optimizer).__name__,
            "every": every,
        }
        if scaler is not None and optimizer is None:
            raise ValueError("scaler= needs optimizer= (the scaler unscales that optimizer's gradients)")
        meta.update(metadata or {})
        self.model, self.every, self.params, self.optimizer = model, every, bool(params), optimizer
        self.scaler = scaler
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
        """Record ``step`` if ``step % every == 0``; return whether it was recorded.

        Args:
            step: the training step (increasing from call to call).
            loss: the step's loss (a float or a 0-d tensor), or None.
            lr: the learning rate; defaults to ``optimizer.param_groups[0]["lr"]``.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ValueError(f"step must be an int, got {step!r}")
        if step % self.every:
            return False
        skipped = self._unscale() if self.scaler is not None else False
        named = list(self.model.named_parameters())
        tensors: dict[str, dict[str, Any]] = {
            "grad": {name: p.grad for name, p in named if p.grad is not None}
        }
        if self.params:
            tensors["param"] = {name: p for name, p in named}
        if self.optimizer is not None:
            names = {id(p): name for name, p in named}
            for g, group in enumerate(self.optimizer.param_groups):
                for i, p in enumerate(group["params"]):
                    for key, value in self.optimizer.state.get(p, {}).items():
                        if is_torch_tensor(value) and value.dim() > 0:
                            name = names.get(id(p), f"param_groups.{g}.{i}")
                            tensors.setdefault(f"state.{key}", {})[name] = value
            if lr is None:
                lr = self.optimizer.param_groups[0]["lr"]
        if is_torch_tensor(loss):
            loss = loss.detach().float().cpu().item()
        update = None if self.optimizer is None else self._update_count()
        self.writer.write_step(step, tensors, loss=loss, lr=lr, update=update, skipped=skipped)
        return True

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
        """Close the writer (every recorded step is already on disk) and drop the step hook."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
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
) -> TraceWriter:
    """Record one step of JAX gradients (a pytree) into a trace.

    Tensor names are the pytree paths joined with ``/``: ``{"dense1": {"kernel": g}}`` gives
    ``"dense1/kernel"``, list/tuple positions give their index, dataclass/namedtuple fields
    their attribute name; a bare array is named ``"value"``. Leaves are converted with
    :func:`numpy.asarray`, so bfloat16 stays bfloat16 (ml_dtypes).

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

    Returns:
        The writer used.
    """
    writer = writer_or_path if isinstance(writer_or_path, TraceWriter) else TraceWriter(writer_or_path)
    tensors = {"grad": _flatten_pytree(grads_pytree)}
    if params is not None:
        tensors["param"] = _flatten_pytree(params)
    for key, tree in (states or {}).items():
        tensors[f"state.{key}"] = _flatten_pytree(tree)
    writer.write_step(step, tensors, loss=loss, lr=lr, update=update, skipped=skipped)
    return writer


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
