"""Gradient traces: record, import and lazily read the tensors of training steps.

A trace is the input of every later stage (emulate, metrics, replay, report). It is a
sequence of steps; each step holds named tensors in one of three *roles*: ``"grad"``
(gradients), ``"param"`` (parameter values) and ``"state.<name>"`` (optimizer state, e.g.
``"state.exp_avg"``, ``"state.exp_avg_sq"``, ``"state.momentum_buffer"``), plus an optional
loss and learning rate. GEMM operands have the roles ``"input"`` (a matmul module's input) and
``"grad_output"`` (the gradient of its output), named by module (:mod:`fpsim.trace.operands`),
or ``"stats.input"`` / ``"stats.grad_output"`` for their statistics vectors
(:mod:`fpsim.trace.operand_stats`).

Trace folder format (version 2)
-------------------------------

A folder with ``manifest.json``, the step log ``steps.jsonl`` and one safetensors file per
step, ``step_000012.safetensors`` (the step number zero-padded to six digits). The manifest
holds the version and the metadata only, and is written once, when a writer opens the folder::

    {"fpsim_trace": 2,
     "metadata": {...}}                        # free-form JSON: model, data, seed, versions

The step log is append-only: one JSON object per line, one line per step, each line ended by
a newline (``\n``)::

    {"step": 12, "file": "step_000012.safetensors",
     "loss": 0.731, "lr": 0.001,               # number, null, or "NaN"/"Infinity"/"-Infinity"
     "update": 12,                             # optional: the optimizer's update count
     "skipped": true,                          # optional, only when true
     "tensors": [{"key": "grad:layer.weight", "name": "layer.weight", "role": "grad",
                  "shape": [64, 32], "dtype": "float32"}, ...]}

(shown on several lines here; one line in the file). A line is valid only with its newline:
bytes after the last newline are a step whose line was being appended when the writer
stopped, reported (:class:`RuntimeWarning`) and ignored as an incomplete step; every complete
line must be valid JSON, else the log is corrupt (:class:`TraceError` naming the line).
Version 1 (``"fpsim_trace": 1``) kept the same step objects in a ``"steps"`` list of the
manifest, rewritten at every step; such traces still read, and a :class:`TraceWriter` opened
on one converts it to version 2.

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
file's ``__metadata__`` repeats the step (``fpsim_trace_step``, a decimal string) and its
loss, lr, update and skipped flag (each as JSON text), so a folder of step files also opens
without its manifest. Byte order is little-endian; data is C-ordered and 8-byte aligned.

The listing must agree with the files: opening a trace checks that each listed file is a
regular file inside the folder, that its header lists exactly the listed keys, shapes and
dtypes, and that its ``__metadata__`` (when it has ``fpsim_trace_step``) agrees with the
listed step, loss, lr, update and skipped flag; step files not listed (left by an
interrupted write) are ignored with a warning. Any disagreement raises :class:`TraceError`
naming the file.

Writing: :class:`TraceWriter` holds the folder's writer lock (``flock`` on
``.fpsim_writer.lock``, which names the holder's pid; :mod:`fpsim.trace.lock`): a second
writer, in the same process or another, is refused naming that pid, and the lock of a
writer that died is taken over (even while children it forked live on: they close their copy).
Each step is written to a fresh temporary file
(``mkstemp``, never following a planted symlink), fsynced and renamed into place, then its
log line is appended in one ``write`` and fsynced. A crash at any point (``SIGKILL``
included) leaves exactly the completed steps readable (those whose ``write_step`` returned,
and at most the one being written); a full disk raises :class:`OSError` naming the file,
leaves the listed steps as they were (a step file whose line could not be appended stays
unlisted, and the next writer deletes it) and closes the writer, releasing the lock.
:class:`TorchCapture` writes in a background thread: a crash can also lose the steps still
queued for it, at most ``max_pending + 1`` whose ``cap.step`` returned, and none recorded
before ``cap.flush()`` returned. A run resumed from a checkpoint at step ``S`` opens the
writer with ``resume_from=S``, which drops the steps ``>= S``: the step log is rewritten
without them (a temporary file, fsynced, renamed over the log), then their files are
deleted, so a crash leaves the old trace or the new one and the log never lists a missing
file; this is the one time the log is not appended to. (A reader that opened the trace
before then may find a dropped step's file gone or replaced: an error naming it, never the
wrong tensor.)

Reading files from strangers (:mod:`fpsim.trace.files`): every file is opened without
blocking and must be a regular file (a FIFO, socket, device or folder is refused, never
waited on); in a trace folder or an imported folder it must not be a symlink leading
outside the folder; JSON (headers, manifest, log, ``__metadata__``) is parsed with bounds on
nesting, integer digits and size; tensors are read with ``pread`` into memory of their own,
never memory-mapped, so a file truncated while in use raises :class:`TraceError` instead of
killing the process with ``SIGBUS``. Every failure of a reader, importer or writer is a
:class:`TraceError` (or an :class:`OSError` carrying the path) naming the file; pickles are
never loaded.

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

from .capture import TorchCapture
from .checkpoints import open_checkpoint
from .errors import TraceError
from .importers import as_trace, open_trace, sample_trace_path
from .jax_capture import capture_jax, jax_operands
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
