"""An element format and a block scale as the Triton kernels take them: typed tuples.

Every kernel that encodes or decodes an element format receives it as two arguments
instead of a spelled-out list of numbers:

* :class:`FormatArgs`, a runtime tuple of ints (the numbers: mantissa width, emin, codes
  of max / inf / NaN, field masks, the saturate and flush limits), and
* :class:`FormatPaths`, a ``tl.constexpr`` tuple (what changes the code path: integer or
  float, 32-bit, encoding, sign, zero, a target reaching below float32's normal range).

A block recipe's scale numbers (the block and optimizer kernels) are one :class:`ScaleArgs`
tuple. The rounding mode and the overflow rule of an encode are constexpr codes beside them
(:func:`rounding_codes`).

Triton 3.9 passes a ``NamedTuple`` argument field by field and keeps the field names, in
its interpreter and in compiled kernels, so a helper reads ``f.code_max``. Runtime fields
are specialised by value like any int argument (``do_not_specialize`` does not reach
inside a tuple): a field equal to 1 is compiled as a constant and one divisible by 16 is
marked so. The kernels therefore read a field only through ``tl.cast`` (``_intcast.py``'s
``i32`` / ``u32``), which gives the same type for a constant and a runtime value; the
sm_90 compile tests build the specialisation a launch makes. Every value is an int32 bit
pattern (uint32 numbers wrapped, see :func:`~fpsim.kernels.arguments.i32`).

Tested through the kernels, which are compared bit for bit with the emulator (tests/kernels/).
This module imports neither torch nor triton.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from fpsim.formats import AnyFormat, BlockFormat, Codebook, Encoding, Format, IntFormat, RoundMode

from ._codes import Overflow, overflow_code
from .arguments import i32

__all__ = ["FormatArgs", "FormatPaths", "ScaleArgs"]
__all__ += ["element_args", "f32_bits", "format_args", "rounding_codes", "scale_args"]


class FormatArgs(NamedTuple):
    """Runtime numbers of an element format (int32 bit patterns), for encode and decode.

    Float formats use the first 17 fields and integer formats the last six (plus
    ``mant_one`` and the unused defaults); the others hold fixed placeholders.

    Attributes:
        m: mantissa (fraction) bits.
        emin: exponent of the smallest normal binade.
        emin_b: ``emin + 127``, emin in float32's biased exponent.
        d0: ``23 - m``, float32 significand bits below the target's quantum.
        bias: exponent bias.
        code_max: code of the largest finite magnitude.
        inf_lim: codes above it overflow (``code_max``; 0xFFFFFFFF when saturating).
        ftz_lim: codes below it flush to zero after rounding (0 when subnormals are kept).
        mant_one: ``1 << m``, the implicit bit.
        code_inf: code of +inf (0 without inf).
        code_nan: code of the NaN an encode writes (0 without NaN).
        sign_shift: position of the sign bit.
        subn_mask: 0xFFFFFFFF when subnormal codes decode to numbers, 0 when to zero.
        sign_mask: the sign bit as a mask (0 unsigned).
        mag_mask: the magnitude bits (exponent and mantissa fields).
        frac_mask: the mantissa field.
        top_field: the all-ones exponent field.
        fb: integer formats: fraction bits (value = code * 2**-fb).
        ibits: integer formats: width in bits.
        imask: integer formats: ``2**ibits - 1``.
        max_int: integer formats: the largest value.
        lo: integer formats: minus the smallest value.
        clamp: integer formats: 1 clamps out-of-range values (saturate or symmetric), 0 wraps.
    """

    m: int = 0
    emin: int = 0
    emin_b: int = 0
    d0: int = 0
    bias: int = 0
    code_max: int = 0
    inf_lim: int = 0
    ftz_lim: int = 0
    mant_one: int = 1
    code_inf: int = 0
    code_nan: int = 0
    sign_shift: int = 0
    subn_mask: int = 0
    sign_mask: int = 0
    mag_mask: int = 0
    frac_mask: int = 0
    top_field: int = 0
    fb: int = 0
    ibits: int = 8
    imask: int = 255
    max_int: int = 0
    lo: int = 0
    clamp: int = 0


class FormatPaths(NamedTuple):
    """What of an element format changes the kernels' code path (a ``tl.constexpr`` tuple).

    Attributes:
        IS_INT: an :class:`~fpsim.IntFormat` (two's complement or unsigned integers).
        BITS32: 32 bits wide (codes are float32 / int32 bit patterns as they are).
        ENC: the format's :attr:`~fpsim.formats.Encoding.code`.
        SIGNED: has a sign bit.
        HAS_ZERO: has a zero (False for E8M0: field 0 is the normal ``2**emin``).
        EMIN_LOW: reaches below float32's smallest normal (``emin < -126``).
    """

    IS_INT: bool = False
    BITS32: bool = False
    ENC: int = Encoding.IEEE.code
    SIGNED: bool = False
    HAS_ZERO: bool = True
    EMIN_LOW: bool = False


def format_args(
    fmt: AnyFormat, *, saturate: bool = False, ftz: bool = False
) -> tuple[FormatArgs, FormatPaths]:
    """The kernels' two tuples for ``fmt``, as the emulator's encode and decode read it.

    Follows :func:`fpsim.emulate._bitcore.encode_float` / ``encode_int`` (limits) and
    :func:`fpsim.emulate.element.decode` (fields); tested through the kernels, which are
    compared bit for bit with the emulator.

    Args:
        fmt: a :class:`~fpsim.Format` or :class:`~fpsim.IntFormat`.
        saturate: clamp out-of-range values to +-max (integers: clamp instead of wrapping).
        ftz: flush subnormal results to zero after rounding.

    Returns:
        ``(FormatArgs, FormatPaths)``; the numbers are int32 bit patterns.
    """
    if isinstance(fmt, IntFormat):
        args = FormatArgs(
            fb=fmt.fraction_bits,
            ibits=fmt.bits,
            imask=i32((1 << fmt.bits) - 1),
            max_int=i32(fmt.max_int),
            lo=i32(-fmt.min_int),
            clamp=int(saturate or fmt.symmetric),
        )
        return args, FormatPaths(IS_INT=True, BITS32=fmt.bits == 32, SIGNED=fmt.signed)
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    args = FormatArgs(
        m=m,
        emin=fmt.min_exponent,
        emin_b=fmt.min_exponent + 127,
        d0=23 - m,
        bias=fmt.bias,
        code_max=i32(fmt.code_of_max),
        inf_lim=i32(0xFFFFFFFF if saturate else fmt.code_of_max),
        ftz_lim=(1 << m) if ftz and m > 0 else 0,
        mant_one=1 << m,
        code_inf=i32(fmt.code_of_inf or 0),
        code_nan=i32(fmt.code_of_nan or 0),
        sign_shift=e + m,
        subn_mask=i32(0xFFFFFFFF if fmt.subnormals else 0),
        sign_mask=i32(fmt.sign_mask),
        mag_mask=i32((1 << (e + m)) - 1),
        frac_mask=(1 << m) - 1,
        top_field=(1 << e) - 1,
    )
    paths = FormatPaths(
        BITS32=fmt.bits == 32,
        ENC=fmt.encoding.code,
        SIGNED=fmt.signed,
        HAS_ZERO=fmt.has_zero,
        EMIN_LOW=fmt.min_exponent < -126,
    )
    return args, paths


def element_args(bf: BlockFormat) -> tuple[FormatArgs, FormatPaths]:
    """The tuples of ``bf``'s element format as a block encode casts the scaled elements:
    saturating, subnormal results flushed where the element has none
    (:func:`fpsim.emulate.blocks.encode_blocks`); placeholders for a codebook, whose kernels
    look the nearest entry up instead of casting."""
    el = bf.element
    if isinstance(el, Codebook):
        return FormatArgs(), FormatPaths()
    return format_args(el, saturate=True, ftz=not getattr(el, "subnormals", True))


def rounding_codes(fmt: AnyFormat, mode: RoundMode) -> tuple[int, int]:
    """The constexprs ``(MODE, OVF)`` of an encode of ``fmt`` rounded in ``mode``: the mode's
    :attr:`~fpsim.formats.RoundMode.code` and where overflow goes
    (:func:`~fpsim.kernels._codes.overflow_code`; integers: nowhere, they clamp or wrap)."""
    ovf = overflow_code(fmt, mode) if isinstance(fmt, Format) else Overflow.NOWHERE
    return mode.code, int(ovf)


class ScaleArgs(NamedTuple):
    """Runtime numbers of a block recipe's scale rule (int32; floats as float32 bit patterns).

    Attributes:
        elem_max_bits: the largest element magnitude (:attr:`~fpsim.formats.BlockFormat.elem_max`).
        eps_bits: the amax floor (:attr:`~fpsim.formats.BlockFormat.eps`).
        inv_max_bits: ``f32(1 / elem_max)`` (MX_RCEIL).
        emax: ``floor(log2(elem_max))``, the element's largest exponent (MX rules).
        even_inc: ``2**(22 - m)`` (MX_EVEN, ``m`` the element's mantissa bits): added to
            amax's bits before they are cut to the exponent, it rounds amax to the element's
            precision first.
    """

    elem_max_bits: int = 0
    eps_bits: int = 0
    inv_max_bits: int = 0
    emax: int = 0
    even_inc: int = 0


def f32_bits(v: float) -> int:
    """The bits of ``float32(v)`` as an int32 (a float argument of a kernel)."""
    return int(np.float32(v).view(np.int32))


def scale_args(bf: BlockFormat) -> ScaleArgs:
    """The :class:`ScaleArgs` of ``bf`` as :mod:`fpsim.emulate.scale_rules` reads the recipe."""
    el = bf.element
    m = el.mantissa_bits if isinstance(el, Format) else (el.bits - 2 if isinstance(el, IntFormat) else 0)
    return ScaleArgs(
        elem_max_bits=f32_bits(bf.elem_max),
        eps_bits=f32_bits(bf.eps),
        inv_max_bits=f32_bits(1 / bf.elem_max),
        emax=math.frexp(bf.elem_max)[1] - 1,
        even_inc=i32(1 << (22 - m)),
    )
