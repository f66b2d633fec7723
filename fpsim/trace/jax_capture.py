"""Record training steps of a JAX loop (pytrees) into a trace.

JAX (optax's Adam state: ``opt_state[0]`` of ``optax.adamw``, a ``ScaleByAdamState``)::

    grads = jax.grad(loss_fn)(params, batch)
    adam = opt_state[0]
    writer = capture_jax("runs/trace", step, grads, params=params, loss=loss,
                         states={"mu": adam.mu, "nu": adam.nu}, update=int(adam.count) + 1)

JAX has no module hooks: :func:`capture_jax` takes the operands as pytrees (``inputs=``,
``grad_outputs=``), which :func:`jax_operands` computes for a loss function written with
output taps (see there). Writing is synchronous (:class:`~fpsim.trace.TraceWriter`): a step
whose :func:`capture_jax` returned is on disk. jax is imported only inside the functions
that use it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .operand_stats import stats_vector
from .writer import TraceWriter

__all__ = ["capture_jax", "jax_operands"]


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
    resume_from: int | None = None,
) -> TraceWriter:
    """Record one step of JAX gradients (a pytree) into a trace.

    Tensor names are the pytree paths joined with ``/``: ``{"dense1": {"kernel": g}}`` gives
    ``"dense1/kernel"``, list/tuple positions give their index, dataclass/namedtuple fields
    their attribute name; a bare array is named ``"value"``. Leaves are converted with
    :func:`numpy.asarray`, so bfloat16 stays bfloat16 (ml_dtypes). Writing is synchronous.

    A step that cannot be written (a full disk) raises its own exception (an :class:`OSError`
    keeps its ``errno`` and names the step's file) with a note naming the lost step; the
    writer is closed then, its lock released (:class:`TraceWriter`): the trace keeps the
    steps written before, and a new ``capture_jax`` on the folder appends after them.

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
        resume_from: when ``writer_or_path`` is a folder: the step the run resumes from (its
            checkpoint's); the trace's steps from there on are dropped (see :class:`TraceWriter`).

    Raises:
        ValueError: a step not after the trace's steps (naming them), an update count below
            the last recorded one, ``resume_from`` with a writer already open.
        OSError: the write failed (the writer is closed).

    Returns:
        The writer used.
    """
    if isinstance(writer_or_path, TraceWriter):
        if resume_from is not None:
            raise ValueError(
                "resume_from= applies when capture_jax opens the trace folder; this TraceWriter is open "
                "already (give resume_from= to TraceWriter, or the folder to capture_jax)"
            )
        writer, opened = writer_or_path, False
    else:
        writer, opened = TraceWriter(writer_or_path, resume_from=resume_from), True
    try:
        tensors = _tensors(grads_pytree, params, states, inputs, grad_outputs, operand_stats)
        writer.write_step(step, tensors, loss=loss, lr=lr, update=update, skipped=skipped)
    except BaseException:
        if opened:
            writer.close()  # nobody else holds it: release the folder's lock
        raise
    return writer


def _tensors(
    grads_pytree: Any,
    params: Any,
    states: Mapping[str, Any] | None,
    inputs: Any,
    grad_outputs: Any,
    operand_stats: bool,
) -> dict[str, dict[str, np.ndarray]]:
    """Role -> name -> array of one step's pytrees (see :func:`capture_jax`)."""
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
    return tensors


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
