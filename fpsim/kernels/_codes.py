"""The integer codes the Triton kernels take as ``tl.constexpr`` arguments, defined once.

The codes fpsim's other tiers share are numbered where the choice is defined, and the kernels
read them from there: a rounding mode's ``MODE`` is :attr:`fpsim.formats.RoundMode.code`, a
float format's ``ENC`` is :attr:`fpsim.formats.Encoding.code`, an optimizer state's ``M_KIND``
and ``V_KIND`` are :class:`fpsim.formats.codes.StateKind` and Adam's ``DECAY`` is
:class:`fpsim.formats.codes.Decay` (re-exported here). The codes only the kernels take are
numbered below: where an overflow goes, the input dtype, the source of random words, the scale
rule of a block kernel (the scale rules' :attr:`~fpsim.formats.ScaleRule.code` and the
codebook's), the compensation and random words of the accumulation kernel. The host
maps fpsim's choices to these codes here and passes them to the kernels as plain ints. The
kernel files compare with module-level ``tl.constexpr`` copies of these values (``_NEAREST_EVEN
= tl.constexpr(RoundMode.NEAREST_EVEN.code)``, ``_TE = tl.constexpr(int(Rule.TE))`` and the
like): the Triton 3.9 compiler refuses a global that is not a ``tl.constexpr`` (an enum class
included) inside ``@triton.jit`` code, although the interpreter accepts one.

This module imports neither torch nor triton.
"""

from __future__ import annotations

import enum

from fpsim.formats import BlockFormat, Codebook, Encoding, Format, IntFormat, RoundMode, ScaleRule
from fpsim.formats.codes import Decay, StateKind

__all__ = [
    "Overflow",
    "Source",
    "Random",
    "Rule",
    "BLOCK_KERNEL_RULES",
    "CODEBOOK_RULE",
    "StateKind",
    "Decay",
    "Comp",
    "Words",
    "overflow_code",
    "rule_code",
    "state_kind",
]


class Overflow(enum.IntEnum):
    """Where a value beyond the largest finite code goes (constexpr ``OVF``, IEEE 754-2019
    section 7.4); everything else saturates to the largest finite code.

    Attributes:
        NOWHERE: finite formats: nothing goes to infinity.
        POSITIVE: toward +inf: positives only (and infinite inputs).
        NEGATIVE: toward -inf: negatives only (and infinite inputs).
        ALWAYS: nearest and stochastic rounding: every overflow.
        INF_INPUTS: toward zero and odd: only infinite inputs.
    """

    NOWHERE = 0
    POSITIVE = 1
    NEGATIVE = 2
    ALWAYS = 3
    INF_INPUTS = 4


class Source(enum.IntEnum):
    """Input dtype of a cast kernel (constexpr ``SRC``, ``P_SRC``, ``G_SRC``).

    Attributes:
        FLOAT32: float32 bits viewed as int32.
        FLOAT16: float16 bits viewed as int16, widened exactly in the kernel.
        BFLOAT16: bfloat16 bits viewed as int16, the top half of a float32.
    """

    FLOAT32 = 0
    FLOAT16 = 1
    BFLOAT16 = 2


class Random(enum.IntEnum):
    """Source of the random words of stochastic rounding (constexpr ``RAND``).

    Attributes:
        NONE: no random words (deterministic rounding).
        LOADED: uint32 words loaded from a tensor of the input's shape.
        PHILOX: Philox4x32-10 of (seed, flat index), the words of ``tl.randint``.
    """

    NONE = 0
    LOADED = 1
    PHILOX = 2


CODEBOOK_RULE = 7
"""The block kernel's ``RULE`` for codebook elements (bitsandbytes: the nearest codebook entry
of ``x / absmax``), beside the scale rules' own numbers; no :class:`ScaleRule` takes it."""

Rule = enum.IntEnum("Rule", {**{r.name: r.code for r in ScaleRule}, "CODEBOOK": CODEBOOK_RULE})
Rule.__doc__ = """Scale rule of a block kernel (constexpr ``RULE``): each :class:`~fpsim.formats.ScaleRule`
under its own name and :attr:`~fpsim.formats.ScaleRule.code`, and CODEBOOK."""
Rule.__module__ = __name__

BLOCK_KERNEL_RULES = frozenset(ScaleRule)
"""The scale rules whose arithmetic the block kernel has (``_blocks_kernel.py``); the host
refuses the others (:func:`rule_code`) instead of running another rule's branch."""


class Comp(enum.IntEnum):
    """Compensated summation of the accumulation kernel (constexpr ``COMP``;
    :class:`fpsim.accumulate.Compensation`)."""

    NONE = 0
    KAHAN = 1
    NEUMAIER = 2


class Words(enum.IntEnum):
    """Source of the accumulation kernel's random words (constexprs ``RAND``, accumulator and promotion
    roundings, and ``QRAND``, product roundings).

    Attributes:
        NONE: no stochastic rounding.
        LOADED: uint32 words loaded from the ``random_bits`` tensor (``RAND`` only).
        SPLITMIX64: SplitMix64 of (seed stream, index), as
            :func:`fpsim.emulate.random.random_bits_at`, computed in the kernel.
    """

    NONE = 0
    LOADED = 1
    SPLITMIX64 = 2


def overflow_code(fmt: Format, mode: RoundMode) -> Overflow:
    """Where overflow goes for a float format rounded in ``mode``."""
    if fmt.encoding is Encoding.FINITE:
        return Overflow.NOWHERE
    if mode in (RoundMode.TOWARD_ZERO, RoundMode.ODD):
        return Overflow.INF_INPUTS
    if mode is RoundMode.TOWARD_POSITIVE:
        return Overflow.POSITIVE
    if mode is RoundMode.TOWARD_NEGATIVE:
        return Overflow.NEGATIVE
    return Overflow.ALWAYS


def rule_code(bf: BlockFormat) -> Rule:
    """The block kernel's rule of a recipe: its scale rule, or CODEBOOK for codebook elements.

    Raises:
        ValueError: a scale rule whose arithmetic the block kernel does not have
            (:data:`BLOCK_KERNEL_RULES`).
    """
    if isinstance(bf.element, Codebook):
        return Rule.CODEBOOK
    if bf.rule not in BLOCK_KERNEL_RULES:
        known = ", ".join(f"ScaleRule.{r.name}" for r in ScaleRule if r in BLOCK_KERNEL_RULES)
        raise ValueError(
            f"{bf.name}: the Triton block kernel has no scale rule ScaleRule.{bf.rule.name} "
            f"(use fpsim.emulate.blocks); it has {known}"
        )
    return Rule[bf.rule.name]


def state_kind(bf: BlockFormat | None) -> StateKind:
    """How an optimizer state of recipe ``bf`` is stored (None: FP32)."""
    if bf is None:
        return StateKind.FP32
    if isinstance(bf.element, Codebook):
        return StateKind.CODEBOOK
    return StateKind.INT if isinstance(bf.element, IntFormat) else StateKind.FLOAT
