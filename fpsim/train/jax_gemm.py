"""Emulated low-precision GEMMs for JAX: :func:`linear`, ``x @ w.T`` through ``jax.custom_vjp``.

The same three GEMMs as :class:`fpsim.train.linear.EmulatedLinear` (the torch path), with the
same operands: fprop ``y = x W^T`` quantizes ``x`` and ``W``; the backward quantizes ``dy`` and
``W^T`` for dgrad ``dx = dy W`` and ``dy^T`` and ``x^T`` (the token axis as contraction) for
wgrad ``dW = dy^T x``, each from the high-precision tensor along that GEMM's contraction axis,
by :func:`fpsim.train.gemm.quantize_operand` run on the host through ``jax.pure_callback``
(one implementation for both frameworks). The NVFP4 Hadamard transform and the stochastic
rounding words are the torch path's too: the words come from
:func:`fpsim.train.gemm.operand_seed` of the layer's ``name`` and the ``step`` passed in, so a
torch module of that name at that step quantizes to the same bits. Leading batch dimensions of
``x`` are flattened into tokens, as the torch path does.

The GEMM itself runs in the callback too, a real FP32 one: ``np.matmul(a, b.T)`` of the
dequantized float32 operands (numpy's BLAS: the bits of ``np.matmul`` on the same machine;
not XLA's dot, which under ``jax.jit`` gave other last bits than the same dot run alone, on
jaxlib 0.10's CPU backend), or with ``GemmRecipe(accumulate=...)``
:func:`fpsim.train.gemm.gemm` (the emulated accumulator), the torch path's own code. The torch
path's FP32 GEMM is ``torch.matmul`` (torch's BLAS), so y, dx and dW equal the torch path's
where the two BLAS sum alike; the operands are equal always. Tested
(tests/train/test_jax_gemm.py, jitted ``jax.vjp``/``jax.grad``): y, dx and dW equal, bit for
bit, ``np.matmul`` of the operands ``fpsim.quantize`` gives on the numpy tier, and the torch
path with its FP32 matmul swapped for that ``np.matmul`` gives the same bits for the same
inputs, layer name and step.

Delayed scaling (``fp8-delayed``, TE's DelayedScaling) carries a state per role: the amax
history and the scale of :class:`fpsim.DelayedState`, here as arrays (:class:`RoleState`, one
per delayed role in a :class:`DelayedStates` pytree, :func:`init_state`). ``dense`` then takes
the state as a fourth argument and casts each role with its scale, by
:func:`fpsim.train.gemm.delayed_cast` (the torch path's code): input and weight once in the
forward (the backward reuses those casts, transposed), grad_output once in the backward.
The next state comes back as the *gradient* of the state argument ("overwrite with gradient",
as Flax's FP8 ops and TE-JAX carry their FP8 metadata: a custom VJP cannot return other
outputs from the backward): differentiate with respect to the state too and take that
gradient as the new state instead of applying it::

    dense = linear("fp8-delayed", name="fc")
    state = init_state("fp8-delayed")

    @jax.jit
    def train_step(w, state, x, t, step):
        loss = lambda w, state: jnp.mean((dense(x, w, step, state) - t) ** 2)
        l, (dw, state) = jax.value_and_grad(loss, argnums=(0, 1))(w, state)
        return w - 0.01 * dw, state, l

A forward alone (no gradient taken) does not step the state, and ``jax.vmap`` is refused
(``jax.pure_callback`` names it): a batch of new states would be summed into one. Without
delayed scaling, ``jax.vmap`` of ``dense`` gives each batch element's own ``dense`` (its own
per-tensor scales), run one after another on the host. Each state belongs to one
``dense`` call per step: a state passed to two calls would get the sum of two new states.
Tested (tests/train/test_jax_gemm.py): over 20 jitted steps, y, dx, dW, the amax histories and
the scales equal the torch path's (its matmul swapped for ``np.matmul``) and those of
:class:`fpsim.DelayedScaling` stepped by hand, bit for bit.

Statistics (``linear(..., stats=True)``): the host callbacks record the torch layer's
:class:`fpsim.train.gemmstat.GemmStat` records (``convert(stats=True)``), by the same code on
the same operands: one per GEMM operand and step (a delayed cast once, for both its GEMMs), and
with ``what_if=`` recipes one per what-if recipe too. :meth:`Dense.gemm_stats` (one layer) and
:func:`gemm_stats` (several, in model order) give them as flat dicts in the order of
:func:`fpsim.train.linear.gemm_stats`. JAX may run a callback again for the same values
(``jax.checkpoint``, a function traced again): the records are kept per (step, GEMM, role,
recipe), a repeat with equal statistics adds nothing, and other statistics for a recorded key
(two calls passed the same step) are refused, loudly, from the callback. A forward alone (no
gradient) records fprop only, as a torch forward does; the forward's callback hands the
backward's a token, so that a gradient that does not read ``y`` cannot drop it as dead code.
``jax.vmap`` of a layer with stats is refused while tracing: per-example statistics would share
one key. What-if recipes with delayed scaling are refused: their state would live on the host,
stepped by callbacks that JAX may run again (train with such a recipe, or ask the torch layer).
Without stats nothing is computed or kept. Tested (tests/train/test_jax_gemm_stats.py): the rows
of jitted ``jax.grad`` steps equal the torch path's, field by field (NaN by class) and in order,
for bf16, fp8-current, fp8-delayed over 3 steps, mxfp8, nvfp4 and what-if recipes, for one layer
and for two.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from .._compiled import Backend
from ..emulate.blocks import block_geometry
from ..emulate.delayed import DelayedScaling, DelayedState
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
from .gemmstat import GemmStat, StatLog

__all__ = ["Dense", "DelayedStates", "GemmStat", "RoleState", "gemm_stats", "init_state", "linear"]

_F32 = np.float32

_OPERANDS = (
    ("input", Gemm.FPROP),
    ("weight", Gemm.FPROP),
    ("grad_output", Gemm.DGRAD),
    ("weight", Gemm.DGRAD),
    ("grad_output", Gemm.WGRAD),
    ("input", Gemm.WGRAD),
)
"""The six quantized operands: fprop's two, then the backward's four."""


class RoleState(NamedTuple):
    """One role's delayed-scaling state as arrays: :class:`fpsim.DelayedState`'s amax history
    (float32, newest slot first) and scale (a float32 scalar)."""

    history: jax.Array
    scale: jax.Array


class DelayedStates(NamedTuple):
    """The delayed-scaling state of one :func:`linear`: a :class:`RoleState` per role whose
    format is a :class:`fpsim.DelayedScaling`, None for the others (a pytree of arrays)."""

    input: RoleState | None = None
    weight: RoleState | None = None
    grad_output: RoleState | None = None


def _delayed_roles(recipe: GemmRecipe) -> list[str]:
    return [r for r in ROLES if isinstance(recipe.operand(r).format, DelayedScaling)]


def init_state(recipe: GemmRecipe | str) -> DelayedStates:
    """The state before the first step of ``recipe``'s delayed roles: zero histories, scale 1
    (:meth:`fpsim.DelayedScaling.init`).

    Raises:
        ValueError: an unknown recipe, or one without delayed scaling (named).
    """
    recipe = resolve_recipe(recipe)
    roles = _delayed_roles(recipe)
    if not roles:
        raise ValueError(f"recipe {recipe.name!r} has no delayed scaling: its dense takes no state")
    states = {}
    for r in roles:
        st = recipe.operand(r).format.init()
        states[r] = RoleState(jnp.asarray(st.history, jnp.float32), jnp.asarray(st.scale, jnp.float32))
    return DelayedStates(**states)


def _check(recipe: GemmRecipe, name: str, m: int, n: int, k: int) -> None:
    """Refuse, while tracing, a shape an operand's format or the Hadamard transform cannot
    take (the torch path refuses the same shapes when it runs)."""
    shapes = {
        ("input", Gemm.FPROP): (m, k),
        ("weight", Gemm.FPROP): (n, k),
        ("grad_output", Gemm.DGRAD): (m, n),
        ("weight", Gemm.DGRAD): (k, n),
        ("grad_output", Gemm.WGRAD): (n, m),
        ("input", Gemm.WGRAD): (k, m),
    }
    for (role, g), shape in shapes.items():
        op = recipe.operand(role)
        try:
            if op.hadamard and g is Gemm.WGRAD and shape[-1] % 16:
                raise ValueError(
                    f"the Hadamard transform needs a contraction length divisible by 16, got {shape[-1]}"
                )
            if isinstance(op.format, BlockFormat):
                block_geometry(shape, op.format)
        except ValueError as e:
            raise ValueError(f"{name}: {role} in {g.value} {shape} under {op.name}: {e}") from None


def _check_state(recipe: GemmRecipe, name: str, state: DelayedStates | None) -> None:
    """Refuse a state that is missing, not wanted, or not shaped as :func:`init_state`'s."""
    roles = _delayed_roles(recipe)
    if not roles:
        if state is not None:
            raise ValueError(f"{name}: recipe {recipe.name!r} has no delayed scaling; pass no state")
        return
    if not isinstance(state, DelayedStates):
        raise ValueError(
            f"{name}: recipe {recipe.name!r} scales {', '.join(roles)} with delayed scaling: pass "
            f"dense(x, w, step, state) with a DelayedStates (fpsim.train.jax_gemm.init_state), got "
            f"{type(state).__name__}"
        )
    for r in ROLES:
        st = getattr(state, r)
        if r not in roles:
            if st is not None:
                raise ValueError(
                    f"{name}: the state has a {r} entry, which {recipe.name!r} does not scale by delay"
                )
            continue
        n = recipe.operand(r).format.history_len
        shapes = None if st is None else [(jnp.shape(a), jnp.result_type(a)) for a in st]
        if shapes != [((n,), jnp.float32), ((), jnp.float32)]:
            raise ValueError(
                f"{name}: the {r} state must be a RoleState of a float32 history of {n} and a float32 "
                f"scalar scale (init_state({recipe.name!r})), got {shapes}"
            )


def linear(
    recipe: GemmRecipe | str,
    *,
    name: str = "linear",
    backend: Backend | str = "auto",
    stats: bool = False,
    what_if: Iterable[GemmRecipe | str] = (),
) -> Dense:
    """An emulated ``dense(x, w, step[, state]) -> x @ w.T`` whose three GEMMs run in ``recipe``
    (module doc), a :class:`Dense`.

    ``x``: float32 ``(..., K)``; ``w``: float32 ``(N, K)`` (torch's ``nn.Linear`` layout);
    ``step``: the step (an int or int32 scalar, traced under ``jax.jit``), the torch module's
    ``module.step`` (1 at its first forward): with ``name`` it draws the stochastic rounding
    words. ``state``: with delayed scaling, the :class:`DelayedStates` of the step
    (:func:`init_state` at the first), whose gradient is the next one; otherwise none.
    ``jax.grad``/``jax.vjp`` give dx and dW from the emulated dgrad and wgrad; ``step`` has no
    gradient. Works under ``jax.jit`` (the quantization runs on the host).

    Args:
        recipe: a preset name of :data:`fpsim.train.gemm.GEMM_RECIPES` or a GemmRecipe.
        name: the layer's name (the torch module's name in the model; ``convert`` of a bare
            ``nn.Linear`` names it ``"linear"``).
        backend: where the emulator's loops run (:class:`fpsim.Backend`).
        stats: record per-operand statistics (:meth:`Dense.gemm_stats`; module doc).
        what_if: recipes (names or GemmRecipes) whose statistics are recorded next to the
            trained recipe's, on the same operands, as ``convert(what_if=)`` does. Needs
            ``stats``; recipes without delayed scaling only (module doc says why).

    Raises:
        ValueError: an unknown recipe, what-if recipes without ``stats``, with delayed scaling
            or named like another, or at the call (tracing) inputs that are not float32, a
            ``w`` that is not 2-D, a feature count that differs from ``w``'s, a shape an
            operand's format refuses, a state missing, unwanted or shaped unlike
            :func:`init_state`'s (named).
        TypeError: ``stats`` not a bool.
    """
    if not isinstance(stats, bool):
        raise TypeError(f"{name}: stats must be a bool, got {stats!r}")
    recipe = resolve_recipe(recipe)
    what_if = tuple(resolve_recipe(r) for r in ([what_if] if isinstance(what_if, str) else what_if))
    names = [recipe.name, *(r.name for r in what_if)]
    if len(set(names)) < len(names):
        raise ValueError(
            f"{name}: the recipe and the what-if recipes need distinct names, got {', '.join(names)}"
        )
    if what_if and not stats:
        raise ValueError(f"{name}: what_if records statistics only: pass stats=True")
    for r in what_if:
        if _delayed_roles(r):
            raise ValueError(
                f"{name}: what-if recipe {r.name!r} scales {', '.join(_delayed_roles(r))} with delayed "
                "scaling, whose state would live on the host, stepped by callbacks JAX may run again; "
                "what_if takes recipes without delayed scaling (train with it, or use the torch layer)"
            )
    return Dense(_Layer(recipe, name, Backend.resolve(backend), stats, what_if))


class Dense:
    """The emulated ``dense(x, w, step[, state])`` of :func:`linear` (call it; it works under
    ``jax.jit``, ``jax.grad`` and ``jax.checkpoint``) and, with ``stats``, its statistics."""

    def __init__(self, layer: _Layer) -> None:
        self._layer = layer
        dense2 = jax.custom_vjp(lambda x2, w, step, state: layer.fwd(x2, w, step, state)[0])
        dense2.defvjp(layer.fwd, layer.bwd)
        self._dense2 = dense2

    @property
    def name(self) -> str:
        """The layer's name."""
        return self._layer.name

    @property
    def recipe(self) -> GemmRecipe:
        """The recipe trained with."""
        return self._layer.recipe

    def __call__(
        self, x: jax.Array, w: jax.Array, step: jax.Array | int, state: DelayedStates | None = None
    ) -> jax.Array:
        x, w, step = self._layer.check(x, w, step, state)
        m, k = int(np.prod(x.shape[:-1], dtype=np.int64)), x.shape[-1]
        return self._dense2(x.reshape(m, k), w, step, state).reshape(*x.shape[:-1], w.shape[0])

    def records(self, *, clear: bool = False) -> list[GemmStat]:
        """The :class:`GemmStat` records, ordered as :meth:`gemm_stats` (``clear``: as there).

        Raises:
            ValueError: the layer was made without ``stats``.
        """
        return [r for _, r in self._log().records(clear=clear)]

    def gemm_stats(self, *, clear: bool = False) -> list[dict]:
        """The records as flat dicts (:meth:`GemmStat.row`), by step, GEMM and role in the torch
        layer's order (:func:`gemm_stats` of this layer alone); ``clear`` empties the log.

        Raises:
            ValueError: the layer was made without ``stats``.
        """
        return gemm_stats([self], clear=clear)

    def _log(self) -> StatLog:
        if self._layer.log is None:
            raise ValueError(f"{self.name}: made without stats, it records none: linear(..., stats=True)")
        return self._layer.log


def gemm_stats(layers: Iterable[Dense] | Dense, *, clear: bool = False) -> list[dict]:
    """Every record of ``layers`` (each made with ``stats``) as flat dicts, in the order of
    :func:`fpsim.train.linear.gemm_stats` for a model holding them in that order: by step,
    GEMM, layer, then role as the torch layer records them.

    The callbacks record as a jitted step runs, which may be after the call that dispatched it
    returned: read the statistics of a step after its results are ready
    (``jax.block_until_ready``). ``clear`` empties each layer's log as it is read, so that a
    long run can drain its statistics every few steps instead of keeping them all in memory (a
    step run again after that is recorded again).

    Raises:
        ValueError: a layer made without ``stats``.
        TypeError: ``layers`` holds something other than a :class:`Dense` (one Dense alone is
            taken as ``[dense]``).
    """
    layers = [layers] if isinstance(layers, Dense) else list(layers)
    bad = [type(d).__name__ for d in layers if not isinstance(d, Dense)]
    if bad:
        raise TypeError(f"gemm_stats takes layers made by linear() (Dense), got {', '.join(bad)}")
    logs = [d._log() for d in layers]  # every layer checked before any log is cleared
    keyed = [(k[:2], i, k[2], r) for i, log in enumerate(logs) for k, r in log.records(clear=clear)]
    return [r.row() for *_, r in sorted(keyed, key=lambda t: t[:3])]


def _append_order(recipe: GemmRecipe, what_if: tuple[GemmRecipe, ...]) -> dict[tuple[Gemm, str, str], int]:
    """The position of each (GEMM, role, recipe name) in the sequence the torch layer records a
    step in (forward: input, weight; backward: grad_output, then weight and input where they
    are cast again; each cast followed by its what-if recipes'; a delayed cast recorded for
    both its GEMMs at once). :func:`fpsim.train.linear.gemm_stats` sorts stably by step and
    GEMM, so this order within a GEMM is its row order."""
    seq: list[tuple[Gemm, str, str]] = []
    delayed = _delayed_roles(recipe)

    def cast(role: str, *gemms: Gemm) -> None:
        seq.extend((g, role, recipe.name) for g in gemms)
        seq.extend((g, role, r.name) for g in gemms for r in what_if)

    for role in ("input", "weight"):
        cast(role, *(ROLE_GEMMS[role] if role in delayed else ROLE_GEMMS[role][:1]))
    if "grad_output" in delayed:
        cast("grad_output", Gemm.DGRAD, Gemm.WGRAD)
    else:
        cast("grad_output", Gemm.DGRAD)
        cast("grad_output", Gemm.WGRAD)
    for role in ("weight", "input"):
        if role not in delayed:
            cast(role, ROLE_GEMMS[role][1])
    return {k: i for i, k in enumerate(seq)}


class _Layer:
    """What :func:`linear`'s ``dense`` runs: the checks while tracing, the host callbacks
    (quantization and GEMMs) and the custom VJP's forward and backward."""

    def __init__(
        self, recipe: GemmRecipe, name: str, backend: Backend, stats: bool, what_if: tuple[GemmRecipe, ...]
    ) -> None:
        self.recipe, self.name, self.backend, self.what_if = recipe, name, backend, what_if
        self.policy = {r: recipe.operand(r).format for r in _delayed_roles(recipe)}
        self.log = StatLog(name, _append_order(recipe, what_if)) if stats else None
        # jax.vmap runs the host callbacks once per batch element: dense of each element alone.
        # Not with delayed scaling, whose batched new states would be summed into one gradient.
        self.vmap = None if self.policy else "sequential"

    def check(self, x, w, step, state) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``x``, ``w`` and ``step`` as arrays, after refusing what does not fit (named)."""
        name = self.name
        dt = [getattr(a, "dtype", type(a).__name__) for a in (x, w)]
        if any(d != np.float32 for d in dt):  # checked before jnp.asarray casts float64 down
            raise ValueError(f"{name}: emulated GEMMs take float32 inputs and weights, got {dt[0]} / {dt[1]}")
        x, w = jnp.asarray(x), jnp.asarray(w)
        if w.ndim != 2 or x.ndim < 1:
            raise ValueError(f"{name}: w must be 2-D (N, K) and x (..., K), got {w.shape} and {x.shape}")
        n, k = w.shape
        if x.shape[-1] != k:
            raise ValueError(f"{name}: input has {x.shape[-1]} features, the weight {k}")
        for recipe in (self.recipe, *self.what_if):
            _check(recipe, name, int(np.prod(x.shape[:-1], dtype=np.int64)), n, k)
        _check_state(self.recipe, name, state)
        step = jnp.asarray(step, jnp.int32)
        if step.shape != ():
            raise ValueError(f"{name}: step must be a scalar, got shape {step.shape}")
        return x, w, step

    def _host_gemm(self, a, b):
        a, b = np.ascontiguousarray(a, _F32), np.ascontiguousarray(b, _F32)
        spec = self.recipe.accumulate
        return np.matmul(a, b.T) if spec is None else gemm(a, b, spec)

    def mm(self, a, b):
        """``a @ b^T`` on the host: numpy's FP32 matmul, or the recipe's accumulator."""
        out = jax.ShapeDtypeStruct((a.shape[0], b.shape[0]), jnp.float32)
        return jax.pure_callback(self._host_gemm, out, a, b, vmap_method=self.vmap)

    def quantized(self, keys, arrays, step, states, after=()):
        """The operands ``keys`` of the oriented ``arrays``, quantized on the host, the next
        state of each delayed role among them (``states``: the role's RoleState, or None) and,
        with stats, their records (:meth:`records`) and a token: a float32 zero the backward's
        callback takes (``after``), so that a gradient that does not read ``y`` (a loss linear
        in it) cannot drop the forward's callback and its fprop records as dead code."""

        def host(xs, s, sts, _):
            s, out, new, recs = int(s), [], [], []
            for (role, g), a, st in zip(keys, xs, sts):
                a = np.ascontiguousarray(a, _F32)
                if st is None:
                    q, rec = module_operand(
                        a, self.recipe, role, g, self.name, s, self.backend, stats=self.log is not None
                    )
                    recs += self.records(s, role, (g,), (a,), rec)
                else:  # one cast serves both GEMMs of the role (fpsim.train.gemm.delayed_cast)
                    state = DelayedState(np.array(st.history, _F32), float(_F32(st.scale)))
                    pol, want = self.policy[role], self.log is not None
                    q, nst, rec = delayed_cast(a, pol, state, stats=want, backend=self.backend)
                    new.append(RoleState(nst.history, _F32(nst.scale)))
                    recs += self.records(s, role, ROLE_GEMMS[role], (a, a.T), rec)
                out.append(q)
            if self.log is None:
                return tuple(out), tuple(new), ()
            self.log.add(recs)
            return tuple(out), tuple(new), (_F32(0),)

        f32 = lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.float32)  # noqa: E731
        new = tuple(RoleState(f32(st.history), f32(st.scale)) for st in states if st is not None)
        token = () if self.log is None else (jax.ShapeDtypeStruct((), jnp.float32),)
        out = (tuple(f32(a) for a in arrays), new, token)

        def call(arrays, step, states, after):
            return jax.pure_callback(host, out, arrays, step, states, after, vmap_method=self.vmap)

        if self.log is not None:  # refuse jax.vmap while tracing, named (record's keys have no batch axis)
            call = custom_vmap(call)
            call.def_vmap(self._refuse_vmap)
        return call(tuple(arrays), step, tuple(states), tuple(after))

    def records(self, step: int, role: str, gemms, arrays, rec: OperandStats | None) -> list[tuple]:
        """With stats, the entries of :meth:`fpsim.train.gemmstat.StatLog.add`: ``rec`` (the
        recipe's) for each GEMM of ``gemms``, and each what-if recipe's statistics of the
        oriented operand ``arrays[i]`` in ``gemms[i]`` (:func:`fpsim.train.gemm.module_operand`,
        as the torch layer computes them); without stats none."""
        if self.log is None:
            return []
        out = [(self.recipe.name, step, g, role, rec) for g in gemms]
        for g, a in zip(gemms, arrays):
            a = np.ascontiguousarray(a)
            for r in self.what_if:
                st = module_operand(a, r, role, g, self.name, step, self.backend, stats=True)[1]
                out.append((r.name, step, g, role, st))
        return out

    def _refuse_vmap(self, axis_size, in_batched, *args):
        raise ValueError(
            f"{self.name}: jax.vmap of a layer made with stats=True is refused: the records are "
            "kept per (step, GEMM, role, recipe), and a batch of per-example statistics has no key "
            "of its own; vmap a layer made without stats, or call it on the whole batch"
        )

    def fwd(self, x2, w, step, state):
        st = DelayedStates() if state is None else state
        (xq, wq), new, token = self.quantized(_OPERANDS[:2], (x2, w), step, (st.input, st.weight))
        new = iter(new)
        new_in = next(new) if st.input is not None else None
        new_w = next(new) if st.weight is not None else None
        keep = (None if new_in is None else xq, None if new_w is None else wq)
        return self.mm(xq, wq), (x2, w, step, state, keep, new_in, new_w, token)

    def bwd(self, res, dy):
        x2, w, step, state, (xq, wq), new_in, new_w, token = res
        g_st = None if state is None else state.grad_output
        want = [(_OPERANDS[2], dy, g_st)]  # the delayed casts of the forward serve the backward
        if wq is None:
            want.append((_OPERANDS[3], w.T, None))
        if g_st is None:
            want.append((_OPERANDS[4], dy.T, None))
        if xq is None:
            want.append((_OPERANDS[5], x2.T, None))
        keys, arrays, sts = zip(*want)
        qs, new, _ = self.quantized(keys, arrays, step, sts, after=token)
        qs = iter(qs)
        gq_d = next(qs)
        wq_d = next(qs) if wq is None else wq.T
        gq_w = next(qs) if g_st is None else gq_d.T
        xq_w = next(qs) if xq is None else xq.T
        d_state = (
            None if state is None else DelayedStates(new_in, new_w, new[0] if g_st is not None else None)
        )
        return self.mm(gq_d, wq_d), self.mm(gq_w, xq_w), None, d_state
