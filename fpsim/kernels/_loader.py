"""Lazy imports of torch and triton, and the kernel modules for each device.

Triton decides between the compiler and its CPU interpreter when a function is decorated
with ``@triton.jit``: the decorator reads ``TRITON_INTERPRET`` at that moment and returns an
``InterpretedFunction`` or a ``JITFunction`` (``triton/runtime/jit.py``). The interpreter
runs kernels on CPU torch tensors; compiled kernels need CUDA (or ROCm) tensors.

So the kernel source files (``_X_kernel.py`` beside its host ``X.py``: ``_cast_kernel.py``,
``_blocks_kernel.py``, ``_optim_kernel.py``, ``_accumulate_kernel.py``, ``_metrics_kernel.py``,
``_hwcast_kernel.py``, and their shared helpers ``_intcast.py`` and ``_blockscale.py``) are
executed once per mode, as two separate modules, with ``TRITON_INTERPRET`` set to ``"1"`` or
``"0"`` only while their decorators run (:func:`kernel_module`). A call on CPU tensors uses
the interpreted copy, a call on GPU tensors the compiled one, whatever the environment says.
Setting the variable briefly is not thread-safe: load the modules before starting threads
(:func:`kernel_module` caches them).

Triton 3.9's interpreter patches ``triton.language`` for every call of one ``@triton.jit``
function from another and never restores those patches (``InterpretedFunction.__call__``);
afterwards no kernel can be compiled in that process ("'value' object has no attribute
'dtype'"). :func:`interpreter_patches_restored` puts ``triton.language`` back after an
interpreted launch; every interpreted launch here goes through it (:func:`launch`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

_HERE = Path(__file__).resolve().parent


def require_torch() -> Any:
    """Import torch, or raise ImportError saying how to install it."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is a test dependency
        raise ImportError("fpsim.kernels needs torch: pip install 'fpsim[kernels]'") from e
    return torch


def require_triton() -> Any:
    """Import triton, or raise ImportError saying how to install it."""
    try:
        import triton
    except ImportError as e:
        raise ImportError("fpsim.kernels needs triton: pip install 'fpsim[kernels]'") from e
    return triton


def is_interpreted(device: Any) -> bool:
    """Whether tensors on ``device`` run in Triton's CPU interpreter (True for the CPU)."""
    kind = device if isinstance(device, str) else device.type
    return kind.split(":")[0] == "cpu"


def kernel_module(name: str, interpret: bool) -> ModuleType:
    """The kernel source file ``fpsim/kernels/<name>.py`` executed for the interpreter or the compiler.

    Args:
        name: the file's name without ``.py``: ``"_cast_kernel"``, ``"_intcast"``, ...
            (a kernel file loads the helper files it calls through here too, for its own mode).
        interpret: True for Triton's CPU interpreter, False for compiled GPU kernels.

    Returns:
        The module, cached in ``sys.modules`` as ``fpsim.kernels.<name>__interp`` or
        ``fpsim.kernels.<name>__compiled``.
    """
    key = f"fpsim.kernels.{name}__{'interp' if interpret else 'compiled'}"
    mod = sys.modules.get(key)
    if mod is not None:
        return mod
    require_triton()
    spec = importlib.util.spec_from_file_location(key, _HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(key, None)
        raise
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    return mod


def _lang_objects() -> list[Any]:
    """The objects Triton's interpreter patches (``triton/runtime/interpreter.py``)."""
    import triton.language as tl

    objs = [tl, tl.core, tl.math, tl.tensor, tl.dtype, getattr(tl.core, "condition", None)]
    objs.append(getattr(tl.core, "tensor_descriptor_base", None))
    return [o for o in objs if o is not None]


@contextlib.contextmanager
def interpreter_patches_restored() -> Iterator[None]:
    """Restore ``triton.language`` to its state on entry when the block exits.

    Wrap interpreted kernel launches in it so that a later compilation in the same process
    sees the real language (see the module docstring).
    """
    saved = [(obj, dict(vars(obj))) for obj in _lang_objects()]
    try:
        yield
    finally:
        for obj, before in saved:
            now = vars(obj)
            for name in [k for k in now if k not in before]:
                delattr(obj, name)
            for name, value in before.items():
                if now.get(name, _MISSING) is not value:
                    setattr(obj, name, value)


_MISSING = object()


def launch(kernel: Any, grid: tuple[int, ...], interpret: bool, *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)``; interpreted launches leave triton.language as it was."""
    if not interpret:
        kernel[grid](*args, **kwargs)
        return
    with interpreter_patches_restored():
        kernel[grid](*args, **kwargs)
