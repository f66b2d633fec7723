"""What a replayed configuration stores where: :class:`ReplayConfig`, the :data:`PRESETS` (and
:func:`resolve_configs`, which looks names up in them, :data:`DEFAULT_CONFIGS`) and the
:func:`memory_table`.

A configuration is built from names or objects and holds objects: every format, block recipe
and rounding mode is resolved once, when the configuration is made (the conventions of the
README's Architecture section); the replay below takes those objects. Its repr shows the names
(of the registered formats and recipes) that it was made from.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from ..emulate.delayed import DelayedScaling
from ..formats import RECIPES, BlockFormat, Codebook, Format, IntFormat, RoundMode, get_format
from ..optim import AdamW, Optimizer
from .lossscale import LossScaler

__all__ = ["DEFAULT_CONFIGS", "PRESETS", "ReplayConfig", "memory_table", "resolve_configs"]

StateFormat = Format | IntFormat | BlockFormat
"""A state's storage: an element format or a block recipe."""

_STATE_FIELDS = {"exp_avg": "m", "exp_avg_sq": "v", "momentum_buffer": "momentum"}
_FLOAT32 = get_format("float32")


@dataclass(frozen=True, repr=False)
class ReplayConfig:
    """One low-precision training configuration to replay.

    Every format argument takes a name or an object and is stored resolved (the object).

    Args:
        name: label in the tables.
        m, v, momentum: storage of Adam's first/second moment and SGD's momentum: an element
            format or block recipe, e.g. ``"bnb_dynamic8_block256"``.
        min_quantized_size: tensors with fewer elements keep FP32 states.
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
        ValueError: an unknown format name or rounding mode (the message lists the known ones).
    """

    name: str
    m: StateFormat | str = _FLOAT32
    v: StateFormat | str = _FLOAT32
    momentum: StateFormat | str = _FLOAT32
    min_quantized_size: int = 0
    master: Format | str = _FLOAT32
    master_rounding: RoundMode | str = RoundMode.NEAREST_EVEN
    kahan: bool = False
    master_overrides: tuple[tuple[str, Format | str], ...] = ()
    weights: Format | str | None = None
    grad: Format | BlockFormat | str = _FLOAT32
    loss_scaler: LossScaler | None = None
    grad_delayed: DelayedScaling | None = None

    def __post_init__(self) -> None:
        resolved = {k: get_format(getattr(self, k)) for k in ("m", "v", "momentum", "master", "grad")}
        resolved["master_rounding"] = RoundMode.parse(self.master_rounding)
        resolved["master_overrides"] = tuple((str(p), get_format(f)) for p, f in self.master_overrides)
        resolved["weights"] = None if self.weights is None else get_format(self.weights)
        for k, value in resolved.items():
            object.__setattr__(self, k, value)

    def state_format(self, state: str) -> StateFormat:
        """The storage of optimizer state ``state`` (``"exp_avg"``, ...)."""
        return getattr(self, _STATE_FIELDS[state])

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


def _shown(value: Any) -> str:
    """The repr of a field value, with registered formats and recipes as their names and
    rounding modes as theirs."""
    if isinstance(value, RoundMode):
        return repr(value.value)
    if isinstance(value, tuple):
        inner = ", ".join(_shown(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, (Format, IntFormat, BlockFormat)):
        try:
            known = get_format(value.name) == value
        except ValueError:  # a format made by the user, not in the registries
            known = False
        return repr(value.name) if known else repr(value)
    return repr(value)


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
            m=replace(RECIPES["bnb_dynamic8_block256"], element=Codebook.bnb_dynamic(True, lut_bins=65536)),
            v=replace(RECIPES["bnb_dynamic8u_block256"], element=Codebook.bnb_dynamic(False, lut_bins=65536)),
            min_quantized_size=4096,
        ),
        ReplayConfig("msamp-o2", m="e4m3_tensor_pow2", v="float16", master="float16"),
        ReplayConfig("fp16-grads-dynamic", grad="float16", loss_scaler=LossScaler()),
        ReplayConfig("fp8-grads-delayed", grad_delayed=DelayedScaling("float8_e5m2", history_len=16)),
    )
}
"""Named configurations for ``fpsim replay --config NAME``."""

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
    """Bytes per parameter of each configuration: weights, grads, states, master copy, total.

    Block recipes count their scales (``BlockFormat.bytes_per_element``); tensors below
    ``min_quantized_size`` count FP32 states; per-tensor master overrides are weighted by size.

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
    states = 0.0
    for st in optimizer.states:
        per = c.state_format(st).bytes_per_element
        states += sum((per if k >= c.min_quantized_size else 4.0) * k for k in sizes.values()) / total
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
        "kahan_buffer": comp,
        "total": weights + master + grad + states + comp,
    }
