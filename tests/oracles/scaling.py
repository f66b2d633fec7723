"""Reference transcriptions of the scaling recipes, shared by the block-format tests.

Every function here is written from the recipes as read from Transformer Engine, torchao,
bitsandbytes and the OCP MX reference code, with numpy float32 arithmetic and ml_dtypes
casts. None of them calls fpsim's encode / decode: they are the oracles the tests hold fpsim
to. Element tables come from fpsim's scalar tier (:func:`oracles.finite_values`), which the
element-format tests check against ml_dtypes.

The block-format tests cite the recipes as sections:

1. TE DelayedScaling (``delayed_scaling.cu`` kernel_bulk); its rules, numbered, are the
   module docstring of ``fpsim/emulate/delayed.py``.
2. TE current scaling (``recipe_common.cuh`` compute_scale_from_amax; ``ScaleRule.TE``).
3. TE Float8BlockScaling (1x128 blocks, 128x128 tiles, pow2 scales).
4. MX (OCP MX v1.0 section 6.3 and torchao's CEIL / EVEN / RCEIL; ``ScaleRule.MX_*``).
5. NVFP4 (TE ``core_nvfp4.cuh``; ``ScaleRule.NVFP4``).
6. bitsandbytes blockwise quantization with its dynamic codebook (``Codebook``).
7. torchao AdamWFp8 and linear INT8 (``ScaleRule.ABSMAX``).

Each rule as fpsim states it is the docstring of ``ScaleRule`` (and ``Codebook``) in
``fpsim/formats/block.py``.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

F32 = np.float32
U32 = np.uint32
FLT_MAX = np.finfo(np.float32).max

# element name -> (ml_dtypes type, largest finite value, floor(log2(max)) = MX emax_elem)
ELEMENTS = {
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0, 8),
    "float8_e5m2": (ml_dtypes.float8_e5m2, 57344.0, 15),
    "float6_e2m3fn": (ml_dtypes.float6_e2m3fn, 7.5, 2),
    "float6_e3m2fn": (ml_dtypes.float6_e3m2fn, 28.0, 4),
    "float4_e2m1fn": (ml_dtypes.float4_e2m1fn, 6.0, 2),
}
BITS = {"float8_e4m3fn": 8, "float8_e5m2": 8, "float6_e2m3fn": 6, "float6_e3m2fn": 6, "float4_e2m1fn": 4}


# --- comparisons -------------------------------------------------------------------------------


def assert_hex_equal(got, want, what: str, inputs=None, width: int = 2) -> None:
    """Exact equality of two integer arrays (codes or float32 bit patterns); on mismatch the
    message lists how many differ and the first 8 in hex, with their inputs."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != expected {want.shape}"
    g = got.astype(np.int64).reshape(-1)
    w = want.astype(np.int64).reshape(-1)
    bad = np.flatnonzero(g != w)
    if bad.size == 0:
        return
    x = None if inputs is None else np.asarray(inputs).reshape(-1)
    lines = [f"{what}: {bad.size} of {g.size} differ; first {min(8, bad.size)}:"]
    for i in bad[:8]:
        where = tuple(int(k) for k in np.unravel_index(i, got.shape)) if got.ndim else ()
        src = "" if x is None else f" x={float(x[i])!r} ({float(x[i]).hex()})"
        lines.append(
            f"  at {where}:{src} want 0x{w[i] & 0xFFFFFFFF:0{width}x} got 0x{g[i] & 0xFFFFFFFF:0{width}x}"
        )
    raise AssertionError("\n".join(lines))


def f32_bits(a) -> np.ndarray:
    return np.asarray(a, F32).view(U32)


# --- blocking ------------------------------------------------------------------------------------


def blocks_last(x: np.ndarray, b: int) -> np.ndarray:
    """Pad the last axis with zeros to a multiple of ``b``; shape (..., nblocks, b)."""
    n = x.shape[-1]
    pad = (-n) % b
    xp = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
    return xp.reshape(*x.shape[:-1], (n + pad) // b, b)


def unblocks_last(a: np.ndarray, n: int) -> np.ndarray:
    return a.reshape(*a.shape[:-2], -1)[..., :n]


def blocks_flat(x: np.ndarray, b: int) -> np.ndarray:
    """The flattened tensor padded with zeros to a multiple of ``b``; shape (nblocks, b)."""
    f = x.reshape(-1)
    return np.pad(f, (0, (-f.size) % b)).reshape(-1, b)


def unblocks_flat(a: np.ndarray, shape) -> np.ndarray:
    return a.reshape(-1)[: math.prod(shape)].reshape(shape)


def fmax_amax(xb: np.ndarray, axis=-1) -> np.ndarray:
    """fmaxf reduction of |x| from 0 (NaN elements ignored), float32."""
    return np.fmax.reduce(np.abs(xb), axis=axis, initial=0, keepdims=True).astype(F32)


def nan_amax(xb: np.ndarray, axis=-1) -> np.ndarray:
    """torch.amax(|x|): NaN propagates, float32."""
    return np.max(np.abs(xb), axis=axis, initial=0, keepdims=True).astype(F32)


# --- element casts -------------------------------------------------------------------------------


def cast_sat(v, elem: str) -> np.ndarray:
    """Saturating round-to-nearest-even cast (``cvt.rn.satfinite``): clamp to +-max, then the
    ml_dtypes RNE cast. Codes as uint8 (low ``bits`` bits). NaN stays NaN (E4M3/E5M2)."""
    dt, mx, _ = ELEMENTS[elem]
    with np.errstate(invalid="ignore"):
        c = np.clip(np.asarray(v, np.float64), -mx, mx)
    # ml_dtypes casts float64 through float32 (two roundings); callers pass float32-exact
    # values, or values so small (< 2**-100) that both roundings give a signed zero.
    c32 = c.astype(F32)
    with np.errstate(invalid="ignore"):
        ok = np.isnan(c) | (c32.astype(np.float64) == c) | (np.abs(c) < 2.0**-100)
    assert ok.all(), "cast_sat needs float32-exact inputs"
    return c32.astype(dt).view(np.uint8) & np.uint8((1 << BITS[elem]) - 1)


def int_rne(v, lo: int, hi: int) -> np.ndarray:
    """Round half to even, clamp to [lo, hi], two's-complement uint8 codes."""
    k = np.clip(np.rint(np.asarray(v, np.float64)), lo, hi).astype(np.int64)
    return (k & 0xFF).astype(np.uint8)


# --- recipes ---------------------------------------------------------------------------------------


def te_scale(amax, elem_max: float, pow2: bool = False, eps: float = 0.0) -> np.ndarray:
    """TE recipe_common.cuh ``compute_scale_from_amax`` (section 2), float32:
    amax < eps -> eps; amax 0/inf/NaN -> 1; f32(elem_max / amax); inf -> FLT_MAX; pow2 masks
    the mantissa (rounds down)."""
    a = np.asarray(amax, F32)
    a = np.where(a < F32(eps), F32(eps), a).astype(F32)
    special = np.isinf(a) | (a == 0) | np.isnan(a)
    with np.errstate(divide="ignore", over="ignore"):
        q = F32(elem_max) / np.where(special, F32(1), a)
    scale = np.where(np.isinf(q), FLT_MAX, q).astype(F32)
    if pow2:
        scale = (scale.view(U32) & U32(0xFF800000)).view(F32)
    return np.where(special, F32(1), scale).astype(F32)


def mx_floor_exponent(amax) -> np.ndarray:
    """floor(log2 amax) from float64 frexp (not from float32 bits): amax = m * 2**e,
    m in [0.5, 1). Only meaningful for amax > 0 and finite."""
    a = np.asarray(amax, np.float64)
    with np.errstate(invalid="ignore"):
        _, e = np.frexp(np.where(np.isfinite(a) & (a > 0), a, 1.0))
    return e.astype(np.int64) - 1


def mx_floor_ref(x: np.ndarray, elem: str, block: int = 32):
    """OCP MX v1.0 section 6.3 floor rule along the last axis (section 4).

    Returns (element codes, E8M0 scale codes). ``elem`` is an ELEMENTS name or "mxint8"
    (k/64, k in [-127, 127], emax 0)."""
    xb = blocks_last(np.asarray(x, F32), block)
    amax = nan_amax(xb)
    emax = 0 if elem == "mxint8" else ELEMENTS[elem][2]
    e = mx_floor_exponent(amax) - emax
    e = np.where(amax == 0, -127, np.maximum(e, -127))
    nan = ~np.isfinite(amax) | (e > 127)
    scales = np.where(nan, 255, e + 127).astype(np.uint8)
    v = xb.astype(np.float64) * np.ldexp(1.0, -np.where(nan, 0, e))  # exact 2**-e (np.exp2 is a SIMD ufunc)
    if elem == "mxint8":
        codes = int_rne(v * 64, -127, 127)
    else:
        codes = cast_sat(v, elem)
    return unblocks_last(codes, x.shape[-1]), scales[..., 0]


def absmax_int8_ref(xb: np.ndarray):
    """Linear symmetric INT8: s = f32(amax / 127), k = RNE(f32(x / s)) in [-127, 127]."""
    amax = nan_amax(xb)
    s = (amax / F32(127)).astype(F32)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(s == 0, F32(0), xb / np.where(s == 0, F32(1), s)).astype(F32)
    return int_rne(q, -127, 127), f32_bits(s[..., 0])


def absmax_fp8_ref(xb: np.ndarray, eps: float = 1e-12):
    """torchao AdamWFp8 (section 7): s = f32(clip(amax, f32(eps)) / 448),
    codes = e4m3(f32(x / s)) saturating."""
    amax = nan_amax(xb)
    s = (np.maximum(amax, F32(eps)) / F32(448)).astype(F32)
    q = (xb / s).astype(F32)
    return cast_sat(q, "float8_e4m3fn"), f32_bits(s[..., 0])


def nvfp4_ref(x: np.ndarray, block: int = 16):
    """TE NVFP4, newest order (section 5), along the last axis.

    Returns (element codes, E4M3 block scale codes, tensor decode scale float32)."""
    xb = blocks_last(np.asarray(x, F32), block)
    amax_b = fmax_amax(xb)
    amax_t = F32(np.fmax.reduce(np.abs(x).reshape(-1), initial=0))
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = np.fmin(F32(2688) / amax_t, FLT_MAX).astype(F32)
    if amax_t == 0 or s_enc == 0:
        s_enc = F32(1)
    s_dec = F32(F32(1) / s_enc)
    sdb = np.fmin((amax_b * F32(s_enc * F32(1 / 6))).astype(F32), FLT_MAX)
    s8 = cast_sat(sdb, "float8_e4m3fn")
    s8v = s8.view(ml_dtypes.float8_e4m3fn).astype(F32)
    with np.errstate(divide="ignore", over="ignore"):
        c = np.where(s8v == 0, FLT_MAX, np.fmin(F32(1) / (s8v * s_dec).astype(F32), FLT_MAX)).astype(F32)
        v = (xb * c).astype(F32)
    codes = cast_sat(v, "float4_e2m1fn")
    return unblocks_last(codes, x.shape[-1]), s8[..., 0], s_dec


def nearest_index(v, table) -> np.ndarray:
    """Brute force: index of the entry nearest to each v (float64 |c - v|), ties to the lower
    index (argmin returns the first minimum)."""
    v = np.asarray(v, np.float64).reshape(-1)
    c = np.asarray(table, np.float64)
    out = np.empty(v.size, np.int64)
    step = 8192
    for i in range(0, v.size, step):
        out[i : i + step] = np.argmin(np.abs(v[i : i + step, None] - c[None, :]), axis=1)
    return out


def bnb_dquantize(x, code) -> np.ndarray:
    """bitsandbytes' CUDA nearest search, ``dQuantize<0>`` of csrc/kernels.cu, step by step
    for a table of 256 float32 entries: ``pivot`` 127, ``upper_pivot`` 255, ``lower_pivot`` 0,
    ``lower`` -1, ``upper`` 1; for ``i`` = 64, 32, ..., 1: if ``x > code[pivot]`` the lower
    bound moves to the pivot and ``pivot += i``, else the upper bound does and ``pivot -= i``.
    Bounds never moved take ``code[255]`` / ``code[0]``. Then with ``val = code[pivot]``: if
    ``x > val``, ``upper_pivot`` iff ``x > f32(f32(upper + val) * 0.5)`` else ``pivot``; else
    ``lower_pivot`` iff ``x < f32(f32(lower + val) * 0.5)`` else ``pivot``. NaN compares
    false everywhere. Returns int64 indices, x's shape."""
    x = np.asarray(x, F32)
    code = np.asarray(code, F32)
    assert code.shape == (256,)
    pivot = np.full(x.shape, 127, np.int64)
    upper_pivot = np.full(x.shape, 255, np.int64)
    lower_pivot = np.zeros(x.shape, np.int64)
    lower, upper = np.full(x.shape, F32(-1)), np.full(x.shape, F32(1))
    val = code[pivot]
    i = 64
    while i > 0:
        gt = x > val
        lower_pivot, lower = np.where(gt, pivot, lower_pivot), np.where(gt, val, lower)
        upper_pivot, upper = np.where(gt, upper_pivot, pivot), np.where(gt, upper, val)
        pivot = np.where(gt, pivot + i, pivot - i)
        val = code[pivot]
        i >>= 1
    upper = np.where(upper_pivot == 255, code[255], upper)
    lower = np.where(lower_pivot == 0, code[0], lower)
    mid_up = ((upper + val) * F32(0.5)).astype(F32)
    mid_lo = ((lower + val) * F32(0.5)).astype(F32)
    gt = x > val
    return np.where(gt, np.where(x > mid_up, upper_pivot, pivot), np.where(x < mid_lo, lower_pivot, pivot))


def bnb_kernel_codes(xb: np.ndarray, code):
    """bitsandbytes' CUDA ``kQuantizeBlockwise`` (General8bit, not stochastic) along the
    last axis (section 6): absmax by fmaxf over |x| (NaN skipped), ``inv = f32(1.0f /
    absmax)`` correctly rounded, no clamp (an absmax of at most 2**-128 gives inf), codes
    ``dQuantize<0>(f32(x * inv))``. An all-NaN block starts the kernel's reduction at
    -FLT_MAX, here at 0. Returns (uint8 codes, float32 absmax with keepdims)."""
    xb = np.asarray(xb, F32)
    amax = fmax_amax(xb)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = (F32(1) / amax).astype(F32)
        v = (xb * inv).astype(F32)
    return bnb_dquantize(v, code).astype(np.uint8), amax


def bnb_hard_blocks(table, signed: bool) -> np.ndarray:
    """Blocks of 256 for the nearest codebook rule (section 6): every float32 midpoint of
    ``table`` and the float32 on either side, and the entries, in blocks led by 1.0 (absmax 1,
    so v = x); the entries times absmaxes 3e-39, 5e-39, 9.99e-39, 1.1e-38 (where a clamp at
    1e-38 would change v), just above 2**-128, 2**-128, 1e-40 and 2**-149 (where 1/absmax is
    inf); an all-zero block; blocks with inf and NaN. |x| where not ``signed``."""
    c = np.asarray(table, F32)
    mid = ((c[:-1] + c[1:]) * F32(0.5)).astype(F32)
    near = np.concatenate([mid, np.nextafter(mid, F32(np.inf)), np.nextafter(mid, F32(-np.inf)), c])
    pad = -near.size % 255
    near = np.concatenate([near, np.zeros(pad, F32)]).reshape(-1, 255)
    rows = [np.concatenate([np.ones((near.shape[0], 1), F32), near], axis=1)]
    above = float(np.nextafter(F32(2.0**-128), F32(1)))  # the smallest absmax with a finite 1/absmax
    tiny = [3e-39, 5e-39, 9.99e-39, 1.1e-38, above, 2.0**-128, 1e-40, 2.0**-149]
    rows.append((np.array(tiny, F32)[:, None] * c[None, :]).astype(F32))
    special = np.zeros((3, 256), F32)
    special[1, :4] = [np.inf, 1.0, np.nan, -0.5]
    special[2, :4] = [np.nan, 0.25, -1.0, 3.0]
    rows.append(special)
    x = np.concatenate(rows).reshape(-1)
    return x if signed else np.abs(x)
