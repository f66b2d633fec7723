"""Turn numpy, ml_dtypes, torch and JAX arrays into numpy arrays without changing a bit."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["is_torch_tensor", "to_numpy"]

# torch dtype name -> (same-width integer view, ml_dtypes type) for types numpy lacks.
_TORCH_VIEWS = {
    "bfloat16": ("int16", "bfloat16"),
    "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
    "float8_e5m2": ("uint8", "float8_e5m2"),
    "float8_e4m3fnuz": ("uint8", "float8_e4m3fnuz"),
    "float8_e5m2fnuz": ("uint8", "float8_e5m2fnuz"),
    "float8_e8m0fnu": ("uint8", "float8_e8m0fnu"),
}


def is_torch_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (checked without importing torch)."""
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def torch_to_numpy(t: Any) -> np.ndarray:
    """A torch tensor as a numpy array with identical bits (bfloat16/float8 via ml_dtypes).

    The result shares memory with ``t`` when ``t`` is a dense, contiguous CPU tensor.
    """
    import torch

    t = t.detach()
    if t.is_sparse:
        t = t.to_dense()
    t = t.cpu().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    view = _TORCH_VIEWS.get(name)
    if view is not None:
        import ml_dtypes  # only for the types numpy lacks (its import is slow)

        return t.view(getattr(torch, view[0])).numpy().view(getattr(ml_dtypes, view[1]))
    try:
        return t.numpy()
    except TypeError as e:
        raise TypeError(f"torch dtype {t.dtype} has no numpy equivalent: {e}") from e


def to_numpy(x: Any) -> np.ndarray:
    """Convert a numpy, ml_dtypes, torch or JAX array (or a Python number) to numpy, bit-exactly.

    Raises:
        TypeError: for objects that do not convert to a numeric array (object dtype).
    """
    if isinstance(x, np.ndarray):
        out = x
    elif is_torch_tensor(x):
        out = torch_to_numpy(x)
    else:
        out = np.asarray(x)  # JAX arrays: bfloat16 and float8 come back as ml_dtypes types
    if out.dtype.kind not in "biufV" or out.dtype.kind == "V" and out.dtype.type is np.void:
        raise TypeError(f"cannot store an array of dtype {out.dtype} ({type(x).__name__})")
    return out
