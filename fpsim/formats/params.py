"""An element format's numbers as the compiled loops and the Triton kernels read them: one tuple.

The numba loops (:mod:`fpsim._compiled.measure`), the Triton cast, block and optimizer
kernels (:mod:`fpsim.kernels`) and the Triton accumulation kernel take a format as one
:class:`FormatParams`, built from a :class:`~fpsim.formats.Format` or
:class:`~fpsim.formats.IntFormat` by :func:`format_params` and nowhere else. Each tier reads
the fields it needs by name (numba and the accumulation kernel by their position in
``FormatParams._fields``); none has a tuple of its own. How each one receives it:

* numba: ``tuple(params)``, a plain tuple of int64 (:func:`fpsim.emulate.element.loop_params`;
  a ``NamedTuple`` argument costs numba about 12 us more per call).
* Triton cast, block and optimizer kernels: the tuple itself, with the 32-bit words as int32
  bit patterns (:func:`fpsim.kernels.format_args.format_args`), beside the constexpr
  :class:`~fpsim.kernels.format_args.FormatPaths` derived from it.
* Triton accumulation kernel: a row of its int64 parameter tensor, one per format.

Every field is an int (flags 0 or 1). The derived numbers (masks, limits) are computed here
once, so no tier derives them again per call or per program.

The fields keep their positions for good: a new field is appended and none is moved, because
numba caches the compiled loops on disk with the positions frozen in and checks only the
loops' own file for changes (tests/formats/test_params.py pins the order).

This module imports neither numba nor triton. Tested in tests/formats/test_params.py
(each field against ml_dtypes' ``finfo``/``iinfo`` and the format's spec numbers) and
through every loop and kernel, which are compared bit for bit with the numpy tier.
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

import numpy as np

from .element import AnyFormat, Format, IntFormat

__all__ = ["FormatParams", "format_params"]


class FormatParams(NamedTuple):
    """The numbers of an element format and of the encode options it is cast with.

    Attributes:
        is_int: an :class:`~fpsim.IntFormat`.
        signed: has a sign bit.
        has_zero: has a zero (0 for E8M0, whose field 0 is the normal ``2**emin``).
        has_nan: has a NaN code.
        enc: the :attr:`~fpsim.formats.Encoding.code` (0 for integers).
        bits: width in bits.
        e, m: exponent and mantissa (trailing significand) bits of a float format.
        emin: exponent of the smallest normal binade.
        bias: exponent bias.
        code_max, code_inf, code_nan: codes of the largest finite magnitude, of +inf and of
            the NaN an encode writes (0: none).
        subnormal: subnormal codes decode to numbers (subnormals kept, a zero, a mantissa).
        fast: signed with a zero (nearest-even and stochastic rounding have a fast path in
            the numba loops).
        wide: a float format wider than 16 bits (the numba loops have no decode table for it).
        frac: integer formats: fraction bits (value = code * 2**-frac).
        max_int, min_int: integer formats: the range.
        saturate: the encode clamps out-of-range values to +-max.
        ftz: the encode flushes subnormal results to zero.
        clamp: integer formats clamp out-of-range values (saturate or symmetric), else wrap.
        emin_b: ``emin + 127``, emin as float32's biased exponent.
        d0: ``23 - m``, float32 significand bits below the format's quantum.
        inf_lim: magnitude codes above it overflow (``code_max``; 0xFFFFFFFF when saturating).
        ftz_lim: magnitude codes below it flush to zero (``2**m`` under ``ftz``, else 0).
        mant_one: ``2**m``, the implicit bit.
        sign_shift: position of the sign bit (``e + m``).
        subn_mask: the mantissa mask of a subnormal code (0xFFFFFFFF when ``subnormal``, 0).
        sign_mask: the sign bit (0 unsigned).
        mag_mask: the magnitude bits (exponent and mantissa fields).
        frac_mask: the mantissa field.
        top_field: the all-ones exponent field.
        imask: ``2**bits - 1``.
        f64_min_normal, f64_max: float64 bit patterns of the smallest normal and the largest
            finite value (float formats; the accumulation kernel's bounds).
    """

    is_int: int = 0
    signed: int = 0
    has_zero: int = 1
    has_nan: int = 0
    enc: int = 0
    bits: int = 8
    e: int = 0
    m: int = 0
    emin: int = 0
    bias: int = 0
    code_max: int = 0
    code_inf: int = 0
    code_nan: int = 0
    subnormal: int = 0
    fast: int = 0
    wide: int = 0
    frac: int = 0
    max_int: int = 0
    min_int: int = 0
    saturate: int = 0
    ftz: int = 0
    clamp: int = 0
    emin_b: int = 0
    d0: int = 0
    inf_lim: int = 0
    ftz_lim: int = 0
    mant_one: int = 1
    sign_shift: int = 0
    subn_mask: int = 0
    sign_mask: int = 0
    mag_mask: int = 0
    frac_mask: int = 0
    top_field: int = 0
    imask: int = 255
    f64_min_normal: int = 0
    f64_max: int = 0


def _f64_bits(v: float) -> int:
    return int(np.float64(v).view(np.int64))


@cache
def format_params(fmt: AnyFormat, *, saturate: bool = False, ftz: bool = False) -> FormatParams:
    """The :class:`FormatParams` of ``fmt`` encoded with ``saturate`` and ``ftz``.

    Follows :func:`fpsim.emulate._bitcore.encode_float` / ``encode_int`` (limits) and
    :func:`fpsim.emulate.element.decode` (fields).

    Args:
        fmt: a :class:`~fpsim.Format` or :class:`~fpsim.IntFormat`.
        saturate: clamp out-of-range values to +-max (integers: clamp instead of wrapping).
        ftz: flush subnormal results to zero after rounding.

    Returns:
        The tuple; uint32 words as they are (non-negative), not as int32 bit patterns.
    """
    saturate, ftz = bool(saturate), bool(ftz)
    if isinstance(fmt, IntFormat):
        return FormatParams(
            is_int=1,
            signed=int(fmt.signed),
            bits=fmt.bits,
            frac=fmt.fraction_bits,
            max_int=int(fmt.max_int),
            min_int=int(fmt.min_int),
            saturate=int(saturate),
            ftz=int(ftz),
            clamp=int(saturate or fmt.symmetric),
            imask=(1 << fmt.bits) - 1,
        )
    if not isinstance(fmt, Format):
        raise TypeError(f"format_params: fmt must be a Format or IntFormat, got {type(fmt).__name__} {fmt!r}")
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    subnormal = fmt.subnormals and fmt.has_zero and m > 0
    return FormatParams(
        signed=int(fmt.signed),
        has_zero=int(fmt.has_zero),
        has_nan=int(fmt.has_nan),
        enc=fmt.encoding.code,
        bits=fmt.bits,
        e=e,
        m=m,
        emin=fmt.min_exponent,
        bias=fmt.bias,
        code_max=int(fmt.code_of_max),
        code_inf=int(fmt.code_of_inf or 0),
        code_nan=int(fmt.code_of_nan or 0),
        subnormal=int(subnormal),
        fast=int(fmt.signed and fmt.has_zero),
        wide=int(fmt.bits > 16),
        saturate=int(saturate),
        ftz=int(ftz),
        emin_b=fmt.min_exponent + 127,
        d0=23 - m,
        inf_lim=0xFFFFFFFF if saturate else int(fmt.code_of_max),
        ftz_lim=(1 << m) if ftz and m > 0 else 0,
        mant_one=1 << m,
        sign_shift=e + m,
        subn_mask=0xFFFFFFFF if subnormal else 0,
        sign_mask=int(fmt.sign_mask),
        mag_mask=(1 << (e + m)) - 1,
        frac_mask=(1 << m) - 1,
        top_field=(1 << e) - 1,
        imask=(1 << fmt.bits) - 1,
        f64_min_normal=_f64_bits(fmt.min_normal),
        f64_max=_f64_bits(fmt.max),
    )
