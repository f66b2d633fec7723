"""Hardware casts: the GPU's own float8 / bfloat16 / float16 conversion, as codes.

``encode(x, fmt, saturate=...)`` converts with ``x.to(tl.float8e4nv)`` (float8_e4m3fn),
``tl.float8e5`` (float8_e5m2), ``tl.bfloat16`` or ``tl.float16`` and returns the codes
(torch.uint8 / torch.uint16), with the overflow, saturation and flush-to-zero conventions
of :func:`fpsim.emulate.element.encode` enforced around the instruction (see ``_hwcast_kernel.py``), so the
result must equal the emulator's nearest-even codes; NaN codes are the hardware's (compare
by class). Only round-to-nearest-even is offered: it is what ``.to()`` does.

These casts are validated on a GPU only (README, "Triton kernels"): Triton 3.9's CPU
interpreter performs float8 and bfloat16 casts wrongly (it does not round them as the
hardware does), so on CPU tensors only the float16 target runs (its numpy cast is exact);
the others raise
:class:`HardwareCastUnavailable`. :func:`unavailable_reason` says why a combination cannot
run, for skipping.
"""

from __future__ import annotations

import struct
import warnings
from typing import Any

from fpsim.formats import Format, RoundMode

from ._loader import is_interpreted, kernel_module, require_torch
from ._loader import launch as _launch_kernel
from .arguments import Launch, launch_grid
from .cast import element_format

__all__ = ["encode", "quantize", "HW_FORMATS", "unavailable_reason", "HardwareCastUnavailable"]

HW_FORMATS: dict[str, int] = {"float16": 0, "bfloat16": 1, "float8_e4m3fn": 2, "float8_e5m2": 3}
"""Formats with a hardware cast, and the kernel's TARGET number for each."""

_DEFAULT = Launch()


class HardwareCastUnavailable(RuntimeError):
    """The hardware cast cannot run here (format, mode, device or interpreter)."""


def unavailable_reason(
    fmt: Any, device: Any, rounding: RoundMode | str = RoundMode.NEAREST_EVEN
) -> str | None:
    """Why the hardware cast of ``fmt`` cannot run on ``device`` (None when it can).

    Args:
        fmt: a format or its name.
        device: "cpu", "cuda", a torch.device.
        rounding: the rounding mode asked for.
    """
    f = element_format(fmt)
    if f.name not in HW_FORMATS or not isinstance(f, Format):
        return f"{f.name} has no hardware cast (only {', '.join(HW_FORMATS)})"
    if RoundMode.parse(rounding) is not RoundMode.NEAREST_EVEN:
        return "hardware casts round to nearest even only"
    if is_interpreted(device) and f.name != "float16":
        return (
            f"Triton's CPU interpreter casts to {f.name} wrongly; "
            "the hardware path is validated on a GPU only"
        )
    if not is_interpreted(device):
        torch = require_torch()
        if not torch.cuda.is_available():
            return "no CUDA device"
        if f.name.startswith("float8") and torch.cuda.get_device_capability() < (8, 9):
            return f"{f.name} conversions need compute capability 8.9+ (Ada/Hopper)"
    return None


def encode(
    x: Any,
    fmt: Any,
    *,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    saturate: bool = False,
    subnormals: bool = True,
    launch: Launch = _DEFAULT,
    **unused: Any,
) -> Any:
    """Codes of ``x`` by the hardware conversion to ``fmt`` (nearest even).

    Args:
        x: torch float32 or float16 tensor (bfloat16 too on a GPU).
        fmt: float16, bfloat16, float8_e4m3fn or float8_e5m2 (name or Format).
        rounding: must be nearest_even.
        saturate: clamp out-of-range values and infinities to +-max before converting.
        subnormals: False flushes subnormal results to signed zero after converting.
        launch: block size and warps.
        unused: ``random_bits`` and the like, accepted (and ignored) so that the signature
            matches :func:`fpsim.kernels.cast.encode` in :func:`fpsim.kernels.validate.validate`.

    Returns:
        torch.uint8 (float8) or torch.uint16 codes of ``x``'s shape.

    Raises:
        HardwareCastUnavailable: see :func:`unavailable_reason`.
    """
    torch = require_torch()
    f = element_format(fmt)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"encode: x must be a torch tensor, got {type(x).__name__}")
    reason = unavailable_reason(f, x.device, rounding)
    if reason is not None:
        raise HardwareCastUnavailable(f"hardware cast to {f.name}: {reason}")
    allowed = (
        (torch.float32, torch.float16)
        if is_interpreted(x.device)
        else (torch.float32, torch.float16, torch.bfloat16)
    )
    if x.dtype not in allowed:
        raise TypeError(f"hwcast.encode: x must be one of {allowed}, got {x.dtype}")
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=getattr(torch, f.code_dtype), device=x.device)
    n = x.numel()
    if n == 0:
        return out
    interp = is_interpreted(x.device)
    kernel = kernel_module("_hwcast_kernel", interp).hw_encode_kernel
    block, grid, extra = launch_grid(n, x.device, launch)
    consts = dict(hw_consts(f, saturate, subnormals), BLOCK=block, I64=n + block >= 2**31)
    with warnings.catch_warnings():
        # the interpreter's numpy float16 cast warns on overflow (to inf, as it should)
        warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
        _launch_kernel(kernel, grid, interp, x, out, n, **consts, **extra)
    return out


def hw_consts(fmt: Format, saturate: bool, subnormals: bool) -> dict[str, Any]:
    """The constexpr parameters of ``hw_encode_kernel`` for a format of :data:`HW_FORMATS`.

    ``OVER_BITS`` is the float32 pattern of the midpoint between max and the next binade
    step (max + ulp / 2, exact in float32 for these formats); ``TIE_UP`` whether that
    midpoint rounds up (max's code is odd, IEEE 754 roundTiesToEven).
    """
    m = fmt.mantissa_bits
    ulp = 2.0 ** (fmt.max_exponent - m)
    return {
        "TARGET": HW_FORMATS[fmt.name],
        "SAT": bool(saturate),
        "FTZ": not subnormals,
        "MAX_BITS": _f32_bits(fmt.max),
        "OVER_BITS": _f32_bits(fmt.max + ulp / 2),
        "TIE_UP": bool(fmt.code_of_max & 1),
        "OVER_CODE": fmt.code_of_inf if fmt.code_of_inf is not None else fmt.code_of_nan,
        "SIGN_SHIFT": fmt.exponent_bits + m,
        "EXP_MASK": ((1 << fmt.exponent_bits) - 1) << m,
    }


def quantize(x: Any, fmt: Any, **kwargs: Any) -> Any:
    """float32 values of the hardware codes (decoded by :func:`fpsim.kernels.cast.decode`)."""
    from .cast import decode

    return decode(encode(x, fmt, **kwargs), fmt)


def _f32_bits(v: float) -> int:
    """float32 bit pattern of ``v`` (exact for the maxima and midpoints used here)."""
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    assert struct.unpack("<f", struct.pack("<I", bits))[0] == v, v
    return bits
