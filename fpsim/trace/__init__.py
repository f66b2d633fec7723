"""Gradient traces: record, import and lazily read the tensors of training steps.

A trace is the input of every later stage (emulate, metrics, replay, report). It is a
sequence of steps; each step holds named tensors in one of three *roles*: ``"grad"``
(gradients), ``"param"`` (parameter values) and ``"state.<name>"`` (optimizer state, e.g.
``"state.exp_avg"``, ``"state.exp_avg_sq"``, ``"state.momentum_buffer"``), plus an optional
loss and learning rate. GEMM operands have the roles ``"input"`` (a matmul module's input) and
``"grad_output"`` (the gradient of its output), named by module (:mod:`fpsim.trace.operands`),
or ``"stats.input"`` / ``"stats.grad_output"`` for their statistics vectors
(:mod:`fpsim.trace.operand_stats`).

Trace folder format (version 1)
-------------------------------

A folder with ``manifest.json`` and one safetensors file per step, ``step_000012.safetensors``
(the step number zero-padded to six digits). The manifest::

    {
     "fpsim_trace": 1,
     "metadata": {...},                        # free-form JSON: model, data, seed, versions
     "steps": [
      {"step": 12, "file": "step_000012.safetensors",
       "loss": 0.731, "lr": 0.001,             # number, null, or "NaN"/"Infinity"/"-Infinity"
       "update": 12,                           # optional: the optimizer's update count
       "skipped": true,                        # optional, only when true
       "tensors": [{"key": "grad:layer.weight", "name": "layer.weight", "role": "grad",
                    "shape": [64, 32], "dtype": "float32"}, ...]},
      ...]
    }

Steps are listed in increasing order, each once. ``update`` (optional, an integer >= 1) is
the 1-based number of the optimizer update this step's gradients feed (the ``t`` of Adam's
bias correction): the updates done before the step plus one, as :class:`TorchCapture` reads
it from the optimizer; ``skipped`` (optional, true when present) says that the recorded run
did not apply this update (a loss scaler found inf/NaN), so the next step has the same
``update``. A trace without ``update`` counts is replayed with its step numbers as update
counts (:mod:`fpsim.replay`). The step number itself is the training loop's own counter
(0-based ``enumerate`` is fine). A tensor's key in its safetensors file is
``"<role>:<name>"``; dtypes are float32, float16, bfloat16, float64, float8_e4m3fn,
float8_e5m2 (safetensors codes F32, F16, BF16, F64, F8_E4M3, F8_E5M2), also float8_e8m0fnu,
integer and bool tensors, whose :attr:`TensorEntry.dtype` says they are not floats. A step
file's ``__metadata__`` repeats the step (``fpsim_trace_step``) and its loss, lr, update and
skipped flag, so a
folder of step files also opens without its manifest. Byte order is little-endian; data is
C-ordered and 8-byte aligned.

The manifest must agree with the files: opening a trace checks that each listed file
exists and that its header lists exactly the manifest's keys, shapes and dtypes; step
files the manifest does not list (left by an interrupted write) are ignored with a warning.
Any disagreement raises :class:`TraceError` naming the file.

:class:`TraceWriter` writes each step atomically (temporary file, fsync, rename, then the
manifest the same way), so a crash leaves a valid trace of the completed steps.
:func:`open_trace` also imports folders of ``.pt``/``.npz``/``.safetensors`` files and single
files (see :mod:`fpsim.trace.importers`), torch and Hugging Face Trainer checkpoints
(:func:`open_checkpoint`, :mod:`fpsim.trace.checkpoints`). :class:`TorchCapture` (written
in a background thread, :mod:`fpsim.trace.capture_async`, on a schedule,
:mod:`fpsim.trace.schedule`), :class:`TraceCallback` (for the Trainer) and
:func:`capture_jax` record from training loops; importing this package imports neither torch
nor jax.
:func:`as_trace` is what every stage's entry point does with its ``trace`` argument (a
:class:`Trace` as it is, None for the bundled sample, anything else through
:func:`open_trace`). :mod:`fpsim.trace.remote` locates tensors and reads flat ranges of them
from any fsspec file system (the Dask workers' reader); :mod:`fpsim.trace.jsonvalues` holds
how non-finite floats are written to JSON (:func:`json_safe` for result summaries).

Example:
    >>> from fpsim.trace import open_trace, sample_trace_path
    >>> trace = open_trace(sample_trace_path())
    >>> e = trace.entries(step=trace.steps[-1], role="grad")[0]
    >>> trace.read(e).shape == e.shape
    True
"""

from __future__ import annotations

from .capture import TorchCapture, capture_jax, jax_operands
from .checkpoints import open_checkpoint
from .errors import TraceError
from .importers import as_trace, open_trace, sample_trace_path
from .jsonvalues import json_safe
from .operand_stats import OperandStats, decode_stats
from .reader import TensorEntry, Trace
from .trainer import TraceCallback
from .writer import TraceWriter

__all__ = [
    "OperandStats",
    "TensorEntry",
    "TraceCallback",
    "TorchCapture",
    "Trace",
    "TraceError",
    "TraceWriter",
    "as_trace",
    "capture_jax",
    "decode_stats",
    "jax_operands",
    "json_safe",
    "open_checkpoint",
    "open_trace",
    "sample_trace_path",
]
