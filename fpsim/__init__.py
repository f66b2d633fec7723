"""fpsim: see what low-precision number formats do to your tensors.

Public API (kept small): formats and their registry, rounding modes, and the emulator's
three verbs ``encode`` / ``decode`` / ``quantize``.
"""

from .emulate import decode, encode, quantize
from .formats import FORMATS, Encoding, Format, IntFormat, get_format
from .rounding import RoundMode

__all__ = [
    "FORMATS",
    "Encoding",
    "Format",
    "IntFormat",
    "RoundMode",
    "decode",
    "encode",
    "get_format",
    "quantize",
]
__version__ = "0.1.0"
