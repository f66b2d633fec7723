"""Record gradients (and optionally parameters and optimizer state) from a training loop.

PyTorch::

    with TorchCapture(model, "runs/trace", every=10, params=True, optimizer=opt) as cap:
        for step, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            cap.step(step, loss=loss)  # after backward(), before opt.step() and zero_grad()
            opt.step()

JAX::

    grads = jax.grad(loss_fn)(params, batch)
    writer = capture_jax("runs/trace", step, grads, params=params, loss=loss)

torch and jax are imported only inside the functions that use them.
"""

from __future__ import annotations

import os
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
    """

    def __init__(
        self,
        model: Any,
        path: str | os.PathLike[str],
        every: int = 1,
        params: bool = False,
        optimizer: Any = None,
        metadata: Mapping[str, Any] | None = None,
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
        meta.update(metadata or {})
        self.model, self.every, self.params, self.optimizer = model, every, bool(params), optimizer
        self.writer = TraceWriter(path, metadata=meta)

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
        self.writer.write_step(step, tensors, loss=loss, lr=lr)
        return True

    def close(self) -> None:
        """Close the writer (every recorded step is already on disk)."""
        self.writer.close()

    def __enter__(self) -> TorchCapture:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def capture_jax(
    writer_or_path: TraceWriter | str | os.PathLike[str],
    step: int,
    grads_pytree: Any,
    params: Any = None,
    loss: Any = None,
    lr: Any = None,
    states: Mapping[str, Any] | None = None,
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
            ``{"mu": adam_state.mu, "nu": adam_state.nu}`` (roles ``"state.mu"``, ``"state.nu"``).

    Returns:
        The writer used.
    """
    writer = writer_or_path if isinstance(writer_or_path, TraceWriter) else TraceWriter(writer_or_path)
    tensors = {"grad": _flatten_pytree(grads_pytree)}
    if params is not None:
        tensors["param"] = _flatten_pytree(params)
    for key, tree in (states or {}).items():
        tensors[f"state.{key}"] = _flatten_pytree(tree)
    writer.write_step(step, tensors, loss=loss, lr=lr)
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
