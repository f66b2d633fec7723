"""Portable Triton reduction for :mod:`fpsim.analysis.metrics`: the counts and sums of one chunk.

:func:`tally` computes what :func:`fpsim.analysis.metrics._tally` computes for a chunk, from the
inputs ``x``, the stored values ``q`` (float32) and the element codes:

* counts (elements, nonzero, nan_in, inf_in, underflow, subnormal, overflow, saturated):
  exact integers, equal to the emulator's;
* maxima (max_abs_err, max_rel_err, max_abs_in): equal to the emulator's bit for bit
  (each term is the same float64 operation, correctly rounded division, and a max does not
  depend on order);
* sums (sum_sq_err, sum_sq_signal, underflow_energy): float64 sums of the same float64
  terms in a different order (a tree per program instance, then the partials in order).
  All terms are >= 0, so each of these and numpy's pairwise sum is within ``(n-1) u /
  (1 - (n-1) u)`` relative error of the exact sum (u = 2**-53, Higham, Accuracy and
  Stability of Numerical Algorithms, 2nd ed., section 4.2; tighter for tree orders); the
  two therefore differ relatively by at most ``2 (n-1) u / (1 - (n-1) u)``, about
  ``2.3e-10`` for a chunk of 2**20 elements. The test checks that bound.

Not covered: the log2 histogram (``with_hist``); the element flags (code at +-max,
subnormal element) are computed from the codes on the host with
:func:`fpsim.analysis.metrics.element_flags`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from ._loader import is_interpreted, kernel_module, require_torch
from ._loader import launch as _launch_kernel

__all__ = ["tally", "sum_bound"]

_BLOCK = 1 << 14


def sum_bound(n: int) -> float:
    """Largest relative difference between the kernel's and the emulator's float sums of
    ``n`` non-negative float64 terms (see the module doc)."""
    g = max(n - 1, 0) * 2.0**-53
    return 2 * g / (1 - g)


def tally(x: Any, q: Any, codes: Any, element: Any) -> dict[str, Any]:
    """Counts, sums and maxima of one chunk (the fields of :class:`fpsim.analysis.metrics.Partial`
    except the histogram), for torch float32 tensors ``x`` and ``q`` and the codes.

    Args:
        x: the inputs (torch float32; CPU: Triton interpreter, GPU: compiled).
        q: the stored values, e.g. ``decode_blocks(encode_blocks(x, fmt), fmt)``, x's shape.
        codes: the element codes (numpy or torch), x's shape.
        element: the element format (:class:`~fpsim.Format`, :class:`~fpsim.IntFormat`
            or :class:`~fpsim.formats.block.Codebook`).
    """
    from fpsim.analysis.metrics import element_flags

    torch = require_torch()
    for name, t in (("x", x), ("q", q)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise TypeError(f"tally: {name} must be a torch float32 tensor")
    if tuple(q.shape) != tuple(x.shape):
        raise ValueError(f"tally: q has shape {tuple(q.shape)}; x has {tuple(x.shape)}")
    c = codes.cpu().numpy() if isinstance(codes, torch.Tensor) else np.asarray(codes)
    at_max, sub = element_flags(c.reshape(-1), element)
    flags = at_max.astype(np.uint8) | (sub.astype(np.uint8) << 1 if sub is not None else np.uint8(0))
    n = x.numel()
    block = min(_BLOCK, 1 << max(4, (n - 1).bit_length()))
    g = max(1, -(-n // block))
    dev = x.device
    cnt = torch.zeros((g, 8), dtype=torch.int32, device=dev)
    sums = torch.zeros((g, 4), dtype=torch.float64, device=dev)
    maxs = torch.zeros((g, 4), dtype=torch.float64, device=dev)
    interp = is_interpreted(dev)
    extra = {} if interp else {"num_warps": 4, "enable_fp_fusion": False}
    if n:
        with np.errstate(all="ignore"):
            _launch_kernel(
                kernel_module("_metrics_kernel", interp).tally_kernel,
                (g,),
                interp,
                x.contiguous().view(torch.int32).reshape(-1),
                q.contiguous().view(torch.int32).reshape(-1),
                torch.from_numpy(np.ascontiguousarray(flags)).to(dev),
                cnt,
                sums,
                maxs,
                n,
                BLOCK=block,
                **extra,
            )
    k = cnt.cpu().numpy().astype(np.int64).sum(axis=0)
    s = sums.cpu().numpy()
    m = maxs.cpu().numpy().max(axis=0)
    return {
        "elements": n,
        "nan_in": int(k[0]),
        "inf_in": n - int(k[0]) - int(k[1]),
        "nonzero": int(k[2]),
        "overflow": int(k[3]),
        "underflow": int(k[4]),
        "subnormal": int(k[5]),
        "saturated": int(k[6]),
        "sum_sq_err": Fraction(float(sum(s[:, 0].tolist()))),
        "sum_sq_signal": Fraction(float(sum(s[:, 1].tolist()))),
        "underflow_energy": Fraction(float(sum(s[:, 2].tolist()))),
        "max_abs_err": float(m[0]),
        "max_rel_err": float(m[1]),
        "max_abs_in": float(m[2]),
    }
