"""The public verbs ``encode`` / ``decode`` / ``quantize`` for every kind of format.

Element formats (:class:`~fpsim.Format`, :class:`~fpsim.IntFormat`) go to
:mod:`fpsim.emulate.element`; block formats (:class:`~fpsim.BlockFormat`) to :mod:`fpsim.emulate.blocks`,
which returns codes plus scales as a :class:`~fpsim.BlockCodes`. This thin module sits above
both, so that neither imports the other's verbs (the data flow of the README's Architecture
section). Each verb resolves the format (a name, a format object, or a numpy / ml_dtypes / JAX /
torch dtype, :func:`fpsim.get_format`) and the backend once and hands objects down.

Array types: numpy in, numpy out; JAX in, JAX out (element formats also under ``jax.jit``; block
formats quantize concrete JAX arrays on the host);
a torch tensor (any device, any dtype including bfloat16 and the float8 types) is read bit for
bit on the CPU, and the float results of :func:`decode` and :func:`quantize` come back as a
float32 torch tensor on the input's device (float32, as every fpsim value: exact for every
format). Codes (:func:`encode`) are numpy arrays (or a BlockCodes) whatever the input, as torch
has no arithmetic on uint16/uint32.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .._compiled import Backend
from ..formats import BlockFormat, get_format
from . import blocks, element

__all__ = ["encode", "decode", "quantize"]


def encode(x: Any, fmt: Any, *, backend: Backend | str = "auto", **kwargs: Any) -> Any:
    """Codes of ``x`` in ``fmt``: see :func:`fpsim.emulate.element.encode` (element formats) and
    :func:`fpsim.emulate.blocks.encode_blocks` (block formats, returns a BlockCodes).

    ``fmt``: a name, a :class:`~fpsim.Format` / :class:`~fpsim.BlockFormat`, or a dtype
    (``ml_dtypes.float8_e4m3fn``, ``torch.bfloat16``, ...: :func:`fpsim.get_format`; a dtype names
    the format, ``saturate`` stays what you pass, so ``torch.float8_e4m3fn`` with
    ``saturate=True`` is torch's cast). ``backend`` (:class:`~fpsim.Backend` or its name) is where
    the loops run on numpy input (the same codes on each); JAX input runs under JAX. A torch
    tensor is read on the CPU; the codes are numpy.
    """
    fmt, backend = get_format(fmt), Backend.resolve(backend)
    x = _host(x)[0]
    if isinstance(fmt, BlockFormat):
        return blocks.encode_blocks(x, fmt, backend=backend, **kwargs)
    return element.encode(x, fmt, backend=backend, **kwargs)


def decode(codes: Any, fmt: Any, *, backend: Backend | str = "auto") -> Any:
    """float32 values of ``codes`` (a BlockCodes for block formats), of the codes' array type
    (torch codes give a float32 tensor on their device)."""
    fmt, backend = get_format(fmt), Backend.resolve(backend)
    if isinstance(fmt, BlockFormat):
        return blocks.decode_array(codes, fmt, backend)
    codes, like = _host(codes)
    return _like(element.decode_array(codes, fmt), like)


def quantize(x: Any, fmt: Any, *, backend: Backend | str = "auto", **kwargs: Any) -> Any:
    """``decode(encode(x, fmt, **kwargs), fmt)``: ``x`` as the format stores it, float32, of
    ``x``'s array type (a torch tensor gives a float32 tensor on its device)."""
    fmt, backend = get_format(fmt), Backend.resolve(backend)
    x, like = _host(x)
    if isinstance(fmt, BlockFormat):
        x, jax_in = _from_jax(x)
        out = blocks.decode_array(blocks.encode_blocks(x, fmt, backend=backend, **kwargs), fmt, backend)
        return jax_in.numpy.asarray(out) if jax_in else _like(out, like)
    return _like(element.decode_array(element.encode(x, fmt, backend=backend, **kwargs), fmt), like)


def _from_jax(x: Any) -> tuple[Any, Any]:
    """(a concrete JAX array as numpy, the jax module) for the block formats, which run on numpy;
    (x, None) for anything else. Inside ``jax.jit`` a block format is refused."""
    jax = sys.modules.get("jax")
    if jax is None or not isinstance(x, jax.Array):
        return x, None
    if isinstance(x, jax.core.Tracer):
        raise TypeError("block formats run on numpy arrays, outside jax.jit (element formats run inside)")
    return np.asarray(x), jax


def _host(x: Any) -> tuple[Any, Any]:
    """(``x`` as the emulator reads it, the torch tensor it came from or None).

    A torch tensor becomes a numpy array with the same bits: bfloat16 and the float8 types
    through ml_dtypes' dtype of the same name (numpy has none of its own); others as is.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return x, None
    t = x.detach().cpu().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if t.dtype.is_floating_point and name not in ("float16", "float32", "float64"):
        import ml_dtypes

        np_dtype = getattr(ml_dtypes, name, None)
        if np_dtype is None or np.dtype(np_dtype).itemsize != t.element_size():
            raise TypeError(f"cannot read a torch {name} tensor; give float or integer tensors")
        raw = t.view(torch.uint8 if t.element_size() == 1 else torch.int16).numpy()
        return raw.view(np_dtype), x
    return t.numpy(), x


def _like(out: Any, like: Any) -> Any:
    """``out`` (a float32 numpy array) as a tensor on ``like``'s device when ``like`` is one."""
    if like is None:
        return out
    import torch

    return torch.from_numpy(np.array(out, dtype=np.float32, copy=True)).to(like.device)
