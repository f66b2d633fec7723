"""Emulated low-precision accumulation: sums, dot products and matrix products.

Every addition is rounded once, exactly, into the accumulator's format, in a fixed order, so
swamping (an addend lost because it is below half an ulp of the running sum) and the error
growth of long reductions can be measured, e.g. the FP8 GEMMs of DeepSeek-V3 (arXiv
2412.19437, section 3.3.2), whose Hopper tensor cores keep about 14 bits of the sum.

Definitions (the schedule is data-independent, so a kernel can mirror it bit for bit):

Addends.
    ``sum`` adds the elements of ``x`` (reduced axes flattened in C order). ``dot`` adds the
    products ``a[..., k] * b[..., k]``; ``matmul`` the products ``a[i, k] * b[k, j]``.
    Inputs are first converted to float32 (float64 rounds to nearest even; narrower types
    are exact), then rounded to ``input_format`` if one is given (an element format, or a
    block recipe applied as fake quantization: values are the decoded float32 values).
    A product is exact (a product of two float32 values is exact in float64); with
    ``product_format`` it is rounded once to that format. ``product_format=None`` thus
    models a fused multiply-add (one rounding per step, as tensor cores and FFMA do);
    ``product_format="float32"`` models a separate multiply and add.

Rounding.
    ``R(v)`` rounds the exact real ``v`` to the accumulator format with ``rounding``
    (IEEE 754-2019 section 4.3 for the directed and nearest modes, overflow by section
    7.4, formats without infinity as :func:`fpsim.encode`; stochastic and odd as defined
    in :class:`fpsim.RoundMode`). ``R(u + v)`` is the exact sum rounded once.

Order (``order``: an :class:`Order` or its name; ``block``): a tree of width ``W`` over the
``n`` addends of a chunk.
    Level 0 holds the addends; the elements of each level are cut into consecutive groups
    of ``W`` (the last group may be shorter); each group is summed left to right,
    ``s = R(e_0)``, ``s = R(s + e_i)``; the group sums are the next level; this repeats
    until one value remains. ``"sequential"`` is ``W = n`` (one group: the plain left to
    right sum), ``"pairwise"`` is ``W = 2`` (a balanced binary tree; at every node the left
    child covers the largest power of two below the node's length), ``"blocked"`` takes
    ``block=W``. A group's partial sum never mixes with another group's before the group
    is complete.

Compensation (``compensated``: a :class:`Compensation`, its name or a bool), per group,
every operation rounded by ``R``:
    ``"kahan"`` (Kahan 1965; Higham, Accuracy and Stability, Alg. 4.2):
    ``s = R(e_0), c = 0``; then ``y = R(e_i - c); u = R(s + y); c = R(R(u - s) - y); s = u``;
    the group's value is ``s``. ``"neumaier"`` (Neumaier 1974): ``s = R(e_0), c = 0``;
    then ``u = R(s + e_i)``, ``t = R(R(s - u) + e_i)`` if ``|s| >= |e_i|`` else
    ``t = R(R(e_i - u) + s)``, ``c = R(c + t)``, ``s = u``; the value is ``R(s + c)``.
    ``True`` means ``"kahan"``.

Promotion (``promote_every=N``, DeepSeek-V3 section 3.3.2 "increasing accumulation
precision"): the addends are cut into consecutive chunks of ``N``; each chunk is reduced in
the accumulator as above, and its value ``c_j`` is added into a second accumulator in
``promote_to`` (float32) with ``promote_rounding``: ``P = R'(c_0)``, ``P = R'(P + c_j)``.
:func:`scaled_matmul` multiplies ``c_j`` by the block scales first, see there.

Random bits (stochastic rounding). The roundings of one output element are numbered
``j = 0, 1, ...`` in the order they happen when the tree is evaluated depth first, left to
right (a group's value is added to its parent group as soon as the group is complete;
after a chunk's root, its promotion rounding). :func:`rounding_count` gives the total.
Rounding ``j`` of output element ``o`` (flat C index of the output) uses the low
``stochastic_bits`` bits of ``random_bits[j].flat[o]``, or of the word
``fpsim.emulate.random.random_bits_at(4 * seed, j * n_out + o, 1)`` when ``seed`` is given.
Products use ``random_bits_at(4 * seed + 1, k * n_out + o, 1)`` (also ``stochastic_bits``
bits); inputs ``a`` (or ``x``) and ``b`` use ``4 * seed + 2`` and ``4 * seed + 3`` at their
flat element index (32 bits, as :func:`fpsim.encode`).

Cost: the loop over K runs in Python; each step is about 16 numpy operations on a tile of
up to ``2**14`` outputs (float64 temporaries that stay in L2), so a 1024^3 matmul takes a
few seconds (``benchmarks/bench_accumulate.py``), while a single long 1-D sum runs at about
1e5 additions per second (1e4 with compensation).

Mirroring in a kernel: results are defined by the exact values above, so any correct
implementation agrees bit for bit. The emulator computes ``R(acc + t)`` in float64 (below);
a GPU kernel whose products are exact in float32 (inputs of at most 12 significant bits,
e.g. FP8 and FP16, or BF16 away from the bottom of its range) can compute the same with
float32 TwoSum and round-to-odd at 24 bits for accumulators of at most 22 bits (stochastic
rounding then takes at most ``23 - p`` random bits), looping in the order defined here and
contracting a multiply and an add only where the fused step is modelled.

The settings are resolved once into an :class:`AccumulatorSpec` (:mod:`fpsim.accumulate.spec`:
:class:`Order`, :class:`Compensation`); the verbs live in :mod:`fpsim.accumulate.verbs`, the
rounding core and the schedule in :mod:`fpsim.accumulate._accumulator`, the rounding of the
operands in :mod:`fpsim.accumulate._operands`, the exact references in
:mod:`fpsim.accumulate.exact`, and the error-vs-K sweeps of ``fpsim accumulate`` in
:mod:`fpsim.accumulate.sweeps`. Exactness of one rounded addition (see
``Rounder.add``): for float64 operands ``u, v`` the float64 sum ``s = u + v`` and its error
``e`` (Knuth's TwoSum) satisfy ``u + v = s + e`` exactly. ``s`` is then replaced by the
round-to-odd value ``RO53(u + v)``: ``s`` itself when ``e = 0`` or ``s`` is odd, else the odd
neighbour of ``s`` on ``e``'s side. Rounding ``RO53(x)`` to ``p <= 51`` bits gives ``R(x)``
for every non-stochastic mode (Boldo and Melquiond, "Emulation of FMA and correctly rounded
sums: proved algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008, Theorem 1
for nearest; for the directed modes and odd because ``RO53(x)`` lies strictly between the same
two ``p``-bit neighbours as ``x`` when ``x`` is not a ``p``-bit number, and equals ``x`` when
it is). Stochastic rounding only reads the top ``n = stochastic_bits`` discarded bits and
whether any discarded bit is set; the odd bit sits below those bits when ``n <= 51 -
mantissa_bits``, so ``n`` is capped there (28 for a float32 accumulator, 32 for 14 bits or
fewer)."""

from __future__ import annotations

from ._accumulator import rounding_count
from .exact import error_summary, exact_dot, exact_matmul, exact_sum, relative_error
from .spec import AccumulatorSpec, Compensation, Order, Rounding, accumulator_format
from .verbs import AccumulationInfo, dot, matmul, matmul_spec, scaled_matmul, sum  # noqa: A004 - mirrors numpy.sum

__all__ = [
    "AccumulationInfo",
    "AccumulatorSpec",
    "Compensation",
    "Order",
    "Rounding",
    "accumulator_format",
    "dot",
    "error_summary",
    "exact_dot",
    "exact_matmul",
    "exact_sum",
    "matmul",
    "matmul_spec",
    "relative_error",
    "rounding_count",
    "scaled_matmul",
    "sum",
]
