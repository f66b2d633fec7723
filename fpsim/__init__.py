"""fpsim: see what low-precision number formats do to your tensors.

Public API (kept small): element formats and block recipes with their registries, rounding
modes, the three verbs ``encode`` / ``decode`` / ``quantize`` that take any of them, delayed
scaling, emulated accumulation (``sum`` / ``dot`` / ``matmul`` / ``scaled_matmul``) and the
choice of :class:`Backend` for the hot loops. The stages of the data flow are sub-packages
(see the README's Architecture section).
"""

from ._compiled import Backend, FallbackWarning
from .accumulate import dot, matmul, scaled_matmul, sum  # noqa: A004 - fpsim.sum mirrors numpy.sum
from .emulate import decode, encode, quantize
from .emulate.blocks import BlockCodes
from .emulate.delayed import DelayedScaling, DelayedState
from .formats import (
    FORMATS,
    RECIPES,
    BlockFormat,
    Codebook,
    Encoding,
    Format,
    IntFormat,
    RoundMode,
    ScaleRule,
    get_format,
)

__all__ = [
    "FORMATS",
    "RECIPES",
    "Backend",
    "BlockCodes",
    "FallbackWarning",
    "BlockFormat",
    "Codebook",
    "DelayedScaling",
    "DelayedState",
    "ScaleRule",
    "Encoding",
    "Format",
    "IntFormat",
    "RoundMode",
    "decode",
    "dot",
    "encode",
    "get_format",
    "matmul",
    "quantize",
    "scaled_matmul",
    "sum",
]
__version__ = "0.2.0"
