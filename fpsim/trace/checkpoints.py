"""Open training checkpoints as one-step traces: parameters and optimizer state, by name.

Two layouts are read (:func:`open_checkpoint`; :func:`fpsim.trace.open_trace` hands them
here too):

* a **torch checkpoint** file (``.pt``/``.pth``/``.bin``) holding
  ``{"model": model.state_dict(), "optimizer": optimizer.state_dict(), ...}``. The model's
  tensors become role ``"param"``; the optimizer's per-parameter state (``state[i]``,
  integer ids) becomes roles ``"state.<key>"`` (tensors of at least one dimension, as
  :class:`~fpsim.trace.TorchCapture` records them). Top-level ``"step"``,
  ``"global_step"`` or ``"iteration"`` integers number the step; other entries (epoch,
  scheduler or scaler state, ...) are not traced and are listed in the metadata
  (``"not_imported"``);
* a **Hugging Face Trainer checkpoint folder** (``checkpoint-500/``): the weights in
  ``model.safetensors`` (memory-mapped) or ``pytorch_model.bin``, the optimizer in
  ``optimizer.pt``, the step (``global_step``) and the last logged learning rate and
  loss in ``trainer_state.json``. ``training_args.bin``, ``scheduler.pt`` and
  ``rng_state.pth`` are not read (``training_args.bin`` is a pickle).

Torch files are read only with ``torch.load(weights_only=True, map_location="cpu")``.

The optimizer numbers parameters 0, 1, ... in the order of its ``param_groups`` (group 0's
parameters first); the model names them. The integer ids are mapped to names:

1. by the ``param_names`` the optimizer stored in its groups (torch >= 2.6 optimizers built
   from ``model.named_parameters()``); else
2. by ``param_names=`` given here: the names in ``param_groups`` order, one list for all
   groups or a list per group (each group's count checked); else
3. in a Trainer checkpoint folder with a ``config.json``, when transformers is installed: by
   the model rebuilt from the config on the meta device (no weights allocated), its
   ``named_parameters()`` order for one group, and for two the Trainer's own grouping below
   (``Trainer.get_decay_parameter_names`` of the installed transformers); else
4. with one parameter group only and a state dict loaded with torch (not safetensors, whose
   header is sorted by name), by the order of the model state dict's float tensors,
   which is ``model.named_parameters()`` order when the optimizer was built from
   ``model.parameters()`` and the model has no float buffers.

A Trainer builds two groups (weight decay, then none); its order is::

    decay = trainer.get_decay_parameter_names(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    param_names = [n for n, _ in named if n in decay] + [n for n, _ in named if n not in decay]

Whatever the way, every state tensor must have the shape of the parameter it is mapped to
and every id must be mapped, or :class:`~fpsim.trace.TraceError` says what is missing (a
model with buffers, or a Trainer's two groups (weight decay / none) without transformers or
a ``config.json``, needs ``param_names``).

The trace's one step gets ``update`` = the optimizer's largest ``step`` count + 1 (the
update the next gradients would feed), its ``lr`` from ``param_groups[0]``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .convert import is_torch_tensor, torch_to_numpy
from .errors import TraceError
from .reader import SafetensorsSource, StepRecord, TensorEntry, Trace
from .safetensors_io import read_header

__all__ = ["TRAINER_STATE", "checkpoint_or_none", "is_torch_checkpoint", "open_checkpoint"]

_STEP_KEYS = ("step", "global_step", "iteration")
TRAINER_STATE = "trainer_state.json"


def open_checkpoint(
    path: str | os.PathLike[str],
    *,
    param_names: Sequence[str] | Sequence[Sequence[str]] | None = None,
    step: int | None = None,
) -> Trace:
    """Open a torch checkpoint file or a Trainer checkpoint folder as a one-step trace.

    Args:
        path: the checkpoint file, or the Trainer's ``checkpoint-N`` folder.
        param_names: the parameter names in the optimizer's ``param_groups`` order (see the
            module docstring for when it is needed).
        step: the step number (default: the one the checkpoint records, else 0).

    Raises:
        TraceError: an unreadable file, a layout this does not know, or state that cannot
            be mapped to names unambiguously, naming the file.
    """
    p = Path(path)
    if p.is_dir():
        return _open_trainer(p, param_names, step)
    obj = _load(p)
    if not is_torch_checkpoint(obj):
        raise TraceError(f"{p}: not a torch checkpoint (a dict with 'model' and 'optimizer' state dicts)")
    steps = {k: obj[k] for k in _STEP_KEYS if isinstance(obj.get(k), int) and not isinstance(obj[k], bool)}
    recorded = next(iter(steps.values()), None)
    skipped = sorted(str(k) for k in obj if k not in ("model", "optimizer", *steps))
    return _trace(p, obj["model"], p, obj["optimizer"], p, param_names, step, recorded, None, skipped)


def checkpoint_or_none(file: Path) -> Trace | None:
    """The trace of a torch checkpoint file, or None when the file is not one (for
    :func:`fpsim.trace.open_trace`, which then reads it as a file of named tensors)."""
    try:
        obj = _load(file)
    except TraceError:
        return None  # the per-step importer reports it
    return open_checkpoint(file) if is_torch_checkpoint(obj) else None


def is_torch_checkpoint(obj: Any) -> bool:
    """Whether a loaded object is ``{"model": state_dict, "optimizer": optimizer_state_dict, ...}``."""
    return (
        isinstance(obj, Mapping)
        and isinstance(obj.get("model"), Mapping)
        and _is_optimizer_state(obj.get("optimizer"))
    )


def _is_optimizer_state(opt: Any) -> bool:
    return isinstance(opt, Mapping) and isinstance(opt.get("state"), Mapping) and "param_groups" in opt


def _load(file: Path) -> Any:
    import torch

    if not file.is_file():
        raise TraceError(f"{file}: no such file")
    try:
        return torch.load(file, weights_only=True, map_location="cpu", mmap=True)
    except Exception:
        pass
    try:
        return torch.load(file, weights_only=True, map_location="cpu")
    except Exception as e:  # torch raises many types for corrupt/unsafe files
        raise TraceError(
            f"{file}: cannot load with torch.load(weights_only=True): {type(e).__name__}: {e}"
        ) from e


def _open_trainer(folder: Path, param_names: Any, step: int | None) -> Trace:
    state_file, opt_file = folder / TRAINER_STATE, folder / "optimizer.pt"
    weights = [folder / n for n in ("model.safetensors", "pytorch_model.bin") if (folder / n).is_file()]
    if not state_file.is_file() or not opt_file.is_file() or not weights:
        sharded = sorted(p.name for p in folder.glob("*.index.json"))
        more = f"; sharded weights ({sharded}) are not supported" if sharded else ""
        raise TraceError(
            f"{folder}: a Trainer checkpoint folder has {TRAINER_STATE}, optimizer.pt and "
            f"model.safetensors or pytorch_model.bin{more}"
        )
    try:
        trainer_state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"{state_file}: cannot read: {e}") from e
    recorded = trainer_state.get("global_step") if isinstance(trainer_state, dict) else None
    if not isinstance(recorded, int) or isinstance(recorded, bool) or recorded < 0:
        raise TraceError(f"{state_file}: 'global_step' must be a non-negative integer, got {recorded!r}")
    losses = [h["loss"] for h in trainer_state.get("log_history", []) if isinstance(h, dict) and "loss" in h]
    loss = float(losses[-1]) if losses and isinstance(losses[-1], (int, float)) else None
    wfile = weights[0]
    if wfile.suffix == ".safetensors":
        header = read_header(wfile)
        model: Any = header
    else:
        model = _load(wfile)
        if not isinstance(model, Mapping):
            raise TraceError(f"{wfile}: expected a state dict, got {type(model).__name__}")
    opt = _load(opt_file)
    if not _is_optimizer_state(opt):
        raise TraceError(f"{opt_file}: not an optimizer state dict (no 'state' and 'param_groups')")
    groups = opt["param_groups"]
    stored = isinstance(groups, list) and all(isinstance(g, Mapping) and "param_names" in g for g in groups)
    how = "param_names="
    if param_names is None and not stored and (folder / "config.json").is_file():
        param_names = _trainer_param_names(folder, len(groups) if isinstance(groups, list) else 0)
        how = "the names rebuilt from config.json (the Trainer's grouping)"
    return _trace(folder, model, wfile, opt, opt_file, param_names, step, recorded, loss, [], how)


def _trainer_param_names(folder: Path, groups: int) -> list[list[str]] | None:
    """The parameter names of a Trainer checkpoint's optimizer groups, from its ``config.json``.

    The model is built from the config with transformers on the meta device (no weights are
    read or allocated); with one group the names are ``named_parameters()`` order, with two
    the Trainer's own grouping (``Trainer.get_decay_parameter_names``: the decay group first,
    then the rest, each in ``named_parameters()`` order, trainable parameters only). None
    (the caller then asks for ``param_names=``) without transformers or with another number
    of groups.

    Raises:
        TraceError: a config transformers cannot read, or one naming no transformers model.
    """
    if groups not in (1, 2):
        return None
    try:
        import transformers
    except ImportError:
        return None
    import torch

    config_file = folder / "config.json"
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # transformers raises several types for a bad config
        raise TraceError(f"{config_file}: transformers cannot read it: {type(e).__name__}: {e}") from e
    archs = getattr(config, "architectures", None) or []
    cls = getattr(transformers, archs[0], None) if archs else None
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise TraceError(
            f"{config_file}: 'architectures' {archs} names no transformers model class to rebuild the "
            "parameter order from: pass param_names= (the parameter names in param_groups order)"
        )
    try:
        with torch.device("meta"):
            model = cls(config)
    except Exception as e:  # whatever the model's constructor raises
        raise TraceError(
            f"{config_file}: transformers cannot build {archs[0]} from it ({type(e).__name__}: {e}): pass "
            "param_names= (the parameter names in param_groups order)"
        ) from e
    named = [n for n, p in model.named_parameters() if p.requires_grad]
    if groups == 1:
        return [named]
    trainer = transformers.Trainer.__new__(transformers.Trainer)  # the rule needs no Trainer state
    decay = set(trainer.get_decay_parameter_names(model))
    return [[n for n in named if n in decay], [n for n in named if n not in decay]]


def _trace(
    where: Path,
    model: Any,
    model_file: Path,
    opt: Mapping[str, Any],
    opt_file: Path,
    param_names: Any,
    step: int | None,
    recorded: int | None,
    loss: float | None,
    skipped: list[str],
    names_from: str = "param_names=",
) -> Trace:
    if step is None:
        step = 0 if recorded is None else recorded
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    if isinstance(model, Mapping):
        shapes = {str(k): tuple(v.shape) for k, v in model.items() if is_torch_tensor(v)}
        dtypes = {str(k): str(v.dtype).removeprefix("torch.") for k, v in model.items() if is_torch_tensor(v)}
        floats = [k for k, v in model.items() if is_torch_tensor(v) and v.is_floating_point()]
    else:  # a safetensors header
        shapes = {k: s.shape for k, s in model.tensors.items()}
        dtypes = {k: s.dtype for k, s in model.tensors.items()}
        floats = None  # a safetensors header lists its tensors sorted, not in the model's order
    groups = opt["param_groups"]
    if not isinstance(groups, list) or not all(isinstance(g, Mapping) and "params" in g for g in groups):
        raise TraceError(f"{opt_file}: 'param_groups' must be a list of dicts with 'params'")
    names = _names(opt_file, groups, opt["state"], param_names, floats, shapes, names_from)
    record = StepRecord(step, loss, _lr(groups))
    for name in shapes:
        record.entries.append(
            TensorEntry(step, "param", name, f"param:{name}", shapes[name], dtypes[name], model_file)
        )
    state_tensors: dict[str, Any] = {}
    counts = []
    for pid, per_param in opt["state"].items():
        if not isinstance(per_param, Mapping):
            raise TraceError(f"{opt_file}: state[{pid!r}] is not a dict")
        for key, value in per_param.items():
            if key == "step":
                counts.append(int(value.item()) if is_torch_tensor(value) else int(value))
            if not (is_torch_tensor(value) and value.dim() > 0):
                continue
            name = names[pid]
            if tuple(value.shape) != shapes[name]:
                raise TraceError(
                    f"{opt_file}: state[{pid}][{key!r}] has shape {tuple(value.shape)} but the parameter it "
                    f"maps to, {name!r}, has {shapes[name]}: pass param_names= in param_groups order"
                )
            entry_key = f"state.{key}:{name}"
            dtype = str(value.dtype).removeprefix("torch.")
            record.entries.append(
                TensorEntry(step, f"state.{key}", name, entry_key, shapes[name], dtype, opt_file)
            )
            state_tensors[entry_key] = value
    record.update = max(counts) + 1 if counts else None
    sources: dict[Path, Any] = {opt_file: _Loaded(state_tensors)}
    if isinstance(model, Mapping):
        loaded = {f"param:{k}": v for k, v in model.items() if is_torch_tensor(v)}
        sources[model_file] = _Loaded({**loaded, **(state_tensors if model_file == opt_file else {})})
    else:
        sources[model_file] = SafetensorsSource(model, {f"param:{k}": k for k in shapes})
    meta = {"source": str(where), "importer": "fpsim.trace.checkpoints"}
    if skipped:
        meta["not_imported"] = skipped
    return Trace(where, meta, [record], sources)


def _names(
    file: Path,
    groups: list,
    state: Mapping,
    given: Any,
    floats: list[str] | None,
    shapes: Mapping[str, tuple],
    given_how: str = "param_names=",
) -> dict[Any, str]:
    """Optimizer parameter id -> model parameter name (see the module docstring)."""
    ids = [pid for g in groups for pid in g["params"]]
    stored = [g.get("param_names") for g in groups]
    if all(isinstance(s, list) for s in stored):
        order = [n for s in stored for n in s]
        how = "the optimizer's param_names"
    elif given is not None:
        given = list(given)
        how = given_how
        order = given
        if given and not isinstance(given[0], str):  # a list per group: each group's count must fit
            order = [n for s in given for n in s]
            counts, want = [len(s) for s in given], [len(g["params"]) for g in groups]
            if counts != want:
                raise TraceError(f"{file}: {how} gives {counts} names per group for groups of {want}")
    elif len(groups) == 1 and floats is not None:
        order = floats
        how = "the model state dict's float tensors (one parameter group)"
        if len(order) != len(ids):
            raise TraceError(
                f"{file}: the optimizer has {len(ids)} parameters but the model state dict {len(order)} "
                f"float tensors (buffers?): pass param_names= (the parameter names in param_groups order)"
            )
    else:
        why = f"{len(groups)} parameter groups" if floats is not None else "a safetensors model (unordered)"
        raise TraceError(
            f"{file}: the optimizer stores no param_names and the model is {why}: pass param_names= "
            f"(the parameter names in param_groups order, e.g. a Trainer's decay group first)"
        )
    if len(order) != len(ids):
        raise TraceError(f"{file}: {how} gives {len(order)} names for {len(ids)} optimizer parameters")
    unknown = [n for n in order if n not in shapes]
    if unknown:
        raise TraceError(f"{file}: names {unknown[:5]} (from {how}) are not in the model state dict")
    mapping = dict(zip(ids, order))
    missing = [pid for pid in state if pid not in mapping]
    if missing:
        raise TraceError(f"{file}: optimizer state ids {missing[:5]} are in no param group")
    return mapping


def _lr(groups: list) -> float | None:
    lr = groups[0].get("lr") if groups else None
    if is_torch_tensor(lr):
        lr = lr.item()
    return float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None


class _Loaded:
    """Reads tensors already loaded with ``torch.load`` (memory-mapped where possible)."""

    def __init__(self, tensors: Mapping[str, Any]):
        self.tensors = dict(tensors)

    def read(self, entry: TensorEntry) -> np.ndarray:
        return torch_to_numpy(self.tensors[entry.key])
