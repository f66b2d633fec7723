"""What a code means: element formats, block formats and rounding modes.

- :mod:`.element`: :class:`Format` (binary floating point: sign, exponent, trailing
  significand, the convention for the top codes), :class:`IntFormat`, :class:`Encoding` and
  the built-in :data:`FORMATS`, named as ml_dtypes names them.
- :mod:`.block`: :class:`BlockFormat` (element format, block shape, scale format and
  :class:`ScaleRule`), :class:`Codebook` and the :data:`RECIPES`.
- :mod:`.rounding`: :class:`RoundMode`.
- :mod:`.codes`: the integer codes of an optimizer state's storage (``StateKind``) and of Adam's
  weight decay (``Decay``); with :attr:`RoundMode.code` and :attr:`Encoding.code`, the one
  numbering the compiled loops and the Triton kernels read.
- :mod:`.params`: :class:`~fpsim.formats.params.FormatParams`, a format's numbers as the one
  tuple the numba loops and the Triton kernels read.
- :mod:`.amax`: the largest magnitude of a float32/float64 array decided on its bit patterns
  (NaN ignored or propagated), the one amax of every numpy-tier module, the trace included.

Everything else here is description; the arithmetic lives in :mod:`fpsim.emulate`. Names are
resolved to objects once, by :func:`get_format`, at the public entry points.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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


def get_format(fmt: Any) -> AnyFormat | BlockFormat:
    """Return the format or block recipe ``fmt`` names; a format object passes through.

    ``fmt`` is a name in :data:`FORMATS` (element formats) or :data:`RECIPES` (block formats
    such as ``mxfp8_e4m3``), a format object, or a dtype as people already name formats: a
    numpy dtype or scalar type (``np.float16``, ``np.dtype(ml_dtypes.bfloat16)``,
    ``ml_dtypes.float8_e4m3fn``, ``jnp.bfloat16``) or a torch dtype (``torch.float8_e4m3fn``,
    ``torch.bfloat16``). A dtype maps by its name to the format of the same name (the formats
    are named as ml_dtypes names them, and torch uses the same names); a dtype with no such
    format (float64, int32, torch's packed float4_e2m1fn_x2, ...) is refused.

    A dtype names the format (the codes and their values), not a cast's rule: torch's cast to
    float8_e4m3fn saturates out-of-range values to +-448 whereas ml_dtypes' gives NaN, and
    ``get_format`` gives the same :class:`Format` for both; the verbs' ``saturate`` flag stays
    what the caller passes (``saturate=True`` is torch's cast).

    Raises:
        ValueError: an unknown name or a dtype without a format; the message lists the known
            names.
        TypeError: anything that is neither a name, a dtype nor a format.
    """
    if isinstance(fmt, (Format, IntFormat, BlockFormat)):
        return fmt
    if isinstance(fmt, str):
        found = FORMATS.get(fmt) or RECIPES.get(fmt)
        if found is None:
            known = ", ".join([*FORMATS, *RECIPES])
            raise ValueError(f"unknown format {fmt!r}; known formats: {known}")
        return found
    name = _dtype_name(fmt)
    if name is not None:
        found = FORMATS.get(name)
        if found is None:
            raise ValueError(
                f"dtype {fmt!r} has no fpsim format; dtypes with one: {', '.join(FORMATS)} "
                "(as numpy, ml_dtypes, JAX or torch dtypes)"
            )
        return found
    raise TypeError(f"format must be a name, a dtype or a Format, got {type(fmt).__name__}: {fmt!r}")


def _dtype_name(fmt: Any) -> str | None:
    """The name of the numpy/ml_dtypes/JAX/torch dtype ``fmt`` (``"float8_e4m3fn"``), or None
    when ``fmt`` is no dtype (arrays are not dtypes: only dtypes and scalar types are read)."""
    kind = type(fmt)
    if kind.__module__ == "torch" and kind.__name__ == "dtype":  # torch.float8_e4m3fn: no import
        return str(fmt).removeprefix("torch.")
    if isinstance(fmt, np.dtype):
        return fmt.name
    if isinstance(fmt, type):  # np.float16, ml_dtypes.bfloat16, jnp.bfloat16, jnp.float32
        if issubclass(fmt, np.generic):
            return np.dtype(fmt).name
        dt = getattr(fmt, "dtype", None)
        if isinstance(dt, np.dtype):
            return dt.name
    return None
