"""Find the ``torch.optim.Optimizer`` inside the wrappers training frameworks hand out.

A capture needs the optimizer that holds the state and runs the update: its step hooks count
the updates, its ``state`` holds ``exp_avg`` and friends, keyed by the model's parameters.
Frameworks wrap it:

* accelerate's ``AcceleratedOptimizer`` (what a Hugging Face ``Trainer`` gives its callbacks),
  and its ``DeepSpeedOptimizerWrapper``: ``.optimizer``;
* Lightning's ``LightningOptimizer`` (``self.optimizers()`` in a ``LightningModule``):
  ``._optimizer``;
* torch's learning-rate schedulers, ``torch.optim.swa_utils.SWALR`` included: ``.optimizer``;
* ``torch.distributed.optim.ZeroRedundancyOptimizer`` and ``PostLocalSGDOptimizer``:
  ``.optim`` (the optimizer of this rank's parameters); ``_NamedOptimizer``: ``._optimizer``.

:func:`torch_optimizer` follows these attributes (``optimizer``, ``_optimizer``, ``optim``,
``base_optimizer``: any of them holding an object with ``param_groups`` and ``state``) to
the innermost object, which must be an initialized ``torch.optim.Optimizer``. Where that is
not so, or where the optimizer found updates none of the model's parameters (DeepSpeed
ZeRO's optimizer of flattened partitions, an optimizer of another copy of the model), the
error names the chain of wrapper types: the state cannot be named by the model's parameters.
"""

from __future__ import annotations

from typing import Any

__all__ = ["torch_optimizer"]

_INNER = ("optimizer", "_optimizer", "optim", "base_optimizer")
_DEPTH = 8


def torch_optimizer(optimizer: Any, model: Any) -> Any:
    """The ``torch.optim.Optimizer`` that ``optimizer`` is or wraps (see the module docstring).

    Args:
        optimizer: an optimizer, or a wrapper of one (accelerate, Lightning, a scheduler, ...).
        model: the ``torch.nn.Module`` whose parameters the optimizer must update.

    Returns:
        The innermost optimizer (``optimizer`` itself when it wraps none).

    Raises:
        TypeError: no initialized ``torch.optim.Optimizer`` inside, or (through a wrapper) one
            that updates none of the model's parameters; the message names the wrapper types.
    """
    import torch

    chain, current = [], optimizer
    while (inner := _inner(current)) is not None and len(chain) < _DEPTH:
        chain.append(type(current).__name__)
        current = inner
    path = " > ".join([*chain, type(current).__name__])
    if not isinstance(current, torch.optim.Optimizer) or not hasattr(current, "_optimizer_step_post_hooks"):
        raise TypeError(
            f"optimizer= must be a torch.optim.Optimizer or a wrapper exposing one as "
            f"{', '.join('.' + a for a in _INNER)}; got {path}, which is not an initialized "
            "torch.optim.Optimizer"
        )
    if chain:
        own = {id(p) for p in model.parameters()}
        if not any(id(p) in own for g in current.param_groups for p in g["params"]):
            raise TypeError(
                f"the optimizer inside {path} updates none of the model's parameters (flattened or "
                "sharded copies, as DeepSpeed ZeRO keeps, or another model's): its state cannot be "
                "named by the model's parameters"
            )
    return current


def _inner(obj: Any) -> Any:
    """The optimizer ``obj`` wraps, or None."""
    for attr in _INNER:
        inner = getattr(obj, attr, None)
        if (
            inner is not None
            and inner is not obj
            and all(hasattr(inner, a) for a in ("param_groups", "state"))
        ):
            return inner
    return None
