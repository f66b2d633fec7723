"""Portable Triton casts: encode, decode and quantize torch tensors bit-identically to
:mod:`fpsim.emulate.element`.

The kernels (``_cast_kernel.py``, with the shared helpers of ``_intcast.py``) port the
emulator's integer algorithm (:mod:`fpsim.emulate._bitcore`) to Triton with integer bit
operations only, so they run exactly in Triton's CPU interpreter (whose float8 and bfloat16
float casts are wrong) and on a GPU. Every :class:`~fpsim.Format` and
:class:`~fpsim.IntFormat` (the whole of :data:`fpsim.FORMATS` and any other format the
emulator accepts) and every :class:`~fpsim.RoundMode` is supported, with ``saturate`` and
``subnormals`` as in :func:`fpsim.emulate.element.encode`.

Tensors and dtypes:
    * Inputs: torch float32, float16 or bfloat16 tensors of any shape and layout (a
      non-contiguous tensor is copied first). float16 and bfloat16 are widened exactly to
      float32 inside the kernel, so their codes equal the emulator's for ``x.float()``.
      float64 is not supported (the emulator rounds float64 once, directly; a kernel would
      need 64-bit integer paths): convert on the host with the emulator instead.
    * Codes: torch.uint8 (formats up to 8 bits), torch.uint16 (up to 16) or torch.uint32
      (float32), i.e. :attr:`Format.code_dtype`; ``codes.cpu().numpy()`` has the emulator's
      dtype. :func:`decode` also takes int8/16/32/64 codes (range-checked like the emulator)
      and int32 bit patterns for 32-bit formats.
    * Values (decode, quantize): torch.float32; NaN is 0x7FC00000 as numpy's NaN cast gives
      (float32 format: the code's own bits).
    * Tensors on the CPU run in Triton's interpreter, tensors on a GPU run compiled kernels
      (see :mod:`fpsim.kernels._loader`); no environment variable is needed.

Stochastic rounding (:class:`~fpsim.RoundMode` STOCHASTIC) takes either ``random_bits``
(uint32 words as a torch.uint32 or torch.int32 bit-pattern tensor of ``x``'s shape, the same
words the emulator takes) or ``seed``: element ``i`` of the flattened tensor then uses
``tl.randint(seed, i)`` (Philox4x32-10), which :func:`fpsim.kernels.philox.philox_bits`
reproduces in numpy::

    codes = fpsim.kernels.cast.encode(x, "float8_e4m3fn", rounding="stochastic", seed=7)
    bits = philox_bits(7, x.numel()).reshape(tuple(x.shape))
    assert (codes.numpy() == fpsim.emulate.element.encode(x.numpy(), "float8_e4m3fn",
                                                  rounding="stochastic", random_bits=bits)).all()
"""

from __future__ import annotations

from typing import Any

from fpsim.formats import AnyFormat, Format, IntFormat, RoundMode, get_format

from ._codes import Random, Source
from ._loader import is_interpreted, kernel_module, require_torch
from ._loader import launch as _launch_kernel
from .arguments import Launch, i32, launch_grid, stochastic_source
from .format_args import format_args, rounding_codes

__all__ = ["encode", "decode", "quantize", "code_dtype", "Launch"]

_DEFAULT = Launch()


def element_format(fmt: Any) -> AnyFormat:
    """The :class:`Format` or :class:`IntFormat` named by ``fmt`` (TypeError for block formats)."""
    f = get_format(fmt)
    if not isinstance(f, (Format, IntFormat)):
        raise TypeError(f"{f.name} is a block format; the cast kernels take element formats")
    return f


def code_dtype(fmt: Any) -> Any:
    """torch dtype of the codes of ``fmt``: uint8, uint16 or uint32 (``Format.code_dtype``)."""
    torch = require_torch()
    return getattr(torch, element_format(fmt).code_dtype)


def encode(
    x: Any,
    fmt: Any,
    *,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    saturate: bool = False,
    subnormals: bool = True,
    random_bits: Any = None,
    seed: int | None = None,
    stochastic_bits: int = 32,
    launch: Launch = _DEFAULT,
) -> Any:
    """Codes of ``x`` in ``fmt``, bit-identical to :func:`fpsim.emulate.element.encode`.

    Args:
        x: torch float32, float16 or bfloat16 tensor (CPU: Triton interpreter; GPU: compiled).
        fmt: a :class:`~fpsim.Format`, :class:`~fpsim.IntFormat` or registry name.
        rounding: a :class:`~fpsim.RoundMode` or its name (IEEE 754-2019 section 4.3,
            stochastic, odd).
        saturate: clamp out-of-range values, +-inf included, to +-max (integers: clamp
            instead of wrapping), as in :func:`fpsim.emulate.element.encode`.
        subnormals: False flushes subnormal results to zero after rounding (PTX ``.ftz``).
        random_bits: stochastic rounding only: uint32 words (torch.uint32 or torch.int32 bit
            patterns, or a numpy uint32 array) of ``x``'s shape; element i uses the low
            ``stochastic_bits`` bits of its word.
        seed: stochastic rounding only, instead of ``random_bits``: draw element i's word
            in the kernel as ``tl.randint(seed, i)`` (i the flat index; see
            :func:`fpsim.kernels.philox.philox_bits`). An int in ``[-2**63, 2**64)``.
        stochastic_bits: random bits one stochastic rounding uses, 1 to 32.
        launch: block size and warps (:class:`Launch`).

    Returns:
        Codes of ``x``'s shape on ``x``'s device, dtype :func:`code_dtype` (uint8, uint16 or
        uint32).

    Raises:
        TypeError: for a non-tensor ``x``, an unsupported dtype or a block format.
        ValueError: for bad stochastic-rounding arguments.
    """
    return _run_encode(
        x, fmt, rounding, saturate, subnormals, random_bits, seed, stochastic_bits, launch, False
    )


def quantize(
    x: Any,
    fmt: Any,
    *,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    saturate: bool = False,
    subnormals: bool = True,
    random_bits: Any = None,
    seed: int | None = None,
    stochastic_bits: int = 32,
    launch: Launch = _DEFAULT,
) -> Any:
    """``decode(encode(x, fmt, ...), fmt)`` in one fused kernel: float32 values of ``x``'s shape.

    Takes the arguments of :func:`encode`; bit-identical to :func:`fpsim.emulate.element.quantize`.
    The codes stay in registers, so the kernel moves only the input and the float32 output.
    """
    return _run_encode(
        x, fmt, rounding, saturate, subnormals, random_bits, seed, stochastic_bits, launch, True
    )


def decode(codes: Any, fmt: Any, *, launch: Launch = _DEFAULT) -> Any:
    """float32 values of ``codes``, bit-identical to :func:`fpsim.emulate.element.decode`.

    No lookup table: the float32 bit pattern is built from the code's fields with integer
    operations (normal and subnormal float32 results, +-inf, NaN as 0x7FC00000, flushed
    subnormal codes as signed zeros).

    Args:
        codes: torch integer tensor: uint8/uint16/uint32, or int8/int16/int32/int64 holding
            codes in ``[0, 2**bits)`` (for 32-bit formats int32 is read as a bit pattern).
        fmt: a :class:`~fpsim.Format`, :class:`~fpsim.IntFormat` or registry name.
        launch: block size and warps (:class:`Launch`).

    Returns:
        A float32 tensor of ``codes``' shape on its device.

    Raises:
        TypeError: for non-integer codes or a block format.
        ValueError: for codes out of range, as the emulator (checked unless the dtype is
            unsigned and at most ``fmt.bits`` wide).
    """
    torch = require_torch()
    fmt = element_format(fmt)
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"decode: codes must be a torch tensor, got {type(codes).__name__}")
    dt = codes.dtype
    unsigned = {torch.uint8: 8, torch.uint16: 16, torch.uint32: 32}
    signed = {torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}
    if dt not in unsigned and dt not in signed:
        raise TypeError(f"decode: codes must be an integer tensor, got dtype {dt}")
    if dt is torch.int32 and fmt.bits == 32:
        codes = codes.view(torch.uint32)
    elif not (dt in unsigned and unsigned[dt] <= fmt.bits) and codes.numel():
        wide = codes.to(torch.int64)
        lo, hi = int(wide.min()), int(wide.max())
        if lo < 0 or hi >= (1 << fmt.bits):
            raise ValueError(
                f"decode: codes out of range for {fmt.name} ({fmt.bits} bits): min {lo}, max {hi}"
            )
    codes = codes.contiguous()
    out = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
    n = codes.numel()
    if n == 0:
        return out
    interp = is_interpreted(codes.device)
    block, grid, extra = launch_grid(n, codes.device, launch)
    fa, fp = format_args(fmt)
    kernel = kernel_module("_cast_kernel", interp).decode_kernel
    args = (codes, out.view(torch.int32), n, fa)
    _launch_kernel(kernel, grid, interp, *args, FMT=fp, BLOCK=block, I64=n + block >= 2**31, **extra)
    return out


# --- host side -------------------------------------------------------------------------------


def _run_encode(x, fmt, rounding, saturate, subnormals, random_bits, seed, nbits, launch, quant):
    torch = require_torch()
    fmt, mode = element_format(fmt), RoundMode.parse(rounding)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"encode: x must be a torch tensor, got {type(x).__name__}")
    src = {torch.float32: Source.FLOAT32, torch.float16: Source.FLOAT16, torch.bfloat16: Source.BFLOAT16}.get(
        x.dtype
    )
    if src is None:
        raise TypeError(
            f"encode: x must be float32, float16 or bfloat16, got {x.dtype} "
            "(float64: use fpsim.emulate.element.encode, which rounds it once, directly)"
        )
    if not isinstance(launch, Launch):
        raise TypeError(f"encode: launch must be a Launch, got {type(launch).__name__}")
    x = x.contiguous()
    xv = x.view(torch.int32 if src is Source.FLOAT32 else torch.int16)
    rand, rand_kind, seed_arg = xv, Random.NONE, 0
    if mode is RoundMode.STOCHASTIC:
        if not 1 <= nbits <= 32:
            raise ValueError(f"stochastic_bits must be in [1, 32], got {nbits}")
        rand, rand_kind, seed_arg = stochastic_source(torch, x, xv, random_bits, seed)
    else:
        nbits = 32  # unused: one compiled specialisation for every value
    n = x.numel()
    if quant:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        target = out.view(torch.int32)
    else:
        out = torch.empty(x.shape, dtype=code_dtype(fmt), device=x.device)
        target = out
    if n == 0:
        return out
    ftz = not (subnormals and getattr(fmt, "subnormals", True))
    fa, fp = format_args(fmt, saturate=bool(saturate), ftz=ftz)
    mode_code, ovf = rounding_codes(fmt, mode)
    interp = is_interpreted(x.device)
    block, grid, extra = launch_grid(n, x.device, launch)
    _launch_kernel(
        kernel_module("_cast_kernel", interp).encode_kernel,
        grid,
        interp,
        xv,
        rand,
        target,
        n,
        i32(seed_arg),
        i32(seed_arg >> 32),
        nbits,
        i32((1 << nbits) - 1),
        fa,
        FMT=fp,
        MODE=mode_code,
        OVF=ovf,
        SRC=int(src),
        RAND=int(rand_kind),
        QUANT=quant,
        BLOCK=block,
        I64=n + block >= 2**31,
        **extra,
    )
    return out
