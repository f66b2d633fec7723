"""Capture from a Hugging Face ``Trainer``: a callback with the options of TorchCapture.

::

    from fpsim.trace import TraceCallback
    trainer = Trainer(model, args, ..., callbacks=[TraceCallback("runs/trace", when=50,
                                                                  states="first", operands="stats")])
    trainer.train()

:class:`TraceCallback` follows the ``transformers.TrainerCallback`` protocol without
importing transformers: the Trainer calls ``on_<event>(args, state, control, **kwargs)`` on
every callback, with ``model`` and ``optimizer`` among the keyword arguments (the optimizer
as accelerate's ``AcceleratedOptimizer``, whose inner ``torch.optim.Optimizer`` the capture
takes: :mod:`fpsim.trace.wrappers`). The capture is made at ``on_train_begin``
(``total_steps`` = ``state.max_steps``, ``first_step`` = ``state.global_step``, so a
resumed run appends) and steps at ``on_pre_optimizer_step``
(the Trainer calls it after the backward passes of a step, gradient accumulation and
``max_grad_norm`` clipping, before ``optimizer.step()`` and ``zero_grad()``, so the gradients
are those the optimizer uses; tests/trace/test_hf_trainer.py): the recorded step number is
``state.global_step``, the updates done before this one. ``on_train_end`` closes the capture
(waiting for the writer). A Trainer without ``on_pre_optimizer_step`` (transformers before
4.41) zeroes the gradients before ``on_step_end``: the callback then raises an error instead
of recording steps without gradients.

A run resumed from a checkpoint (``trainer.train(resume_from_checkpoint=...)``) starts at the
checkpoint's step. If the trace holds steps from there on already (the run was preempted
after the checkpoint), the capture refuses them, unless the callback is made with
``resume=True``: then the trace's steps from the Trainer's first step on are dropped
(``TorchCapture(resume_from=...)``) and recorded again.
"""

from __future__ import annotations

import os
from typing import Any

from .capture import TorchCapture

__all__ = ["TraceCallback"]


class TraceCallback:
    """A ``TrainerCallback`` that records a trace with :class:`~fpsim.trace.TorchCapture`.

    Args:
        path: the trace folder.
        resume: drop the trace's steps from the Trainer's first step (``state.global_step`` at
            ``on_train_begin``: a resumed run's checkpoint step) on, and record from there.
        **options: TorchCapture's options (``when``, ``last``, ``tensors``, ``states``,
            ``operands``, ``params``, ``asynchronous``, ``max_pending``, ``metadata``);
            ``optimizer`` is the Trainer's, given to the events.
    """

    def __init__(self, path: str | os.PathLike[str], *, resume: bool = False, **options: Any):
        for key in ("model", "optimizer", "total_steps", "first_step", "every", "resume_from"):
            if key in options:
                hint = " (resume=True resumes from the Trainer's step)" if key == "resume_from" else ""
                raise ValueError(
                    f"TraceCallback sets {key} itself (from the Trainer); do not pass {key}={hint}"
                )
        if not isinstance(resume, bool):
            raise ValueError(f"resume must be True or False, got {resume!r}")
        self.path, self.options, self.resume = path, options, resume
        self.capture: TorchCapture | None = None
        self._pre_optimizer_seen = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Make the capture (the optimizer comes with this event in the Trainer)."""
        optimizer = kwargs.get("optimizer")
        if model is None or optimizer is None:
            raise ValueError("TraceCallback.on_train_begin needs the Trainer's model= and optimizer=")
        meta = {"trainer": "transformers.Trainer", **dict(self.options.pop("metadata", None) or {})}
        self.capture = TorchCapture(
            model,
            self.path,
            optimizer=optimizer,
            total_steps=state.max_steps if self.options.get("last") is not None else None,
            first_step=state.global_step,
            resume_from=state.global_step if self.resume else None,
            metadata=meta,
            **self.options,
        )

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Record the step (gradients in place, before the update)."""
        self._pre_optimizer_seen = True
        self._capture().step(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Check that the step was recorded before the update (see the module docstring)."""
        if not self._pre_optimizer_seen:
            raise RuntimeError(
                "TraceCallback records at on_pre_optimizer_step, which this Trainer did not call "
                "(transformers < 4.41 zeroes the gradients before on_step_end): upgrade transformers"
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the capture: every recorded step is on disk when this returns."""
        if self.capture is not None:
            self.capture.close()
            self.capture = None

    def _capture(self) -> TorchCapture:
        if self.capture is None:
            raise RuntimeError("TraceCallback: on_train_begin was not called")
        return self.capture

    # The other events of the protocol: nothing to do.
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None: ...
