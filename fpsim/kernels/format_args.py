"""An element format and a block scale as the Triton kernels take them: typed tuples.

Every kernel that encodes or decodes an element format receives it as two arguments
instead of a spelled-out list of numbers:

* the format's :class:`~fpsim.formats.params.FormatParams`, the one tuple of a format's
  numbers that the numba loops read too (mantissa width, emin, codes of max / inf / NaN,
  field masks, the saturate and flush limits), as a runtime argument, and
* :class:`FormatPaths`, a ``tl.constexpr`` tuple derived from it (what changes the code
  path: integer or float, 32-bit, encoding, sign, zero, a target reaching below float32's
  normal range).

A block recipe's scale numbers (the block and optimizer kernels) are one :class:`ScaleArgs`
tuple. The rounding mode and the overflow rule of an encode are constexpr codes beside them
(:func:`rounding_codes`).

Triton 3.9 passes a ``NamedTuple`` argument field by field and keeps the field names, in
its interpreter and in compiled kernels, so a helper reads ``f.code_max``. Runtime fields
are specialised by value like any int argument (``do_not_specialize`` does not reach
inside a tuple): a field equal to 1 is compiled as a constant and one divisible by 16 is
marked so. The kernels therefore read a field only through ``tl.cast`` (``_intcast.py``'s
``i32`` / ``u32``), which gives the same type for a constant and a runtime value; the
sm_90 compile tests build the specialisation a launch makes. Every 32-bit word is passed as
an int32 bit pattern (uint32 numbers wrapped, see :func:`~fpsim.kernels.arguments.i32`), so
its type does not depend on the format; the two float64 bit patterns are int64.

Tested through the kernels, which are compared bit for bit with the emulator (tests/kernels/).
This module imports neither torch nor triton.
"""

from __future__ import annotations

import math
from functools import cache
from typing import NamedTuple

import numpy as np

from fpsim.formats import AnyFormat, BlockFormat, Codebook, Encoding, Format, IntFormat, RoundMode
from fpsim.formats.params import FormatParams, format_params

from ._codes import Overflow, overflow_code
from .arguments import i32

__all__ = ["FormatPaths", "ScaleArgs"]
__all__ += ["element_args", "f32_bits", "format_args", "rounding_codes", "scale_args"]


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

    @classmethod
    def of(cls, p: FormatParams) -> FormatPaths:
        """The code paths of the format whose numbers are ``p``."""
        return cls(
            IS_INT=bool(p.is_int),
            BITS32=p.bits == 32,
            ENC=p.enc,
            SIGNED=bool(p.signed),
            HAS_ZERO=bool(p.has_zero),
            EMIN_LOW=p.emin < -126,
        )


_WIDE_FIELDS = ("f64_min_normal", "f64_max")
"""float64 bit patterns: passed as int64, not wrapped to 32 bits."""


@cache
def format_args(
    fmt: AnyFormat, *, saturate: bool = False, ftz: bool = False
) -> tuple[FormatParams, FormatPaths]:
    """The kernels' two tuples for ``fmt``: its :class:`~fpsim.formats.params.FormatParams`
    (from :func:`~fpsim.formats.params.format_params`, the tuple the numba loops read) with
    every 32-bit word as an int32 bit pattern, and the :class:`FormatPaths` derived from it.

    Tested through the kernels, which are compared bit for bit with the emulator.

    Args:
        fmt: a :class:`~fpsim.Format` or :class:`~fpsim.IntFormat`.
        saturate: clamp out-of-range values to +-max (integers: clamp instead of wrapping).
        ftz: flush subnormal results to zero after rounding.
    """
    p = format_params(fmt, saturate=saturate, ftz=ftz)
    words = p._replace(**{k: i32(v) for k, v in p._asdict().items() if k not in _WIDE_FIELDS})
    return words, FormatPaths.of(p)


_PLACEHOLDER = (FormatParams(), FormatPaths.of(FormatParams()))


def element_args(bf: BlockFormat) -> tuple[FormatParams, FormatPaths]:
    """The tuples of ``bf``'s element format as a block encode casts the scaled elements:
    saturating, subnormal results flushed where the element has none
    (:func:`fpsim.emulate.blocks.encode_blocks`); placeholders for a codebook, whose kernels
    look the nearest entry up instead of casting."""
    el = bf.element
    if isinstance(el, Codebook):
        return _PLACEHOLDER
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
