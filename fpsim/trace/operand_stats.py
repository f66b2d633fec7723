"""Statistics of a GEMM operand, the small record of ``operands="stats"``.

A capture with ``operands="stats"`` stores, instead of each operand tensor, one float64
vector under the role ``"stats.input"`` or ``"stats.grad_output"`` (same name as the operand
would have). Its layout, :data:`STATS_FIELDS` then the histogram:

* ``elements``: the tensor's element count; ``nonzero``: finite nonzero elements;
  ``nan`` and ``inf``: NaN and infinite elements;
* ``amax``: the largest magnitude, NaN ignored and infinities included (the amax that
  Transformer Engine's scaling recipes take, ``fmaxf``), 0 for an empty tensor;
* ``hist``: 256 counts of the float32 exponent fields of the finite nonzero elements (bin e:
  ``2**(e-127) <= |x| < 2**(e-126)``, bin 0 holds float32 subnormals), the histogram
  :mod:`fpsim.analysis.metrics` keeps.

Counts are exact in float64 up to 2**53 elements. The values are those of the operand cast to
float32 (exact for float16, bfloat16 and float8 operands).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..formats.amax import amax_ignore_nan

__all__ = ["STATS_FIELDS", "STATS_LENGTH", "OperandStats", "decode_stats", "stats_vector"]

STATS_FIELDS = ("elements", "nonzero", "nan", "inf", "amax")
"""The scalar fields at the start of a statistics vector, in order."""

STATS_LENGTH = len(STATS_FIELDS) + 256
"""Length of a statistics vector: the fields, then the 256-bin histogram."""


@dataclass(frozen=True)
class OperandStats:
    """One operand's statistics (see the module docstring).

    Attributes:
        elements: element count.
        nonzero: finite nonzero elements.
        nan: NaN elements.
        inf: infinite elements.
        amax: the largest magnitude (NaN ignored), as float32 holds it.
        hist: int64 counts per float32 exponent field (256 bins).
    """

    elements: int
    nonzero: int
    nan: int
    inf: int
    amax: float
    hist: np.ndarray


def decode_stats(vector: Any, where: str = "statistics") -> OperandStats:
    """An :class:`OperandStats` from a recorded statistics vector.

    Args:
        vector: the float64 vector of :data:`STATS_LENGTH` values (e.g. ``trace.read(entry)``).
        where: what the vector is, for messages (e.g. the file and key).

    Raises:
        ValueError: a vector of another length or dtype, or counts that are not
            non-negative integers adding up.
    """
    v = np.asarray(vector)
    if v.dtype != np.float64 or v.shape != (STATS_LENGTH,):
        raise ValueError(
            f"{where}: a statistics vector is float64[{STATS_LENGTH}], got {v.dtype}{list(v.shape)}"
        )
    counts = np.concatenate([v[:4], v[5:]])
    if not (np.all(counts >= 0) and np.all(counts == np.floor(counts))):
        raise ValueError(f"{where}: counts must be non-negative integers")
    elements, nonzero, nan, inf = (int(c) for c in v[:4])
    hist = v[5:].astype(np.int64)
    if int(hist.sum()) != nonzero or nonzero + nan + inf > elements:
        raise ValueError(f"{where}: the histogram ({int(hist.sum())}) and the counts do not add up")
    return OperandStats(elements, nonzero, nan, inf, float(v[4]), hist)


def stats_vector(x: Any) -> np.ndarray:
    """The statistics vector of an array (numpy, ml_dtypes or JAX), computed with numpy.

    What ``capture_jax(..., operand_stats=True)`` stores; the torch capture computes the same
    vector on the tensor's device (:func:`fpsim.trace.operands.torch_stats_vector`).
    """
    from .convert import to_numpy

    a = to_numpy(x)
    if a.dtype.kind == "V" or a.dtype.kind == "f":
        a = a.astype(np.float32)
    else:
        raise TypeError(f"operand statistics need a float array, got {a.dtype}")
    flat = a.reshape(-1)
    bits = flat.view(np.uint32)
    expo = (bits >> np.uint32(23)) & np.uint32(0xFF)
    nan = np.isnan(flat)
    nonzero = (expo != 0xFF) & ((bits & np.uint32(0x7FFFFFFF)) != 0)
    hist = np.bincount(expo[nonzero], minlength=256).astype(np.float64)
    amax = float(amax_ignore_nan(flat))
    head = [
        flat.size,
        np.count_nonzero(nonzero),
        np.count_nonzero(nan),
        np.count_nonzero(np.isinf(flat)),
        amax,
    ]
    return np.concatenate([np.asarray(head, np.float64), hist])
