"""The arguments of the fused optimizer kernel (``_optim_kernel.py``) as typed tuples.

:func:`fpsim.kernels.optim.adamw_step` launches ``adam_kernel`` with a handful of tuples
instead of a spelled-out list of numbers: the tensors of the master copy
(:class:`MasterTensors`) and of each state (:class:`StateTensors`), the step's float32
scalars (:class:`AdamArgs`), each state's numbers (:class:`StateArgs`: its element format
and scale rule) and the constexpr code paths of the master copy (:class:`MasterPaths`) and of
each state (:class:`StatePaths`). The numbers follow :meth:`fpsim.replay.optim.Adam.scalars`
and :func:`fpsim.emulate.blocks.encode_blocks` (ABSMAX rule, saturating, nearest-even);
tested through the kernel, which is compared bit for bit with its emulator twin
(tests/kernels/test_optim_kernel.py).

This module imports neither torch nor triton.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from fpsim.emulate import decode
from fpsim.emulate.scale_rules import nearest_thresholds
from fpsim.formats import BlockFormat, Codebook, Format, RoundMode
from fpsim.formats.params import FormatParams
from fpsim.replay.optim import Adam

from ._codes import Decay, Source, StateKind, state_kind
from .format_args import (
    FormatPaths,
    ScaleArgs,
    element_args,
    format_args,
    rounding_codes,
    scale_args,
)

__all__ = [
    "AdamArgs",
    "MasterPaths",
    "MasterTensors",
    "StateArgs",
    "StatePaths",
    "StateTensors",
    "adam_args",
    "master_paths",
    "state_args",
    "state_tables",
]

_F32 = np.float32


class MasterTensors(NamedTuple):
    """The master copy's tensors (int16 bits of bfloat16 / float16 codes, int32 of float32).

    Attributes:
        codes: the codes read.
        codes_out: the codes written (may be ``codes``: in place).
        random: uint32 random words as int32 when loaded (else any tensor, unread).
    """

    codes: Any
    codes_out: Any
    random: Any


class StateTensors(NamedTuple):
    """An optimizer state's tensors (FP32 states: values as int32 bits; the scale, table and
    threshold tensors are then unread placeholders).

    Attributes:
        codes, scales: the state read: uint8 codes and one float32 scale per block (int32 bits).
        codes_out, scales_out: the state written (may be the ones read: in place).
        table: float32 value of each of the 256 codes (the emulator's decode).
        mids: codebooks: float32 nearest-entry thresholds padded with +inf to 256.
    """

    codes: Any
    scales: Any
    codes_out: Any
    scales_out: Any
    table: Any
    mids: Any


class AdamArgs(NamedTuple):
    """The float32 scalars of one Adam step (:meth:`fpsim.replay.optim.Adam.scalars`), as
    Python floats holding float32 values exactly (float arguments are not value-specialised).

    Attributes:
        decay: AdamW ``1 - lr * wd``; Adam (L2) ``wd``; unused without decay.
        omb1, omb2: ``1 - beta1``, ``1 - beta2``.
        beta2: ``beta2``.
        neg_step: ``-lr / (1 - beta1**t)``.
        bias2: ``sqrt(1 - beta2**t)``.
        eps: ``eps``.
    """

    decay: float
    omb1: float
    omb2: float
    beta2: float
    neg_step: float
    bias2: float
    eps: float


class StateArgs(NamedTuple):
    """An optimizer state's runtime numbers: its element format (:class:`FormatParams`,
    saturating) and its ABSMAX scale (:class:`ScaleArgs`); placeholders for FP32 and codebook
    states, which use neither."""

    fmt: FormatParams = FormatParams()
    scale: ScaleArgs = ScaleArgs()


class StatePaths(NamedTuple):
    """An optimizer state's code paths (a ``tl.constexpr`` tuple).

    Attributes:
        KIND: how it is stored, a :class:`~fpsim.formats.codes.StateKind` (FP32, CODEBOOK,
            INT or FLOAT).
        FMT: its element format's :class:`FormatPaths` (INT and FLOAT).
    """

    KIND: int = int(StateKind.FP32)
    FMT: FormatPaths = FormatPaths()


class MasterPaths(NamedTuple):
    """The master copy's code paths (a ``tl.constexpr`` tuple).

    Attributes:
        SRC: its dtype, a :class:`~fpsim.kernels._codes.Source`.
        RAND: the source of stochastic rounding's words, a :class:`~fpsim.kernels._codes.Random`.
        MODE: its rounding, a :attr:`~fpsim.formats.RoundMode.code`.
        OVF: where overflow goes, an :class:`~fpsim.kernels._codes.Overflow`.
        FMT: its format's :class:`FormatPaths`.
    """

    SRC: int
    RAND: int
    MODE: int
    OVF: int
    FMT: FormatPaths


_SOURCES = {"float32": Source.FLOAT32, "bfloat16": Source.BFLOAT16, "float16": Source.FLOAT16}


def master_paths(fmt: Format, mode: RoundMode, rand: int) -> tuple[FormatParams, MasterPaths]:
    """The master format's numbers and code paths (bfloat16, float16 or float32; rounded
    once, overflowing to inf as :func:`fpsim.encode`)."""
    fa, fp = format_args(fmt)
    mode_code, ovf = rounding_codes(fmt, mode)
    return fa, MasterPaths(SRC=int(_SOURCES[fmt.name]), RAND=int(rand), MODE=mode_code, OVF=ovf, FMT=fp)


def adam_args(opt: Adam, lr: float, t: int) -> tuple[Decay, AdamArgs]:
    """The DECAY code and the float32 scalars of :meth:`fpsim.replay.optim.Adam.scalars`."""
    sc = opt.scalars(lr, t)
    vals = (sc.decay, sc.omb1, sc.omb2, sc.b2, sc.neg_step, sc.bc2, sc.eps)
    return Decay(sc.mode), AdamArgs(*(float(_F32(v)) for v in vals))


@functools.lru_cache(maxsize=64)
def state_args(bf: BlockFormat | None) -> tuple[StateArgs, StatePaths]:
    """A state's numbers and code paths (None: an FP32 state)."""
    kind = int(state_kind(bf))
    if bf is None or isinstance(bf.element, Codebook):
        return StateArgs(), StatePaths(KIND=kind)
    fa, fp = element_args(bf)
    return StateArgs(fa, scale_args(bf)), StatePaths(KIND=kind, FMT=fp)


@functools.lru_cache(maxsize=64)
def state_tables(bf: BlockFormat | None) -> tuple[np.ndarray, np.ndarray]:
    """A state's decode table (the emulator's value of each of the 256 codes) and codebook
    thresholds (:func:`fpsim.emulate.scale_rules.nearest_thresholds`, padded with +inf);
    zeros and +inf where unused."""
    table = np.zeros(256, _F32)
    mids = np.full(256, np.inf, _F32)
    if bf is None:
        return table, mids
    el = bf.element
    if isinstance(el, Codebook):
        c = el.table
        table[: c.size] = c
        mids[: c.size - 1] = nearest_thresholds(c)  # as fpsim.emulate.blocks's bucket lookup
    else:
        table[: 1 << el.bits] = decode(np.arange(1 << el.bits, dtype=np.uint8), el)
    return table, mids
