"""Portable Triton matmul / dot with limited-precision accumulation: :func:`fpsim.matmul`
and :func:`fpsim.dot` on torch tensors, bit for bit.

:func:`matmul` and :func:`dot` take the arguments of :func:`fpsim.accumulate.matmul` and
:func:`fpsim.accumulate.dot` and return what they return (float32 values), bit-identical:
tested against the emulator with zero tolerance (``tests/kernels/test_accumulate_kernel.py``
and ``fpsim validate-kernels --kernel accumulate.matmul``, NaNs compared by class).

Operation order (``order="sequential"``, the emulator's module doc). For every output
element, with ``t_k`` the exact product ``a[i, k] * b[k, j]`` (rounded once to
``product_format`` when one is given) and ``R`` the rounding into the accumulator:

* K is cut into chunks of ``promote_every`` addends (one chunk without promotion);
* a chunk is summed left to right: ``s = R(t_c0)``, then ``s = R(s + t_k)`` for every later
  ``k`` of the chunk (with ``compensated="kahan"``: ``y = R(t_k - c)``, ``u = R(s + y)``,
  ``c = R(R(u - s) - y)``, ``s = u``; with ``"neumaier"``: ``u = R(s + t_k)``,
  ``c = R(c + R(R(big - u) + small))``, ``s = u``, and the chunk's value ``R(s + c)``);
* the chunk's value enters the ``promote_to`` accumulator: ``P = R'(s)`` for the first
  chunk, ``P = R'(P + s)`` after (DeepSeek-V3 section 3.3.2).

Stochastic rounding numbers the roundings of one output ``j = 0, 1, ...`` in that order and
uses ``random_bits[j].flat[o]`` or, with ``seed``, the SplitMix64 word
:func:`fpsim.emulate.random.random_bits_at` ``(4 * seed, j * n_out + o)``, computed in the kernel;
product roundings use ``(4 * seed + 1, k * n_out + o)``. Inputs rounded to
``input_format`` are quantized first with :func:`fpsim.kernels.cast.quantize` (itself
bit-identical to the emulator), with the emulator's seed streams ``4 * seed + 2`` and
``4 * seed + 3``.

Why it is bit-identical: every result is defined by exact values (the emulator's module
doc), and the kernel evaluates the same float64 operations in the same order. A product of
two float32 numbers is exact in float64. ``R(u + v)`` is Knuth's TwoSum (exact error),
rounding to odd at 53 bits, then rounding to the accumulator's ``p`` bits with integer
operations on the float64 bit pattern: one correct rounding of the exact sum, no double
rounding (Boldo and Melquiond 2008), for every mode, stochastic included (its random bits
sit above the odd bit). Values outside the normal range use the integer port of
:func:`fpsim.emulate._bitcore.encode_float` for float64 sources, as the emulator's slow path. The
compiled kernel is launched with ``enable_fp_fusion=False``, so no multiply-add is fused.

Supported: every signed :class:`~fpsim.Format` with a zero as accumulator, ``promote_to``
and ``product_format`` (all of :data:`fpsim.FORMATS` but E8M0 and the integer formats, and
the ``p``-significant-bit accumulators of :func:`fpsim.accumulate.accumulator_format`),
every rounding mode, ``promote_every``, Kahan and Neumaier compensation, element
``input_format`` s (any :class:`~fpsim.Format` or :class:`~fpsim.IntFormat`), batched
and 1-D operands. Not supported (NotImplementedError naming the argument):
``order="pairwise"`` / ``"blocked"`` (the emulator's depth-first trees), ``return_info``,
block-recipe ``input_format`` (use :func:`fpsim.scaled_matmul`), integer, unsigned or
zero-less ``product_format``.

Tensors on the CPU run in Triton's interpreter, tensors on a GPU run compiled kernels
(:mod:`fpsim.kernels._loader`).

Example::

    c = fpsim.kernels.accumulate.matmul(a, b, accumulator=14, promote_every=128)
    ref = fpsim.matmul(a.numpy(), b.numpy(), accumulator=14, promote_every=128)
    assert (c.numpy().view("uint32") == ref.view("uint32")).all()
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fpsim.accumulate import rounding_count
from fpsim.accumulate.spec import (
    AccumulatorSpec,
    Compensation,
    Order,
    Rounding,
    SeedStream,
    accumulator_format,
)
from fpsim.emulate.random import SEED_MULTIPLIER
from fpsim.formats import BlockFormat, Format, RoundMode
from fpsim.formats.params import FormatParams, format_params

from ._codes import Comp, Words
from ._loader import is_interpreted, kernel_module, require_torch
from ._loader import launch as _launch_kernel

__all__ = ["Launch", "dot", "matmul"]


FORMAT_PARAMS = len(FormatParams._fields)
"""Entries per format in the kernel's int64 parameter tensor: a format's
:class:`~fpsim.formats.params.FormatParams` (:func:`_format_params`), the tuple the numba loops
and the other kernels read, at its fields' positions."""


_COMP = {c: Comp[c.name] for c in Compensation}


@dataclass(frozen=True)
class Launch:
    """Launch settings of the accumulation kernel.

    Args:
        block_m, block_n: output tile (powers of two). None: on a GPU 32 x 32 (dot: 128 x 1);
            on the CPU the whole output up to 64 x 64 (dot: 1024), as the interpreter costs
            per operation, not per element.
        num_warps: warps per program on a GPU (ignored by the interpreter).
    """

    block_m: int | None = None
    block_n: int | None = None
    num_warps: int = 4


_DEFAULT = Launch()


def matmul(a: Any, b: Any, **kwargs: Any) -> Any:
    """``a @ b`` with every addition rounded to ``accumulator``: :func:`fpsim.matmul` in Triton.

    Bit-identical to ``fpsim.matmul(a.numpy(), b.numpy(), **same keywords)`` (tested with
    zero tolerance, see the module doc); shapes as ``numpy.matmul``: ``(..., M, K) @
    (..., K, N)`` with broadcast batch axes, 1-D operands promoted and squeezed.

    Args:
        a, b: torch float32 tensors (float16 / bfloat16 are widened exactly, float64 is
            rounded to float32 to nearest even, as the emulator does), on one device.
        accumulator: the accumulator's format: a name, a signed :class:`~fpsim.Format` with
            a zero, or an int ``p`` (float32's range with ``p`` significant bits).
        rounding: the accumulator's rounding mode (every :class:`~fpsim.RoundMode`).
        order: ``"sequential"`` only.
        block: ignored for the sequential order (as in the emulator).
        promote_every: chunk length after which the partial sum is added into the
            ``promote_to`` accumulator with ``promote_rounding``; None: no promotion.
        promote_to, promote_rounding: the promotion accumulator's format and rounding.
        compensated: False, True / ``"kahan"`` or ``"neumaier"``.
        random_bits: stochastic accumulator or promotion rounding: uint32 words of shape
            ``(fpsim.accumulate.rounding_count(K, ...), *batch, M, N)`` (numpy uint32, or
            a torch uint32 / int32 bit-pattern tensor).
        seed: int; random words for every stochastic rounding not given ``random_bits``
            (drawn in the kernel as :func:`fpsim.emulate.random.random_bits_at`).
        stochastic_bits: random bits per stochastic rounding (default ``min(32, 51 - M)``).
        input_format, input_rounding: element format (and rounding) of the inputs, or pairs
            ``(for a, for b)``.
        product_format, product_rounding: round each product once to this signed float
            format; None: exact products (a fused multiply-add per step).
        return_info: not supported (NotImplementedError).
        launch: tile sizes and warps (:class:`Launch`).

    Returns:
        A float32 tensor of the result's shape on the inputs' device.

    Raises:
        TypeError: non-tensor or non-float inputs.
        ValueError: the emulator's argument errors (shapes, formats, random bits, seed).
        NotImplementedError: ``order`` other than sequential, ``return_info``, a block-recipe
            ``input_format``, a ``product_format`` that is not a signed float format with zero.
    """
    return _products("matmul", a, b, **kwargs)


def dot(a: Any, b: Any, **kwargs: Any) -> Any:
    """``sum_k a[..., k] * b[..., k]`` (numpy.vecdot shapes): :func:`fpsim.dot` in Triton.

    Keywords and guarantees as :func:`matmul` (random words indexed by the flat index of
    the broadcast output shape ``broadcast(a.shape[:-1], b.shape[:-1])``); bit-identical to
    ``fpsim.dot(a.numpy(), b.numpy(), **kwargs)``.
    """
    return _products("dot", a, b, **kwargs)


def _products(
    kind: str,
    a: Any,
    b: Any,
    *,
    accumulator: str | Format | int = "float32",
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    order: Order | str = Order.SEQUENTIAL,
    block: int | None = None,
    promote_every: int | None = None,
    promote_to: str | Format | int = "float32",
    promote_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    compensated: Compensation | bool | str = False,
    random_bits: Any = None,
    seed: int | None = None,
    stochastic_bits: int | None = None,
    input_format: Any = None,
    input_rounding: Any = RoundMode.NEAREST_EVEN,
    product_format: Any = None,
    product_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    return_info: bool = False,
    launch: Launch = _DEFAULT,
) -> Any:
    """The keywords resolved into the emulator's spec (its checks), then the kernel's limits."""
    torch = require_torch()
    spec = AccumulatorSpec.build(
        accumulator=accumulator,
        rounding=rounding,
        order=order,
        block=block,
        promote_every=promote_every,
        promote_to=promote_to,
        promote_rounding=promote_rounding,
        compensated=compensated,
        stochastic_bits=stochastic_bits,
        seed=seed,
        input_format=input_format,
        input_rounding=input_rounding,
        product_format=product_format,
        product_rounding=product_rounding,
    )
    _supported(spec, return_info)
    if not isinstance(launch, Launch):
        raise TypeError(f"launch must be a Launch, got {type(launch).__name__}")
    a, b = _tensor(torch, a, "a"), _tensor(torch, b, "b")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} and b on {b.device}; both must be on one device")
    problem = _dot(torch, spec, a, b) if kind == "dot" else _matmul(torch, spec, a, b)
    out = _run(torch, spec, problem, random_bits, launch)
    return problem.squeeze(out)


@dataclass(frozen=True)
class _Problem:
    """Contiguous float32 operands of ``nb`` (m, k) x (k, n) products, as the kernel reads them.

    matmul: ``a`` of shape (nb, m, k) and ``b`` of shape (nb, k, n); dot: ``a`` and ``b`` of
    shape (m, k) with nb == n == 1 (output i reduces row i of both). ``squeezed`` says which
    1-D operands of a matmul were promoted.
    """

    a: Any
    b: Any
    nb: int
    m: int
    n: int
    k: int
    out_shape: tuple
    is_dot: bool
    squeezed: tuple[bool, bool] = (False, False)

    def squeeze(self, out: Any) -> Any:
        """The result without the axes of promoted 1-D operands (numpy.matmul's shapes)."""
        if self.squeezed[1]:
            out = out[..., 0]
        if self.squeezed[0]:
            out = out[..., 0, :] if not self.squeezed[1] else out[..., 0]
        return out


def _matmul(torch: Any, spec: AccumulatorSpec, a: Any, b: Any) -> _Problem:
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: operands must have at least one axis")
    squeeze = (a.ndim == 1, b.ndim == 1)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: K mismatch, a has shape {tuple(a.shape)} and b {tuple(b.shape)}")
    a2 = _inputs(torch, a2, spec.inputs[0], spec.stream(SeedStream.INPUT_A), "a")
    bt = _inputs(
        torch, b2.transpose(-1, -2), spec.inputs[1], spec.stream(SeedStream.INPUT_B), "b"
    )  # (..., N, K)
    batch = tuple(torch.broadcast_shapes(a2.shape[:-2], bt.shape[:-2]))
    m, k = a2.shape[-2:]
    n = bt.shape[-2]
    nb = math.prod(batch)
    av = a2.expand(*batch, m, k).reshape(nb, m, k).contiguous()
    bv = bt.transpose(-1, -2).expand(*batch, k, n).reshape(nb, k, n).contiguous()
    return _Problem(av, bv, nb, m, n, k, (*batch, m, n), False, squeeze)


def _dot(torch: Any, spec: AccumulatorSpec, a: Any, b: Any) -> _Problem:
    if a.ndim == 0 or b.ndim == 0 or a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"dot: a and b need the same last axis; got shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    a = _inputs(torch, a, spec.inputs[0], spec.stream(SeedStream.INPUT_A), "a")
    b = _inputs(torch, b, spec.inputs[1], spec.stream(SeedStream.INPUT_B), "b")
    k = a.shape[-1]
    out_shape = tuple(torch.broadcast_shapes(a.shape[:-1], b.shape[:-1]))
    n_out = math.prod(out_shape)
    av = a.expand(*out_shape, k).reshape(n_out, k).contiguous()
    bv = b.expand(*out_shape, k).reshape(n_out, k).contiguous()
    return _Problem(av, bv, 1, n_out, 1, k, out_shape, True)


# --- arguments ------------------------------------------------------------------------------


def _supported(spec: AccumulatorSpec, return_info: bool) -> None:
    """Raise NotImplementedError for what the kernel does not port (the emulator does)."""
    if spec.order is not Order.SEQUENTIAL:
        raise NotImplementedError(
            f"order={spec.order.value!r}: the accumulation kernel implements order='sequential' only; "
            "use fpsim.accumulate.matmul for the tree orders"
        )
    if return_info:
        raise NotImplementedError(
            "return_info=True: the accumulation kernel does not count lost addends; "
            "use fpsim.accumulate.matmul for AccumulationInfo"
        )
    p = spec.product
    if p is not None and not (isinstance(p.format, Format) and p.format.signed and p.format.has_zero):
        raise NotImplementedError(
            f"product_format={p.format.name}: the accumulation kernel rounds products to signed float "
            "formats with a zero only (not integer, unsigned or E8M0 formats)"
        )
    for r in spec.inputs:
        if r is not None and isinstance(r.format, BlockFormat):
            raise NotImplementedError(
                f"input_format={r.format.name}: block recipes are not supported by the accumulation kernel; "
                "use fpsim.scaled_matmul (emulator) or quantize the inputs first"
            )


def _tensor(torch: Any, x: Any, name: str) -> Any:
    """float32 values of a torch float tensor (the emulator's conversion of its inputs)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"{name} must be a float32, float16, bfloat16 or float64 tensor, got {x.dtype}")
    return x.to(torch.float32)  # exact from 16 bits; float64 to nearest even, as numpy's astype


def _inputs(torch: Any, x: Any, rounding: Rounding | None, stream: int | None, name: str) -> Any:
    """float32 values of an input after ``input_format`` (fpsim.accumulate._operands.round_operand),
    by the portable cast kernel; stochastic rounding draws the emulator's words of ``stream``."""
    if rounding is None:
        return x
    from fpsim.emulate.random import random_bits_at
    from fpsim.kernels import cast

    kw: dict[str, Any] = {}
    if rounding.mode is RoundMode.STOCHASTIC:  # the spec checked that a seed is given
        bits = random_bits_at(stream, 0, x.numel()).reshape(tuple(x.shape))
        kw = {"random_bits": torch.from_numpy(bits.view(np.int32)).to(x.device), "stochastic_bits": 32}
    return cast.quantize(x.contiguous(), rounding.format, rounding=rounding.mode, **kw)


def _format_params(fmt: Format | None) -> list[int]:
    """The :class:`~fpsim.formats.params.FormatParams` ``_accumulate_kernel._format`` reads
    (float32's for an unused slot), subnormal results flushed where ``fmt`` has none."""
    if fmt is None:
        fmt = accumulator_format("float32")
    return list(format_params(fmt, ftz=not fmt.subnormals and fmt.mantissa_bits > 0))


def _offset(stream: int | None) -> int:
    """SplitMix64 offset of a seed stream as an int64 bit pattern (fpsim.emulate.random.random_bits_at)."""
    v = ((stream or 0) * SEED_MULTIPLIER) % (1 << 64)
    return v - (1 << 64) if v >= (1 << 63) else v


def _random_words(torch: Any, random_bits: Any, shape: tuple, device: Any) -> Any:
    if isinstance(random_bits, torch.Tensor):
        if random_bits.dtype not in (torch.uint32, torch.int32):
            raise ValueError(
                f"random_bits must be uint32 words (torch.uint32 / torch.int32 bit patterns); "
                f"got {random_bits.dtype}"
            )
        bits = random_bits.view(torch.int32)
    else:
        arr = np.asarray(random_bits)
        if arr.dtype != np.uint32:
            raise ValueError(f"random_bits must be uint32 of shape {shape}; got {arr.dtype} {arr.shape}")
        bits = torch.from_numpy(np.ascontiguousarray(arr).view(np.int32))
    if tuple(bits.shape) != shape:
        raise ValueError(
            f"random_bits must be uint32 of shape {shape} (rounding_count x output); got {tuple(bits.shape)}"
        )
    return bits.to(device).contiguous().reshape(-1)


def _tiles(interp: bool, m: int, n: int, is_dot: bool, launch: Launch) -> tuple[int, int]:
    def pow2(v: int) -> int:
        return 1 << max(0, (v - 1).bit_length())

    if is_dot:
        bm = launch.block_m or (min(pow2(m), 1024) if interp else 128)
        bn = 1
    else:
        bm = launch.block_m or (min(pow2(m), 64) if interp else 32)
        bn = launch.block_n or (min(pow2(n), 64) if interp else 32)
    for v, what in ((bm, "block_m"), (bn, "block_n")):
        if v < 1 or v & (v - 1):
            raise ValueError(f"launch.{what} must be a power of two, got {v}")
    return bm, bn


def _words(torch: Any, spec: AccumulatorSpec, random_bits: Any, shape: tuple, device: Any, dummy: Any):
    """The accumulator's random-word source and the tensor it loads (``dummy`` when unused)."""
    if not spec.stochastic:
        return Words.NONE, dummy
    if random_bits is not None:
        return Words.LOADED, _random_words(torch, random_bits, shape, device)
    if spec.seed is None:
        raise ValueError("stochastic rounding needs random_bits= or seed=")
    return Words.SPLITMIX64, dummy


def _params(torch: Any, spec: AccumulatorSpec, device: Any) -> Any:
    """The int64 parameter tensor: three formats (accumulator, product, promotion) of
    :data:`FORMAT_PARAMS` entries each, then the SplitMix64 offsets of the accumulator's and
    the products' seed streams."""
    params = _format_params(spec.accumulator) + _format_params(spec.product.format if spec.product else None)
    params += _format_params(spec.promote_to)
    params += [_offset(spec.stream(SeedStream.ACCUMULATOR)), _offset(spec.stream(SeedStream.PRODUCT))]
    return torch.tensor(params, dtype=torch.int64, device=device)


def _run(torch: Any, spec: AccumulatorSpec, pb: _Problem, random_bits: Any, launch: Launch) -> Any:
    """Launch the kernel on the problem's operands; the float32 result of ``pb.out_shape``."""
    device = pb.a.device
    n_out = pb.nb * pb.m * pb.n
    count = rounding_count(
        pb.k, promote_every=spec.promote_every, compensated=spec.compensation, promoted=spec.promoted
    )
    dummy = pb.a.view(torch.int32)  # stands in for the unused pointer
    rand_kind, rand = _words(torch, spec, random_bits, (count, *pb.out_shape), device, dummy)
    out = torch.zeros(pb.out_shape, dtype=torch.float32, device=device)
    if n_out == 0 or pb.k == 0:
        return out
    qmode = spec.product.mode if spec.product else RoundMode.NEAREST_EVEN
    interp = is_interpreted(device)
    bm, bn = _tiles(interp, pb.m, pb.n, pb.is_dot, launch)
    grid = (pb.nb * -(-pb.m // bm), -(-pb.n // bn))  # the kernel derives nb (and n_out) from it
    extra = {} if interp else {"num_warps": launch.num_warps, "enable_fp_fusion": False}
    with np.errstate(all="ignore"):  # the interpreter's numpy float64 ops on inf and NaN
        _launch_kernel(
            kernel_module("_accumulate_kernel", interp).matmul_kernel,
            grid,
            interp,
            pb.a,
            pb.b,
            out.view(torch.int32),
            rand,
            _params(torch, spec, device),
            pb.m,
            pb.n,
            pb.k,
            spec.promote_every or pb.k,
            spec.stochastic_bits,
            MODE=spec.rounding.code,
            PMODE=spec.promote_rounding.code if spec.promoted else 0,
            QMODE=qmode.code,
            PROMOTE=spec.promoted,
            PROD=spec.product is not None,
            COMP=int(_COMP[spec.compensation]),
            RAND=int(rand_kind),
            DOT=pb.is_dot,
            BM=bm,
            BN=bn,
            **extra,
        )
    return out
