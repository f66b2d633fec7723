"""Compiled loops (numba, optional: ``pip install 'fpsim[fast]'``) for the replay's hot paths.

Each function here does what a numpy path of :mod:`fpsim.optim`, :mod:`fpsim.scaling` or
:mod:`fpsim.replay` does, in one pass over memory instead of a dozen, and gives the same bits:
numba compiles without fast-math, so LLVM neither contracts a multiply and an add into an fma
nor flushes subnormals, division and square root are IEEE (correctly rounded), and the fmas
the optimizers need are LLVM's ``llvm.fma`` intrinsic (one rounding, IEEE 754 section 5.4.1,
in hardware or libm). The tests run both paths on the same inputs (zeros, subnormals, inf,
NaN, ties) and compare bit patterns; float64 statistics are summed in a fixed order (chunks of
2^15 elements, each left to right, then the chunks in order) and may differ from numpy's in
the last bits.

The functions are single-threaded and release the GIL; the replay runs them from its thread
pool. They compile on first use (about a second each), never at import.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["available"]

_CHUNK = 1 << 15


@functools.cache
def available() -> bool:
    """Whether numba can be imported (then the compiled paths are used)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _kernels() -> dict[str, Any]:
    """Compile-on-first-call dispatchers of every loop (numba imported here, not at import)."""
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic

    @intrinsic
    def fma32(typingctx, a, b, c):
        sig = types.float32(types.float32, types.float32, types.float32)

        def codegen(context, builder, signature, args):
            f = ir.FloatType()
            fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
            return builder.call(fn, args)

        return sig, codegen

    @intrinsic
    def bits32(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))

        return types.uint32(types.float32), codegen

    jit = njit(nogil=True, cache=False, fastmath=False, error_model="numpy")

    @jit
    def adam(p, g, m, v, po, mo, vo, mode, decay, omb1, omb2, b2, bc2, eps, neg_step):
        # fpsim.optim._adam_step with Adam.scalars, element by element
        for i in range(p.size):
            pi, gi = p[i], g[i]
            if mode == 1:
                pi = pi * decay
            elif mode == 2:
                gi = fma32(pi, decay, gi)
            mi = fma32(omb1, gi - m[i], m[i])
            vi = fma32(omb2 * gi, gi, v[i] * b2)
            denom = np.sqrt(vi) / bc2 + eps
            po[i] = pi + (neg_step * mi) / denom
            mo[i] = mi
            vo[i] = vi

    @jit
    def sgd(p, g, buf, po, bo, first, l2, wd, mu, neg_lr):
        # fpsim.optim._sgd_step
        for i in range(p.size):
            gi = g[i]
            if l2:
                gi = fma32(p[i], wd, gi)
            b = gi if first else buf[i] * mu + gi
            po[i] = fma32(b, neg_lr, p[i])
            bo[i] = b

    @jit
    def codebook_encode(x, block, base, thr, table, codes, absmax, values, want_values):
        # fpsim.scaling._codebook (nearest): fmaxf absmax (NaN skipped), v = x * f32(1/max(a, 1e-38)),
        # index = base[key] + (v > thr[key]) with key = top 16 bits of v; with want_values also
        # the decoded value table[index] * a (fpsim.scaling._decode_rows)
        n = x.size
        one, tiny = np.float32(1), np.float32(1e-38)
        for b in range(absmax.size):
            lo, hi = b * block, min(n, (b + 1) * block)
            a = np.float32(0)
            for i in range(lo, hi):
                t = abs(x[i])
                if t > a:  # fmax: NaN never wins
                    a = t
            absmax[b] = a
            inv = one / max(a, tiny)
            for i in range(lo, hi):
                v = x[i] * inv
                k = bits32(v) >> 16
                q = base[k] + (1 if v > thr[k] else 0)
                codes[i] = q
                if want_values:
                    values[i] = table[q] * a

    @jit
    def codebook_decode(codes, table, scales, block, out):
        # fpsim.scaling._decode_rows for codebooks: table[code] * scale
        n = codes.size
        for b in range(scales.size):
            s = scales[b]
            for i in range(b * block, min(n, (b + 1) * block)):
                out[i] = table[codes[i]] * s

    @jit
    def tensor_stats(f, old, new, ref, ref_old, sums):
        # fpsim.replay._update_counts and _param_sums in one pass: counts of changed and of
        # swallowed updates; sum d^2, sum ref^2, u.ur, u.u, ur.ur (float64), chunk by chunk
        n = new.size
        updates = swamped = 0
        for c in range(0, n, _CHUNK):
            s0 = s1 = s2 = s3 = s4 = 0.0
            for i in range(c, min(n, c + _CHUNK)):
                if f[i] != old[i]:
                    updates += 1
                    if new[i] == old[i]:
                        swamped += 1
                a, r = np.float64(new[i]), np.float64(ref[i])
                d = a - r
                u, ur = a - np.float64(old[i]), r - np.float64(ref_old[i])
                s0 += d * d
                s1 += r * r
                s2 += u * ur
                s3 += u * u
                s4 += ur * ur
            sums[0] += s0
            sums[1] += s1
            sums[2] += s2
            sums[3] += s3
            sums[4] += s4
        return updates, swamped

    @jit
    def state_stats(exact, stored, ref, sums):
        # fpsim.replay._zero_counts and _state_sums in one pass
        n = stored.size
        nonzero = zeroed = 0
        for c in range(0, n, _CHUNK):
            s0 = s1 = 0.0
            for i in range(c, min(n, c + _CHUNK)):
                if exact[i] != 0:
                    nonzero += 1
                    if stored[i] == 0:
                        zeroed += 1
                r = np.float64(ref[i])
                e = np.float64(stored[i]) - r
                s0 += e * e
                s1 += r * r
            sums[0] += s0
            sums[1] += s1
        return nonzero, zeroed

    return {
        "adam": adam,
        "sgd": sgd,
        "codebook_encode": codebook_encode,
        "codebook_decode": codebook_decode,
        "tensor_stats": tensor_stats,
        "state_stats": state_stats,
    }


def kernel(name: str) -> Any:
    """The compiled loop ``name`` (see :func:`_kernels`); call only when :func:`available`."""
    return _kernels()[name]


def flat32(*arrays: Any) -> list[np.ndarray] | None:
    """1-D views of float32 C-contiguous arrays of one size, or None (then use numpy)."""
    out = []
    for a in arrays:
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
            return None
        out.append(a.reshape(-1))
    if len({a.size for a in out}) > 1:
        return None
    return out
