"""What a format does to a tensor, as mergeable partial results.

:func:`measure` rounds a tensor to a format or block recipe and returns a :class:`Partial`:
counts (elements, nonzero, underflow, subnormal, overflow, saturated, NaN/inf already in the
input), sums of squared error and signal, extrema and a log2-magnitude histogram.
:func:`measure_swamping` returns a :class:`SwampPartial` for a parameter update. Partials
merge with ``+`` (:mod:`fpsim.analysis.partials`), so a tensor can be measured in chunks,
streamed and reduced across workers.

Reproducibility: a tensor is always cut into the same *canonical chunks* (a function of its
shape and the recipe only, see :func:`chunk_slices`). Float sums are exact sums of float64
terms (:mod:`fpsim.analysis.partials`), counts exact integers, maxima order-free, so streaming,
processing whole, any merge order across threads and processes, and both tiers (numpy, and
the compiled one of :mod:`fpsim.analysis.compiled`) give bit-identical results.

Definitions (per element, ``x`` the input, ``q`` the value the format stores):
    nonzero: ``x`` finite and != 0. underflow: nonzero and ``q == 0``.
    subnormal: nonzero, ``q != 0`` and the element lands below the element format's
        smallest normal (in the scaled domain for block formats; 0 for integer/codebook
        elements). overflow: ``x`` finite and ``q`` inf or NaN.
    saturated: ``x`` finite, the element code is +-max and ``|x| > |q|`` (clamped).
    sum_sq_err: sum of ``(q - x)**2`` over finite ``x`` with finite ``q`` (the difference in
        float64, its square a term of :mod:`fpsim.analysis.partials`).
    sum_sq_signal: sum of ``x**2`` over finite ``x``. underflow_energy: over underflow.
    hist: counts of float32 exponent fields of nonzero finite ``x`` (bin e: 2**(e-127) <=
        |x| < 2**(e-126); bin 0 holds float32 subnormals).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._compiled import Backend
from ..emulate import blocks, element
from ..emulate.random import random_bits_at, shifted_seed
from ..formats import AnyFormat, BlockFormat, Codebook, Format, IntFormat, RoundMode, get_format
from ..formats.amax import amax_ignore_nan
from .partials import Partial, SwampPartial, exact_sum

__all__ = [
    "chunk_view",
    "element_flags",
    "needs_tensor_amax",
    "Partial",
    "SwampPartial",
    "measure",
    "measure_chunk",
    "measure_swamping",
    "not_covered",
    "swamping_chunk",
    "measure_tensor",
    "tally_chunk",
    "tally_jobs",
    "swamping_partial",
    "chunk_slices",
    "iter_chunks",
    "tensor_amax",
    "CHUNK",
]

AnyKind = AnyFormat | BlockFormat
"""What the analysis measures: an element format or a block recipe."""

CHUNK = 1 << 20
"""Elements per canonical chunk (rows are kept whole for row- and tile-blocked recipes)."""


# --- canonical chunks ------------------------------------------------------------------


def chunk_slices(shape: tuple[int, ...], fmt: Any) -> list[tuple[int, int]]:
    """Canonical chunks of a tensor as ``(start, stop)`` ranges of its flat (C-order) index.

    Element formats and flattened block recipes cut the flat tensor every :data:`CHUNK`
    elements. Recipes with blocks over trailing axes cut between whole rows (whole
    128-row tile bands, whole leading slices for 2-D tiles of a >2-D tensor) so that no
    block is split. Per-tensor recipes and NVFP4 take the tensor amax as an input, so they
    are cut like the others.
    """
    return _slices(shape, get_format(fmt))


def _slices(shape: tuple[int, ...], fmt: AnyKind) -> list[tuple[int, int]]:
    """:func:`chunk_slices` of a resolved format."""
    n = math.prod(shape)
    if n == 0:
        return []
    unit = 1  # elements that must stay together
    if isinstance(fmt, BlockFormat) and not fmt.flatten and fmt.block is not None:
        k = len(fmt.block)
        if len(shape) < k:
            raise ValueError(f"{fmt.name}: blocks {fmt.block} span the last {k} axes; got shape {shape}")
        if k == 1:
            unit = shape[-1]  # whole rows
        elif len(shape) == 2 and fmt.block[0] != -1:
            unit = shape[-1] * fmt.block[0]  # whole bands of tiles
        else:
            unit = math.prod(shape[1:]) if len(shape) > k else n  # whole leading slices
    step = max(unit, CHUNK // unit * unit) if unit else n
    return [(i, min(i + step, n)) for i in range(0, n, step)]


def not_covered(shape: tuple[int, ...], fmt: AnyKind) -> str | None:
    """Why the recipe ``fmt`` does not apply to a tensor of ``shape`` (blocks over more axes
    than it has, as a 2-D tile over a bias or any block over a 0-d tensor; blocks that do not
    divide it where the recipe has no padding), or None where it does (element formats
    always do). The analysis leaves such a tensor out for that recipe and reports it, as
    Transformer Engine leaves non-GEMM tensors in high precision."""
    if not isinstance(fmt, BlockFormat):
        return None
    try:
        _slices(shape, fmt)
        blocks.block_geometry(shape, fmt)
    except ValueError as err:
        return str(err)
    return None


def chunk_view(flat: np.ndarray, shape: tuple[int, ...], start: int, stop: int, fmt: Any) -> np.ndarray:
    """The chunk shaped so the recipe sees whole rows (or whole leading slices)."""
    part = flat[start:stop]
    if not (isinstance(fmt, BlockFormat) and not fmt.flatten and fmt.block is not None and len(shape) > 1):
        return part
    if len(fmt.block) == 1 or len(shape) == 2:
        return part.reshape(-1, shape[-1])
    return part.reshape((-1, *shape[1:]))


# --- measuring ---------------------------------------------------------------------------


def measure(
    x: Any,
    fmt: Any,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    *,
    seed: int = 0,
    saturate: bool = False,
    with_hist: bool = False,
    progress: Any = None,
    backend: Backend | str = "auto",
) -> Partial:
    """Partial metrics of the whole tensor ``x`` (numpy or memory-mapped) under ``fmt``.

    Works through the canonical chunks, so memory stays bounded for memory-mapped input.
    The log2 histogram (format-independent) is filled only when ``with_hist`` is set.
    ``seed`` feeds stochastic rounding (see :func:`fpsim.emulate.random.random_bits_at`);
    ``saturate`` applies to element formats (block recipes define their own saturation).
    ``progress``, if given, is called with the element count of each chunk done. ``backend``
    (:class:`~fpsim.Backend`) is where the block loops run; the partials are the same.
    """
    fmt, mode = get_format(fmt), RoundMode.parse(rounding)
    return measure_tensor(
        x,
        fmt,
        mode,
        Backend.resolve(backend),
        seed=seed,
        saturate=saturate,
        with_hist=with_hist,
        progress=progress,
    )


def measure_tensor(
    x: Any,
    fmt: AnyKind,
    mode: RoundMode,
    backend: Backend,
    *,
    seed: int = 0,
    saturate: bool = False,
    with_hist: bool = False,
    progress: Any = None,
) -> Partial:
    """:func:`measure` with the format, rounding mode and backend resolved."""
    x = np.asarray(x) if not isinstance(x, np.ndarray) else x
    shape = x.shape
    flat = x.reshape(-1)
    amax = tensor_amax(flat) if needs_tensor_amax(fmt) else None
    total = Partial()
    for start, stop in _slices(shape, fmt):
        part = chunk_view(flat, shape, start, stop, fmt)
        total = total + tally_chunk(
            part,
            fmt,
            mode,
            backend,
            offset=start,
            seed=seed,
            saturate=saturate,
            tensor_amax=amax,
            with_hist=with_hist,
        )
        if progress is not None:
            progress(stop - start)
    return total


def needs_tensor_amax(fmt: AnyKind) -> bool:
    """Whether a chunk of a tensor needs the whole tensor's amax (per-tensor recipes, NVFP4)."""
    return isinstance(fmt, BlockFormat) and (fmt.block is None or fmt.rule.needs_tensor_amax)


def tensor_amax(flat: np.ndarray) -> float:
    """Largest finite-or-infinite magnitude of the float32 values, NaN ignored (fmaxf), chunk
    by chunk (:func:`fpsim.formats.amax.amax_ignore_nan`); 0 for an empty tensor."""
    parts = []
    for i in range(0, flat.size, CHUNK):
        with np.errstate(invalid="ignore"):  # (float64 signaling NaNs cast to float32 raise the flag)
            parts.append(amax_ignore_nan(np.asarray(flat[i : i + CHUNK], np.float32)))
    return float(amax_ignore_nan(np.array(parts, np.float32)))


def measure_chunk(
    x: np.ndarray,
    fmt: Any,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    *,
    offset: int = 0,
    seed: int = 0,
    saturate: bool = False,
    tensor_amax: float | None = None,
    with_hist: bool = False,
    backend: Backend | str = "auto",
) -> Partial:
    """Partial metrics of one canonical chunk that starts at flat index ``offset``."""
    fmt, mode = get_format(fmt), RoundMode.parse(rounding)
    return tally_chunk(
        x,
        fmt,
        mode,
        Backend.resolve(backend),
        offset=offset,
        seed=seed,
        saturate=saturate,
        tensor_amax=tensor_amax,
        with_hist=with_hist,
    )


def tally_chunk(
    x: np.ndarray,
    fmt: AnyKind,
    mode: RoundMode,
    backend: Backend,
    *,
    offset: int = 0,
    seed: int = 0,
    saturate: bool = False,
    tensor_amax: float | None = None,
    with_hist: bool = False,
) -> Partial:
    """:func:`measure_chunk` with the format, rounding mode and backend resolved."""
    job = (fmt, mode, with_hist)
    return tally_jobs(
        x, [job], backend, offset=offset, seed=seed, saturate=saturate, tensor_amax=tensor_amax
    )[0]


def tally_jobs(
    x: np.ndarray,
    jobs: list[tuple[AnyKind, RoundMode, bool]],
    backend: Backend,
    *,
    offset: int = 0,
    seed: int = 0,
    saturate: bool = False,
    tensor_amax: float | None = None,
) -> list[Partial]:
    """The partials of one chunk under several (format, mode, with_hist) jobs: the chunk is
    converted once and, on :attr:`Backend.COMPILED`, its format-independent tallies are
    computed once (:func:`fpsim.analysis.compiled.inputs`) and each job is one compiled
    pass. ``x`` is shaped as the jobs' recipes need it (:func:`chunk_view`); ``tensor_amax``
    goes to the jobs that need it (:func:`needs_tensor_amax`)."""
    x = np.asarray(x)
    if x.dtype.kind != "f" and not element.is_ml_float(x.dtype):
        raise TypeError(f"cannot measure a tensor of dtype {x.dtype}: not a float type")
    xf = x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)
    compiled = backend is Backend.COMPILED and xf.size > 0
    inp = None
    if compiled:
        from . import compiled as fast

        inp = fast.inputs(xf, any(h for _, _, h in jobs))
    out = []
    for fmt, mode, with_hist in jobs:
        if compiled and not isinstance(fmt, BlockFormat):
            kw = {"offset": offset, "seed": seed, "saturate": saturate, "with_hist": with_hist}
            out.append(fast.element_partial(xf, fmt, mode, inp, **kw))
            continue
        if compiled:
            amax = tensor_amax if needs_tensor_amax(fmt) else None
            kw = {"offset": offset, "seed": seed, "tensor_amax": amax, "with_hist": with_hist}
            part = fast.block_partial(xf, fmt, mode, inp, **kw)
            if part is not None:
                out.append(part)
                continue
        rand = None
        if mode is RoundMode.STOCHASTIC:
            rand = random_bits_at(seed, offset, xf.size).reshape(xf.shape)
        if isinstance(fmt, BlockFormat):
            amax = tensor_amax if needs_tensor_amax(fmt) else None
            enc = blocks.encode_array(element.as_float32(xf), fmt, mode, backend, rand=rand, tensor_amax=amax)
            q = blocks.decode_array(enc, fmt, backend)
            codes, el = enc.codes, fmt.element
        else:
            codes = element.encode_array(xf, fmt, mode, saturate=saturate, rand=rand)
            q, el = element.decode_array(codes, fmt), fmt
        codes = np.asarray(codes).reshape(-1)
        if compiled:
            out.append(fast.value_partial(xf, q, *element_flags(codes, el), inp, with_hist))
        else:
            out.append(tally_partial(xf.reshape(-1), q.reshape(-1), codes, el, with_hist))
    return out


_SUB = 1 << 16  # elements per sub-block: temporaries stay in cache


def tally_partial(x: np.ndarray, q: np.ndarray, codes: np.ndarray, el: Any, with_hist: bool) -> Partial:
    """Counts and sums of one chunk, worked through in cache-sized sub-blocks.

    Float sums: exact (:func:`fpsim.analysis.partials.exact_sum` of the float64 terms).
    """
    p = Partial(elements=x.size)
    at_max_all, sub_all = element_flags(codes, el)
    counts = np.zeros(7, np.int64)  # nan, finite, nonzero, overflow, underflow, subnormal, saturated
    s_err = s_sig = s_under = exact_sum(np.zeros(0))
    m_err = m_rel = m_in = 0.0
    hist = np.zeros(256, np.int64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for i in range(0, x.size, _SUB):
            xs, qs = x[i : i + _SUB], q[i : i + _SUB]
            ax = np.abs(xs)
            finite = ax < np.inf  # NaN compares false
            nz = finite & (xs != 0)
            qfin = np.isfinite(qs)
            ok = finite & qfin
            zq = qs == 0
            under = nz & zq
            counts[0] += np.count_nonzero(xs != xs)
            counts[1] += np.count_nonzero(finite)
            counts[2] += np.count_nonzero(nz)
            counts[3] += np.count_nonzero(finite & ~qfin)
            nu = np.count_nonzero(under)
            counts[4] += nu
            if sub_all is not None:
                counts[5] += np.count_nonzero(nz & ~zq & sub_all[i : i + _SUB])
            aq = np.abs(qs)
            counts[6] += np.count_nonzero(finite & at_max_all[i : i + _SUB] & (ax > aq))
            x64 = np.where(finite, xs, 0).astype(np.float64)
            err = qs - x64  # exact: the difference of two float32 values fits float64 here
            if not ok.all():
                err = np.where(ok, err, 0.0)
            s_err += exact_sum(err, square=True)
            s_sig += exact_sum(x64, square=True)
            if nu:
                s_under += exact_sum(x64[under], square=True)
            aerr = np.abs(err)
            m_err = max(m_err, float(aerr.max(initial=0)))
            m_in = max(m_in, float(np.abs(x64).max(initial=0)))
            if nz.any():
                rel = np.divide(aerr, np.abs(x64), out=np.zeros_like(aerr), where=nz)
                m_rel = max(m_rel, float(rel.max()))
            if with_hist:
                expo = (np.asarray(xs, np.float32).view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)
                hist += np.bincount(expo[nz], minlength=256)
    p.nan_in = int(counts[0])
    p.inf_in = x.size - p.nan_in - int(counts[1])
    p.nonzero, p.overflow, p.underflow, p.subnormal, p.saturated = (int(c) for c in counts[2:])
    p.sum_sq_err, p.sum_sq_signal, p.underflow_energy = s_err, s_sig, s_under
    p.max_abs_err, p.max_rel_err, p.max_abs_in = m_err, m_rel, m_in
    p.hist = hist
    return p


def element_flags(codes: np.ndarray, el: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """(element code is +-max, element is subnormal) per element; None where meaningless."""
    if isinstance(el, Codebook):
        return (codes == 0) | (codes == len(el.values) - 1), None
    if isinstance(el, IntFormat):
        k = codes.astype(np.int64)
        if el.signed:
            k = np.where(k >= 1 << (el.bits - 1), k - (1 << el.bits), k)
        return (k == el.max_int) | (k == el.min_int), None
    mag = codes & ((1 << (el.exponent_bits + el.mantissa_bits)) - 1)
    at_max = mag == el.code_of_max
    if not (el.subnormals and el.has_zero and el.mantissa_bits):
        return at_max, None
    return at_max, (mag >> el.mantissa_bits) == 0


# --- swamping ---------------------------------------------------------------------------


def measure_swamping(
    theta: Any,
    delta: Any,
    fmt: Any,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    *,
    seed: int = 0,
    scale: float | None = None,
) -> SwampPartial:
    """How much of the update ``delta`` survives when added to ``theta`` stored in ``fmt``.

    With ``scale`` the update is ``float32(scale * delta)``, formed chunk by chunk (pass the
    gradient and ``-lr`` to keep memory bounded). Sums that overflow the format count as
    updates that were not lost, with no realised size.

    ``theta`` is first stored in ``fmt`` (nearest-even); the sum is formed exactly (float64
    holds the sum of two float32 values that matters for rounding) and rounded once to
    ``fmt`` with ``rounding``. Works chunk by chunk like :func:`measure`.
    """
    fmt, mode = get_format(fmt), RoundMode.parse(rounding)
    if not isinstance(fmt, (Format, IntFormat)):
        raise TypeError(f"swamping needs an element format for the stored parameters, got {fmt.name}")
    return swamping_partial(theta, delta, fmt, mode, seed=seed, scale=scale)


def swamping_partial(
    theta: Any, delta: Any, fmt: AnyFormat, mode: RoundMode, *, seed: int = 0, scale: float | None = None
) -> SwampPartial:
    """:func:`measure_swamping` with the element format and rounding mode resolved."""
    theta = np.asarray(theta).reshape(-1)
    delta = np.asarray(delta).reshape(-1)
    if theta.shape != delta.shape:
        raise ValueError(f"theta has {theta.size} elements, delta {delta.size}")
    total = SwampPartial()
    for start in range(0, theta.size, CHUNK):
        t = _quantize(np.asarray(theta[start : start + CHUNK], np.float32), fmt, RoundMode.NEAREST_EVEN)
        d = np.asarray(delta[start : start + CHUNK], np.float32)
        if scale is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                d = np.float32(scale) * d
        rand = random_bits_at(seed, start, t.size) if mode is RoundMode.STOCHASTIC else None
        with np.errstate(invalid="ignore", over="ignore"):
            new = _quantize(t.astype(np.float64) + d, fmt, mode, rand)
            upd = np.isfinite(d) & (d != 0) & np.isfinite(t)
            realised = np.where(upd & np.isfinite(new), new.astype(np.float64) - t, 0.0)
            total = total + SwampPartial(
                updates=int(np.count_nonzero(upd)),
                lost=int(np.count_nonzero(upd & (new == t))),
                sum_abs_intended=exact_sum(np.where(upd, d, 0)),
                sum_abs_realised=exact_sum(realised),
            )
    return total


def swamping_chunk(
    theta: np.ndarray,
    grad: np.ndarray,
    fmt: AnyFormat,
    backend: Backend,
    *,
    seed: int,
    scale: float,
    offset: int,
) -> tuple[SwampPartial, SwampPartial]:
    """The swamping partials, nearest-even then stochastic, of one chunk of at most
    :data:`CHUNK` elements starting at flat index ``offset`` (the update ``float32(scale *
    grad)``): what :func:`swamping_partial` gives for that chunk, the random words those of the
    chunk's place in the tensor; on :attr:`Backend.COMPILED` both modes in one compiled pass."""
    if theta.size > CHUNK:
        raise ValueError(f"a swamping chunk holds at most {CHUNK} elements, got {theta.size}")
    if backend is Backend.COMPILED and theta.size:
        from .compiled import swamp_partials

        return swamp_partials(theta, grad, fmt, scale=scale, seed=seed, offset=offset)
    s = shifted_seed(seed, offset)
    return tuple(
        swamping_partial(theta, grad, fmt, m, seed=s, scale=scale)
        for m in (RoundMode.NEAREST_EVEN, RoundMode.STOCHASTIC)
    )


def _quantize(x: np.ndarray, fmt: AnyFormat, mode: RoundMode, rand: np.ndarray | None = None) -> np.ndarray:
    return element.decode_array(element.encode_array(x, fmt, mode, rand=rand), fmt)


def iter_chunks(x: np.ndarray, fmt: Any) -> Iterator[tuple[int, np.ndarray]]:
    """``(offset, chunk)`` pairs of the canonical chunks of ``x`` (for distributed work)."""
    fmt = get_format(fmt)
    flat = x.reshape(-1)
    for start, stop in _slices(x.shape, fmt):
        yield start, chunk_view(flat, x.shape, start, stop, fmt)
