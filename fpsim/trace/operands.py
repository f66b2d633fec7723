"""GEMM operands of a PyTorch model: each matmul module's input and its output's gradient.

FP8 recipes quantize the operands of every GEMM: the input (activations) and the weight in
the forward pass (E4M3), the gradient of the output in the backward pass (E5M2). An
:class:`OperandRecorder` hooks every ``torch.nn.Linear`` (subclasses included, e.g.
``nn.MultiheadAttention.out_proj``) and ``torch.nn.Conv1d/2d/3d`` of a model and, while armed:

* a forward hook copies the module's first positional input (role ``"input"``);
* a hook on the module's output tensor copies the gradient that reaches it in the backward
  pass (role ``"grad_output"``), exactly the ``grad_output[0]`` a
  ``register_full_backward_hook`` sees.

Operands are named by module (``"layers.0.fc1"``, the name in ``model.named_modules()``,
which prefixes its parameters' names); a module called more than once in a recorded step
(gradient accumulation, weight sharing) gives ``"name#1"``, ``"name#2"``, ... for the later
calls. Only forwards run with gradients enabled are recorded (an evaluation pass under
``torch.no_grad()`` is not). ``nn.MultiheadAttention`` runs its projections functionally
(its ``out_proj`` module is never called), so it is recorded as one module: its input is the
query (the input of the in-projection GEMM) and its grad_output the gradient of the
attention output (the output of the out-projection GEMM).

With ``stats=True`` each operand becomes its statistics vector (roles ``"stats.input"``,
``"stats.grad_output"``; :mod:`fpsim.trace.operand_stats`), computed where the tensor lives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .capture_async import snapshot_tensor
from .operand_stats import STATS_LENGTH

__all__ = ["OperandRecorder", "matmul_modules", "torch_stats_vector"]


def matmul_modules(model: Any) -> list[tuple[str, Any]]:
    """The ``(name, module)`` pairs of ``model`` whose operands are recorded, in module order."""
    import torch

    nn = torch.nn
    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]
    fused = {f"{name}.out_proj" for name, m in found if isinstance(m, nn.MultiheadAttention)}
    return [(name, m) for name, m in found if name not in fused]


class OperandRecorder:
    """Hooks on a model's matmul modules that copy their operands while armed.

    Args:
        model: the ``torch.nn.Module``.
        select: which modules to record, asked with the module's name and its parameters'
            names (a schedule's patterns: ``"fc.*"`` selects the module ``fc`` through
            ``fc.weight``).
        stats: record statistics vectors instead of the tensors.

    Raises:
        ValueError: the model (or the selection) has no Linear/Conv module.
    """

    def __init__(self, model: Any, select: Callable[[str], bool] = lambda name: True, stats: bool = False):
        found = matmul_modules(model)
        chosen = [
            (n, m) for n, m in found if select(n) or any(select(f"{n}.{p}") for p, _ in m.named_parameters())
        ]
        if not chosen:
            what = "none is selected by tensors=" if found else "the model has none"
            raise ValueError(
                f"operands= records nn.Linear, nn.Conv1d/2d/3d and nn.MultiheadAttention modules, but {what}"
            )
        self.names = [n for n, _ in chosen]
        self.stats = bool(stats)
        self.armed = False
        self.devices: set[Any] = set()
        self._calls: dict[str, int] = {}
        self._inputs: dict[str, Any] = {}
        self._grads: dict[str, Any] = {}
        self._handles = [m.register_forward_hook(self._hook(n)) for n, m in chosen]

    def arm(self, on: bool) -> None:
        """Start (True) or stop recording; drops whatever was recorded."""
        self.armed = bool(on)
        self._calls, self._inputs, self._grads, self.devices = {}, {}, {}, set()

    def collect(self) -> dict[str, dict[str, Any]]:
        """The operands recorded since :meth:`arm`: role -> name -> copy (empty roles left out)."""
        roles = ("stats.input", "stats.grad_output") if self.stats else ("input", "grad_output")
        out = {role: named for role, named in zip(roles, (self._inputs, self._grads)) if named}
        self._inputs, self._grads = {}, {}
        return out

    def remove(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.arm(False)

    def _take(self, t: Any) -> Any:
        return snapshot_tensor(torch_stats_vector(t) if self.stats else t, self.devices)

    def _hook(self, name: str) -> Callable[..., None]:
        import torch

        def forward_hook(module: Any, args: tuple, output: Any) -> None:
            if not self.armed or not torch.is_grad_enabled() or not args or not torch.is_tensor(args[0]):
                return
            k = self._calls.get(name, 0)
            self._calls[name] = k + 1
            key = name if k == 0 else f"{name}#{k}"
            self._inputs[key] = self._take(args[0])
            if isinstance(output, tuple) and output:  # MultiheadAttention: (output, weights)
                output = output[0]
            if torch.is_tensor(output) and output.requires_grad:

                def grad_hook(g: Any) -> None:
                    if self.armed:
                        self._grads[key] = self._take(g)

                output.register_hook(grad_hook)

        return forward_hook


def torch_stats_vector(t: Any) -> Any:
    """The statistics vector of a tensor (:mod:`fpsim.trace.operand_stats`), on its device.

    Follows the layout of :data:`~fpsim.trace.operand_stats.STATS_FIELDS`; tested against the
    histogram and counts of :func:`fpsim.analysis.metrics.measure` and numpy's amax.
    """
    import torch

    x = t.detach().reshape(-1).to(torch.float32)
    bits = x.view(torch.int32)
    expo = (bits >> 23) & 0xFF
    nan = torch.isnan(x)
    inf = torch.isinf(x)
    nonzero = (expo != 0xFF) & ((bits & 0x7FFFFFFF) != 0)
    hist = torch.bincount(expo[nonzero], minlength=256).to(torch.float64)
    amax = torch.where(nan, 0.0, x.abs()).amax() if x.numel() else x.new_zeros(())
    head = torch.stack(
        [
            torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device),
            nonzero.sum().to(torch.float64),
            nan.sum().to(torch.float64),
            inf.sum().to(torch.float64),
            amax.to(torch.float64),
        ]
    )
    out = torch.cat([head, hist])
    assert out.numel() == STATS_LENGTH
    return out
