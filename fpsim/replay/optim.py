"""Optimizer update math in float32 with a fixed order of operations.

Each function takes float32 numpy arrays (parameter, gradient, states) and returns new ones;
every elementwise operation rounds to float32 (IEEE 754 nearest-even) in the order written in
the docstrings, and ``fma(a, b, c)`` (one rounding of ``a * b + c``, emulated exactly by
:func:`fma32`) appears exactly where PyTorch's vectorized CPU kernels use ``vec::fmadd``:
``lerp`` (Adam's first moment), ``addcmul`` (the second) and ``add``/``add_`` with ``alpha``
(L2 decay, SGD's update). PyTorch's CPU ``sqrt`` for float32 is not correctly rounded (1 ulp
off for ~17% of inputs on the machine these were measured on, depending on the CPU's SIMD
width); fpsim's default is (:attr:`Sqrt.IEEE`, IEEE 754 5.4.1), so Adam's parameters can
differ from torch's by a few ulps; ``Adam(sqrt="torch")`` takes torch's own square root
(:attr:`Sqrt.TORCH`) and then gives torch's parameters on the machine at hand.
The formulas follow PyTorch's single-tensor implementations (torch/optim/adam.py
``_single_tensor_adam``, with ``decoupled_weight_decay`` for AdamW; torch/optim/sgd.py);
scalars such as the bias corrections are computed in float64 as Python does and rounded to
float32 where they meet a tensor. The tests measure the distance to torch in float32 ulps. A
Triton kernel that mirrors a step must use this exact order and these fmas (fpsim.kernels).

Where a step runs is a :class:`fpsim.Backend` (``backend=`` of :meth:`Optimizer.step`):
``NUMPY`` is the code below, ``COMPILED`` the loops of :mod:`fpsim._compiled.loops` (same bits;
they cover :attr:`Sqrt.IEEE`, SGD without nesterov and float32 C-contiguous arrays of one
shape: any other case runs on numpy after a :class:`fpsim.FallbackWarning` naming it, once per
case, :func:`fpsim._compiled.fallback`).

New optimizers (Lion, Adafactor) add a :class:`Optimizer` subclass with its own ``states``
and ``step``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from typing import Any, ClassVar, NamedTuple

import numpy as np

from .. import _compiled
from .._compiled import Backend
from ..formats.codes import Decay

__all__ = ["Optimizer", "Adam", "AdamW", "SGD", "Sqrt", "get_optimizer", "fma32"]

_F32 = np.float32


class Sqrt(enum.Enum):
    """The float32 square root of Adam's denominator.

    ``IEEE``: ``np.sqrt``, correctly rounded (IEEE 754 squareRoot, section 5.4.1), the same on
    every machine; the compiled loops and the Triton kernels take this one. ``TORCH``: torch's
    own CPU float32 ``sqrt`` (torch imported when a step runs), which is not correctly rounded
    and depends on the SIMD kernel torch picks on the CPU at hand: with it the parameters equal
    those of ``torch.optim`` run on the same machine.
    """

    IEEE = "ieee"
    TORCH = "torch"

    @classmethod
    def resolve(cls, sqrt: Sqrt | str) -> Sqrt:
        """A :class:`Sqrt` from a member or its name (``"ieee"``, ``"torch"``).

        Raises:
            ValueError: an unknown name (the message lists the allowed ones).
        """
        if isinstance(sqrt, cls):
            return sqrt
        try:
            return cls(sqrt)
        except ValueError:
            raise ValueError(f"sqrt must be one of ieee, torch; got {sqrt!r}") from None

    def function(self) -> Callable[[np.ndarray], np.ndarray]:
        """The square root on float32 arrays."""
        return np.sqrt if self is Sqrt.IEEE else _torch_sqrt


def _torch_sqrt(x: np.ndarray) -> np.ndarray:
    """torch's CPU float32 ``sqrt`` of ``x`` (:attr:`Sqrt.TORCH`)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(x, _F32)).sqrt().numpy()


def fma32(a, b, c) -> np.ndarray:
    """``float32(a * b + c)`` with one rounding (IEEE 754 fusedMultiplyAdd, section 5.4.1).

    The product of two float32 values is exact in float64, so ``r = fl64(a*b + c)`` is the
    exact value rounded once to 53 bits. Rounding ``r`` to float32 gives the correctly rounded
    result unless ``r`` is exactly a float32 midpoint (no midpoint can lie strictly between the
    exact value and its nearest float64), or the result is float32-subnormal; those few
    elements are redone with round-to-odd (TwoSum gives the exact error; an inexact even
    result steps one ulp toward it), after which the float32 rounding is exact (53 >= 24 + 2;
    Boldo & Melquiond, "Emulation of FMA and correctly rounded sums", 2008). Tested against
    exact rationals.
    """
    a, b, c = np.broadcast_arrays(np.asarray(a, _F32), np.asarray(b, _F32), np.asarray(c, _F32))
    return _chunked(_fma, a, b, c)[0]


def _fma(a, b, c) -> tuple[np.ndarray]:
    """:func:`fma32` of float32 arrays (or scalars) that broadcast together, in one piece."""
    p = np.multiply(a, b, dtype=np.float64)
    c64 = np.asarray(c, np.float64)
    r = p + c64
    o = r.astype(_F32)
    risky = ((r.view(np.uint64) & np.uint64(0x1FFFFFFF)) == np.uint64(0x10000000)) | (np.abs(r) < 2.0**-125)
    if risky.any():
        p, c64 = np.broadcast_arrays(p, c64)
        o[risky] = _fma32_odd(p[risky], c64[risky])
    return (o,)


def _compiled_step(
    loop: Callable[..., Any], scalars: tuple, ins: tuple, outs: tuple | None, what: str
) -> tuple | None:
    """The step by ``loop``, a compiled loop of :mod:`fpsim._compiled.loops` (same bits; the
    caller chose :attr:`Backend.COMPILED`), or None to use numpy after saying so
    (:func:`fpsim._compiled.fallback`, the case named after ``what``): an array is not a
    float32 C-contiguous array of ``ins[0]``'s shape, or an output overlaps an input."""
    shape = np.shape(ins[0])
    if outs is None and all(_flat32(a, shape) for a in ins):  # the usual case, checked at once
        outs = tuple(np.empty(shape, _F32) for _ in ins[1:])
        loop(*(a.reshape(-1) for a in ins), *(a.reshape(-1) for a in outs), *scalars)
        return outs
    fresh = outs is None and all(np.shape(a) == shape for a in ins)
    if fresh:  # p and the states, new: flat float32, they overlap nothing (only ins checked)
        outs = tuple(np.empty(shape, _F32) for _ in ins[1:])
    why = _not_flat(ins, () if fresh else outs, shape, overlap=not fresh)
    if why is not None:
        _compiled.fallback(f"{what} on {why}")
        return None
    loop(*(a.reshape(-1) for a in ins), *(a.reshape(-1) for a in outs), *scalars)
    return tuple(outs)


def _flat32(a: Any, shape: tuple) -> bool:
    """``a`` is a float32 C-contiguous numpy array of ``shape``."""
    return type(a) is np.ndarray and a.dtype == _F32 and a.shape == shape and a.flags.c_contiguous


def _not_flat(ins: tuple, outs: tuple | None, shape: tuple, *, overlap: bool = True) -> str | None:
    """Why the compiled loops cannot take these arrays (None: they can); ``overlap``: check
    that no output shares memory with an input."""
    if outs is None or any(np.shape(a) != shape for a in (*ins, *outs)):
        return "arrays of different shapes (broadcast)"
    for a in (*ins, *outs):
        if not isinstance(a, np.ndarray) or a.dtype != _F32:
            return f"{type(a).__name__ if not isinstance(a, np.ndarray) else a.dtype} arrays (not float32)"
        if not a.flags.c_contiguous:
            return "arrays that are not C-contiguous"
    if overlap and any(np.shares_memory(o, a) for o in outs for a in ins):
        return "outputs that overlap the inputs"
    return None


_CHUNK = 1 << 15  # elements per pass: float64 temporaries stay in cache, none is page-faulted


def _chunked(fn, *arrays, out: Sequence[np.ndarray] | None = None) -> tuple[np.ndarray, ...]:
    """``fn`` (elementwise, float32 arrays in and out) over cache-sized chunks of ``arrays``.

    The same values as ``fn(*arrays)``; only the temporaries are small. Full-size temporaries
    cost more than the arithmetic here: each is fresh memory from the OS, page-faulted in.
    ``out``: float32 arrays of the inputs' shape to write the results into.
    """
    arrays = np.broadcast_arrays(*(np.asarray(a, _F32) for a in arrays))
    shape = arrays[0].shape
    flat = [a.reshape(-1) for a in arrays]
    n = flat[0].size
    outs = None if out is None else [_flat_out(o, shape) for o in out]
    for i in range(0, max(n, 1), _CHUNK):
        res = fn(*(a[i : i + _CHUNK] for a in flat))
        if outs is None:
            outs = [np.empty(n, _F32) for _ in res]
        for o, r in zip(outs, res):
            o[i : i + _CHUNK] = r
    assert outs is not None
    return tuple(o.reshape(shape) for o in outs)


def _flat_out(o: np.ndarray, shape: tuple) -> np.ndarray:
    if not isinstance(o, np.ndarray) or o.dtype != _F32 or o.shape != shape:
        got = f"{o.dtype} {o.shape}" if isinstance(o, np.ndarray) else type(o).__name__
        raise ValueError(f"out: need float32 arrays of shape {shape}, got {got}")
    flat = o.reshape(-1)
    if not np.shares_memory(flat, o):
        raise ValueError("out: arrays must be contiguous")
    return flat


def _fma32_odd(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c
        bb = s - p
        err = (p - (s - bb)) + (c - bb)
        bits = s.view(np.int64)
        fix = (err != 0) & np.isfinite(err) & ((bits & 1) == 0)
        toward = np.where((err > 0) == (s > 0), 1, -1)
        return np.where(fix, (bits + toward).view(np.float64), s).astype(_F32)


@dataclass(frozen=True)
class Optimizer:
    """Base of the optimizer descriptions: hyper-parameters only, no state."""

    weight_decay: float = 0.0

    name: ClassVar[str] = "optimizer"
    states: ClassVar[tuple[str, ...]] = ()
    elementwise: ClassVar[bool] = False
    """Whether each output element depends only on the same element of the inputs (then the
    replay may update pieces of a tensor in parallel; False for factored optimizers)."""
    other_names: ClassVar[dict[str, str]] = {}
    """Names other libraries record these states under (optax's), mapped to :attr:`states`."""

    def needs_states(self, t: int) -> bool:
        """Whether update ``t`` reads states a previous update wrote (False at the first update:
        torch creates them then, at zero)."""
        return t > 1

    def step(
        self,
        p: np.ndarray,
        g: np.ndarray,
        states: dict[str, np.ndarray],
        lr: float,
        t: int,
        *,
        out: tuple[np.ndarray, dict[str, np.ndarray]] | None = None,
        backend: Backend | str = "auto",
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Return the new parameter and states for update number ``t`` (1-based).

        ``out``: ``(param, {state: array})`` float32 arrays of ``p``'s shape to write the
        results into (and return); elementwise optimizers take it. ``backend``: where the
        step runs (:meth:`fpsim.Backend.resolve`; the same bits on each).
        """
        raise NotImplementedError

    def with_sqrt(self, sqrt: Sqrt) -> Optimizer:
        """This optimizer with square root ``sqrt`` (itself where it takes none)."""
        return self


@dataclass(frozen=True)
class Adam(Optimizer):
    """Adam (Kingma & Ba), PyTorch semantics: L2 weight decay added to the gradient.

    ``m = fma(f32(1 - b1), g - m, m)`` (torch's lerp for a weight below 0.5);
    ``v = fma(f32(1 - b2) * g, g, v * f32(b2))`` (mul_, then addcmul_);
    ``denom = sqrt(v) / f32(sqrt(1 - b2**t)) + eps``;
    ``p = p + (f32(-lr / (1 - b1**t)) * m) / denom`` (addcdiv_). L2 decay:
    ``g = fma(p, wd, g)``. ``sqrt``: the square root of ``denom``, a :class:`Sqrt` or its name
    (default ``"ieee"``, correctly rounded).
    """

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    sqrt: Sqrt | str = Sqrt.IEEE
    name = "adam"
    states = ("exp_avg", "exp_avg_sq")
    other_names = {"mu": "exp_avg", "nu": "exp_avg_sq"}  # optax's ScaleByAdamState
    elementwise = True
    decoupled = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "sqrt", Sqrt.resolve(self.sqrt))
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else self.betas
        object.__setattr__(self, "betas", betas)
        if not (isinstance(betas, tuple) and len(betas) == 2 and all(_real(b) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"{type(self).__name__}: betas must be two numbers in [0, 1), got {betas!r}")
        if not (_real(self.eps) and self.eps >= 0):
            raise ValueError(f"{type(self).__name__}: eps must be a finite number >= 0, got {self.eps!r}")
        _check_decay(self)

    def step(self, p, g, states, lr, t, *, out=None, backend="auto"):
        outs = None if out is None else (out[0], out[1]["exp_avg"], out[1]["exp_avg_sq"])
        ins = (p, g, states["exp_avg"], states["exp_avg_sq"])
        sc = self.scalars(lr, t)
        done = None
        if Backend.resolve(backend) is Backend.COMPILED:
            if self.sqrt is Sqrt.IEEE:
                done = _compiled_step(_compiled.load().adam, sc, ins, outs, "Adam's step")
            else:
                _compiled.fallback("Adam's step with sqrt='torch' (the loops take the IEEE square root)")
        p, m, v = done or _chunked(partial(_adam_step, sc=sc, sqrt=self.sqrt.function()), *ins, out=outs)
        return p, {"exp_avg": m, "exp_avg_sq": v}

    def with_sqrt(self, sqrt: Sqrt) -> Adam:
        return replace(self, sqrt=sqrt)

    def scalars(self, lr: float, t: int) -> AdamScalars:
        """The step's scalars, computed in float64 as Python does and rounded to float32 once
        (the numpy step, the compiled loop and the Triton kernel all take these). Kept per
        optimizer, Python float ``lr`` and int ``t``, as every tensor of a step takes the same
        (other types are computed each time); with the signs of ``lr`` and ``eps``, which
        equality does not tell (-0.0 gives another ``neg_step`` or ``eps``)."""
        if type(lr) is float and type(t) is int:
            return _adam_scalars(self, lr, t, math.copysign(1.0, lr), math.copysign(1.0, self.eps))
        return self._scalars(lr, t)

    def _scalars(self, lr: float, t: int) -> AdamScalars:
        b1, b2 = self.betas
        mode = int(Decay.of(self.weight_decay, self.decoupled))
        decay = 1 - lr * self.weight_decay if self.decoupled else self.weight_decay
        rest = (decay, 1 - b1, 1 - b2, b2, math.sqrt(1 - b2**t), self.eps, -(lr / (1 - b1**t)))
        with np.errstate(over="ignore"):
            return AdamScalars(mode, *(_F32(x) for x in rest))


@lru_cache(maxsize=64)
def _adam_scalars(opt: Adam, lr: float, t: int, *signs: float) -> AdamScalars:
    """:meth:`Adam.scalars` kept (``signs``: of ``lr`` and ``eps``, part of the key only)."""
    return opt._scalars(lr, t)


class AdamScalars(NamedTuple):
    """Adam's per-step scalars (float32): ``mode`` the :class:`~fpsim.formats.codes.Decay` code
    (an int, as the compiled loop takes it): none, decoupled ``p * decay`` or L2
    ``g = fma(p, decay, g)``; ``bc2 = sqrt(1 - b2**t)``, ``neg_step = -lr / (1 - b1**t)``."""

    mode: int
    decay: np.float32
    omb1: np.float32
    omb2: np.float32
    b2: np.float32
    bc2: np.float32
    eps: np.float32
    neg_step: np.float32


def _adam_step(p, g, m, v, sc: AdamScalars, sqrt: Callable[[np.ndarray], np.ndarray]):
    """Adam's update on float32 arrays in the documented order (the numpy path), ``sqrt`` the
    square root of :class:`Sqrt`."""
    if sc.mode == Decay.DECOUPLED:
        p = p * sc.decay
    elif sc.mode == Decay.L2:
        (g,) = _fma(p, sc.decay, g)
    (m,) = _fma(sc.omb1, g - m, m)
    (v,) = _fma(sc.omb2 * g, g, v * sc.b2)
    denom = sqrt(v) / sc.bc2 + sc.eps
    return p + (sc.neg_step * m) / denom, m, v


@dataclass(frozen=True)
class AdamW(Adam):
    """AdamW (Loshchilov & Hutter): decoupled decay ``p = p * f32(1 - lr * wd)`` first."""

    weight_decay: float = 0.01
    name = "adamw"
    decoupled = True


@dataclass(frozen=True)
class SGD(Optimizer):
    """SGD with momentum, PyTorch semantics (dampening 0): ``buf = g`` at the first update,
    then ``buf = buf * f32(mu) + g``; ``p = fma(buf, f32(-lr), p)``, with ``nesterov``
    ``p = fma(fma(buf, f32(mu), g), f32(-lr), p)`` (``grad.add(buf, alpha=momentum)``; numpy
    only). L2 decay: ``g = fma(p, wd, g)``."""

    momentum: float = 0.9
    nesterov: bool = False
    name = "sgd"
    states = ("momentum_buffer",)
    other_names = {"trace": "momentum_buffer"}  # optax's TraceState
    elementwise = True

    def __post_init__(self) -> None:
        if not (_real(self.momentum) and self.momentum >= 0):
            raise ValueError(f"SGD: momentum must be a finite number >= 0, got {self.momentum!r}")
        if not isinstance(self.nesterov, bool) or (self.nesterov and not self.momentum):
            raise ValueError(
                f"SGD: nesterov must be True or False (True needs momentum > 0), got {self.nesterov!r}"
            )
        _check_decay(self)

    def needs_states(self, t: int) -> bool:
        return t > 1 and self.momentum != 0

    def step(self, p, g, states, lr, t, *, out=None, backend="auto"):
        buf = states.get("momentum_buffer")
        first = buf is None or t == 1
        outs = None if out is None else (out[0], out[1]["momentum_buffer"])
        ins = (p, g, g if first else buf)
        sc = (first, bool(self.weight_decay), _F32(self.weight_decay), _F32(self.momentum), _F32(-lr))
        done = None
        if Backend.resolve(backend) is Backend.COMPILED:
            if not self.nesterov:
                done = _compiled_step(_compiled.load().sgd, sc, ins, outs, "SGD's step")
            else:
                _compiled.fallback("SGD's step with nesterov=True")
        p, buf = done or _chunked(partial(_sgd_step, sc=sc, nesterov=self.nesterov), *ins, out=outs)
        return p, {"momentum_buffer": buf}


def _sgd_step(p, g, buf, sc: tuple, nesterov: bool = False):
    """SGD's update on float32 arrays (the numpy path); ``sc`` as the compiled loop takes it."""
    first, l2, wd, mu, neg_lr = sc
    if l2:
        (g,) = _fma(p, wd, g)
    buf = g if first else buf * mu + g
    step = _fma(buf, mu, g)[0] if nesterov else buf
    return _fma(step, neg_lr, p)[0], buf


def _real(x: Any) -> bool:
    """Whether ``x`` is a finite real number (not a bool)."""
    return (
        isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool) and math.isfinite(x)
    )


def _check_decay(opt: Optimizer) -> None:
    if not (_real(opt.weight_decay) and opt.weight_decay >= 0):
        raise ValueError(
            f"{type(opt).__name__}: weight_decay must be a finite number >= 0, got {opt.weight_decay!r}"
        )


def get_optimizer(name: str, **kwargs) -> Optimizer:
    """``"adam"``, ``"adamw"`` or ``"sgd"`` with hyper-parameters; a clear error otherwise."""
    table = {"adam": Adam, "adamw": AdamW, "sgd": SGD}
    if name not in table:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(table)}")
    return table[name](**kwargs)
