"""Validation of the accumulation kernel (:mod:`fpsim.kernels.validate`).

:func:`run` compares :func:`fpsim.kernels.accumulate.matmul` (or any callable with its
signature) with :func:`fpsim.accumulate.matmul`, the float32 bit patterns of every output
compared with zero tolerance (NaNs by class), for one accumulator format and rounding mode.
The accumulators validated by ``fpsim validate-kernels`` are :data:`ACCUMULATORS`.

Inputs (``(a, b)`` pairs, sized to the accumulator's range; smaller with ``cases="quick"``):

* ``random``: values over the format's whole exponent range (products from below its
  smallest subnormal to beyond its max, so sums underflow and overflow), with zeros of
  both signs;
* ``specials``: random values with +-inf, NaN and +-0 mixed in;
* ``cancellation``: every row holds values and their negatives, the columns of ``b`` are
  1 or ``1 +- 2**-(p + 1)``: large partial sums that cancel down to rounding residues;
* ``swamping``: uniform [0, 1) values times 1 (``K = 600``; 4100 when full): a bfloat16
  accumulator stalls at 256, a float16 one at 2048 (full), where every addend is below
  half an ulp of the sum;
* ``ties``: integers of ``p + 1`` bits times ``+-1, 0.5, 2``: partial sums land on
  midpoints between accumulator values;
* ``shape ...``: 1x1x1, K = 1, M and N no multiple of any tile (70 x 5 x 66), a batch, a
  1-D operand, and K = 1023 (full);
* ``trace ...``: tensors of the bundled sample trace (Gram matrices ``g @ g.T`` of the
  largest 2-D tensor of a step, scaled by a power of two into the format's range).

Option variants, one :class:`~fpsim.kernels.validate.Case` each: plain; ``promote_every``
(7, and 128 for the swamping set, DeepSeek-V3's interval) with the same rounding for the
promotion; Kahan compensation (and Neumaier when full); float8_e4m3fn inputs and bfloat16
products rounded in the same mode. The last ones skip the long sums (and, when quick, run
on the random, specials, cancellation and ties sets only). Stochastic rounding alternates
given ``random_bits`` words (edge words mixed in) and ``seed``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fpsim.formats import Format, RoundMode

from .common import SHOWN, Case, Mismatch, binade_spread, check_cases, f32_fields, random_words, trace_tensors

_BIG = ("swamping", "shape (2, 1023, 3)")  # the long sums: plain and promoted variants only


def accumulators() -> dict[str, Format]:
    """The accumulator formats ``fpsim validate-kernels`` runs ``accumulate.matmul`` for:
    float32, bfloat16, float16, float8_e5m2 and DeepSeek-V3's 14-bit accumulator
    (float32's range with 14 significant bits, ``float32_p14``)."""
    from fpsim.accumulate import accumulator_format

    fmts = [accumulator_format(n) for n in ("float32", "bfloat16", "float16", "float8_e5m2", 14)]
    return {f.name: f for f in fmts}


def _log2_range(fmt: Format) -> tuple[float, float]:
    return math.log2(fmt.min_subnormal), math.log2(fmt.max)


def _spread(rng: np.random.Generator, shape: tuple, lo: float, hi: float) -> np.ndarray:
    """Values spread evenly over the binades of [2**lo, 2**hi] (magnitudes from 2**floor(lo) to
    below 2**ceil(hi): :func:`~.common.binade_spread`), random signs, float32."""
    mag = binade_spread(rng, shape, math.floor(lo), math.ceil(hi) - 1) * rng.choice([-1.0, 1.0], shape)
    with np.errstate(over="ignore", under="ignore"):
        return mag.astype(np.float32)


def _pow2_scale(x: np.ndarray, target: float) -> np.ndarray:
    """``x`` times the power of two that brings max |x| just under ``target`` (exact)."""
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    if amax == 0.0 or not math.isfinite(amax):
        return x
    k = max(-120, min(120, math.floor(math.log2(target / amax))))
    with np.errstate(under="ignore", over="ignore"):
        return np.ldexp(x, k).astype(np.float32)


def input_pairs(fmt: Format, quick: bool, seed: int = 0) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, a, b) float32 operand pairs for accumulator ``fmt`` (see the module doc)."""
    rng = np.random.default_rng([seed, fmt.bits, fmt.mantissa_bits])
    p = fmt.mantissa_bits + 1
    lo, hi = _log2_range(fmt)
    out: list[tuple[str, np.ndarray, np.ndarray]] = []

    m, k, n = (9, 24, 7) if quick else (45, 300, 37)
    half = ((lo - 3) / 2, (hi + 1) / 2)  # products from min_subnormal / 16 (or / 8) to about 4 max
    a, b = _spread(rng, (m, k), *half), _spread(rng, (k, n), *half)
    a.reshape(-1)[::11] = 0.0
    b.reshape(-1)[5::13] = -0.0
    out.append(("random", a, b))

    a, b = _spread(rng, (4, 9), -4, 4), _spread(rng, (9, 5), -4, 4)
    a[0, 3], a[1, 0], a[2, 5], a[3, 8] = np.inf, -np.inf, np.nan, -0.0
    b[4, 1], b[0, 2], b[6, 4] = np.inf, np.nan, 0.0
    out.append(("specials", a, b))

    k2 = 24 if quick else 96
    v = _spread(rng, (7, k2 // 2), hi - 12, hi - 4)
    a = np.concatenate([v, -rng.permuted(v, axis=1)], axis=1)
    a = rng.permuted(a, axis=1).astype(np.float32)
    delta = 2.0 ** -min(p + 1, 23)
    b = np.where(rng.random((k2, 5)) < 0.5, 1.0, 1.0 + delta * rng.choice([-1.0, 1.0], (k2, 5)))
    b[:, 0] = 1.0
    out.append(("cancellation", a, b.astype(np.float32)))

    k3 = 600 if quick else 4100
    a = rng.random((2, k3), dtype=np.float32)
    a[1] = -a[1]
    b = np.ones((k3, 3), np.float32)
    b[:, 1] = 0.5
    b[:, 2] = rng.random(k3, dtype=np.float32)
    out.append(("swamping", a, b))

    q = min(p + 1, 24)
    scale = 2.0 ** min(0, math.floor(hi) - q - 4)
    a = (rng.integers(-(1 << q), 1 << q, (6, 40)) * scale).astype(np.float32)
    b = rng.choice(np.array([1.0, -1.0, 0.5, 2.0], np.float32), (40, 5))
    out.append(("ties", a, b))

    moderate = (lo / 4, hi / 4)
    shapes = [((1, 1), (1, 1)), ((3, 1), (1, 4)), ((70, 5), (5, 66)), ((2, 3, 9), (2, 9, 4)), ((9,), (9, 4))]
    if not quick:
        shapes.append(((2, 1023), (1023, 3)))
    for sa, sb in shapes:
        label = f"shape {sa} @ {sb}" if len(sa) != 2 or len(sb) != 2 else f"shape {(sa[0], sa[1], sb[1])}"
        out.append((label, _spread(rng, sa, *moderate), _spread(rng, sb, *moderate)))

    for name, arrays in trace_tensors(quick):
        two_d = [x for x in arrays if x.ndim == 2 and x.size]
        if not two_d:
            continue
        g = max(two_d, key=lambda x: x.size)
        kg = g.shape[1]
        gs = _pow2_scale(np.array(g, np.float32), math.sqrt(fmt.max / (4 * kg)))
        out.append((f"{name} {tuple(g.shape)} gram", gs, np.ascontiguousarray(gs.T)))
    return out


def _variants(mode: RoundMode, quick: bool) -> list[dict[str, Any]]:
    sr = mode is RoundMode.STOCHASTIC
    v: list[dict[str, Any]] = [
        {"random": "bits" if sr else None},
        {"promote_every": 7, "promote_rounding": mode.value, "random": "seed" if sr else None},
        {"compensated": "kahan", "random": "bits" if sr else None, "stochastic_bits": 5 if sr else None},
        {
            "input_format": "float8_e4m3fn",
            "input_rounding": mode.value,
            "product_format": "bfloat16",
            "product_rounding": mode.value,
            "random": "seed",
        },
    ]
    if not quick:
        v.append({"compensated": "neumaier", "random": "seed" if sr else None})
    return v


def run(fmt: Format, rounding: RoundMode, *, cases: str, device: str, name: str, fn: Any = None) -> list[Any]:
    """Compare the accumulation kernel with :func:`fpsim.accumulate.matmul`, bit for bit.

    Args:
        fmt: the accumulator format.
        rounding: the accumulator's rounding mode.
        cases: "full" or "quick" (smaller inputs, fewer variants).
        device: "cpu" (Triton's interpreter) or "cuda".
        name: the kernel's name in the report.
        fn: the kernel's host function (default :func:`fpsim.kernels.accumulate.matmul`),
            called as ``fn(a, b, accumulator=fmt, rounding=..., **options)`` on torch tensors.

    Returns:
        One :class:`~fpsim.kernels.validate.Case` per option variant, each over every input
        pair; the first mismatches carry the output index, the exact sum (``input``) and
        both float32 results field by field.
    """
    import torch

    from fpsim.accumulate import matmul as ref
    from fpsim.accumulate import rounding_count

    if fn is None:
        from ..accumulate import matmul as fn
    quick = check_cases(cases)
    pairs = input_pairs(fmt, quick)
    out = []
    for i, var in enumerate(_variants(rounding, quick)):
        opts = {k: v for k, v in var.items() if v is not None}
        random = opts.pop("random", None)
        kw: dict[str, Any] = {"accumulator": fmt, "rounding": rounding.value, **opts}
        if random == "seed":
            kw["seed"] = 1234 + i
        case = Case(name, fmt.name, rounding.value, {**opts, "random": random, "nan_by_class": True})
        cheap = "compensated" not in opts and "input_format" not in opts
        core = ("random", "specials", "cancellation", "ties")
        rng = np.random.default_rng([11, fmt.bits, i])
        for set_name, a, b in pairs:
            if not cheap and (set_name in _BIG or (quick and set_name not in core)):
                continue
            kw_set = dict(kw)
            if "promote_every" in kw_set and set_name == "swamping":
                kw_set["promote_every"] = 128
            if random == "bits":
                count = rounding_count(
                    a.shape[-1],
                    promote_every=kw_set.get("promote_every"),
                    compensated=kw_set.get("compensated", False),
                )
                out_shape = _out_shape(a.shape, b.shape)
                words = random_words(count * math.prod(out_shape), rng)
                kw_set["random_bits"] = words.reshape((count, *out_shape))
            with np.errstate(all="ignore"):
                want = np.asarray(ref(a, b, **kw_set), np.float32)
            try:
                got = fn(torch.from_numpy(a).to(device), torch.from_numpy(b).to(device), **kw_set)
                got = got.cpu().numpy()
            except Exception as e:  # noqa: BLE001 - reported in the case
                case.error = f"{set_name}: {type(e).__name__}: {e}"
                break
            if got.shape != want.shape or got.dtype != np.float32:
                case.error = f"{set_name}: got {got.dtype} {got.shape}, want float32 {want.shape}"
                break
            g, w = got.reshape(-1).view(np.uint32), want.reshape(-1).view(np.uint32)
            bad = (g != w) & ~(np.isnan(got.reshape(-1)) & np.isnan(want.reshape(-1)))
            case.compared += int(g.size)
            case.mismatches += int(bad.sum())
            for j in np.flatnonzero(bad)[: max(0, SHOWN - len(case.first))]:
                exact = _exact_at(a, b, int(j))
                case.first.append(
                    Mismatch(
                        set_name,
                        int(j),
                        f"0x{int(np.float64(exact).view(np.uint64)):016x}",
                        exact,
                        int(w[j]),
                        int(g[j]),
                        f32_fields(w[j]),
                        f32_fields(g[j]),
                    )
                )
        out.append(case)
    return out


def _out_shape(sa: tuple, sb: tuple) -> tuple:
    """numpy.matmul's output shape before squeezing 1-D operands (the random words' shape)."""
    a2 = (1, *sa) if len(sa) == 1 else sa
    b2 = (*sb, 1) if len(sb) == 1 else sb
    return (*np.broadcast_shapes(a2[:-2], b2[:-2]), a2[-2], b2[-1])


def _exact_at(a: np.ndarray, b: np.ndarray, j: int) -> float:
    """The exact sum (correctly rounded to float64) of output ``j`` (flat index, unsqueezed)."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    shape = _out_shape(a.shape, b.shape)
    idx = np.unravel_index(j, shape)
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    av = np.broadcast_to(a2, (*batch, *a2.shape[-2:]))[(*idx[:-2], idx[-2])]
    bv = np.broadcast_to(b2, (*batch, *b2.shape[-2:]))[(*idx[:-2], slice(None), idx[-1])]
    with np.errstate(all="ignore"):
        terms = av.astype(np.float64) * bv.astype(np.float64)
    try:
        return math.fsum(terms.tolist())
    except (OverflowError, ValueError):
        return float(np.sum(terms))
