"""fpsim: see what low-precision number formats do to your tensors.

Public API (kept small): element formats and block recipes with their registries, rounding
modes, the three verbs ``encode`` / ``decode`` / ``quantize`` that take any of them, delayed
scaling, and emulated accumulation (``sum`` / ``dot`` / ``matmul`` / ``scaled_matmul``).
"""

from .accumulate import dot, matmul, scaled_matmul, sum  # noqa: A004 - fpsim.sum mirrors numpy.sum
from .blockformat import RECIPES, BlockFormat, Codebook, ScaleRule
from .codec import decode, encode, quantize
from .delayed import DelayedScaling, DelayedState
from .formats import FORMATS, Encoding, Format, IntFormat, get_format
from .rounding import RoundMode
from .scaling import BlockCodes

__all__ = [
    "FORMATS",
    "RECIPES",
    "BlockCodes",
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
__version__ = "0.1.0"
