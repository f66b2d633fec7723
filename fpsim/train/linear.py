"""torch modules whose GEMMs run in an emulated low-precision recipe: :func:`convert`.

:func:`convert` replaces ``nn.Linear`` modules of a model (in place; the parameters are the
same objects, so an optimizer made before keeps working) with :class:`EmulatedLinear`, whose
forward and backward are one ``torch.autograd.Function``: fprop, dgrad and wgrad as
:mod:`fpsim.train.gemm` describes them, each operand quantized from the high-precision tensor
along that GEMM's contraction axis (:func:`fpsim.train.gemm.quantize_operand`), the GEMM an
FP32 ``torch.matmul`` of the dequantized operands (or the recipe's emulated accumulator,
:func:`fpsim.train.gemm.gemm`), the bias added after it in FP32 and its gradient summed from the
high-precision ``dy``. A role whose cast transposes with it
(:attr:`fpsim.train.gemm.OperandRecipe.transposes`: element formats, one scale per tensor,
square tiles; no stochastic words, no Hadamard transform) is cast once per step and read
transposed by its second GEMM, the same bits as casting it again (without ``stats``, which
are recorded per GEMM).

The quantization runs on numpy (the emulator's code); CUDA tensors are copied to the host for
it (no Triton path yet). Parameters and inputs must be float32.

Steps: each forward of a module is one step (``module.step`` counts them; the backward that
follows belongs to the same step). Delayed scaling keeps one :class:`fpsim.DelayedState` per
role in ``module.delayed``, stepped at the forward (input, weight) and the backward
(grad_output). Statistics (``stats=True``): each module appends a :class:`GemmStat` per GEMM
operand and step to ``module.gemm_stats`` (in memory), and with ``what_if=`` recipes one per
what-if recipe too; :func:`gemm_stats` gathers them over a model. Without ``stats`` nothing is
computed.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

import numpy as np
import torch

from .._compiled import Backend
from ..emulate.blocks import block_geometry
from ..emulate.delayed import DelayedScaling
from ..formats import BlockFormat
from .gemm import (
    ROLE_GEMMS,
    ROLES,
    Gemm,
    GemmRecipe,
    OperandStats,
    delayed_cast,
    gemm,
    module_operand,
    resolve_recipe,
)
from .gemmstat import GemmStat

__all__ = ["EmulatedLinear", "GemmStat", "convert", "gemm_stats"]


class EmulatedLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose three GEMMs run in ``recipe`` (module doc); made by :func:`convert`."""

    recipe: GemmRecipe

    @classmethod
    def wrap(
        cls,
        linear: torch.nn.Linear,
        recipe: GemmRecipe,
        name: str,
        stats: bool,
        backend: Backend,
        what_if: tuple[GemmRecipe, ...] = (),
    ) -> EmulatedLinear:
        """An EmulatedLinear holding ``linear``'s parameters (the same objects) in its training
        mode (hooks registered on ``linear`` are not carried over)."""
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.train(linear.training)
        self.recipe, self.name, self.stats, self.backend = recipe, name, stats, backend
        self.step = 0
        self.delayed = {
            r: recipe.operand(r).format.init()
            for r in ROLES
            if isinstance(recipe.operand(r).format, DelayedScaling)
        }
        self.what_if = what_if
        self.what_if_delayed = {
            (w.name, r): w.operand(r).format.init()
            for w in what_if
            for r in ROLES
            if isinstance(w.operand(r).format, DelayedScaling)
        }
        # roles cast once per step for both GEMMs, the second reading the first transposed
        # (the same bits: OperandRecipe.transposes); without statistics, which are per GEMM
        self.shared = frozenset(
            r for r in ROLES if r not in self.delayed and not stats and recipe.operand(r).transposes
        )
        self.gemm_stats: list[GemmStat] = []
        self._check_weight()
        return self

    def _check_weight(self) -> None:
        """Refuse now a weight shape a recipe's block formats cannot take (pad=False)."""
        n, k = self.weight.shape
        for recipe in (self.recipe, *self.what_if):
            fmt = recipe.weight.format
            if isinstance(fmt, BlockFormat):
                for gemm, shape in ((Gemm.FPROP, (n, k)), (Gemm.DGRAD, (k, n))):
                    try:
                        block_geometry(shape, fmt)
                    except ValueError as e:
                        raise ValueError(
                            f"{self.name}: weight in {gemm.value} {shape} under {recipe.name}: {e}"
                        ) from None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or self.weight.dtype != torch.float32:
            raise ValueError(
                f"{self.name}: emulated GEMMs take float32 inputs and weights, "
                f"got {x.dtype} / {self.weight.dtype}"
            )
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{self.name}: input has {x.shape[-1]} features, the layer {self.in_features}")
        # (a plain attribute: nn.Module.__setattr__, which looks for parameters, buffers and
        # submodules first, costs more than a small GEMM operand's cast)
        self.__dict__["step"] = self.step + 1
        return _LinearFn.apply(x, self.weight, self.bias, self)

    # --- one operand -----------------------------------------------------------------

    def quantized(self, a: np.ndarray, role: str, gemm: Gemm, step: int) -> np.ndarray:
        """``a`` (oriented: contraction axis last) as ``gemm`` reads it, stats recorded."""
        q, st = self._quantize(a, self.recipe, role, gemm, step, self.stats)
        self._record(self.recipe, step, gemm, role, st)
        self._what_if(a, role, gemm, step)
        return q

    def delayed_quantized(self, a: np.ndarray, role: str, step: int) -> np.ndarray:
        """The delayed-scaling cast of ``a`` (in its own orientation; one per step, serving both
        GEMMs of the role), its state stepped."""
        q, self.delayed[role], st = delayed_cast(
            a, self.recipe.operand(role).format, self.delayed[role], stats=self.stats, backend=self.backend
        )
        for g in ROLE_GEMMS[role]:
            self._record(self.recipe, step, g, role, st)
        if self.what_if:
            self._what_if(a, role, ROLE_GEMMS[role][0], step)
            self._what_if(np.ascontiguousarray(a.T), role, ROLE_GEMMS[role][1], step)
        return q

    def _quantize(self, a, recipe: GemmRecipe, role: str, gemm: Gemm, step: int, stats: bool):
        return module_operand(a, recipe, role, gemm, self.name, step, self.backend, stats=stats)

    def _what_if(self, a: np.ndarray, role: str, gemm: Gemm, step: int) -> None:
        """The statistics of ``a`` under each what-if recipe (nothing else kept). A delayed
        what-if casts once per step, in the role's first GEMM, and counts for both."""
        for recipe in self.what_if:
            op = recipe.operand(role)
            if isinstance(op.format, DelayedScaling):
                if gemm is ROLE_GEMMS[role][0]:
                    key = (recipe.name, role)
                    _, self.what_if_delayed[key], st = delayed_cast(
                        a, op.format, self.what_if_delayed[key], stats=True, backend=self.backend
                    )
                    for g in ROLE_GEMMS[role]:
                        self._record(recipe, step, g, role, st)
            else:
                self._record(recipe, step, gemm, role, self._quantize(a, recipe, role, gemm, step, True)[1])

    def _record(self, recipe: GemmRecipe, step: int, gemm: Gemm, role: str, st: OperandStats | None) -> None:
        if st is not None:
            self.gemm_stats.append(GemmStat(self.name, recipe.name, step, gemm.value, role, st))

    def is_delayed(self, role: str) -> bool:
        return role in self.delayed

    def once(self, role: str) -> bool:
        """Whether ``role`` is cast once per step (delayed scaling, or ``shared``)."""
        return role in self.delayed or role in self.shared


def _gemm(a: np.ndarray, b: np.ndarray, mod: EmulatedLinear) -> torch.Tensor:
    """``a @ b^T`` (both contiguous, contraction axis last): FP32, or the recipe's accumulator."""
    spec = mod.recipe.accumulate
    if spec is not None:
        return torch.from_numpy(gemm(a, b, spec))
    return torch.matmul(torch.from_numpy(a), torch.from_numpy(b).T)


def _host(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().to("cpu", torch.float32).numpy())


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias, mod: EmulatedLinear) -> torch.Tensor:
        x2, w = _host(x).reshape(-1, mod.in_features), _host(weight)
        step = mod.step
        if mod.is_delayed("input"):
            xq = mod.delayed_quantized(x2, "input", step)
            ctx.xq_wgrad = np.ascontiguousarray(xq.T)
        else:
            xq = mod.quantized(x2, "input", Gemm.FPROP, step)
            if mod.once("input"):
                ctx.xq_wgrad = np.ascontiguousarray(xq.T)
        if mod.is_delayed("weight"):
            wq = mod.delayed_quantized(w, "weight", step)
            ctx.wq_dgrad = np.ascontiguousarray(wq.T)
        else:
            wq = mod.quantized(w, "weight", Gemm.FPROP, step)
            if mod.once("weight"):
                ctx.wq_dgrad = np.ascontiguousarray(wq.T)
        y = _gemm(xq, wq, mod)
        if bias is not None:
            y = y + bias.detach().to("cpu")
        ctx.mod, ctx.step, ctx.x2, ctx.w = mod, step, x2, w
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return y.reshape(*x.shape[:-1], mod.out_features).to(x.device)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        mod, step = ctx.mod, ctx.step
        dy2 = _host(dy).reshape(-1, mod.out_features)
        if mod.is_delayed("grad_output"):
            gq = mod.delayed_quantized(dy2, "grad_output", step)
            gq_d, gq_w = gq, np.ascontiguousarray(gq.T)
        else:
            gq_d = mod.quantized(dy2, "grad_output", Gemm.DGRAD, step)
            if mod.once("grad_output"):
                gq_w = np.ascontiguousarray(gq_d.T)
            else:
                gq_w = mod.quantized(np.ascontiguousarray(dy2.T), "grad_output", Gemm.WGRAD, step)
        if mod.once("weight"):
            wq_d = ctx.wq_dgrad
        else:
            wq_d = mod.quantized(np.ascontiguousarray(ctx.w.T), "weight", Gemm.DGRAD, step)
        if mod.once("input"):
            xq_w = ctx.xq_wgrad
        else:
            xq_w = mod.quantized(np.ascontiguousarray(ctx.x2.T), "input", Gemm.WGRAD, step)
        dx = _gemm(gq_d, wq_d, mod).reshape(ctx.x_shape).to(dy.device)
        dw = _gemm(gq_w, xq_w, mod).to(dy.device)
        db = torch.from_numpy(dy2).sum(0).to(dy.device) if ctx.has_bias else None
        return dx, dw, db, None


def convert(
    model: torch.nn.Module,
    recipe: GemmRecipe | str,
    *,
    modules: Iterable[str] | str | None = None,
    keep_first_last: bool = False,
    stats: bool = False,
    what_if: Iterable[GemmRecipe | str] = (),
    backend: Backend | str = "auto",
) -> torch.nn.Module:
    """Replace ``model``'s ``nn.Linear`` modules with :class:`EmulatedLinear` running ``recipe``.

    Args:
        model: the model, changed in place (and returned); a bare ``nn.Linear`` comes back as
            an EmulatedLinear named ``"linear"`` (holding its parameters).
        recipe: a preset name of :data:`fpsim.train.gemm.GEMM_RECIPES` or a GemmRecipe.
        modules: shell-style patterns of module names (``"layers.*.mlp.*"``); None: every
            ``nn.Linear``.
        keep_first_last: keep the model's first and last ``nn.Linear`` (in module order) in
            FP32, as TE and torchao users keep the first and last layers in high precision.
        stats: record per-operand statistics (:func:`gemm_stats`).
        what_if: recipes (names or GemmRecipes) whose statistics are recorded next to the
            trained recipe's, on the same high-precision operands (each with its own delayed
            state): what each would have done at every step of this run. Needs ``stats``.
        backend: where the emulator's loops run (:class:`fpsim.Backend`).

    Raises:
        ValueError: an unknown recipe, a pattern that matches no ``nn.Linear`` (named), a model
            with layers converted already, or a weight shape a recipe's format cannot take.
    """
    recipe, backend = resolve_recipe(recipe), Backend.resolve(backend)
    what_if = tuple(resolve_recipe(w) for w in ([what_if] if isinstance(what_if, str) else what_if))
    names = [recipe.name, *(w.name for w in what_if)]
    if len(set(names)) < len(names):
        raise ValueError(f"the recipe and the what-if recipes need distinct names, got {', '.join(names)}")
    if what_if and not stats:
        raise ValueError("what_if records statistics only: pass stats=True")
    named = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    done = [n for n, m in named if isinstance(m, EmulatedLinear)]
    if done:
        raise ValueError(f"already converted: {', '.join(done)}; convert a fresh model")
    if not named:
        raise ValueError("the model has no nn.Linear module")
    chosen = [n for n, _ in named]
    if modules is not None:
        patterns = [modules] if isinstance(modules, str) else list(modules)
        for p in patterns:
            if not any(fnmatch.fnmatchcase(n, p) for n in chosen):
                raise ValueError(f"pattern {p!r} matches no nn.Linear; they are: {', '.join(chosen)}")
        chosen = [n for n in chosen if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if keep_first_last:
        ends = {named[0][0], named[-1][0]}
        chosen = [n for n in chosen if n not in ends]
    lookup = dict(named)
    if chosen == [""]:  # the model is one nn.Linear
        return EmulatedLinear.wrap(model, recipe, "linear", stats, backend, what_if)
    for n in chosen:
        new = EmulatedLinear.wrap(lookup[n], recipe, n, stats, backend, what_if)
        parent, _, leaf = n.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, new)
    return model


def gemm_stats(model: torch.nn.Module, *, clear: bool = False) -> list[dict]:
    """Every recorded :class:`GemmStat` of ``model``'s emulated layers as flat dicts, by step,
    module order, GEMM and role; ``clear`` empties the modules' ``gemm_stats`` lists as they
    are read, so that a long run can drain its statistics every few steps instead of keeping
    them all in memory."""
    layers = [m for m in model.modules() if isinstance(m, EmulatedLinear)]
    rows = [s.row() for m in layers for s in m.gemm_stats]
    if clear:
        for m in layers:
            m.gemm_stats.clear()
    order = {g.value: i for i, g in enumerate(Gemm)}
    return sorted(rows, key=lambda r: (r["step"], order[r["gemm"]]))
