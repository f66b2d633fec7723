"""Number formats: what a code means, described by a few primitive fields.

A :class:`Format` is a binary floating-point format (IEEE 754-2019 section 3.3 style: sign,
biased exponent, trailing significand) plus the convention for its top codes (OCP FP8 v1.0
section 5.1 for the ``fn`` formats, the AMD/Graphcore ``fnuz`` variants, OCP MX v1.0 section
5.3 for the finite-only FP6/FP4 formats and section 5.4 for E8M0). An :class:`IntFormat` is a
two's-complement or unsigned integer. Everything else (max, tiny, eps, codes of special values)
is a derived property, checked against ``ml_dtypes.finfo`` in the tests.

Names follow ml_dtypes. Variants are made with :func:`dataclasses.replace`, for example
``replace(get_format("float16"), name="float16_ftz", subnormals=False)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .codes import NumberedEnum

__all__ = [
    "Encoding",
    "Format",
    "IntFormat",
    "AnyFormat",
    "FORMATS",
]


def check_name(name: object, kind: str) -> str:
    """``name`` if it is a non-empty str, else TypeError/ValueError naming ``kind``'s ``name`` argument."""
    if not isinstance(name, str):
        raise TypeError(f"{kind}: name must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise ValueError(f"{kind}: name must be a non-empty str")
    return name


def check_int(value: object, arg: str, where: str) -> int:
    """``value`` as an int if it is one (Python or numpy integer, not bool), else TypeError naming ``arg``."""
    if isinstance(value, bool) or not hasattr(value, "__index__") or isinstance(value, float):
        raise TypeError(f"{where}: {arg} must be an int, got {type(value).__name__} {value!r}")
    return int(value.__index__())  # type: ignore[attr-defined]


def check_bool(value: object, arg: str, where: str) -> bool:
    """``value`` if it is True or False (numpy bools too), else TypeError naming ``arg``."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise TypeError(f"{where}: {arg} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


class Encoding(NumberedEnum):
    """How a float format uses its top codes.

    Attributes:
        IEEE: exponent field all ones holds +-inf (trailing significand 0) and NaNs
            (IEEE 754-2019 section 3.4). float32, float16, bfloat16, float8_e5m2, ...
        FN: finite, no inf; only the all-ones magnitude code is NaN, one per sign
            (OCP FP8 v1.0 E4M3; OCP MX v1.0 E8M0, unsigned, 0xFF).
        FNUZ: finite, no inf, no negative zero; the negative-zero code is the only NaN
            (float8_e4m3fnuz, float8_e5m2fnuz).
        FINITE: every code is a number; no inf, no NaN (OCP MX v1.0 FP6 and FP4).

    Each member is its name (``value``) and its :attr:`code`, the integer the compiled loops
    and the Triton kernels number it by; those read it from here (tests/formats/test_codes.py).
    """

    IEEE = "ieee", 0
    FN = "fn", 1
    FNUZ = "fnuz", 2
    FINITE = "finite", 3


@dataclass(frozen=True)
class Format:
    """A binary floating-point format.

    Args:
        name: the ml_dtypes spelling where ml_dtypes has the format.
        exponent_bits: width of the biased exponent field (>= 1).
        mantissa_bits: width of the trailing significand field (>= 0).
        bias: exponent bias; a normal code with exponent field ``E`` is ``2**(E - bias)``
            times ``1.f``.
        signed: whether there is a sign bit (E8M0 has none).
        encoding: how the top codes are used, see :class:`Encoding`.
        subnormals: whether exponent field 0 with a nonzero significand is a subnormal
            number. When False, such codes decode to zero and encoding flushes subnormal
            results to zero after rounding, as hardware flush-to-zero does (PTX ``.ftz``).
        has_zero: whether exponent field 0 is reserved for zero and subnormals. False only
            for scale formats such as E8M0, whose field 0 is the normal ``2**-bias``.

    The values must be exact in float32 (decode returns float32), so the format needs at
    most 24 significant bits and a range inside float32's, subnormals included.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    signed: bool = True
    encoding: Encoding = Encoding.IEEE
    subnormals: bool = True
    has_zero: bool = True

    def __post_init__(self) -> None:
        where = f"Format {check_name(self.name, 'Format')!r}"
        for f in ("exponent_bits", "mantissa_bits", "bias"):
            object.__setattr__(self, f, check_int(getattr(self, f), f, where))
        for f in ("signed", "subnormals", "has_zero"):
            check_bool(getattr(self, f), f, where)
        e, m = self.exponent_bits, self.mantissa_bits
        if not isinstance(self.encoding, Encoding):
            allowed = ", ".join(f"Encoding.{v.name}" for v in Encoding)
            raise TypeError(f"{where}: encoding must be an Encoding ({allowed}), got {self.encoding!r}")
        if e < 1 or m < 0:
            raise ValueError(f"Format {self.name!r}: need exponent_bits >= 1 and mantissa_bits >= 0")
        if self.bits > 32:
            raise ValueError(f"Format {self.name!r}: at most 32 bits, got {self.bits}")
        if self.encoding is Encoding.IEEE and m < 1:
            raise ValueError(f"Format {self.name!r}: IEEE encoding needs mantissa_bits >= 1 for NaN")
        if self.encoding is Encoding.FNUZ and not self.signed:
            raise ValueError(f"Format {self.name!r}: FNUZ puts NaN at the negative-zero code; needs a sign")
        if not self.has_zero and self.subnormals and m > 0:
            raise ValueError(f"Format {self.name!r}: has_zero=False leaves no room for subnormals")
        if self.max_exponent < self.min_exponent:
            raise ValueError(f"Format {self.name!r}: no finite normal binade")
        if m > 23 or self.max_exponent > 127 or self.min_exponent - m < -149:
            raise ValueError(
                f"Format {self.name!r}: values must be exact in float32 (<= 23 mantissa bits, "
                f"exponents in [-149, 127]); got emin={self.min_exponent}, emax={self.max_exponent}"
            )

    # --- layout -------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Total width of a code."""
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def bytes_per_element(self) -> float:
        """Storage per element, ``bits / 8`` (0.5 for FP4, 0.75 for FP6)."""
        return self.bits / 8

    @property
    def code_dtype(self) -> str:
        """numpy name of the unsigned integer dtype that holds one code."""
        return "uint8" if self.bits <= 8 else "uint16" if self.bits <= 16 else "uint32"

    @property
    def sign_mask(self) -> int:
        """The sign bit of a code (0 for unsigned formats)."""
        return (1 << (self.exponent_bits + self.mantissa_bits)) if self.signed else 0

    # --- range --------------------------------------------------------------------------
    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal binade (``finfo.minexp``)."""
        return (1 if self.has_zero else 0) - self.bias

    @property
    def max_exponent(self) -> int:
        """Exponent of the largest finite binade (``finfo.maxexp - 1``)."""
        top = (1 << self.exponent_bits) - 1
        if self.encoding is Encoding.IEEE or (self.encoding is Encoding.FN and self.mantissa_bits == 0):
            top -= 1
        return top - self.bias

    @property
    def code_of_max(self) -> int:
        """Code of the largest finite positive value."""
        m = self.mantissa_bits
        top = (1 << (self.exponent_bits + m)) - 1
        if self.encoding is Encoding.IEEE:
            return top - (1 << m)
        if self.encoding is Encoding.FN:
            return top - 1
        return top

    @property
    def code_of_nan(self) -> int | None:
        """The NaN code fpsim produces for a positive NaN (None when the format has none).

        IEEE: exponent all ones with the quiet bit (the top significand bit) set; FN: all
        ones; FNUZ: the negative-zero code. Negative NaNs set the sign bit, except FNUZ.
        """
        m, full = self.mantissa_bits, (1 << (self.exponent_bits + self.mantissa_bits)) - 1
        if self.encoding is Encoding.IEEE:
            return (full - ((1 << m) - 1)) | (1 << (m - 1))
        if self.encoding is Encoding.FN:
            return full
        if self.encoding is Encoding.FNUZ:
            return self.sign_mask
        return None

    @property
    def code_of_inf(self) -> int | None:
        """Code of +inf (None when the format has no infinity)."""
        if self.encoding is not Encoding.IEEE:
            return None
        return ((1 << self.exponent_bits) - 1) << self.mantissa_bits

    @property
    def max(self) -> float:
        """Largest finite value."""
        m = self.mantissa_bits
        frac = (self.code_of_max & ((1 << m) - 1)) / (1 << m)
        return math.ldexp(1.0 + frac, self.max_exponent)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value (``finfo.smallest_normal``, ``tiny``)."""
        return math.ldexp(1.0, self.min_exponent)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (``finfo.smallest_subnormal``)."""
        if self.subnormals and self.mantissa_bits > 0:
            return math.ldexp(1.0, self.min_exponent - self.mantissa_bits)
        return self.min_normal

    @property
    def eps(self) -> float:
        """Gap between 1 and the next larger value, ``2**-mantissa_bits`` (``finfo.eps``)."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def dynamic_range(self) -> float:
        """Binades spanned by the positive finite values, ``log2(max / min_subnormal)``."""
        return math.log2(self.max / self.min_subnormal)

    @property
    def has_inf(self) -> bool:
        return self.encoding is Encoding.IEEE

    @property
    def has_nan(self) -> bool:
        return self.encoding is not Encoding.FINITE

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class IntFormat:
    """A ``bits``-wide integer ``k`` (two's complement when ``signed``) with value
    ``k * 2**-fraction_bits``.

    Encoding rounds ``x * 2**fraction_bits`` to an integer with the requested rounding mode,
    then clamps (``saturate=True``) or wraps modulo ``2**bits`` as a C cast of an integer
    does. ``symmetric`` drops the most negative code (-127..127 for 8 bits, as the linear
    absmax scheme and microxcaling's MXINT8 use) and always clamps. MXINT8 elements are
    ``IntFormat("mxint8_element", 8, symmetric=True, fraction_bits=6)`` (OCP MX v1.0 5.3).
    """

    name: str
    bits: int
    signed: bool = True
    symmetric: bool = False
    fraction_bits: int = 0

    def __post_init__(self) -> None:
        where = f"IntFormat {check_name(self.name, 'IntFormat')!r}"
        for f in ("bits", "fraction_bits"):
            object.__setattr__(self, f, check_int(getattr(self, f), f, where))
        for f in ("signed", "symmetric"):
            check_bool(getattr(self, f), f, where)
        if not 2 <= self.bits <= 16:
            raise ValueError(f"IntFormat {self.name!r}: bits must be in [2, 16], got {self.bits}")
        if self.symmetric and not self.signed:
            raise ValueError(f"IntFormat {self.name!r}: symmetric needs signed")
        if not 0 <= self.fraction_bits <= 32:
            raise ValueError(f"IntFormat {self.name!r}: fraction_bits must be in [0, 32]")

    @property
    def max_int(self) -> int:
        """Largest integer code value ``k``."""
        return (1 << (self.bits - self.signed)) - 1

    @property
    def min_int(self) -> int:
        """Smallest integer code value ``k``."""
        if not self.signed:
            return 0
        return -self.max_int if self.symmetric else -(1 << (self.bits - 1))

    @property
    def max(self) -> float:
        """Largest value, ``max_int * 2**-fraction_bits``."""
        return math.ldexp(self.max_int, -self.fraction_bits)

    @property
    def min(self) -> float:
        """Smallest (most negative) value."""
        return math.ldexp(self.min_int, -self.fraction_bits)

    @property
    def code_of_max(self) -> int:
        return self.max_int

    @property
    def code_dtype(self) -> str:
        return "uint8" if self.bits <= 8 else "uint16"

    @property
    def bytes_per_element(self) -> float:
        return self.bits / 8

    def __str__(self) -> str:
        return self.name


AnyFormat = Format | IntFormat

_I, _FN, _UZ, _FIN = Encoding.IEEE, Encoding.FN, Encoding.FNUZ, Encoding.FINITE
_BUILTIN: tuple[AnyFormat, ...] = (
    Format("float32", 8, 23, 127),
    Format("float16", 5, 10, 15),
    Format("bfloat16", 8, 7, 127),
    Format("float8_e4m3fn", 4, 3, 7, encoding=_FN),
    Format("float8_e5m2", 5, 2, 15),
    Format("float8_e4m3fnuz", 4, 3, 8, encoding=_UZ),
    Format("float8_e5m2fnuz", 5, 2, 16, encoding=_UZ),
    Format("float8_e4m3b11fnuz", 4, 3, 11, encoding=_UZ),
    Format("float8_e4m3", 4, 3, 7),
    Format("float8_e3m4", 3, 4, 3),
    Format("float8_e8m0fnu", 8, 0, 127, signed=False, encoding=_FN, subnormals=False, has_zero=False),
    Format("float6_e2m3fn", 2, 3, 1, encoding=_FIN),
    Format("float6_e3m2fn", 3, 2, 3, encoding=_FIN),
    Format("float4_e2m1fn", 2, 1, 1, encoding=_FIN),
    IntFormat("int8", 8),
    IntFormat("int4", 4),
    IntFormat("uint8", 8, signed=False),
    IntFormat("uint4", 4, signed=False),
)

FORMATS: Mapping[str, AnyFormat] = MappingProxyType({f.name: f for f in _BUILTIN})
"""The built-in formats by name (read-only). Define others with :class:`Format`."""
