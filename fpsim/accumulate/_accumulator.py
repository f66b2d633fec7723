"""The rounding core and the schedule of :mod:`fpsim.accumulate` (definitions: its docstring).

:class:`Rounder` rounds float64 sums once, exactly, into an accumulator format;
:func:`reduce_tile` runs the order of additions (sequential, pairwise, blocked tree;
Kahan / Neumaier compensation; promotion every N) over a tile of output elements;
:func:`rounding_count` numbers the roundings for stochastic rounding's random words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..emulate import element as emulate
from ..formats import Encoding, Format, RoundMode
from .spec import AccumulatorSpec, Compensation, Order, tree_width

_U = np.uint64
_ABS = _U(0x7FFF_FFFF_FFFF_FFFF)
_TILE = 1 << 14  # output elements processed together (their temporaries stay in L2)
_py_sum = sum


# --- rounding ---------------------------------------------------------------------------


class Rounder:
    """Rounds float64 arrays into one format and rounding mode (IEEE 754-2019 sections 4.3 and
    7.4; stochastic and odd as :class:`~fpsim.RoundMode`), with work arrays for ``n`` elements.

    In the format's normal range the quantum is a fixed ``d = 52 - M`` bits of the float64
    significand, so rounding is integer arithmetic on the bit pattern (a carry moves into the
    exponent). Anything else (zero, subnormal results, overflow, inf, NaN) goes through
    :func:`fpsim.encode`, which the tests compare with the scalar reference.
    """

    def __init__(self, fmt: Format, mode: RoundMode, nbits: int, n: int):
        self.fmt, self.mode, self.nbits = fmt, mode, nbits
        m = fmt.mantissa_bits
        self.d = _U(52 - m)  # float64 significand bits below the format's quantum
        self.mask = _U((1 << (52 - m)) - 1)
        self.keep = ~self.mask
        self.half_m1 = _U((1 << (51 - m)) - 1)
        self.lo = _U(np.float64(fmt.min_normal).view(_U))
        self.span = _U(np.float64(fmt.max).view(_U)) - self.lo
        self.sr_shift = 52 - m - nbits  # >= 1 whenever a remainder is involved (module doc)
        self.n = n
        self.bb, self.err = np.empty(n), np.empty(n)
        self.m, self.t = np.empty(n, _U), np.empty(n, _U)

    def exact(self, x: np.ndarray, out: np.ndarray | None = None, rand=None) -> np.ndarray:
        """``R(x)`` for float64 ``x`` (its exact value); ``out`` may be ``x``."""
        if out is None:
            out = x.copy()
        elif out is not x:
            np.copyto(out, x)
        return self._round(out, None, rand)

    def add(self, u: np.ndarray, v: np.ndarray, out: np.ndarray | None = None, rand=None) -> np.ndarray:
        """``R(u + v)``, the exact sum rounded once; ``out`` must not be ``u`` or ``v``.

        TwoSum (Knuth, TAOCP vol. 2, 4.2.2) gives ``s + err == u + v`` exactly (nothing can
        overflow: operands are float32-range values or exact products of two of them), then
        round to odd at 53 bits and round that (module doc). Under toward-negative an exact
        zero sum of operands that are not both +0 is -0 (IEEE 754-2019 section 6.3); a
        nonzero sum that rounds to zero keeps its own sign (a float64 sum of these operands
        is zero only when the exact sum is).
        """
        own = u.shape[0] == self.n
        s = np.add(u, v, out=out)
        exact_zero = (s == 0) if self.mode is RoundMode.TOWARD_NEGATIVE else None
        bb = np.subtract(s, u, out=self.bb if own else None)
        err = np.subtract(s, bb, out=self.err if own else None)
        np.subtract(u, err, out=err)
        np.subtract(v, bb, out=bb)
        err += bb
        s = self._round(s, err, rand)
        if exact_zero is not None:
            z = exact_zero & ~((u == 0) & (v == 0) & ~np.signbit(u) & ~np.signbit(v))
            s[z] = -0.0
        return s

    def _round(self, s: np.ndarray, err: np.ndarray | None, rand) -> np.ndarray:
        """Round ``s + err`` (``|err| <= ulp(s) / 2``) in place in ``s``."""
        own = s.shape[0] == self.n
        b = s.view(_U)
        if err is not None and err.any():  # round to odd at 53 bits (module doc)
            nz = np.abs(err) > 0  # a NaN (from inf operands) is not a remainder
            b -= (err * s < 0).view(np.uint8)  # the exact value lies below |s|
            b |= nz.view(np.uint8)
        m = np.bitwise_and(b, _ABS, out=self.m if own else None)
        m -= self.lo
        slow = None
        if m.max(initial=0) > self.span:  # outside the normal range, or overflow
            slow = np.flatnonzero(m > self.span)
            r = None if rand is None else rand[slow]
            codes = emulate.encode(
                s[slow], self.fmt, rounding=self.mode, random_bits=r, stochastic_bits=self.nbits
            )
            slow_vals = decode64(codes, self.fmt)
        mode, d = self.mode, self.d
        if mode is RoundMode.NEAREST_EVEN:
            t = np.right_shift(b, d, out=self.t if own else None)
            t &= _U(1)
            t += self.half_m1
            b += t
            b &= self.keep
        elif mode is RoundMode.NEAREST_AWAY:
            b += self.half_m1 + _U(1)
            b &= self.keep
        elif mode is RoundMode.TOWARD_ZERO:
            b &= self.keep
        else:
            rem = b & self.mask
            b &= self.keep
            if mode is RoundMode.ODD:
                b |= (rem != 0).astype(_U) << d
            elif mode is RoundMode.STOCHASTIC:  # up iff floor(f * 2**n) + R >= 2**n
                sh = self.sr_shift
                top = rem >> _U(sh) if sh >= 0 else rem << _U(-sh)
                top += rand.astype(_U) & _U((1 << self.nbits) - 1)
                b += (top >> _U(self.nbits)) << d
            else:
                neg = b > _ABS
                up = (rem != 0) & (neg if mode is RoundMode.TOWARD_NEGATIVE else ~neg)
                b += up.astype(_U) << d
        if slow is not None:
            s[slow] = slow_vals
        return s


def decode64(codes: np.ndarray, fmt: Format) -> np.ndarray:
    """float64 values of codes of any float format (also 17 to 31 bits, which decode refuses)."""
    if fmt.bits <= 16 or fmt.bits == 32:
        return emulate.decode(codes, fmt).astype(np.float64)
    c = codes.astype(np.int64)
    m = fmt.mantissa_bits
    mag = c & ((1 << (fmt.exponent_bits + m)) - 1)
    field, frac = mag >> m, mag & ((1 << m) - 1)
    normal = field > 0
    sig = np.where(normal, frac + (1 << m), frac if fmt.subnormals else 0).astype(np.float64)
    v = np.ldexp(sig, (np.where(normal, field - fmt.bias, fmt.min_exponent) - m).astype(np.int32))
    top = field == (1 << fmt.exponent_bits) - 1
    if fmt.encoding is Encoding.IEEE:
        v = np.where(top, np.where(frac == 0, np.inf, np.nan), v)
    elif fmt.encoding is Encoding.FN:
        v = np.where(mag == (1 << (fmt.exponent_bits + m)) - 1, np.nan, v)
    neg = (c & fmt.sign_mask) != 0
    if fmt.encoding is Encoding.FNUZ:
        v = np.where(neg & (mag == 0), np.nan, v)
    return np.where(neg, -v, v)


# --- the schedule -----------------------------------------------------------------------


def _levels(n: int, width: int | None) -> list[int]:
    """Element counts of the tree's levels, ``[n, ceil(n / W), ..., 1]`` (at least two)."""
    w = max(n, 2) if width is None else width
    sizes = [n]
    while True:
        sizes.append(-(-sizes[-1] // w))
        if sizes[-1] <= 1:
            return sizes


def _group_sizes(n: int, width: int | None) -> list[list[int]]:
    """Sizes of the groups of each level of the tree over ``n`` elements."""
    w = max(n, 2) if width is None else width
    sizes = _levels(n, width)
    return [[min(w, sizes[lv] - w * g) for g in range(sizes[lv + 1])] for lv in range(len(sizes) - 1)]


def _group_roundings(m: int, comp: Compensation) -> int:
    """Roundings of a group of ``m`` elements (Neumaier adds the final ``R(s + c)``)."""
    if comp is Compensation.NONE:
        return m
    return 1 + 4 * (m - 1) + (comp is Compensation.NEUMAIER)


def rounding_count(
    k: int,
    *,
    order: Order | str = Order.SEQUENTIAL,
    block: int | None = None,
    promote_every: int | None = None,
    compensated: Compensation | bool | str = False,
    promoted: bool | None = None,
) -> int:
    """Roundings per output element of a reduction of ``k`` addends (module doc's numbering).

    This is the length of the first axis of ``random_bits``. ``promoted`` (default: whether
    ``promote_every`` is set) adds one promotion rounding per chunk; :func:`scaled_matmul`
    always promotes, so pass ``promoted=True`` and its chunk length for it.
    """
    promoted = promote_every is not None if promoted is None else promoted
    comp = Compensation.parse(compensated)
    return _count(k, tree_width(order, block), comp, promote_every, promoted)


def spec_rounding_count(spec: AccumulatorSpec, k: int) -> int:
    """:func:`rounding_count` of a reduction of ``k`` addends with ``spec``."""
    return _count(k, spec.width, spec.compensation, spec.promote_every, spec.promoted)


def _count(k: int, width: int | None, comp: Compensation, chunk: int | None, promoted: bool) -> int:
    total = 0
    for c0 in range(0, k, chunk or max(k, 1)):
        n = min(chunk or k, k - c0)
        total += _py_sum(_group_roundings(m, comp) for lv in _group_sizes(n, width) for m in lv)
        total += int(promoted)
    return total


class Stream:
    """Random words of one output tile: rounding ``j`` draws ``rand(j)``; counts every rounding."""

    def __init__(self, source: Callable[[int], np.ndarray] | None):
        self.source = source
        self.j = 0

    def next(self, mode: RoundMode) -> np.ndarray | None:
        j = self.j
        self.j += 1
        return self.source(j) if mode is RoundMode.STOCHASTIC else None


class _Group:
    __slots__ = ("s", "c", "count")

    def __init__(self) -> None:
        self.s = self.c = None
        self.count = 0


def reduce_tile(
    spec: AccumulatorSpec,
    k: int,
    addend: Callable[[int], np.ndarray],
    stream: Stream,
    scale: Callable[[int], np.ndarray] | None = None,
    lost: list | None = None,
) -> np.ndarray:
    """The whole schedule for one tile of outputs: chunks, trees, promotion (module doc)."""
    n = len(addend(0))
    acc = Rounder(spec.accumulator, spec.rounding, spec.stochastic_bits, n)
    chunk = spec.promote_every or k
    total = None
    for c0 in range(0, k, chunk):
        m = min(chunk, k - c0)
        if spec.width is None and spec.compensation is Compensation.NONE:
            part = _sequential(acc, m, c0, addend, stream, lost)
        else:
            part = _tree(spec, acc, m, c0, addend, stream, lost)
        if not spec.promoted:
            return part
        if total is None:
            prom = Rounder(spec.promote_to, spec.promote_rounding, spec.stochastic_bits, n)
        x = part if scale is None else part * scale(c0)  # exact: two values of <= 24 bits
        rand = stream.next(spec.promote_rounding)
        total = prom.exact(x, rand=rand) if total is None else prom.add(total, x, rand=rand)
    return total


def _sequential(acc: Rounder, n: int, c0: int, addend, stream: Stream, lost: list | None) -> np.ndarray:
    """The plain left-to-right sum (the tree with one group), with double-buffered arrays."""
    s = acc.exact(addend(c0), rand=stream.next(acc.mode))
    spare = np.empty_like(s)
    for i in range(c0 + 1, c0 + n):
        x = addend(i)
        acc.add(s, x, out=spare, rand=stream.next(acc.mode))
        if lost is not None:
            _count_lost(lost, spare, s, x)
        s, spare = spare, s
    return s


def _count_lost(lost: list, new: np.ndarray, old: np.ndarray, t: np.ndarray) -> None:
    nz = t != 0
    lost[0] += (new == old) & nz
    lost[1] += nz


def _tree(spec: AccumulatorSpec, acc: Rounder, n: int, c0: int, addend, stream: Stream, lost) -> np.ndarray:
    """Evaluate the tree over addends ``c0 .. c0 + n`` depth first (streaming, one group per level)."""
    groups = _group_sizes(n, spec.width)
    state = [_Group() for _ in groups]
    index = [0] * len(groups)  # current group of each level
    for i in range(n):
        x, lv = addend(c0 + i), 0
        while True:
            g = state[lv]
            _push(spec.compensation, acc, g, x, stream, lost if lv == 0 else None)
            if g.count < groups[lv][index[lv]]:
                break
            x = g.s
            if spec.compensation is Compensation.NEUMAIER:
                x = acc.add(g.s, g.c, rand=stream.next(acc.mode))
            g.count = 0
            index[lv] += 1
            lv += 1
            if lv == len(groups):
                return x
    raise AssertionError("unreachable: the last addend completes the root group")


def _push(comp: Compensation, acc: Rounder, g: _Group, x: np.ndarray, stream: Stream, lost) -> None:
    """Bring ``x`` into group ``g``'s running (compensated) sum (module doc)."""

    def r(u, v):
        return acc.add(u, v, rand=stream.next(acc.mode))

    if g.count == 0:
        g.s = acc.exact(x, rand=stream.next(acc.mode))
        g.c = None if comp is Compensation.NONE else np.zeros_like(x)
    elif comp is Compensation.NONE:
        s = r(g.s, x)
        if lost is not None:
            _count_lost(lost, s, g.s, x)
        g.s = s
    elif comp is Compensation.KAHAN:
        y = r(x, -g.c)
        u = r(g.s, y)
        g.c = r(r(u, -g.s), -y)
        if lost is not None:
            _count_lost(lost, u, g.s, y)
        g.s = u
    else:
        u = r(g.s, x)
        first = np.abs(g.s) >= np.abs(x)
        t = r(r(np.where(first, g.s, x), -u), np.where(first, x, g.s))
        g.c = r(g.c, t)
        if lost is not None:
            _count_lost(lost, u, g.s, x)
        g.s = u
    g.count += 1


# --- inputs -----------------------------------------------------------------------------


def as_f32(x: Any, name: str) -> np.ndarray:
    """``x`` (numpy, ml_dtypes, JAX, torch on the CPU) as float32: exact for every input dtype of
    at most 16 bits (:func:`fpsim.emulate.element.as_float_array`); ``name`` is the argument."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x
    if x.dtype.kind not in "fiub" and not emulate.is_ml_float(x.dtype):
        raise TypeError(f"{name}: need a numeric array, got dtype {x.dtype}")
    with np.errstate(over="ignore"):
        return emulate.as_float_array(x)[1].astype(np.float32)
