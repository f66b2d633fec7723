"""The compiled loops of the ``fast`` extra (numba), as module-level functions.

Each function does what a numpy path of :mod:`fpsim.replay.optim`, :mod:`fpsim.emulate.blocks` or
:mod:`fpsim.replay` does, in one pass over memory instead of a dozen, and gives the same bits:
numba compiles without fast-math, so LLVM neither contracts a multiply and an add into an fma
nor flushes subnormals, division and square root are IEEE (correctly rounded), and the fmas
the optimizers need are LLVM's ``llvm.fma`` intrinsic (one rounding, IEEE 754 section 5.4.1).
``tests/replay/test_compiled.py`` runs both paths on the same inputs (zeros, subnormals, inf, NaN, ties)
and compares bit patterns.

The one relaxation is in the float64 statistics (``jit_sum``): sums of squared errors and of
update products are summed with reassociation allowed inside a tile of ``TILE`` elements, so
that LLVM sums in SIMD lanes, and the tile sums are added in order. The order is fixed by the
compiled code, so results do not depend on the number of threads; they may differ from numpy's
sums, and between machines of different SIMD widths, in the last bits.

Compiled code is cached on disk (numba ``cache=True``: ``__pycache__`` beside this file, or
numba's per-user cache folder when the install folder is read-only; where neither can be
written the loops are compiled in memory on every run). All loops live in this one file on
purpose: numba checks a cached function against the time stamp of the file that defines it
only, so a loop calling a loop of another file could run stale cached code after an upgrade.
The one thing read from elsewhere is the numbering of the 8-bit state encodings and of Adam's
weight decay, :class:`fpsim.formats.codes.StateKind` and :class:`~fpsim.formats.codes.Decay`
(free of numba), as plain integers frozen into the compiled code at compile time; those numbers
are fixed for good (a new member takes a new number, none is ever renumbered), so a cached loop
always agrees with the enums.

This module imports numba at import; it is imported only when the compiled backend is used.
The functions are single-threaded and release the GIL; the replay runs them from its thread
pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ..formats.codes import Decay, StateKind

# the StateKind and Decay numbers as plain integers (compile-time constants of the loops below)
_CODEBOOK = int(StateKind.CODEBOOK)
_INT8_ABSMAX = int(StateKind.INT8_ABSMAX)
_E4M3_ABSMAX = int(StateKind.E4M3_ABSMAX)
_TE_POW2 = int(StateKind.TE_POW2)
_QMAP = int(StateKind.QMAP)
_CODEBOOK_LUT = int(StateKind.CODEBOOK_LUT)
_DECOUPLED = int(Decay.DECOUPLED)
_L2 = int(Decay.L2)

TILE = 1 << 12  # elements per tile: the tile buffers of a step stay in the L1/L2 cache


def _compiler(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)``, or without the disk cache where numba finds no
    folder it may write (it says so when the function is decorated)."""

    def decorate(fn: Callable[..., Any]) -> Any:
        try:
            return njit(cache=True, **options)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return njit(cache=False, **options)(fn)

    return decorate


jit = _compiler(nogil=True, fastmath=False, error_model="numpy")
# Float64 statistics only: reassociation lets LLVM sum in SIMD lanes (a fixed order for the
# compiled code, so the same on every call and thread); nothing else is relaxed.
jit_sum = _compiler(nogil=True, fastmath={"reassoc"}, error_model="numpy")


@intrinsic
def fma32(typingctx, a, b, c):
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)

    return sig, codegen


def bitcast(src: Any, dst: Any, llvm_type: Any) -> Any:
    """A numba intrinsic reinterpreting the bits of a ``src`` scalar as a ``dst`` scalar (one
    LLVM ``bitcast``, generated inline at each call: no compiled code of its own to go stale)."""

    def cast(typingctx: Any, x: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.bitcast(args[0], llvm_type)

        return dst(src), codegen

    return intrinsic(cast)


bits32 = bitcast(types.float32, types.uint32, ir.IntType(32))
float32_of = bitcast(types.uint32, types.float32, ir.FloatType())
bits64 = bitcast(types.float64, types.uint64, ir.IntType(64))
float64_of = bitcast(types.uint64, types.float64, ir.DoubleType())


@jit
def tile_of(block):
    # elements per tile for blocks of `block` elements: whole blocks, about TILE
    return block * max(1, TILE // block)


@jit
def adam(p, g, m, v, po, mo, vo, mode, decay, omb1, omb2, b2, bc2, eps, neg_step):
    # fpsim.replay.optim._adam_step with Adam.scalars (mode: a Decay), element by element
    for i in range(p.size):
        pi, gi = p[i], g[i]
        if mode == _DECOUPLED:
            pi = pi * decay
        elif mode == _L2:
            gi = fma32(pi, decay, gi)
        mi = fma32(omb1, gi - m[i], m[i])
        vi = fma32(omb2 * gi, gi, v[i] * b2)
        denom = np.sqrt(vi) / bc2 + eps
        po[i] = pi + (neg_step * mi) / denom
        mo[i] = mi
        vo[i] = vi


@jit
def bf16_round(x, stochastic, mix, start, out):
    # fpsim.emulate.element.quantize(x, "bfloat16") nearest-even, or with stochastic rounding and
    # random_bits=fpsim.emulate.random.random_bits_at(seed, start, n), mix = seed *
    # 0x9E3779B97F4A7C15 (SplitMix64 of mix + index, low 32 bits): the 16 discarded bits
    # round away iff rem + (r >> 16) >= 2^16 (fpsim.emulate._bitcore._round with 32 random bits).
    # A carry runs into the exponent (overflow gives inf, as IEEE 754 7.4 for these
    # modes). NaN inputs are left to the caller: returns how many there are (their
    # outputs are not set)
    nan = 0
    for i in range(x.size):
        b = bits32(x[i])
        mag = b & np.uint32(0x7FFFFFFF)
        nan += mag > np.uint32(0x7F800000)
        if stochastic:
            z = np.uint64(start + i) + mix
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            add = np.uint32((z ^ (z >> np.uint64(31))) & np.uint64(0xFFFFFFFF)) >> np.uint32(16)
        else:
            add = np.uint32(0x7FFF) + ((mag >> np.uint32(16)) & np.uint32(1))
        q = ((mag + add) >> np.uint32(16)) << np.uint32(16)
        out[i] = float32_of((b & np.uint32(0x80000000)) | q)
    return nan


@jit
def bf16_of64(x):
    # float64 x (not NaN) rounded once to bfloat16, nearest-even, as float32
    # (fpsim.emulate.element.quantize(x, "bfloat16") of float64 input): from 2^-126 up the
    # mantissa rounded to 7 bits on the bits (a carry runs into the exponent; past bfloat16's
    # largest value the result is inf, IEEE 754 7.4), below it |x| * 2^133 rounded to an
    # integer (the subnormal steps of 2^-133); the sign kept (-0 for a negative underflow)
    b = bits64(x)
    mag = b & np.uint64(0x7FFFFFFFFFFFFFFF)
    a = float64_of(mag)
    if a < 2.0**-126:
        r = np.rint(a * 2.0**133) * 2.0**-133
    else:
        q = (mag + np.uint64(0xFFFFFFFFFFF) + ((mag >> np.uint64(45)) & np.uint64(1))) >> np.uint64(45)
        r = float64_of(q << np.uint64(45))
        r = np.inf if r > 3.3895313892515355e38 else r
    return np.float32(-r if b >> np.uint64(63) else r)


@jit
def kahan_bf16(p_f32, p_old, comp, new, comp_out):
    # fpsim.replay.storage.round_master with Kahan compensation, bfloat16 nearest-even:
    # y = (f64(p_f32) - p_old) + comp, new = bf16(p_old + y), comp = bf16(y - (new - p_old)),
    # every operation in float64 and each rounding to bfloat16 once (bf16_of64). Elements
    # where either result is NaN are left to the caller: returns how many there are
    nan = 0
    for i in range(p_f32.size):
        old = np.float64(p_old[i])
        y = (np.float64(p_f32[i]) - old) + np.float64(comp[i])
        s = old + y
        ok = s == s
        nw = bf16_of64(s) if ok else np.float32(0)
        c = y - (np.float64(nw) - old)
        ok = ok and c == c
        nan += not ok
        new[i] = nw
        comp_out[i] = bf16_of64(c) if ok else np.float32(0)
    return nan


@jit
def f16_round(x, out):
    # fpsim.emulate.element.quantize(x, "float16"), nearest-even: from 2^-14 up the mantissa
    # rounded to 10 bits (a carry runs into the exponent; above 65504 the result is inf,
    # as IEEE 754 7.4), below it x * 2^24 rounded to an integer once by adding 2^23 (the
    # subnormal steps of 2^-24). NaN inputs are left to the caller: returns how many
    # there are (their outputs are not set)
    nan = 0
    for i in range(x.size):
        b = bits32(x[i])
        mag = b & np.uint32(0x7FFFFFFF)
        nan += mag > np.uint32(0x7F800000)
        q = (
            (mag + np.uint32(0xFFF) + ((mag >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
        ) << np.uint32(13)
        q = np.uint32(0x7F800000) if q > np.uint32(0x477FE000) else q
        k = (float32_of(mag) * np.float32(16777216) + np.float32(8388608)) - np.float32(8388608)
        q = bits32(k * np.float32(2.0**-24)) if mag < np.uint32(0x38800000) else q
        out[i] = float32_of((b & np.uint32(0x80000000)) | q)
    return nan


@jit
def sgd(p, g, buf, po, bo, first, l2, wd, mu, neg_lr):
    # fpsim.replay.optim._sgd_step
    for i in range(p.size):
        gi = g[i]
        if l2:
            gi = fma32(p[i], wd, gi)
        b = gi if first else buf[i] * mu + gi
        po[i] = fma32(b, neg_lr, p[i])
        bo[i] = b


@jit
def absmax(x):
    # fmaxf over |x| with NaN skipped, on the bit patterns: below NaN, float32 magnitudes
    # order as their bits do (one integer max per element, which vectorizes)
    a = np.uint32(0)
    for i in range(x.size):
        b = bits32(x[i]) & np.uint32(0x7FFFFFFF)
        a = max(a, b if b <= np.uint32(0x7F800000) else np.uint32(0))
    return float32_of(a)


@jit
def codebook_tile(x, block, first, base, thr, table, codes, absmaxes, values):
    # fpsim.emulate.scale_rules.codebook_codes (nearest) on whole blocks x (block `first` onwards): absmax,
    # v = x * f32(1/a) (bitsandbytes' kernels: a = 0 gives inf), index = base[key] + (v > thr[key])
    # with key = the top 16 bits of v, 0 for a NaN v, and the decoded value table[index] * a
    # (fpsim.emulate.blocks._decode_rows) (every inner loop runs over slices from 0: an index of
    # unknown sign makes numba check it for wraparound, and such loops run several times slower)
    n = x.size
    one = np.float32(1)
    for b in range(-(-n // block)):
        lo, hi = b * block, min(n, (b + 1) * block)
        xs, cs, vs = x[lo:hi], codes[lo:hi], values[lo:hi]
        a = absmax(xs)
        absmaxes[first + b] = a
        inv = one / a
        for i in range(xs.size):
            v = xs[i] * inv
            k = bits32(v) >> 16
            q = base[k] + (1 if v > thr[k] else 0)
            q = q if v == v else 0
            cs[i] = q
            vs[i] = table[q] * a


@jit
def lut_tile(x, block, first, lut, table, codes, absmaxes, values):
    # fpsim.emulate.scale_rules.codebook_codes with Codebook.lut_bins = 65536 (bitsandbytes' CPU
    # kernel) on whole blocks x: absmax (NaN skipped), v = x * f32(1/a) clipped to [-1, 1] (NaN
    # stays), bin k = trunc(f32(f64(f32(f32(v + 1) * 0.5)) * 65535 + 0.5)) (float64 product and
    # sum, each rounded), 0 for NaN, index lut[k] (0 for a block of absmax 0), and the decoded
    # value table[index] * a
    n = x.size
    one = np.float32(1)
    for b in range(-(-n // block)):
        lo, hi = b * block, min(n, (b + 1) * block)
        xs, cs, vs = x[lo:hi], codes[lo:hi], values[lo:hi]
        a = absmax(xs)
        absmaxes[first + b] = a
        inv = one / a
        for i in range(xs.size):
            v = xs[i] * inv
            v = -one if v < -one else (one if v > one else v)
            k = np.float32(np.float64((v + one) * np.float32(0.5)) * 65535.0 + 0.5)
            q = lut[np.int64(k) & 0xFFFF] if k == k else lut[0]
            q = q if a != 0 else np.uint8(0)
            cs[i] = q
            vs[i] = table[q] * a


@jit
def qmap_tile(x, block, first, base, thr, table, clip, codes, scales, values):
    # fpsim.replay.qmap.encode_qmap (torchao's quantizer) on whole blocks x: s = max(amax, clip)
    # (amax_nan: a NaN propagates and stays), v = x / s, index = base[key] + (v > thr[key]) with
    # key = the top 16 bits of v (the thresholds of torchao's rule: fpsim.replay.qmap.qmap_buckets),
    # 0 for a NaN v, and the decoded value table[index] * s
    n = x.size
    for b in range(-(-n // block)):
        lo, hi = b * block, min(n, (b + 1) * block)
        xs, cs, vs = x[lo:hi], codes[lo:hi], values[lo:hi]
        a = amax_nan(xs)
        s = a if (a >= clip or a != a) else clip
        scales[first + b] = s
        for i in range(xs.size):
            v = xs[i] / s
            k = bits32(v) >> 16
            q = base[k] + (1 if v > thr[k] else 0)
            q = q if v == v else 0
            cs[i] = q
            vs[i] = table[q] * s


@jit
def amax_nan(x):
    # torch.amax of |x|: NaN if any element is NaN (the bits above inf's), as the canonical
    # quiet NaN 0x7FC00000 (fpsim.formats.amax.amax_propagate_nan)
    a = np.uint32(0)
    for i in range(x.size):
        a = max(a, bits32(x[i]) & np.uint32(0x7FFFFFFF))
    return float32_of(a if a <= np.uint32(0x7F800000) else np.uint32(0x7FC00000))


@jit
def e4m3_code(v):
    # float32 -> float8_e4m3fn, nearest-even, saturating (fpsim.emulate.element.encode with
    # saturate=True): NaN -> S.1111.111, |v| > 448 -> 448, below 2^-6 subnormal steps of
    # 2^-9 (an integer multiple of 2^-9 rounded once by adding 2^23), else the mantissa
    # rounded to 3 bits; branch-free (selects), so that loops of it vectorize
    b = bits32(v)
    sign = (b >> 24) & np.uint32(0x80)
    a = b & np.uint32(0x7FFFFFFF)
    sub = bits32(float32_of(a) * np.float32(512) + np.float32(8388608)) - np.uint32(0x4B000000)
    nor = ((a + np.uint32(0x7FFFF) + ((a >> 20) & np.uint32(1))) >> 20) - np.uint32(120 << 3)
    c = sub if a < np.uint32(0x3C800000) else nor
    c = np.uint32(0x7E) if a > np.uint32(0x43E00000) else c  # above 448, inf included
    c = np.uint32(0x7F) if a > np.uint32(0x7F800000) else c
    return np.uint8(sign | c)


@jit
def int8_code(v):
    # float32 -> int8 symmetric, nearest-even, saturating to -127..127, NaN -> 0
    r = min(max(np.rint(v), np.float32(-127)), np.float32(127))
    return np.uint8(np.int32(np.float32(0) if v != v else r) & 0xFF)


@jit
def te_block(pow2, xs, eps, elem_max, cs, vs, table):
    # fpsim.emulate.scale_rules.prescale (ScaleRule.TE, recipe_common.cuh compute_scale_from_amax) of
    # one block: amax (fmaxf, NaN skipped), at least eps; scale = elem_max / amax, 1 for an
    # amax of 0, inf or NaN, FLT_MAX for an infinite quotient, pow2: the mantissa cleared;
    # elements x * scale cast nearest-even saturating; returns the decode scale 1 / scale
    a = absmax(xs)
    a = eps if a < eps else a
    one = np.float32(1)
    scale = one if (a == 0 or a != a or a == np.inf) else elem_max / a
    scale = np.float32(3.4028234663852886e38) if scale == np.inf else scale
    if pow2:
        scale = float32_of(bits32(scale) & np.uint32(0xFF800000))
    s = one / scale
    for i in range(xs.size):
        cs[i] = e4m3_code(xs[i] * scale)
    for i in range(xs.size):
        vs[i] = table[cs[i]] * s
    return s


@jit
def absmax_tile(kind, x, block, first, eps, elem_max, table, codes, scales, values):
    # fpsim.emulate.scale_rules.prescale (ScaleRule.ABSMAX) with an int8 symmetric (INT8_ABSMAX) or
    # float8_e4m3fn (E4M3_ABSMAX) element on whole blocks: amax (NaN propagates), s =
    # f32(max(amax, eps) / elem_max), elements x / (s or 1) cast nearest-even saturating,
    # and the decoded value table[code] * s
    n = x.size
    for b in range(-(-n // block)):
        lo, hi = b * block, min(n, (b + 1) * block)
        xs, cs, vs = x[lo:hi], codes[lo:hi], values[lo:hi]
        a = amax_nan(xs)
        s = (a if a >= eps or a != a else eps) / elem_max
        scales[first + b] = s
        d = s if s != 0 else np.float32(1)
        if kind == _INT8_ABSMAX:
            for i in range(xs.size):
                cs[i] = int8_code(xs[i] / d)
        else:
            for i in range(xs.size):
                cs[i] = e4m3_code(xs[i] / d)
        for i in range(xs.size):
            vs[i] = table[cs[i]] * s


@jit
def encode_tile(kind, x, block, first, base, thr, table, eps, elem_max, codes, scales, values):
    # one tile of a state, `kind` a StateKind value: CODEBOOK codebook_tile, CODEBOOK_LUT lut_tile
    # (base: the lookup table), QMAP qmap_tile (eps: the clip), INT8_ABSMAX and E4M3_ABSMAX
    # absmax_tile, TE and TE_POW2 te_block (one block: per-tensor scaling; TE_POW2 with a
    # power-of-two scale)
    if kind == _CODEBOOK:
        codebook_tile(x, block, first, base, thr, table, codes, scales, values)
    elif kind == _CODEBOOK_LUT:
        lut_tile(x, block, first, base, table, codes, scales, values)
    elif kind == _QMAP:
        qmap_tile(x, block, first, base, thr, table, eps, codes, scales, values)
    elif kind == _INT8_ABSMAX or kind == _E4M3_ABSMAX:
        absmax_tile(kind, x, block, first, eps, elem_max, table, codes, scales, values)
    else:
        scales[first] = te_block(kind == _TE_POW2, x, eps, elem_max, codes, values, table)


@jit
def codebook_encode(x, block, base, thr, table, codes, absmax, values, want_values):
    # codebook_tile over the tensor, one tile of whole blocks at a time
    tile = tile_of(block)
    buf = np.empty(tile if not want_values else 0, np.float32)
    for lo in range(0, x.size, tile):
        hi = min(x.size, lo + tile)
        out = values[lo:hi] if want_values else buf[: hi - lo]
        codebook_tile(x[lo:hi], block, lo // block, base, thr, table, codes[lo:hi], absmax, out)


@jit
def table_decode(codes, table, scales, block, out):
    # fpsim.emulate.blocks._decode_rows of 8-bit elements with an FP32 scale per block (codebooks,
    # int8, float8_e4m3fn): table[code] * scale, the table holding each code's value
    n = codes.size
    for b in range(scales.size):
        s = scales[b]
        cs, o = codes[b * block : min(n, (b + 1) * block)], out[b * block : min(n, (b + 1) * block)]
        for i in range(cs.size):
            o[i] = table[cs[i]] * s


@jit
def table_gather(codes, table, out):
    # fpsim.emulate.element.decode_array of codes that fit the format (unsigned, no wider than
    # it): table[code], the table holding each code's value (decode_table)
    for i in range(codes.size):
        out[i] = table[codes[i]]


@jit
def zero_counts(exact, stored):
    # nonzero elements of exact, and those of them stored as zero
    nonzero = zeroed = 0
    for i in range(exact.size):
        nz = np.int64(exact[i] != 0)
        nonzero += nz
        zeroed += nz * np.int64(stored[i] == 0)
    return nonzero, zeroed


@jit
def update_counts(f, old, new):
    # elements the optimizer changed, and those of them the master rounding swallowed
    updates = swamped = 0
    for i in range(f.size):
        ch = np.int64(f[i] != old[i])
        updates += ch
        swamped += ch * np.int64(new[i] == old[i])
    return updates, swamped


@jit_sum
def sq_diff(a, b):
    s = 0.0
    for i in range(a.size):
        d = np.float64(a[i]) - np.float64(b[i])
        s += d * d
    return s


@jit_sum
def sq(a):
    s = 0.0
    for i in range(a.size):
        d = np.float64(a[i])
        s += d * d
    return s


@jit_sum
def diff_dot(a, a0, b, b0):
    s = 0.0
    for i in range(a.size):
        s += (np.float64(a[i]) - np.float64(a0[i])) * (np.float64(b[i]) - np.float64(b0[i]))
    return s


@jit
def tensor_stats(f, old, new, ref, ref_old, sums):
    # fpsim.replay.stats._update_counts and _param_sums: counts of changed and of swallowed
    # updates; sum d^2, sum ref^2, u.ur, u.u, ur.ur (float64) tile by tile
    n = new.size
    updates = swamped = 0
    for lo in range(0, n, TILE):
        hi = min(n, lo + TILE)
        nw, r, o, ro = new[lo:hi], ref[lo:hi], old[lo:hi], ref_old[lo:hi]
        a, b = update_counts(f[lo:hi], o, nw)
        updates += a
        swamped += b
        sums[0] += sq_diff(nw, r)
        sums[1] += sq(r)
        sums[2] += diff_dot(nw, o, r, ro)
        sums[3] += sq_diff(nw, o)
        sums[4] += sq_diff(r, ro)
    return updates, swamped


@jit
def tile_state_stats(exact, stored, ref, counts, sums, j):
    # fpsim.replay.stats._zero_counts and _state_sums of one tile, into counts[j:j+2], sums[j:j+2]
    a, b = zero_counts(exact, stored)
    counts[j] += a
    counts[j + 1] += b
    sums[j] += sq_diff(stored, ref)
    sums[j + 1] += sq(ref)


@jit
def state_stats(exact, stored, ref, sums):
    # tile_state_stats, tile by tile
    counts = np.zeros(2, np.int64)
    for lo in range(0, stored.size, TILE):
        hi = min(stored.size, lo + TILE)
        tile_state_stats(exact[lo:hi], stored[lo:hi], ref[lo:hi], counts, sums, 0)
    return counts[0], counts[1]


@jit
def encode_blocks8(kind, x, block, base, thr, table, eps, elem_max, codes, scales, values):
    # encode_tile over the tensor, one tile of whole blocks at a time
    tile = tile_of(block)
    for lo in range(0, x.size, tile):
        hi = min(x.size, lo + tile)
        xs, cs, vs = x[lo:hi], codes[lo:hi], values[lo:hi]
        encode_tile(kind, xs, block, lo // block, base, thr, table, eps, elem_max, cs, scales, vs)


@jit
def adam_blocks(p, g, mq, ms, vq, vs, block, m_state, v_state, po, mref, vref, want_stats, counts, sums, sc):
    # One Adam step with both moments in 8-bit blocks (fpsim.replay.engine's module doc,
    # semantics 2-3), tile by tile of whole blocks: decode (table[code] * scale), the adam
    # loop above, encode_tile on each new moment (codes and scales in place), then with
    # want_stats the state statistics of state_stats against the reference's moments.
    # m_state, v_state: (kind, table, base, thr, eps, elem_max) of each moment
    # (fpsim.replay.fused._moment_args); sc: the step's fpsim.replay.optim.AdamScalars, a tuple
    mk, mt, mbase, mthr, meps, mmax = m_state
    vk, vt, vbase, vthr, veps, vmax = v_state
    mode, decay, omb1, omb2, b2, bc2, eps, neg_step = sc
    n = p.size
    tile = tile_of(block)
    m0, v0 = np.empty(tile, np.float32), np.empty(tile, np.float32)
    m1, v1 = np.empty(tile, np.float32), np.empty(tile, np.float32)
    for lo in range(0, n, tile):
        hi = min(n, lo + tile)
        k, first = hi - lo, lo // block
        last = first - (-k // block)
        table_decode(mq[lo:hi], mt, ms[first:last], block, m0)
        table_decode(vq[lo:hi], vt, vs[first:last], block, v0)
        adam(p[lo:hi], g[lo:hi], m0, v0, po[lo:hi], m1, v1, mode, decay, omb1, omb2, b2, bc2, eps, neg_step)
        encode_tile(mk, m1[:k], block, first, mbase, mthr, mt, meps, mmax, mq[lo:hi], ms, m0)
        encode_tile(vk, v1[:k], block, first, vbase, vthr, vt, veps, vmax, vq[lo:hi], vs, v0)
        if want_stats:
            tile_state_stats(m1[:k], m0[:k], mref[lo:hi], counts, sums, 0)
            tile_state_stats(v1[:k], v0[:k], vref[lo:hi], counts, sums, 2)
