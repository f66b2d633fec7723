"""Portable Triton reduction of the analysis metrics of one chunk
(:func:`fpsim.analysis.metrics.tally_chunk`).

Per program instance: exact integer counts (as int32: at most BLOCK <= 65536 elements),
float64 sums of squares and float64 maxima of the chunk ``x`` (inputs) against ``q`` (the
values the format stores). Classification uses integer tests of the float32 bits (exact,
no float compare conventions involved). The reductions are ``tl.reduce`` with combine
functions of this file (triton's library reductions are decorated at triton's import, for
one mode only; see ``_loader.py``).

Executed once per mode by :func:`fpsim.kernels._loader.kernel_module`; import it there.
"""

import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _count(flag):
    return tl.reduce(flag.to(tl.int32), 0, _add)


@triton.jit
def tally_kernel(x_ptr, q_ptr, f_ptr, cnt_ptr, sum_ptr, max_ptr, n, BLOCK: tl.constexpr):
    """Counts (nan, finite, nonzero, overflow, underflow, subnormal, saturated), sums
    (squared error, signal, underflow energy) and maxima (abs error, rel error, abs input)
    of the program's elements; ``f`` holds the element flags (bit 0: code is +-max, bit 1:
    subnormal element)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    xb = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    qb = tl.load(q_ptr + offs, mask=mask, other=0).to(tl.uint32, bitcast=True)
    fl = tl.load(f_ptr + offs, mask=mask, other=0).to(tl.int32)
    xm = xb & 0x7FFFFFFF
    qm = qb & 0x7FFFFFFF
    nan = xm > 0x7F800000
    finite = xm < 0x7F800000
    nz = finite & (xm != 0)
    qfin = qm < 0x7F800000
    ok = finite & qfin
    zq = qm == 0
    under = nz & zq
    sat = finite & ((fl & 1) != 0) & (qm <= 0x7F800000) & (xm > qm)
    sub = nz & (~zq) & ((fl & 2) != 0)
    base = cnt_ptr + pid * 8
    tl.store(base + 0, _count(nan & mask))
    tl.store(base + 1, _count(finite & mask))
    tl.store(base + 2, _count(nz & mask))
    tl.store(base + 3, _count(finite & (~qfin) & mask))
    tl.store(base + 4, _count(under & mask))
    tl.store(base + 5, _count(sub & mask))
    tl.store(base + 6, _count(sat & mask))
    x64 = tl.where(finite, xb.to(tl.float32, bitcast=True), 0.0).to(tl.float64)
    q64 = tl.where(ok, qb.to(tl.float32, bitcast=True), 0.0).to(tl.float64)
    err = tl.where(ok, q64 - x64, 0.0)
    sq = x64 * x64
    sbase = sum_ptr + pid * 4
    tl.store(sbase + 0, tl.reduce(err * err, 0, _add))
    tl.store(sbase + 1, tl.reduce(sq, 0, _add))
    tl.store(sbase + 2, tl.reduce(tl.where(under, sq, 0.0), 0, _add))
    aerr = tl.abs(err)
    ax = tl.abs(x64)
    rel = tl.where(nz, aerr / tl.where(nz, ax, 1.0), 0.0)  # float64: div.rn.f64 on NVIDIA
    mbase = max_ptr + pid * 4
    tl.store(mbase + 0, tl.reduce(aerr, 0, _max))
    tl.store(mbase + 1, tl.reduce(rel, 0, _max))
    tl.store(mbase + 2, tl.reduce(ax, 0, _max))
