"""What a replayed configuration stores where: :class:`ReplayConfig`, the :data:`PRESETS` (and
:func:`resolve_configs`, which looks names up in them, :data:`DEFAULT_CONFIGS`) and the
:func:`memory_table`.

A configuration is built from names or objects and holds objects: every format, block recipe
and rounding mode is resolved once, when the configuration is made (the conventions of the
README's Architecture section); the replay below takes those objects. Its repr shows the names
(of the registered formats and recipes) that it was made from.

Which storage a tensor's state gets is :meth:`ReplayConfig.state_storage`: the first
``state_overrides`` entry matching the tensor and state, else the configured format; then FP32
where the tensor is below ``min_quantized_size`` or, with ``quantize_ragged=False``, where the
format's block does not divide it. The replay's storage (:mod:`.storage`), its engine and
:func:`memory_table` all ask it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from ..emulate.delayed import DelayedScaling
from ..formats import RECIPES, BlockFormat, Codebook, Format, IntFormat, RoundMode, get_format
from .lossscale import LossScaler
from .optim import AdamW, Optimizer
from .qmap import QMAP_RECIPES, QMapBlocks

__all__ = ["DEFAULT_CONFIGS", "PRESETS", "ReplayConfig", "memory_table", "resolve_configs"]

StateFormat = Format | IntFormat | BlockFormat | QMapBlocks
"""A state's storage: an element format, a block recipe or a torchao state format."""

_STATE_FIELDS = {"exp_avg": "m", "exp_avg_sq": "v", "momentum_buffer": "momentum"}
_FLOAT32 = get_format("float32")


@dataclass(frozen=True, repr=False)
class ReplayConfig:
    """One low-precision training configuration to replay.

    Every format argument takes a name or an object and is stored resolved (the object).

    Args:
        name: label in the tables.
        m, v, momentum: storage of Adam's first/second moment and SGD's momentum: an element
            format, a block recipe (e.g. ``"bnb_dynamic8_block256"``) or a torchao state format
            of :data:`fpsim.replay.qmap.QMAP_RECIPES` (e.g. ``"torchao_dynamic8_block256"``).
        min_quantized_size: tensors with fewer elements keep FP32 states (bitsandbytes'
            ``min_8bit_size``; torchao's optimizers use 4096).
        quantize_ragged: False keeps FP32 states for tensors whose element count is not a
            multiple of the state format's block (torchao's ``_AdamBase._new_buffer``); formats
            without a fixed block (element formats, per-tensor or per-row scales) divide every
            tensor.
        state_overrides: ``(tensor pattern, state pattern, format)`` triples, or
            ``(tensor pattern, format)`` pairs (every state; stored as the triple with state
            pattern ``"*"``): the states whose tensor name and state name (``"exp_avg"``, ...)
            match the fnmatch patterns are stored in that format (first match wins), e.g.
            ``(("embed*", "float32"),)`` keeps the embeddings' Adam states in FP32, as
            bitsandbytes' ``GlobalOptimManager.override_config(p, "optim_bits", 32)`` does.
            ``min_quantized_size`` and ``quantize_ragged`` apply to the format chosen.
        master: format of the optimizer's parameter copy (``"float32"``, ``"bfloat16"``, ...).
        master_rounding: rounding of that copy (nearest_even or stochastic).
        kahan: carry the master rounding error in a compensation buffer (Kahan summation).
        master_overrides: ``(pattern, format)`` pairs; tensors whose name matches the
            fnmatch pattern keep their master copy in that format (first match wins), e.g.
            ``(("embed*", "float32"),)``.
        weights: format of a separate forward copy of the weights, counted in the memory
            table only (None: the master copy is the weights).
        grad: gradient format or block recipe (``"float16"``, ``"e5m2_tensor"``, ...).
        loss_scaler: static or dynamic loss scaling of the gradients.
        grad_delayed: FP8 delayed scaling of the gradients (one state per tensor).

    Raises:
        ValueError: an unknown format name or rounding mode (the message lists the known ones),
            a negative ``min_quantized_size``, or an override that is not a pair or triple of
            patterns and a format (the message names the argument).
    """

    name: str
    m: StateFormat | str = _FLOAT32
    v: StateFormat | str = _FLOAT32
    momentum: StateFormat | str = _FLOAT32
    min_quantized_size: int = 0
    quantize_ragged: bool = True
    state_overrides: tuple[tuple[str, str, StateFormat | str] | tuple[str, StateFormat | str], ...] = ()
    master: Format | str = _FLOAT32
    master_rounding: RoundMode | str = RoundMode.NEAREST_EVEN
    kahan: bool = False
    master_overrides: tuple[tuple[str, Format | str], ...] = ()
    weights: Format | str | None = None
    grad: Format | BlockFormat | str = _FLOAT32
    loss_scaler: LossScaler | None = None
    grad_delayed: DelayedScaling | None = None

    def __post_init__(self) -> None:
        resolved: dict[str, Any] = {k: _state_format(getattr(self, k)) for k in ("m", "v", "momentum")}
        resolved.update({k: get_format(getattr(self, k)) for k in ("master", "grad")})
        resolved["master_rounding"] = RoundMode.parse(self.master_rounding)
        resolved["master_overrides"] = tuple((str(p), get_format(f)) for p, f in self.master_overrides)
        resolved["state_overrides"] = tuple(_state_override(o) for o in self.state_overrides)
        resolved["weights"] = None if self.weights is None else get_format(self.weights)
        size = self.min_quantized_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"ReplayConfig: min_quantized_size must be an integer >= 0, got {size!r}")
        if not isinstance(self.quantize_ragged, bool):
            raise ValueError(
                f"ReplayConfig: quantize_ragged must be True or False, got {self.quantize_ragged!r}"
            )
        for k, value in resolved.items():
            object.__setattr__(self, k, value)

    def state_format(self, state: str) -> StateFormat:
        """The configured storage of optimizer state ``state`` (``"exp_avg"``, ...), before the
        per-tensor rules of :meth:`state_storage`."""
        return getattr(self, _STATE_FIELDS[state])

    def state_storage(self, state: str, tensor: str, size: int) -> StateFormat:
        """The storage of state ``state`` of tensor ``tensor`` with ``size`` elements: the first
        matching ``state_overrides`` format, else :meth:`state_format`; float32 where
        ``size < min_quantized_size`` or (``quantize_ragged=False``) where the format's block
        does not divide ``size``."""
        fmt = self.state_format(state)
        for tensor_pattern, state_pattern, override in self.state_overrides:
            if fnmatch.fnmatchcase(tensor, tensor_pattern) and fnmatch.fnmatchcase(state, state_pattern):
                fmt = override
                break
        if size < self.min_quantized_size:
            return _FLOAT32
        block = getattr(fmt, "block_elements", None)
        if not self.quantize_ragged and block and size % block:
            return _FLOAT32
        return fmt

    def master_format(self, tensor: str) -> Format:
        """The master copy's format of tensor ``tensor`` (the first matching override, else
        ``master``)."""
        for pattern, fmt in self.master_overrides:
            if fnmatch.fnmatchcase(tensor, pattern):
                return fmt
        return self.master

    def __repr__(self) -> str:
        parts = [f"{f.name}={_shown(getattr(self, f.name))}" for f in fields(self)]
        return f"ReplayConfig({', '.join(parts)})"


def _state_format(fmt: Any) -> StateFormat:
    """A state's storage from its name or object: torchao's state formats by their names, the
    rest through :func:`fpsim.get_format`."""
    if isinstance(fmt, QMapBlocks):
        return fmt
    if isinstance(fmt, str) and fmt in QMAP_RECIPES:
        return QMAP_RECIPES[fmt]
    try:
        return get_format(fmt)
    except ValueError as e:
        raise ValueError(f"{e}; torchao state formats: {', '.join(QMAP_RECIPES)}") from None


def _state_override(entry: Any) -> tuple[str, str, StateFormat]:
    """One ``state_overrides`` entry as ``(tensor pattern, state pattern, resolved format)``."""
    ok = isinstance(entry, (tuple, list)) and len(entry) in (2, 3)
    if ok and all(isinstance(p, str) for p in entry[:-1]):
        *patterns, fmt = entry
        tensor, state = (*patterns, "*") if len(patterns) == 1 else patterns
        return tensor, state, _state_format(fmt)
    raise ValueError(
        "ReplayConfig: state_overrides takes (tensor pattern, state pattern, format) triples or "
        f"(tensor pattern, format) pairs, got {entry!r}"
    )


def _shown(value: Any) -> str:
    """The repr of a field value, with registered formats and recipes as their names and
    rounding modes as theirs."""
    if isinstance(value, RoundMode):
        return repr(value.value)
    if isinstance(value, tuple):
        inner = ", ".join(_shown(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, QMapBlocks):
        return repr(value.name) if QMAP_RECIPES.get(value.name) == value else repr(value)
    if isinstance(value, (Format, IntFormat, BlockFormat)):
        try:
            known = get_format(value.name) == value
        except ValueError:  # a format made by the user, not in the registries
            known = False
        return repr(value.name) if known else repr(value)
    return repr(value)


_TORCHAO = {"min_quantized_size": 4096, "quantize_ragged": False}  # torchao's _AdamBase._new_buffer


def _bnb_cpu(name: str, signed: bool) -> BlockFormat:
    """A bitsandbytes recipe with the CPU kernel's lookup table (``Codebook.lut_bins``)."""
    return replace(RECIPES[name], element=Codebook.bnb_dynamic(signed, lut_bins=65536))


PRESETS: dict[str, ReplayConfig] = {
    c.name: c
    for c in (
        ReplayConfig("fp32"),
        ReplayConfig("bf16-master", master="bfloat16"),
        ReplayConfig("bf16-master-sr", master="bfloat16", master_rounding="stochastic"),
        ReplayConfig("bf16-master-kahan", master="bfloat16", kahan=True),
        ReplayConfig("bf16-states", m="bfloat16", v="bfloat16"),
        ReplayConfig("int8-states", m="int8_block256", v="int8_block256"),
        ReplayConfig("fp8-states", m="fp8_e4m3_block256", v="fp8_e4m3_block256"),
        ReplayConfig(
            "bnb-8bit", m="bnb_dynamic8_block256", v="bnb_dynamic8u_block256", min_quantized_size=4096
        ),
        ReplayConfig("bnb-8bit-all", m="bnb_dynamic8_block256", v="bnb_dynamic8u_block256"),
        ReplayConfig(
            "bnb-8bit-cpu",
            m=_bnb_cpu("bnb_dynamic8_block256", True),
            v=_bnb_cpu("bnb_dynamic8u_block256", False),
            min_quantized_size=4096,
        ),
        ReplayConfig(
            "torchao-8bit", m="torchao_dynamic8_block256", v="torchao_dynamic8u_block256", **_TORCHAO
        ),
        ReplayConfig(
            "torchao-4bit", m="torchao_dynamic4_block128", v="torchao_linear4u_block128", **_TORCHAO
        ),
        ReplayConfig("torchao-fp8", m="fp8_e4m3_block256", v="fp8_e4m3_block256", **_TORCHAO),
        ReplayConfig("msamp-o2", m="e4m3_tensor_pow2", v="float16", master="float16"),
        ReplayConfig("fp16-grads-dynamic", grad="float16", loss_scaler=LossScaler()),
        ReplayConfig("fp8-grads-delayed", grad_delayed=DelayedScaling("float8_e5m2", history_len=16)),
    )
}
"""Named configurations for ``fpsim replay --config NAME``.

The presets named after a library take its defaults (tests/replay/test_presets.py checks
them against the installed libraries):

- ``bnb-8bit``: bitsandbytes ``Adam8bit`` / ``AdamW8bit`` (0.50.2, ``Optimizer2State.init_state``):
  tensors below ``min_8bit_size`` = 4096 elements keep FP32 states, the others (1-D ones too,
  ragged last blocks too) 8-bit codes of the signed dynamic map (``exp_avg``) and the unsigned
  one (``exp_avg_sq``) with a float32 absmax per 256 elements, rounded as bitsandbytes' CUDA
  kernel rounds; ``bnb-8bit-cpu`` rounds as its CPU kernel does (a 65536-bin lookup table, the
  one that runs in ``bnb.optim.Adam8bit`` on the CPU).
- ``torchao-8bit``, ``torchao-4bit``, ``torchao-fp8``: torchao ``AdamW8bit``, ``AdamW4bit``,
  ``AdamWFp8`` (0.18, ``_AdamBase._new_buffer``): tensors below 4096 elements or not a multiple
  of the block (256, 128, 256) keep FP32 states; the others ``OptimState8bit`` (the dynamic maps,
  torchao's quantizer: :mod:`fpsim.replay.qmap`), ``OptimState4bit`` (the 4-bit dynamic map for
  ``exp_avg``, the linear map 1/16..1 for ``exp_avg_sq``) or ``OptimStateFp8`` (E4M3 with scale
  ``max(amax, 1e-12) / 448``, the recipe ``fp8_e4m3_block256``).

``int8-states``, ``fp8-states`` and ``bnb-8bit-all`` follow no library's rule: they quantize
every tensor, however small (``fp8-states`` is ``torchao-fp8`` without its FP32 tensors), and
show what quantizing the small tensors (biases, norms) costs. ``bf16-states`` keeps both moments
in bfloat16, ``msamp-o2`` stores MS-AMP O2's formats (FP8 first moment with a per-tensor power
of two scale, float16 second moment and master copy) for every tensor.
"""

DEFAULT_CONFIGS = ("bf16-master", "bnb-8bit-all", "fp8-states")
"""The configurations :func:`fpsim.replay.replay` (and its Dask executor) replays when given none."""


def resolve_configs(configs: Sequence[ReplayConfig | str]) -> list[ReplayConfig]:
    """The configurations of a replay, names of :data:`PRESETS` resolved.

    Args:
        configs: :class:`ReplayConfig` objects or preset names.

    Raises:
        ValueError: an item that is neither a configuration nor a preset name.
    """
    cfgs = [PRESETS[c] if isinstance(c, str) and c in PRESETS else c for c in configs]
    for c in cfgs:
        if not isinstance(c, ReplayConfig):
            raise ValueError(f"unknown replay configuration {c!r}; presets: {', '.join(PRESETS)}")
    return cfgs


def memory_table(
    configs: Sequence[ReplayConfig], sizes: dict[str, int], optimizer: Optimizer | None = None
) -> list[dict[str, Any]]:
    """Bytes per parameter of each configuration: weights, grads, states (their elements),
    scales (the states' block scales), master copy, Kahan buffer, total.

    Each tensor's states count in the storage :meth:`ReplayConfig.state_storage` gives them
    (overrides; FP32 below ``min_quantized_size`` and, with ``quantize_ragged=False``, for
    tensors the block does not divide), at that storage's ``bytes_per_element``, split into
    the elements and the scales (block recipes and torchao's formats: one scale per full block);
    per-tensor master overrides are weighted by size.

    Args:
        configs: :class:`ReplayConfig` objects.
        sizes: elements of each tensor, by name.
        optimizer: the optimizer whose states are counted (default ``AdamW()``).
    """
    optimizer = optimizer or AdamW()
    return [_memory_row(c, sizes, optimizer) for c in configs]


def _memory_row(c: ReplayConfig, sizes: dict[str, int], optimizer: Optimizer) -> dict[str, Any]:
    total = sum(sizes.values()) or 1
    master = sum(c.master_format(n).bytes_per_element * k for n, k in sizes.items()) / total
    states = scales = 0.0
    for st in optimizer.states:
        for n, k in sizes.items():
            fmt = c.state_storage(st, n, k)
            scale = _scale_bytes(fmt)
            states += (fmt.bytes_per_element - scale) * k / total
            scales += scale * k / total
    grad_format = c.grad if c.grad_delayed is None else get_format(c.grad_delayed.element)
    grad = grad_format.bytes_per_element
    weights = c.weights.bytes_per_element if c.weights is not None else 0.0
    comp = master if c.kahan else 0.0
    return {
        "config": c.name,
        "weights": weights,
        "master": master,
        "grads": grad,
        "states": states,
        "scales": scales,
        "kahan_buffer": comp,
        "total": weights + master + grad + states + scales + comp,
    }


def _scale_bytes(fmt: StateFormat) -> float:
    """The bytes per element of a state format's block scales (0 for element formats)."""
    if isinstance(fmt, BlockFormat):
        return fmt.bytes_per_element - fmt.element.bits / 8
    if isinstance(fmt, QMapBlocks):
        return fmt.bytes_per_element - fmt.bits / 8
    return 0.0
