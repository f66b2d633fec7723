"""Delayed (amax-history) per-tensor scaling, as Transformer Engine's DelayedScaling.

The state is explicit: a :class:`DelayedState` holds the amax history and the scale, and
:meth:`DelayedScaling.step` casts one tensor with the *current* scale, records its amax and
returns the next state. Stepping through a sequence of tensors (a recorded trace) is a loop
over ``step``, or :meth:`DelayedScaling.run`.

Rules, from ``transformer_engine/common/recipe/delayed_scaling.cu`` (fused ``kernel_bulk``,
TE's default update path) and ``transformer_engine/pytorch/quantization.py``:

1. Cast: ``codes = cast(f32(x * scale))``, saturating round-to-nearest-even
   (``cvt.rn.satfinite``); the decode scale is ``f32(1 / scale)``. The tensor's amax (NaN
   ignored, as fmaxf) is max-ed into ``history[0]``.
2. Update, after the step: ``last = history[0]``. If ``last != 0`` the history rolls to
   ``[0, h[2], ..., h[N-1], last]`` and the "max" amax is the max of ``h[1..N-1]`` and
   ``last`` (the whole window, this step included); if ``last == 0`` nothing rolls and the
   "max" amax is 0. ``amax_compute_algo="most_recent"`` uses ``last``.
3. ``scale = f32(f32(fp8_max * 2**-margin) / amax)`` when the amax is finite and positive,
   else the previous scale is kept; an infinite scale becomes FLT_MAX. The new scale is used
   by the *next* cast; the first step uses scale 1.

An FP8 scaling policy of one's own, for ``ReplayConfig(grad_delayed=...)``, is any object
that :class:`FP8ScalingPolicy` describes: an ``element`` format, ``init()`` (one state per
tensor) and ``step(state, g) -> (encoded, new_state)``, where the replay engine decodes
``encoded.codes`` in ``element`` and multiplies by ``encoded.scales.view(float32)[0]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from .._compiled import Backend
from ..formats import Format, RoundMode, get_format
from ..formats.amax import amax_ignore_nan
from . import element
from .blocks import BlockCodes, float32_input
from .random import stochastic_words

__all__ = ["DelayedScaling", "DelayedState", "EncodedTensor", "FP8ScalingPolicy"]

_F32 = np.float32

StateT = TypeVar("StateT")


class EncodedTensor(Protocol):
    """One tensor cast by a scaling policy (e.g. :class:`~fpsim.emulate.blocks.BlockCodes`):
    ``codes``, element codes in the policy's ``element`` format, the tensor's shape; ``scales``,
    a numpy array whose first element is the float32 decode multiplier (its uint32 bit pattern,
    or a float32)."""

    @property
    def codes(self) -> np.ndarray: ...

    @property
    def scales(self) -> np.ndarray: ...


@runtime_checkable
class FP8ScalingPolicy(Protocol[StateT]):
    """Per-tensor scaling of a gradient as the replay engine drives it: ``init()`` once per
    tensor, then per step ``step(state, g)`` with ``g`` a float32 array, returning the cast
    tensor and the next state. :class:`DelayedScaling` is one."""

    @property
    def element(self) -> Format | str: ...

    def init(self) -> StateT: ...

    def step(self, state: StateT, x: Any, /) -> tuple[EncodedTensor, StateT]: ...


@dataclass(frozen=True)
class DelayedState:
    """Amax history (float32, newest slot first as TE keeps it) and the scale to use next."""

    history: np.ndarray
    scale: float = 1.0

    @property
    def scale_inv(self) -> float:
        return float(_F32(1) / _F32(self.scale))

    def __repr__(self) -> str:
        """The scale and a digest of the history, not the history itself (1024 slots by default)."""
        h = np.asarray(self.history)
        amax = f", amax max={float(h.max()):.6g}" if h.size else ""
        return f"DelayedState(scale={self.scale!r}, history={h.dtype}[{h.size}]{amax})"


@dataclass(frozen=True)
class DelayedScaling:
    """Transformer Engine DelayedScaling for one tensor (see the module doc for the rules).

    Args:
        element: the FP8 format (float8_e4m3fn forward, float8_e5m2 backward in HYBRID).
        history_len: amax history length (TE default 1024).
        amax_compute_algo: ``"max"`` (TE default) or ``"most_recent"``.
        margin: the scale is divided by ``2**margin`` (TE default 0).
    """

    element: Format | str = "float8_e4m3fn"
    history_len: int = 1024
    amax_compute_algo: str = "max"
    margin: int = 0
    _fmt: Format = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fmt = get_format(self.element)
        if not isinstance(fmt, Format):
            raise TypeError(f"DelayedScaling needs a float element format, got {fmt.name}")
        if self.history_len < 1:
            raise ValueError(f"history_len must be >= 1, got {self.history_len}")
        if self.amax_compute_algo not in ("max", "most_recent"):
            algo = self.amax_compute_algo
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {algo!r}")
        object.__setattr__(self, "_fmt", fmt)

    def init(self) -> DelayedState:
        """The state before the first step: zero history, scale 1."""
        return DelayedState(np.zeros(self.history_len, _F32), 1.0)

    def step(
        self,
        state: DelayedState,
        x: Any,
        *,
        rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
        random_bits: Any = None,
        rng: np.random.Generator | int | None = None,
        stochastic_bits: int = 32,
        subnormals: bool = True,
        backend: Backend | str = "auto",
    ) -> tuple[BlockCodes, DelayedState]:
        """Cast ``x`` with ``state.scale``, then update; returns the codes and the next state.

        The BlockCodes hold the decode scale ``f32(1/scale)`` as one float32 scale code.
        ``random_bits``, ``rng``, ``stochastic_bits`` and ``subnormals`` are those of
        :func:`fpsim.emulate.element.encode`, for the element cast; ``backend`` where it runs
        (:meth:`fpsim.Backend.resolve` with ``x``'s size; the same codes either way).
        """
        mode = RoundMode.parse(rounding)
        x = float32_input(x)
        backend = Backend.resolve(backend, x.size)
        rand = stochastic_words(np, mode, random_bits, rng, x.shape, stochastic_bits)
        scale = _F32(state.scale)
        with np.errstate(over="ignore", invalid="ignore"):  # x * FLT_MAX may overflow: saturates
            scaled = np.asarray(x * scale)
        codes = element.encode_array(
            scaled,
            self._fmt,
            mode,
            saturate=True,
            subnormals=subnormals,
            rand=rand,
            nbits=stochastic_bits,
            backend=backend,
        )
        scale_inv = np.asarray(_F32(1) / scale).reshape(1).view(np.uint32)
        hist = state.history.astype(_F32, copy=True)
        hist[0] = amax_ignore_nan(np.array([hist[0], amax_ignore_nan(x)], _F32))
        return BlockCodes(codes, scale_inv), self._update(hist, scale)

    def run(
        self, xs: Iterable[Any], state: DelayedState | None = None, **kwargs: Any
    ) -> Iterator[tuple[BlockCodes, DelayedState]]:
        """Step through ``xs``; yields (codes, state after the step) per tensor."""
        state = self.init() if state is None else state
        for x in xs:
            out, state = self.step(state, x, **kwargs)
            yield out, state

    def _update(self, hist: np.ndarray, scale: np.float32) -> DelayedState:
        last = hist[0]
        if last != 0:
            window = amax_ignore_nan(hist)  # last and h[1..N-1] (amaxes: >= 0)
            rolled = np.zeros_like(hist)
            rolled[1:-1] = hist[2:]
            if hist.size > 1:
                rolled[-1] = last
            hist = rolled
        else:
            window = _F32(0)
        amax = last if self.amax_compute_algo == "most_recent" else _F32(window)
        if np.isfinite(amax) and amax > 0:
            with np.errstate(over="ignore", divide="ignore"):
                scaled_max = _F32(self._fmt.max * 2.0**-self.margin)
                scale = scaled_max / amax
            if np.isinf(scale):
                scale = np.finfo(_F32).max
        return DelayedState(hist, float(scale))
