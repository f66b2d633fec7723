"""The public verbs ``encode`` / ``decode`` / ``quantize`` for every kind of format.

Element formats (:class:`~fpsim.Format`, :class:`~fpsim.IntFormat`) go to
:mod:`fpsim.emulate.element`; block formats (:class:`~fpsim.BlockFormat`) to :mod:`fpsim.emulate.blocks`,
which returns codes plus scales as a :class:`~fpsim.BlockCodes`. This thin module sits above
both so that neither imports a stage below it (DESIGN.md, data flow).
"""

from __future__ import annotations

from typing import Any

from ..formats import AnyFormat, BlockFormat, get_format
from . import blocks as scaling
from . import element as emulate

__all__ = ["encode", "decode", "quantize"]


def encode(x: Any, fmt: str | AnyFormat | BlockFormat, **kwargs: Any) -> Any:
    """Codes of ``x`` in ``fmt``: see :func:`fpsim.emulate.element.encode` (element formats) and
    :func:`fpsim.emulate.blocks.encode_blocks` (block formats, returns a BlockCodes)."""
    fmt = get_format(fmt)
    if isinstance(fmt, BlockFormat):
        return scaling.encode_blocks(x, fmt, **kwargs)
    return emulate.encode(x, fmt, **kwargs)


def decode(codes: Any, fmt: str | AnyFormat | BlockFormat) -> Any:
    """float32 values of ``codes`` (a BlockCodes for block formats)."""
    fmt = get_format(fmt)
    if isinstance(fmt, BlockFormat):
        return scaling.decode_blocks(codes, fmt)
    return emulate.decode(codes, fmt)


def quantize(x: Any, fmt: str | AnyFormat | BlockFormat, **kwargs: Any) -> Any:
    """``decode(encode(x, fmt, **kwargs), fmt)``: ``x`` as the format stores it, float32."""
    return decode(encode(x, fmt, **kwargs), fmt)
