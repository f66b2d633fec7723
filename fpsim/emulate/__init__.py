"""The public verbs ``encode`` / ``decode`` / ``quantize`` for every kind of format.

Element formats (:class:`~fpsim.Format`, :class:`~fpsim.IntFormat`) go to
:mod:`fpsim.emulate.element`; block formats (:class:`~fpsim.BlockFormat`) to :mod:`fpsim.emulate.blocks`,
which returns codes plus scales as a :class:`~fpsim.BlockCodes`. This thin module sits above
both, so that neither imports the other's verbs (the data flow of the README's Architecture
section). Each verb resolves the format name and the backend once and hands objects down.
"""

from __future__ import annotations

from typing import Any

from .._compiled import Backend
from ..formats import AnyFormat, BlockFormat, get_format
from . import blocks, element

__all__ = ["encode", "decode", "quantize"]


def encode(
    x: Any, fmt: str | AnyFormat | BlockFormat, *, backend: Backend | str = "auto", **kwargs: Any
) -> Any:
    """Codes of ``x`` in ``fmt``: see :func:`fpsim.emulate.element.encode` (element formats) and
    :func:`fpsim.emulate.blocks.encode_blocks` (block formats, returns a BlockCodes).

    ``backend`` (:class:`~fpsim.Backend` or its name) is where the loops run on numpy input
    (the same codes on each); JAX input runs under JAX.
    """
    fmt, backend = get_format(fmt), Backend.resolve(backend)
    if isinstance(fmt, BlockFormat):
        return blocks.encode_blocks(x, fmt, backend=backend, **kwargs)
    return element.encode(x, fmt, backend=backend, **kwargs)


def decode(codes: Any, fmt: str | AnyFormat | BlockFormat, *, backend: Backend | str = "auto") -> Any:
    """float32 values of ``codes`` (a BlockCodes for block formats)."""
    fmt, backend = get_format(fmt), Backend.resolve(backend)
    if isinstance(fmt, BlockFormat):
        return blocks.decode_array(codes, fmt, backend)
    return element.decode_array(codes, fmt)


def quantize(
    x: Any, fmt: str | AnyFormat | BlockFormat, *, backend: Backend | str = "auto", **kwargs: Any
) -> Any:
    """``decode(encode(x, fmt, **kwargs), fmt)``: ``x`` as the format stores it, float32."""
    fmt, backend = get_format(fmt), Backend.resolve(backend)
    if isinstance(fmt, BlockFormat):
        return blocks.decode_array(blocks.encode_blocks(x, fmt, backend=backend, **kwargs), fmt, backend)
    return element.decode_array(element.encode(x, fmt, backend=backend, **kwargs), fmt)
