"""The integer codes of an optimizer state's storage, of Adam's weight decay and of a scale
rule's kernels (:class:`FactorKind`, :class:`DecodeKind`; a rule's own number is
:attr:`fpsim.formats.ScaleRule.code`), numbered once.

The numpy step of :mod:`fpsim.replay.optim`, the compiled loops (:mod:`fpsim._compiled.loops`)
and the Triton kernels (:mod:`fpsim.kernels`) take these two choices as plain integers and read
them from here, as they read a rounding mode's and an encoding's number from
:attr:`fpsim.formats.RoundMode.code` and :attr:`fpsim.formats.Encoding.code`; no other module
numbers them (tests/formats/test_codes.py compares every tier's constants with these members
and scans the source for a second numbering). The numbers are fixed for good: a new member
takes a new number and none is renumbered, because numba caches compiled loops on disk with
the numbers frozen in and checks only the loops' own file for changes.

This module imports neither numba nor triton.
"""

from __future__ import annotations

import enum

__all__ = ["Decay", "DecodeKind", "FactorKind", "NumberedEnum", "StateKind"]


class NumberedEnum(enum.Enum):
    """An enum whose members are their name (``value``) and a fixed integer :attr:`code`,
    written ``MEMBER = "name", code`` (a member without a code fails when the class is made):
    the base of :class:`fpsim.formats.RoundMode` and :class:`fpsim.formats.Encoding`."""

    def __new__(cls, value: str, code: int) -> NumberedEnum:
        member = object.__new__(cls)
        member._value_ = value
        member._code = code
        return member

    @property
    def code(self) -> int:
        """The member's integer code in the compiled loops and the kernels, fixed for good: a new
        member takes a new number and none is renumbered (numba caches compiled loops with the
        numbers frozen in)."""
        return self._code


class StateKind(enum.IntEnum):
    """How an optimizer state is stored (the block loops' ``kind`` argument, the Adam kernel's
    constexprs ``M_KIND`` and ``V_KIND``); element codes with one float32 scale per block,
    except ``FP32``.

    The Triton kernel stores ``FP32``, ``CODEBOOK``, ``INT`` and ``FLOAT`` states
    (:func:`fpsim.kernels._codes.state_kind`); the compiled loops store ``CODEBOOK`` and the
    kinds from ``INT8_ABSMAX`` on (:mod:`fpsim.replay.fused`), the scaled ones for the scale
    rules and elements of :data:`fpsim._compiled.kinds.SCALED_STATES`.

    Attributes:
        FP32: float32 values, no scales.
        CODEBOOK: a codebook rounded to the nearest entry of ``x / absmax`` (the bitsandbytes
            dynamic maps).
        INT: integer element codes of any :class:`~fpsim.formats.IntFormat` under an absmax
            scale per block.
        FLOAT: float element codes of any :class:`~fpsim.formats.Format` under an absmax scale
            per block.
        INT8_ABSMAX: linear int8 with an absmax scale.
        E4M3_ABSMAX: float8_e4m3fn with an absmax scale.
        TE: float8_e4m3fn with Transformer Engine's per-tensor current scaling.
        TE_POW2: the same with the scale rounded down to a power of two.
        QMAP: torchao's quantizer (``x / max(amax, 1e-12)``, NaN propagating, into a table of
            values: :mod:`fpsim.replay.qmap`).
        CODEBOOK_LUT: a codebook through bitsandbytes' CPU lookup table of 65536 bins
            (:attr:`fpsim.formats.Codebook.lut_bins`).
    """

    FP32 = 0
    CODEBOOK = 1
    INT = 2
    FLOAT = 3
    INT8_ABSMAX = 4
    E4M3_ABSMAX = 5
    TE = 6
    TE_POW2 = 7
    QMAP = 8
    CODEBOOK_LUT = 9


class Decay(enum.IntEnum):
    """Weight decay of the Adam step (:attr:`fpsim.replay.optim.AdamScalars.mode`, the compiled
    loop's ``mode``, the kernel's constexpr ``DECAY``), PyTorch's two rules
    (torch/optim/adam.py, ``_single_tensor_adam``).

    Attributes:
        NONE: no weight decay.
        DECOUPLED: AdamW: ``p = p * (1 - lr * wd)`` before the update.
        L2: Adam: ``g = g + wd * p`` (one fma).
    """

    NONE = 0
    DECOUPLED = 1
    L2 = 2

    @classmethod
    def of(cls, weight_decay: float, decoupled: bool) -> Decay:
        """The rule of an optimizer with ``weight_decay`` (0: none) and ``decoupled`` (AdamW)."""
        if not weight_decay:
            return cls.NONE
        return cls.DECOUPLED if decoupled else cls.L2


class FactorKind(enum.IntEnum):
    """How a scale rule's elements are scaled before the element cast
    (:func:`fpsim.emulate.scale_rules.apply_factor`; the compiled tally's ``kind``).

    Attributes:
        PRODUCT: float32 ``x * factor`` (Transformer Engine's encode multiplier, NVFP4).
        QUOTIENT: float32 ``x / factor`` (the absmax decode scale).
        POW2: the exact ``x * 2**-e`` (a float64 product, one rounding in the cast; NaN in a
            block whose scale is NaN): the power-of-two E8M0 scales.
    """

    PRODUCT = 0
    QUOTIENT = 1
    POW2 = 2


class DecodeKind(enum.IntEnum):
    """How a scale rule's stored values are decoded (:func:`fpsim.emulate.blocks.decode_array`;
    the compiled tally's ``dkind``).

    Attributes:
        POW2: the exact float64 product of element and scale, rounded once to float32.
        TENSOR: ``f32(f32(v * s) * tensor_scale)`` (NVFP4's block and tensor scales).
        PRODUCT: one float32 product ``v * s``.
    """

    POW2 = 0
    TENSOR = 1
    PRODUCT = 2
