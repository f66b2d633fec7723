"""Exact references and error measures for sums, dot products and matrix products.

Products of float32 inputs are exact in float64; each row of terms is summed with
:func:`math.fsum` (Shewchuk's algorithm: the exact sum correctly rounded to float64), or
exactly as :class:`fractions.Fraction` with ``fractions=True``. The independent yardstick of
the accumulation measurements; re-exported by :mod:`fpsim.accumulate`.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from ._accumulator import as_f32

_py_sum = sum


def exact_sum(x: Any, axis: int | tuple[int, ...] | None = None, *, fractions: bool = False) -> np.ndarray:
    """Exact sums of ``x`` (as float32) over ``axis``: correctly rounded to float64
    (``math.fsum``, Shewchuk's algorithm), or as :class:`fractions.Fraction` objects with
    ``fractions=True``. One Python loop per output element: for small and medium cases.
    """
    v = as_f32(x, "x").astype(np.float64)
    axes = tuple(range(v.ndim)) if axis is None else tuple(np.atleast_1d(axis).tolist())
    axes = tuple(a % v.ndim for a in axes) if v.ndim else ()
    keep = [i for i in range(v.ndim) if i not in axes]
    shape = tuple(v.shape[i] for i in keep)
    rows = np.transpose(v, keep + list(axes)).reshape(math.prod(shape), math.prod(v.shape[i] for i in axes))
    return _exact_rows(rows, fractions).reshape(shape)


def exact_dot(a: Any, b: Any, *, fractions: bool = False) -> np.ndarray:
    """Exact ``sum_k a[..., k] * b[..., k]`` of float32 inputs (products exact in float64)."""
    a = as_f32(a, "a").astype(np.float64)
    b = as_f32(b, "b").astype(np.float64)
    terms = a * b
    return _exact_rows(terms.reshape(-1, terms.shape[-1]), fractions).reshape(terms.shape[:-1])


def exact_matmul(a: Any, b: Any, *, fractions: bool = False) -> np.ndarray:
    """Exact ``a @ b`` of float32 2-D inputs, correctly rounded to float64 (or Fractions)."""
    a = as_f32(a, "a").astype(np.float64)
    b = as_f32(b, "b").astype(np.float64)
    terms = a[:, None, :] * b.T[None, :, :]  # (M, N, K), exact
    return _exact_rows(terms.reshape(-1, a.shape[1]), fractions).reshape(a.shape[0], b.shape[1])


def _exact_rows(rows: np.ndarray, fractions: bool) -> np.ndarray:
    if not fractions:
        return np.array([math.fsum(r) for r in rows.tolist()], np.float64)
    out = np.empty(len(rows), object)
    out[:] = [_py_sum((Fraction(t) for t in r), Fraction(0)) for r in rows.tolist()]
    return out


def relative_error(approx: Any, exact: Any) -> np.ndarray:
    """``|approx - exact| / |exact|`` elementwise (float64); 0 where both are 0, inf where only
    ``exact`` is. ``exact`` may hold Fractions (the error is then computed exactly first)."""
    ex = np.asarray(exact)
    ap = np.asarray(approx, np.float64)
    if ex.dtype == object:
        err = np.array([abs(Fraction(float(p)) - e) for p, e in zip(ap.reshape(-1), ex.reshape(-1))], object)
        den = np.array([abs(e) for e in ex.reshape(-1)], object)
        out = np.array([float(u / d) if d else (0.0 if u == 0 else math.inf) for u, d in zip(err, den)])
        return out.reshape(ex.shape)
    ex = ex.astype(np.float64)
    err = np.abs(ap - ex)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = err / np.abs(ex)
    return np.where(ex == 0, np.where(err == 0, 0.0, np.inf), rel)


def error_summary(approx: Any, exact: Any, *, magnitude: Any = None) -> dict[str, float]:
    """Error statistics of a reduction against its exact value.

    Args:
        approx: emulated results.
        exact: exact results (float64, e.g. from :func:`exact_matmul` or a float64 matmul).
        magnitude: optional ``sum_k |t_k|`` per output (e.g. ``abs(a) @ abs(b)``); adds
            ``max_scaled_err``, the error relative to the size of the addends, which unlike
            the relative error does not blow up where the result cancels to nearly zero.

    Returns:
        ``max_rel_err``, ``mean_rel_err``, ``median_rel_err`` (elementwise, outputs with
        exact value 0 left out), ``rel_l2_err`` (``||approx - exact|| / ||exact||``),
        ``max_abs_err`` and optionally ``max_scaled_err``.
    """
    ap = np.asarray(approx, np.float64).reshape(-1)
    ex = np.asarray(exact, np.float64).reshape(-1)
    rel = relative_error(ap, ex)[ex != 0]
    err = np.abs(ap - ex)
    norm = float(np.linalg.norm(ex))
    out = {
        "max_rel_err": float(rel.max()) if rel.size else 0.0,
        "mean_rel_err": float(rel.mean()) if rel.size else 0.0,
        "median_rel_err": float(np.median(rel)) if rel.size else 0.0,
        "rel_l2_err": float(np.linalg.norm(err)) / norm if norm else 0.0,
        "max_abs_err": float(err.max()) if err.size else 0.0,
    }
    if magnitude is not None:
        mag = np.asarray(magnitude, np.float64).reshape(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.where(mag > 0, err / mag, 0.0)
        out["max_scaled_err"] = float(scaled.max()) if scaled.size else 0.0
    return out
