"""Emulated low-precision GEMMs: Transformer Engine's recipes as typed objects, on numpy.

A linear layer runs three GEMMs, as Transformer Engine does: fprop ``y = x W^T`` (operands the
input ``x`` and the weight ``W``), dgrad ``dx = dy W`` (``dy``, the gradient of the output,
and ``W``) and wgrad ``dW = dy^T x`` (``dy`` and ``x``). Each operand is quantized along that
GEMM's contraction axis, from the high-precision tensor each time (never dequantized and
quantized again, TE issue 1490): :func:`quantize_operand` takes the operand oriented with its
contraction axis last (``x`` for fprop, ``x^T`` for wgrad, ``W^T`` for dgrad, ...), so that a
1x32 block of ``x^T`` is a block of 32 tokens of one feature. The GEMM itself is an FP32
matmul of the dequantized operands, or with ``GemmRecipe(accumulate=...)`` :func:`gemm`, an
emulated accumulator (:data:`ACCUMULATORS`).

Every quantized operand is ``fpsim.quantize`` of that oriented tensor under the operand's
format (the same code: :func:`fpsim.emulate.blocks.encode_array`, :mod:`fpsim.emulate.element`),
and with delayed scaling :class:`fpsim.DelayedScaling`'s cast (the element value times the
float32 decode scale) with its state stepped once per tensor and step.

The presets (:data:`GEMM_RECIPES`, read from TE's ``transformer_engine/common/recipe/__init__.py``
and ``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py``):

- ``bf16``: operands rounded to bfloat16 (nearest-even).
- ``fp8-current``: Float8CurrentScaling, HYBRID: E4M3 input and weight, E5M2 gradient, one
  scale per tensor from its own amax (``e4m3_tensor``, ``e5m2_tensor``).
- ``fp8-delayed``: DelayedScaling, HYBRID, history 1024, ``max``, margin 0
  (:func:`fp8_delayed` for others): the scale of a step from the amax history before it, the
  history updated after.
- ``fp8-block``: Float8BlockScaling (DeepSeek-V3): E4M3 everywhere (TE's default format),
  1x128 blocks for input and gradient, 128x128 tiles for the weight, power-of-two scales.
- ``mxfp8``: MXFP8BlockScaling: E4M3 everywhere, 1x32 blocks, E8M0 scales by TE's rule
  (``ScaleRule.MX_RCEIL``).
- ``nvfp4``: NVFP4BlockScaling: E2M1 with E4M3 scales per 1x16 block and an FP32 tensor scale;
  16x16 blocks for the weight; stochastic rounding of the gradient (fpsim's random words,
  :func:`operand_seed`, not TE's Philox stream); the 16-point random Hadamard transform (TE's
  sign vector) of the wgrad operands (:func:`hadamard16`), with the tensor scale from the
  transformed tensor's amax.

Ragged blocks follow the format's ``pad`` (the presets pad with zeros, as TE's reference
quantizers do); a format with ``pad=False`` refuses such shapes, naming the operand.

Next to torchao's emulated training (tested against torchao 0.18 on one ``nn.Linear`` in
``tests/train/test_vs_torchao.py``; ``benchmarks/vs_torchao_training.py`` trains the bundled
models both ways):

- ``fp8-current`` and ``Float8Linear`` with ``Float8LinearConfig(emulate=True)`` (tensorwise,
  E4M3 input and weight, E5M2 gradient) give every operand the same codes under the same scale
  ``f32(max / amax)``; fpsim dequantizes as TE does, times ``f32(1 / scale)``, torchao divides
  by the scale, so operands (and y, dx, dW) differ in the last bit unless the scale is a power
  of two. With power-of-two scales on both sides (``pow2`` here, ``round_scales_to_power_of_2``
  there) y, dx, dW and the bias gradient are equal bit for bit. torchao clamps the amax at
  1e-12 (``eps=1e-12`` reproduces it), and its power-of-two rounding (``exp2(floor(log2))``)
  takes the power of two above a scale one ulp below it, where TE masks the mantissa.
- ``mxfp8`` and ``MXFP8Linear(kernel_preference=KernelPreference.EMULATED)`` (its default
  ``ScaleCalculationMode.RCEIL``) are equal bit for bit, blocks along each GEMM's contraction
  axis on both sides, except for a block whose ``amax / 448`` lies just above a power of two:
  torchao's float32 ``log2`` rounds to the integer and takes the scale a binade below TE's
  (``ScaleRule.MX_RCEIL``). torchao's ``FLOOR`` mode is ``ScaleRule.MX_FLOOR``. torchao's MX
  cast refuses a contraction length 32 does not divide; the presets pad.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from .._compiled import Backend, fallback, frozen, load_operand
from ..accumulate import AccumulatorSpec, matmul_spec
from ..emulate import blocks, element, fused
from ..emulate.delayed import DelayedScaling, DelayedState
from ..emulate.random import random_bits_at
from ..formats import FORMATS, RECIPES, BlockFormat, Codebook, Format, RoundMode, ScaleRule
from ..replay.storage import master_seed
from .opstats import OperandStats, fused_stats, max_block_dynamic_range, operand_stats

__all__ = [
    "ACCUMULATORS",
    "GEMM_RECIPES",
    "ROLES",
    "ROLE_GEMMS",
    "Gemm",
    "GemmRecipe",
    "OperandRecipe",
    "OperandStats",
    "delayed_cast",
    "fp8_delayed",
    "gemm",
    "hadamard16",
    "max_block_dynamic_range",
    "module_operand",
    "operand_seed",
    "quantize_operand",
    "resolve_recipe",
]

_F32 = np.float32

ROLES = ("input", "weight", "grad_output")
"""The operand roles, named as fpsim's traces name GEMM operands."""


class Gemm(enum.Enum):
    """The three GEMMs of a linear layer and their operands (first, second), each oriented
    with the contraction axis last: ``out = first @ second^T``."""

    FPROP = "fprop"  # y = x W^T: (x, W), contraction over in_features
    DGRAD = "dgrad"  # dx = dy W: (dy, W^T), contraction over out_features
    WGRAD = "wgrad"  # dW = dy^T x: (dy^T, x^T), contraction over the tokens


ROLE_GEMMS = {
    "input": (Gemm.FPROP, Gemm.WGRAD),
    "weight": (Gemm.FPROP, Gemm.DGRAD),
    "grad_output": (Gemm.DGRAD, Gemm.WGRAD),
}
"""The GEMMs each role enters; the first sees it in its own orientation, the second transposed
(a delayed cast, or a cast that commutes with transposition, serves both)."""


_OperandFormat = Format | BlockFormat | DelayedScaling


@dataclass(frozen=True)
class OperandRecipe:
    """How one operand role is quantized in each GEMM it enters.

    Args:
        format: an element format (each element rounded: ``bfloat16``), a block format
            (blocks along the contraction axis, or 2-D tiles) or a :class:`fpsim.DelayedScaling`
            (per-tensor delayed scaling; the cast is made once per step and serves both GEMMs,
            as TE's per-tensor scale does).
        stochastic: round the elements stochastically (words from :func:`operand_seed`).
        hadamard: apply :func:`hadamard16` along the contraction axis before the wgrad cast
            (NVFP4's random Hadamard transform; input and gradient only).

    Raises:
        TypeError: a format of another kind.
        ValueError: a block format over the flattened tensor or over more than two axes,
            stochastic rounding with delayed scaling (not emulated).
    """

    format: _OperandFormat
    stochastic: bool = False
    hadamard: bool = False

    def __post_init__(self) -> None:
        f = self.format
        if not isinstance(f, (Format, BlockFormat, DelayedScaling)):
            raise TypeError(
                "OperandRecipe.format must be a Format, BlockFormat or DelayedScaling, "
                f"got {type(f).__name__} {f!r}"
            )
        if isinstance(f, BlockFormat) and (f.flatten or (f.block is not None and len(f.block) > 2)):
            raise ValueError(
                f"{f.name}: a GEMM operand takes blocks along its contraction axis or 2-D tiles, "
                "not blocks of the flattened tensor or over more than two axes"
            )
        for name in ("stochastic", "hadamard"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"OperandRecipe.{name} must be a bool, got {getattr(self, name)!r}")
        if self.stochastic and isinstance(f, DelayedScaling):
            raise ValueError("stochastic rounding with delayed scaling is not emulated")

    @property
    def transposes(self) -> bool:
        """Whether the operand cast in one orientation, transposed, is its cast in the other,
        bit for bit: nothing positional enters (no stochastic words, no Hadamard transform) and
        its blocks transpose with it (an element format, one scale per tensor, square 2-D tiles
        with padding); each element's value depends on its own and its block's (and tensor's)
        amax only (tests/train/test_fused_operand.py checks it on the numpy tier)."""
        f = self.format
        if self.stochastic or self.hadamard or isinstance(f, DelayedScaling):
            return False
        if isinstance(f, BlockFormat):
            square = f.block is not None and len(f.block) == 2 and f.block[0] == f.block[1] and f.pad
            return f.block is None or square
        return True

    @property
    def name(self) -> str:
        f = self.format
        if isinstance(f, DelayedScaling):
            return (
                f"{f._fmt.name} delayed (history {f.history_len}, {f.amax_compute_algo}, margin {f.margin})"
            )
        extra = (" stochastic" if self.stochastic else "") + (" +RHT(wgrad)" if self.hadamard else "")
        return f"{f.name}{extra}"


@dataclass(frozen=True)
class GemmRecipe:
    """A recipe: how the input, the weight and the output gradient are quantized.

    Args:
        name: a name for tables and plots.
        input, weight, grad_output: each role's :class:`OperandRecipe`.
        seed: the seed of stochastic rounding (:func:`operand_seed`).
        accumulate: the GEMMs' accumulation: None, FP32 (``torch.matmul`` of the dequantized
            operands), or a :class:`fpsim.accumulate.AccumulatorSpec` (``fpsim.matmul``'s
            emulated accumulator, e.g. :data:`ACCUMULATORS` ``"hopper-fp8"``), deterministic
            roundings only.

    Raises:
        TypeError: operands that are not OperandRecipes, a seed that is not an int, an
            accumulator that is not an AccumulatorSpec.
        ValueError: a Hadamard transform on the weight (TE applies it to the wgrad operands),
            an accumulator with stochastic rounding (not emulated here).
    """

    name: str
    input: OperandRecipe
    weight: OperandRecipe
    grad_output: OperandRecipe
    seed: int = 0
    accumulate: AccumulatorSpec | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"GemmRecipe.name must be a non-empty string, got {self.name!r}")
        for role in ROLES:
            if not isinstance(getattr(self, role), OperandRecipe):
                got = type(getattr(self, role)).__name__
                raise TypeError(f"GemmRecipe {self.name!r}: {role} must be an OperandRecipe, got {got}")
        if self.weight.hadamard:
            raise ValueError(
                f"GemmRecipe {self.name!r}: the Hadamard transform applies to the wgrad operands "
                "(input, grad_output), not to the weight"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"GemmRecipe {self.name!r}: seed must be an int, got {self.seed!r}")
        acc = self.accumulate
        if acc is not None:
            if not isinstance(acc, AccumulatorSpec):
                raise TypeError(
                    f"GemmRecipe {self.name!r}: accumulate must be None or an AccumulatorSpec, "
                    f"got {type(acc).__name__}"
                )
            modes = [acc.rounding, acc.promote_rounding, *(r.mode for r in (*acc.inputs, acc.product) if r)]
            if RoundMode.STOCHASTIC in modes:
                raise ValueError(
                    f"GemmRecipe {self.name!r}: stochastic rounding in the accumulator is not emulated "
                    "in training (every GEMM would draw the same words)"
                )

    def operand(self, role: str) -> OperandRecipe:
        """The recipe of ``role`` (one of :data:`ROLES`)."""
        return getattr(self, role)


ACCUMULATORS: Mapping[str, AccumulatorSpec] = MappingProxyType(
    {
        "hopper-fp8": AccumulatorSpec.build(accumulator=14),
        "hopper-fp8-promoted": AccumulatorSpec.build(accumulator=14, promote_every=128),
    }
)
"""Accumulators for ``GemmRecipe(accumulate=...)``: Hopper's FP8 tensor-core MMA keeping about 14
bits of the aligned sum (DeepSeek-V3's measurement, as ``fpsim accumulate --deepseek`` models
it), without and with promotion to FP32 every 128 products (DeepGEMM)."""


def gemm(a: np.ndarray, b: np.ndarray, spec: AccumulatorSpec | None) -> np.ndarray:
    """``a @ b^T`` of two dequantized operands (float32, contraction axis last) accumulated as
    ``spec`` says (``fpsim.matmul``'s emulated accumulator); None is left to the caller (an FP32
    matmul of its framework)."""
    if spec is None:
        raise ValueError("gemm: an FP32 GEMM runs in the framework (torch.matmul)")
    return np.ascontiguousarray(matmul_spec(spec, a, b.T), _F32)


def fp8_delayed(history_len: int = 1024, amax_compute_algo: str = "max", margin: int = 0) -> GemmRecipe:
    """TE's DelayedScaling with HYBRID formats and these settings (TE's defaults)."""
    args = (history_len, amax_compute_algo, margin)
    name = (
        "fp8-delayed"
        if args == (1024, "max", 0)
        else f"fp8-delayed-h{history_len}-{amax_compute_algo}-m{margin}"
    )
    e4m3, e5m2 = (OperandRecipe(DelayedScaling(f, *args)) for f in ("float8_e4m3fn", "float8_e5m2"))
    return GemmRecipe(name, e4m3, e4m3, e5m2)


def _presets() -> dict[str, GemmRecipe]:
    e4m3, e8m0 = FORMATS["float8_e4m3fn"], FORMATS["float8_e8m0fnu"]
    mx = OperandRecipe(BlockFormat("mxfp8_e4m3_rceil", e4m3, (32,), ScaleRule.MX_RCEIL, e8m0))
    nv = RECIPES["nvfp4"]
    nv_tile = BlockFormat("nvfp4_tile16", nv.element, (16, 16), ScaleRule.NVFP4, nv.scale_format)
    bf16 = OperandRecipe(FORMATS["bfloat16"])
    block = OperandRecipe(RECIPES["e4m3_block128"])
    out = [
        GemmRecipe("bf16", bf16, bf16, bf16),
        GemmRecipe(
            "fp8-current",
            OperandRecipe(RECIPES["e4m3_tensor"]),
            OperandRecipe(RECIPES["e4m3_tensor"]),
            OperandRecipe(RECIPES["e5m2_tensor"]),
        ),
        fp8_delayed(),
        GemmRecipe("fp8-block", block, OperandRecipe(RECIPES["e4m3_tile128"]), block),
        GemmRecipe("mxfp8", mx, mx, mx),
        GemmRecipe(
            "nvfp4",
            OperandRecipe(nv, hadamard=True),
            OperandRecipe(nv_tile),
            OperandRecipe(nv, stochastic=True, hadamard=True),
        ),
    ]
    return {r.name: r for r in out}


GEMM_RECIPES: Mapping[str, GemmRecipe] = MappingProxyType(_presets())
"""The preset recipes by name (read-only; module doc)."""


def resolve_recipe(recipe: GemmRecipe | str) -> GemmRecipe:
    """A :class:`GemmRecipe` from itself or a preset name.

    Raises:
        ValueError: an unknown name (the message lists the presets).
        TypeError: anything else.
    """
    if isinstance(recipe, GemmRecipe):
        return recipe
    if isinstance(recipe, str):
        if recipe not in GEMM_RECIPES:
            raise ValueError(f"unknown GEMM recipe {recipe!r}; presets: {', '.join(GEMM_RECIPES)}")
        return GEMM_RECIPES[recipe]
    raise TypeError(f"recipe must be a preset name or a GemmRecipe, got {type(recipe).__name__}")


def operand_seed(seed: int, module: str, step: int, gemm: Gemm, role: str) -> int:
    """The seed of the stochastic rounding of ``role`` in ``gemm`` of module ``module`` at
    ``step``: the operand's words are ``random_bits_at(seed, 0, n)`` in its oriented shape."""
    return master_seed(seed, step, f"{module}:{gemm.value}:{role}")


_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float64)
"""TE's hard-coded signs of the wgrad Hadamard transform (reference_nvfp4.get_wgrad_sign_vector)."""


def hadamard16(a: np.ndarray, backend: Backend = Backend.NUMPY) -> np.ndarray:
    """TE's random Hadamard transform along the last axis, in chunks of 16: each chunk
    ``v -> v @ (diag(s) H16) / 4`` with ``H16`` Sylvester's Hadamard matrix and ``s`` TE's sign
    vector (orthogonal, so the wgrad GEMM is unchanged in exact arithmetic).

    Computed as a float64 butterfly in a fixed order and rounded once to float32: the same bits
    on every machine (exact, hence correctly rounded, whenever the float64 sums are; TE's kernels
    accumulate in FP32 on tensor cores, so their last bit can differ).

    ``backend``: :attr:`Backend.COMPILED` runs :func:`fpsim._compiled.operand.hadamard16` on a
    float32 ``a`` (the same float64 operations in the same order, tested to give the same bits;
    another dtype runs on numpy, said once with a :class:`fpsim.FallbackWarning`).

    Raises:
        ValueError: a last axis that 16 does not divide (TE refuses it too).
    """
    n = a.shape[-1]
    if n % 16:
        raise ValueError(f"the Hadamard transform needs a contraction length divisible by 16, got {n}")
    rows = a.size // 16
    if backend is Backend.COMPILED:
        if a.dtype == _F32:
            out = np.empty(a.shape, _F32)
            load_operand().hadamard16(frozen(a), _SIGNS, out.reshape(-1))
            return out
        fallback(f"the Hadamard transform of {a.dtype} arrays")
    # the 16 entries of each chunk down the first axis (v[j] = s_j * entry j of every chunk,
    # exact), so that each butterfly stage adds and subtracts long contiguous rows
    v, w = np.empty((16, rows)), np.empty((16, rows))
    with np.errstate(invalid="ignore"):  # signaling NaNs in, inf - inf: NaN, as IEEE says
        np.multiply(np.reshape(a, (rows, 16)).T, _SIGNS[:, None], out=v)
        h = 1
        while h < 16:  # butterfly: entries j and j + h of each 2h-group, ping-pong between v and w
            src, dst = v.reshape(16 // (2 * h), 2, h * rows), w.reshape(16 // (2 * h), 2, h * rows)
            np.add(src[:, 0], src[:, 1], out=dst[:, 0])
            np.subtract(src[:, 0], src[:, 1], out=dst[:, 1])
            v, w = w, v
            h *= 2
    out = np.empty((rows, 16), _F32)  # the exact float64 v / 4, rounded once to float32
    np.multiply(v.T, 0.25, out=out, casting="same_kind")
    return out.reshape(a.shape)


def quantize_operand(
    a: np.ndarray,
    op: OperandRecipe,
    backend: Backend,
    *,
    random_bits: np.ndarray | None = None,
    stats: bool = False,
) -> tuple[np.ndarray, OperandStats | None]:
    """The operand ``a`` (float32, 2-D, contraction axis last) as the GEMM reads it: ``fpsim.quantize``
    under ``op.format`` (a Format or BlockFormat), and its statistics when asked.

    ``random_bits``: the uint32 words of a stochastic rounding (``a``'s shape), else None.
    Delayed scaling is :func:`delayed_cast` (it carries a state). On :attr:`Backend.COMPILED`
    the values come from :func:`fpsim.emulate.fused.quantize_values` (one compiled pass, the
    same bits; a format it does not cover is said so once, with a :class:`fpsim.FallbackWarning`,
    and runs unfused), with ``stats`` from :func:`fpsim.emulate.fused.quantize_tally` and
    :func:`fpsim.train.opstats.fused_stats` (the numpy tier's statistics, field by field).
    """
    fmt = op.format
    mode = RoundMode.STOCHASTIC if random_bits is not None else RoundMode.NEAREST_EVEN
    if backend is Backend.COMPILED and fused.covers(fmt):
        if not stats:
            return fused.quantize_values(a, fmt, mode, rand=random_bits), None
        if a.size:
            q, tally = fused.quantize_tally(a, fmt, mode, rand=random_bits)
            return q, fused_stats(tally)
    if isinstance(fmt, BlockFormat):
        enc = blocks.encode_array(a, fmt, mode, backend, rand=random_bits)
        q = np.ascontiguousarray(blocks.decode_array(enc, fmt, backend))
        if not stats:
            return q, None
        el = fmt.element
        ev = el.table[enc.codes] if isinstance(el, Codebook) else element.decode_array(enc.codes, el)
        s = element.decode_array(np.asarray(enc.scales), fmt.scale_format).astype(np.float64)
        if enc.tensor_scale is not None:
            s = s * enc.tensor_scale
        return q, operand_stats(a, q, np.abs(ev) == fmt.elem_max, s, block_format=fmt)
    codes = element.encode_array(a, fmt, mode, rand=random_bits, backend=backend)
    q = np.ascontiguousarray(element.decode_array(codes, fmt))
    if not stats:
        return q, None
    with np.errstate(invalid="ignore"):
        beyond = np.abs(a) > fmt.max
    return q, operand_stats(a, q, beyond, None, saturated=beyond)


def delayed_cast(
    a: np.ndarray,
    policy: DelayedScaling,
    state: DelayedState,
    *,
    stats: bool = False,
    backend: Backend = Backend.NUMPY,
) -> tuple[np.ndarray, DelayedState, OperandStats | None]:
    """One step of delayed scaling of tensor ``a``: :meth:`fpsim.DelayedScaling.step` (the cast
    with the state's scale, on ``backend``, then the history and scale update), and the values
    the GEMMs read, ``f32(element value * f32(1 / scale))``."""
    enc, new = policy.step(state, a, backend=backend)
    ev = element.decode_array(enc.codes, policy._fmt)
    s = enc.scales.view(_F32)[0]
    q = np.ascontiguousarray((ev * s).astype(_F32))
    if not stats:
        return q, new, None
    scale_inv = np.array([s], np.float64)
    if backend is Backend.COMPILED and a.size and a.dtype == _F32:
        top = fused.at_max_codes(policy._fmt, policy._fmt.max)
        tally = fused.tally(a, q.reshape(a.shape), codes=enc.codes, at_max=top, scale_inv=scale_inv)
        return q, new, fused_stats(tally)
    return q, new, operand_stats(a, q, np.abs(ev) == policy._fmt.max, scale_inv)


def operand_words(seed: int, module: str, step: int, gemm: Gemm, role: str, shape: tuple) -> np.ndarray:
    """The random words of a stochastically rounded operand (:func:`operand_seed`)."""
    return random_bits_at(operand_seed(seed, module, step, gemm, role), 0, math.prod(shape)).reshape(shape)


def module_operand(
    a: np.ndarray,
    recipe: GemmRecipe,
    role: str,
    g: Gemm,
    module: str,
    step: int,
    backend: Backend,
    *,
    stats: bool = False,
) -> tuple[np.ndarray, OperandStats | None]:
    """Operand ``role`` of GEMM ``g`` of layer ``module`` at ``step`` (``a`` oriented, contraction
    axis last) as that GEMM reads it under a stateless ``recipe``: the Hadamard transform of the
    wgrad operands where the recipe has one, the operand's stochastic words (:func:`operand_words`),
    then :func:`quantize_operand`. The one function the torch layer and the JAX ``dot`` share;
    a shape the format or the transform cannot take is a ValueError naming the layer, the
    GEMM and the operand."""
    op, shape = recipe.operand(role), a.shape
    if op.hadamard and g is Gemm.WGRAD:
        try:
            a = hadamard16(a, backend)
        except ValueError as e:
            raise ValueError(f"{module}: {role} in {g.value} {shape}: {e}") from None
    try:
        fused_seed = op.stochastic and backend is Backend.COMPILED and (a.size or not stats)
        if fused_seed and fused.covers(op.format):
            # the operand's words drawn inside the compiled loop (operand_words, not materialized)
            seed = operand_seed(recipe.seed, module, step, g, role)
            if not stats:
                return fused.quantize_values(a, op.format, RoundMode.STOCHASTIC, seed=seed), None
            q, tally = fused.quantize_tally(a, op.format, RoundMode.STOCHASTIC, seed=seed)
            return q, fused_stats(tally)
        words = operand_words(recipe.seed, module, step, g, role, a.shape) if op.stochastic else None
        return quantize_operand(a, op, backend, random_bits=words, stats=stats)
    except ValueError as e:
        raise ValueError(f"{module}: {role} in {g.value} {shape} under {op.name}: {e}") from None
