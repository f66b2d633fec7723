"""The integer codes the Triton kernels take as ``tl.constexpr`` arguments, defined once.

The host maps fpsim's choices (:class:`~fpsim.formats.RoundMode`, :class:`~fpsim.formats.Encoding`,
:class:`~fpsim.formats.ScaleRule`, the kind of a block element, the input dtype, the source of
random words, where an overflow goes, the optimizer's weight decay) to these codes here, in
one place, and passes them to the kernels as plain ints. The kernel files compare with
module-level ``tl.constexpr`` copies of these values (``_NEAREST_EVEN = tl.constexpr(int(
Round.NEAREST_EVEN))`` and the like): the Triton 3.9 compiler refuses a global that is not a
``tl.constexpr`` (an enum class included) inside ``@triton.jit`` code, although the
interpreter accepts one.

This module imports neither torch nor triton.
"""

from __future__ import annotations

import enum

from fpsim.formats import BlockFormat, Codebook, Encoding, Format, IntFormat, RoundMode, ScaleRule

__all__ = [
    "Round",
    "Enc",
    "Overflow",
    "Source",
    "Random",
    "Rule",
    "StateKind",
    "Decay",
    "Comp",
    "Words",
    "round_code",
    "enc_code",
    "overflow_code",
    "rule_code",
    "state_kind",
    "decay_code",
]


class Round(enum.IntEnum):
    """Rounding mode of a cast (constexpr ``MODE``; also ``PMODE``/``QMODE`` of the matmul).

    Attributes:
        NEAREST_EVEN: to nearest, ties to even (IEEE 754-2019 roundTiesToEven).
        NEAREST_AWAY: to nearest, ties away from zero (roundTiesToAway).
        TOWARD_ZERO: truncation (roundTowardZero).
        TOWARD_POSITIVE: up (roundTowardPositive).
        TOWARD_NEGATIVE: down (roundTowardNegative).
        STOCHASTIC: away from zero with probability of the discarded fraction, from the
            element's random word.
        ODD: truncate and set the last kept bit when inexact (rounding to odd).
    """

    NEAREST_EVEN = 0
    NEAREST_AWAY = 1
    TOWARD_ZERO = 2
    TOWARD_POSITIVE = 3
    TOWARD_NEGATIVE = 4
    STOCHASTIC = 5
    ODD = 6


class Enc(enum.IntEnum):
    """Special-value encoding of a float format (constexpr ``ENC``; :class:`~fpsim.formats.Encoding`).

    Attributes:
        IEEE: +-inf and NaNs in the top binade.
        FN: no infinities; the all-ones magnitude is NaN.
        FNUZ: no infinities, no negative zero; the negative-zero code is NaN.
        FINITE: no infinities, no NaN (NaN inputs encode as +0).
    """

    IEEE = 0
    FN = 1
    FNUZ = 2
    FINITE = 3


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


class Rule(enum.IntEnum):
    """Scale rule of a block kernel (constexpr ``RULE``; :class:`~fpsim.formats.ScaleRule`).

    Attributes:
        TE: Transformer Engine ``compute_scale_from_amax`` (per tensor, row or tile).
        ABSMAX: linear block scaling ``s = max(amax, eps) / elem_max``, elements ``x / s``.
        MX_FLOOR: OCP MX shared exponent ``floor(log2 amax) - emax``.
        MX_CEIL: the MX exponent rounded up when amax is no power of two.
        MX_EVEN: the MX exponent of amax rounded to the element format's precision first.
        MX_RCEIL: the exponent of ``amax / elem_max`` rounded up (NVIDIA's RCEIL).
        NVFP4: a float8_e4m3fn scale per 16 elements under a float32 tensor scale.
        CODEBOOK: bitsandbytes: the nearest codebook entry of ``x / absmax``.
    """

    TE = 0
    ABSMAX = 1
    MX_FLOOR = 2
    MX_CEIL = 3
    MX_EVEN = 4
    MX_RCEIL = 5
    NVFP4 = 6
    CODEBOOK = 7


class StateKind(enum.IntEnum):
    """Storage of an optimizer state (constexpr ``M_KIND``, ``V_KIND``).

    Attributes:
        FP32: float32 values, no scales.
        CODEBOOK: bitsandbytes codebook codes, nearest entry of ``x / absmax``.
        INT: integer element codes under an ABSMAX float32 scale per block.
        FLOAT: float element codes under an ABSMAX float32 scale per block.
    """

    FP32 = 0
    CODEBOOK = 1
    INT = 2
    FLOAT = 3


class Decay(enum.IntEnum):
    """Weight decay of the Adam step (constexpr ``DECAY``; :class:`fpsim.replay.optim.Adam`).

    Attributes:
        NONE: no weight decay.
        DECOUPLED: AdamW: ``p = p * (1 - lr * wd)`` before the update.
        L2: Adam: ``g = g + wd * p`` (one fma).
    """

    NONE = 0
    DECOUPLED = 1
    L2 = 2


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


_ROUND = {m: Round[m.name] for m in RoundMode}
_ENC = {e: Enc[e.name] for e in Encoding}
_RULE = {r: Rule[r.name] for r in ScaleRule}


def round_code(mode: RoundMode) -> Round:
    """The kernels' code of a rounding mode."""
    return _ROUND[mode]


def enc_code(encoding: Encoding) -> Enc:
    """The kernels' code of a float format's encoding."""
    return _ENC[encoding]


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
    """The block kernel's rule of a recipe: its scale rule, or CODEBOOK for codebook elements."""
    return Rule.CODEBOOK if isinstance(bf.element, Codebook) else _RULE[bf.rule]


def state_kind(bf: BlockFormat | None) -> StateKind:
    """How an optimizer state of recipe ``bf`` is stored (None: FP32)."""
    if bf is None:
        return StateKind.FP32
    if isinstance(bf.element, Codebook):
        return StateKind.CODEBOOK
    return StateKind.INT if isinstance(bf.element, IntFormat) else StateKind.FLOAT


def decay_code(weight_decay: float, decoupled: bool) -> Decay:
    """The Adam step's decay code: none, decoupled (AdamW) or L2 (Adam)."""
    if not weight_decay:
        return Decay.NONE
    return Decay.DECOUPLED if decoupled else Decay.L2
