"""What a code means: element formats, block formats and rounding modes.

- :mod:`.element`: :class:`Format` (binary floating point: sign, exponent, trailing
  significand, the convention for the top codes), :class:`IntFormat`, :class:`Encoding` and
  the built-in :data:`FORMATS`, named as ml_dtypes names them.
- :mod:`.block`: :class:`BlockFormat` (element format, block shape, scale format and
  :class:`ScaleRule`), :class:`Codebook` and the :data:`RECIPES`.
- :mod:`.rounding`: :class:`RoundMode`.

Everything here is description; the arithmetic lives in :mod:`fpsim.emulate`. Names are
resolved to objects once, by :func:`get_format`, at the public entry points.
"""

from __future__ import annotations

from .block import RECIPES, BlockFormat, Codebook, ScaleRule
from .element import FORMATS, AnyFormat, Encoding, Format, IntFormat
from .rounding import RoundMode

__all__ = [
    "FORMATS",
    "RECIPES",
    "AnyFormat",
    "BlockFormat",
    "Codebook",
    "Encoding",
    "Format",
    "IntFormat",
    "RoundMode",
    "ScaleRule",
    "get_format",
]


def get_format(fmt):
    """Return the format or block recipe named ``fmt``; a format object passes through.

    Looks in :data:`FORMATS` (element formats) and :data:`fpsim.formats.block.RECIPES`
    (block formats such as ``mxfp8_e4m3``).

    Raises:
        ValueError: for an unknown name; the message lists the known names.
        TypeError: for anything that is neither a name nor a format.
    """
    if isinstance(fmt, (Format, IntFormat, BlockFormat)):
        return fmt
    if isinstance(fmt, str):
        found = FORMATS.get(fmt) or RECIPES.get(fmt)
        if found is None:
            known = ", ".join([*FORMATS, *RECIPES])
            raise ValueError(f"unknown format {fmt!r}; known formats: {known}")
        return found
    raise TypeError(f"format must be a name or a Format, got {type(fmt).__name__}: {fmt!r}")
