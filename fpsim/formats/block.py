"""Scaled and block formats: an element format, a block shape and a scale rule.

A :class:`BlockFormat` describes every scaling scheme fpsim emulates: per-tensor current
scaling, per-row/column scales, 1-D blocks and 2-D tiles with FP32 scales (Transformer
Engine, DeepSeek-V3), MX formats (OCP Microscaling v1.0), NVFP4, block-INT8 and the
bitsandbytes dynamic codebook. The arithmetic lives in :mod:`fpsim.emulate.blocks`; this module is
description only. Presets are reachable by name through :func:`fpsim.get_format`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from . import _codebooks
from .codes import DecodeKind, FactorKind
from .element import FORMATS, Format, IntFormat, check_bool, check_int, check_name

__all__ = ["ScaleRule", "RuleTraits", "Codebook", "BlockFormat", "RECIPES"]


@dataclass(frozen=True)
class RuleTraits:
    """What every tier needs to know about a scale rule besides its arithmetic.

    Args:
        code: the rule's number in the compiled and Triton tiers (the kernel's ``RULE``), fixed
            for good as the numbers of :mod:`fpsim.formats.codes` are.
        amax_ignores_nan: the block amax skips NaN (``fmaxf``) rather than propagating it
            (``torch.amax``); codebook elements skip it whatever the rule
            (:attr:`BlockFormat.amax_ignores_nan`).
        needs_tensor_amax: the scales need the whole tensor's amax besides the block's (a first
            pass over the tensor; the numpy tier encodes such a tensor in one piece).
        factor: how elements are scaled before the cast.
        decode: how stored values are decoded.
        scale_format: the name of the format the block scales are stored in.
    """

    code: int
    amax_ignores_nan: bool
    needs_tensor_amax: bool
    factor: FactorKind
    decode: DecodeKind
    scale_format: str


_E8M0, _F32S = "float8_e8m0fnu", "float32"
_P, _Q, _X2 = FactorKind.PRODUCT, FactorKind.QUOTIENT, FactorKind.POW2


class ScaleRule(enum.Enum):
    """How a block's scale is computed from its absolute maximum ``amax``.

    Attributes:
        TE: Transformer Engine ``compute_scale_from_amax`` (recipe_common.cuh): encode
            multiplier ``scale = f32(elem_max / max(amax, eps))``; amax 0, inf or NaN gives
            1; an infinite scale gives FLT_MAX; ``pow2`` keeps only sign and exponent bits
            (rounds down). Elements ``cast(f32(x * scale))``; stored scale ``f32(1/scale)``.
            NaN elements are ignored by the amax (fmaxf). Float8CurrentScaling (per tensor)
            and Float8BlockScaling (1x128, 128x128).
        ABSMAX: decode scale ``s = f32(max(amax, eps) / elem_max)``, elements
            ``cast(f32(x / s))`` (torchao AdamWFp8, DeepSeek-V3 inference kernels,
            linear INT8). A block whose amax is 0 has scale 0 and zero codes. A NaN in a
            block makes its amax NaN (torch.amax). Codebook elements (bitsandbytes) use
            ``x * f32(1/absmax)`` instead, as bitsandbytes' kernels do (its pure-torch path
            divides in a ragged last block; fpsim multiplies there too).
        MX_FLOOR: OCP MX v1.0 section 6.3: ``2**(floor(log2 amax) - emax_elem)``.
        MX_CEIL: ``2**(ceil(log2 amax) - emax_elem)`` (torchao ScaleCalculationMode.CEIL).
        MX_EVEN: amax rounded half-up to the element's significand width first, then the
            floor rule (torchao ScaleCalculationMode.EVEN).
        MX_RCEIL: ``f32(amax * f32(1/elem_max))`` rounded up to a power of two
            (Transformer Engine and cuBLAS MXFP8; torchao RCEIL). Two corners differ from
            TE: fpsim scales the elements of a block with scale code 0 by 2**127 (the code's
            value) where TE multiplies by 1.0, and gives a block holding inf the NaN scale
            0xFF where TE saturates to 0xFE.
        NVFP4: Transformer Engine NVFP4: FP32 tensor scale ``S_enc = f32(2688 / amax_t)``,
            E4M3 block scale ``e4m3(f32(amax_b * f32(S_enc * f32(1/6))))``, elements
            ``cast(f32(x * f32(1 / f32(s8 * f32(1/S_enc)))))``.
        UE8M0_CEIL: DeepGEMM's UE8M0 scales (deep_gemm/utils/math.py ``per_token_cast_to_fp8``
            with ``use_ue8m0``, ``ceil_to_ue8m0``): ``2**ceil(log2(f32(max(amax, eps) /
            elem_max)))`` (DeepGEMM: eps 1e-4, FP8 E4M3 elements, 1x128 blocks), stored as
            E8M0 with the MX clamps below, elements the exact ``x * 2**-e``. The ceiling is
            exact (subnormal quotients included); DeepGEMM's torch reference takes it of a
            float32 ``log2``, which can round a quotient just above a power of two down to it.
            Unlike MX_RCEIL the quotient is a division (not a product with ``f32(1/elem_max)``)
            and the amax is clamped at ``eps``.

    MX rules: scale exponents are clamped below at -127; a non-finite amax or an exponent
    above 127 gives the NaN scale 0xFF. The amax propagates NaN (torch.amax, microxcaling).

    Each member carries its :class:`RuleTraits` (``rule.traits``, and the properties below):
    the facts every tier reads instead of listing members (README, "Adding a scale rule").
    """

    TE = ("te", RuleTraits(0, True, False, _P, DecodeKind.PRODUCT, _F32S))
    ABSMAX = ("absmax", RuleTraits(1, False, False, _Q, DecodeKind.PRODUCT, _F32S))
    MX_FLOOR = ("mx_floor", RuleTraits(2, False, False, _X2, DecodeKind.POW2, _E8M0))
    MX_CEIL = ("mx_ceil", RuleTraits(3, False, False, _X2, DecodeKind.POW2, _E8M0))
    MX_EVEN = ("mx_even", RuleTraits(4, False, False, _X2, DecodeKind.POW2, _E8M0))
    MX_RCEIL = ("mx_rceil", RuleTraits(5, False, False, _X2, DecodeKind.POW2, _E8M0))
    NVFP4 = ("nvfp4", RuleTraits(6, True, True, _P, DecodeKind.TENSOR, "float8_e4m3fn"))
    UE8M0_CEIL = ("ue8m0_ceil", RuleTraits(8, False, False, _X2, DecodeKind.POW2, _E8M0))

    def __new__(cls, value: str, traits: RuleTraits) -> ScaleRule:
        member = object.__new__(cls)
        member._value_ = value
        member.traits = traits
        return member

    @property
    def is_mx(self) -> bool:
        return self.value.startswith("mx_")

    @property
    def code(self) -> int:
        """The rule's number in the compiled and Triton tiers (:attr:`RuleTraits.code`)."""
        return self.traits.code

    @property
    def amax_ignores_nan(self) -> bool:
        """The block amax skips NaN (:attr:`RuleTraits.amax_ignores_nan`)."""
        return self.traits.amax_ignores_nan

    @property
    def needs_tensor_amax(self) -> bool:
        """The scales need the tensor's amax (:attr:`RuleTraits.needs_tensor_amax`)."""
        return self.traits.needs_tensor_amax

    @property
    def factor(self) -> FactorKind:
        """How elements are scaled before the cast (:class:`~fpsim.formats.codes.FactorKind`)."""
        return self.traits.factor

    @property
    def decode(self) -> DecodeKind:
        """How stored values are decoded (:class:`~fpsim.formats.codes.DecodeKind`)."""
        return self.traits.decode


@dataclass(frozen=True)
class Codebook:
    """A table of up to 256 sorted float32 values in [-1, 1]; a code is an index.

    Args:
        name: e.g. ``"bnb_dynamic8"``.
        values: strictly increasing values, exactly representable in float32.
        lut_bins: 0 encodes to the nearest entry as bitsandbytes' CUDA kernel does
            (csrc/kernels.cu ``kQuantizeBlockwise`` with ``dQuantize<0>``):
            ``v = f32(x * f32(1/absmax))`` with no clamp of the absmax (an absmax of 0 up
            to 2**-128 = 2.94e-39 makes ``1/absmax`` inf, an inf absmax makes it 0), then the
            kernel's binary search (pivot 127, steps 64 down to 1), which ends on an even
            entry ``p`` and compares ``v`` with the float32 midpoints ``f32(f32(c[i] +
            c[i+1]) * 0.5)`` of ``p`` and its neighbours. A ``v`` equal to a midpoint goes
            to the even one of the two entries (up from an odd entry, down from an even one);
            values beyond the ends go to the end entries; NaN (a NaN element, ``0 * inf`` in
            a block of absmax 0, ``inf * 0``) goes to entry 0, so an all-zero block has
            codes 0. Where a midpoint rounded in float32, the value equal to it can go to
            the farther entry (55 values of the signed map, 44 of the unsigned). Tables
            shorter than 256 follow the same parity rule. fpsim's reciprocal is IEEE
            (correctly rounded); bitsandbytes builds its CUDA library with
            ``--use_fast_math`` (approximate reciprocal, subnormals flushed to zero), so a
            GPU may differ for blocks with a subnormal absmax or elements and, rarely, for
            a value next to a midpoint. bitsandbytes' pure-torch path
            (backends/default/ops.py) differs too: absmax clamped at 1e-38, ties to the
            lower entry, NaN to the last. 65536 reproduces bitsandbytes 0.50.2's CPU
            kernel, which snaps ``(v + 1) / 2`` to a grid of 65536 bins before the lookup
            and so misses the nearest entry for about 0.15% of normal data.
    """

    name: str
    values: tuple[float, ...]
    lut_bins: int = 0

    def __post_init__(self) -> None:
        where = f"Codebook {check_name(self.name, 'Codebook')!r}"
        if not isinstance(self.values, (tuple, list)) or not all(
            isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
            for x in self.values
        ):
            raise TypeError(
                f"{where}: values must be a tuple of real numbers, got {type(self.values).__name__}"
            )
        object.__setattr__(self, "values", tuple(float(x) for x in self.values))
        object.__setattr__(self, "lut_bins", check_int(self.lut_bins, "lut_bins", where))
        v = np.asarray(self.values, np.float64)
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{where}: values must be finite")
        if not 2 <= v.size <= 256 or np.any(np.diff(v) <= 0) or np.any(np.abs(v) > 1):
            raise ValueError(f"Codebook {self.name!r}: need 2..256 strictly increasing values in [-1, 1]")
        if np.any(v.astype(np.float32) != v):
            raise ValueError(f"Codebook {self.name!r}: values must be exact in float32")
        if self.lut_bins not in (0, 65536):
            raise ValueError(f"Codebook {self.name!r}: lut_bins must be 0 or 65536, got {self.lut_bins}")

    @property
    def bits(self) -> int:
        return max(1, math.ceil(math.log2(len(self.values))))

    @property
    def max(self) -> float:
        return max(abs(self.values[0]), abs(self.values[-1]))

    @property
    def code_dtype(self) -> str:
        return "uint8"

    @property
    def table(self) -> np.ndarray:
        """The values as a float32 array."""
        return np.asarray(self.values, np.float32)

    @classmethod
    def bnb_dynamic(cls, signed: bool = True, *, lut_bins: int = 0) -> Codebook:
        """bitsandbytes' ``create_dynamic_map(signed)``: 8-bit dynamic tree map."""
        words = _codebooks.BNB_DYNAMIC_SIGNED if signed else _codebooks.BNB_DYNAMIC_UNSIGNED
        values = np.asarray(words, np.uint32).view(np.float32).astype(np.float64)
        name = "bnb_dynamic8" if signed else "bnb_dynamic8u"
        return cls(name, tuple(values.tolist()), lut_bins)

    def __str__(self) -> str:
        return self.name


Element = Format | IntFormat | Codebook


@dataclass(frozen=True)
class BlockFormat:
    """Elements in ``element``, one scale per block, computed by ``rule``.

    Args:
        name: preset name, e.g. ``"mxfp8_e4m3"``.
        element: element format (a Format, IntFormat or Codebook).
        block: block shape over the trailing axes, e.g. ``(32,)`` for 1x32 blocks along the
            last axis, ``(128, 128)`` for tiles over the last two; ``-1`` means the whole
            axis (``(-1,)`` is one scale per row, ``(-1, 1)`` one per column of a matrix);
            None means one scale for the whole tensor.
        rule: how a block's scale follows from its amax, see :class:`ScaleRule`.
        scale_format: format of the stored scales (float32, float8_e8m0fnu for MX,
            float8_e4m3fn for NVFP4).
        pow2: round the scale to a power of two (TE ``pow2``: masks the mantissa).
        eps: lower bound applied to the amax before the scale (TE ``amax_epsilon``,
            torchao's ``clip(1e-12)``).
        flatten: block the flattened tensor (bitsandbytes, torchao optimizer states)
            instead of the trailing axes.
        pad: allow a ragged last block along an axis (its missing elements count as
            zeros, which never change the amax). False makes such shapes an error.
    """

    name: str
    element: Element
    block: tuple[int, ...] | None
    rule: ScaleRule
    scale_format: Format = FORMATS["float32"]
    pow2: bool = False
    eps: float = 0.0
    flatten: bool = False
    pad: bool = True

    def __post_init__(self) -> None:
        where = f"BlockFormat {check_name(self.name, 'BlockFormat')!r}"
        self._check_types(where)
        if self.block is not None:
            if not self.block or any(b == 0 or b < -1 for b in self.block):
                raise ValueError(f"{where}: block entries must be positive or -1, got {self.block}")
            if self.flatten and len(self.block) != 1:
                raise ValueError(f"{where}: flatten needs a 1-D block, got {self.block}")
        if isinstance(self.element, Codebook) and self.rule is not ScaleRule.ABSMAX:
            raise ValueError(f"{where}: codebook elements need ScaleRule.ABSMAX")
        want = self.rule.traits.scale_format
        if want == _F32S and self.scale_format.bits != 32:
            raise ValueError(f"{where}: {self.rule.value} stores float32 scales")
        if want != _F32S and self.scale_format.name != want:
            who = "MX rules store" if self.rule.is_mx else f"ScaleRule.{self.rule.name} stores"
            raise ValueError(f"{where}: {who} {want} scales")

    def _check_types(self, where: str) -> None:
        """Types of every field (normalizing ``block`` to a tuple of ints), naming the argument."""
        if not isinstance(self.element, (Format, IntFormat, Codebook)):
            hint = ""
            if isinstance(self.element, str):
                known = self.element in FORMATS
                hint = (
                    f"; use fpsim.formats.FORMATS[{self.element!r}]"
                    if known
                    else f"; known: {', '.join(FORMATS)}"
                )
            raise TypeError(
                f"{where}: element must be a Format, IntFormat or Codebook, "
                f"got {type(self.element).__name__} "
                f"{self.element!r}{hint}"
            )
        if self.block is not None:
            if not isinstance(self.block, (tuple, list)):
                raise TypeError(
                    f"{where}: block must be a tuple of ints (e.g. (32,) or (128, 128)) or None, "
                    f"got {type(self.block).__name__} {self.block!r}"
                )
            object.__setattr__(self, "block", tuple(check_int(b, "block entries", where) for b in self.block))
        if not isinstance(self.rule, ScaleRule):
            allowed = ", ".join(f"ScaleRule.{r.name}" for r in ScaleRule)
            raise TypeError(
                f"{where}: rule must be one of {allowed}, got {type(self.rule).__name__} {self.rule!r}"
            )
        if not isinstance(self.scale_format, Format):
            raise TypeError(f"{where}: scale_format must be a Format, got {type(self.scale_format).__name__}")
        for f in ("pow2", "flatten", "pad"):
            check_bool(getattr(self, f), f, where)
        eps = self.eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
            raise TypeError(f"{where}: eps must be a real number >= 0, got {type(eps).__name__} {eps!r}")
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"{where}: eps must be finite and >= 0, got {eps!r}")
        object.__setattr__(self, "eps", float(eps))

    @property
    def amax_ignores_nan(self) -> bool:
        """The block amax skips NaN (fmaxf: Transformer Engine, NVFP4, bitsandbytes' codebook
        kernels) rather than propagating it (torch.amax); the one NaN policy of every tier."""
        return self.rule.amax_ignores_nan or isinstance(self.element, Codebook)

    @property
    def block_elements(self) -> int | None:
        """Elements per block (None when it depends on the tensor's shape)."""
        if self.block is None or -1 in self.block:
            return None
        return math.prod(self.block)

    @property
    def bits_per_element(self) -> float:
        """Element bits plus the block scale's share (per-tensor scales count as 0)."""
        n = self.block_elements
        return self.element.bits + (self.scale_format.bits / n if n else 0.0)

    @property
    def bytes_per_element(self) -> float:
        return self.bits_per_element / 8

    @property
    def elem_max(self) -> float:
        """Largest element magnitude: the target of the scale."""
        return float(self.element.max)

    def __str__(self) -> str:
        return self.name


def _presets() -> tuple[BlockFormat, ...]:
    f = FORMATS
    e8m0, e4m3 = f["float8_e8m0fnu"], f["float8_e4m3fn"]
    int8_sym = IntFormat("int8_symmetric", 8, symmetric=True)
    mxint8 = IntFormat("mxint8_element", 8, symmetric=True, fraction_bits=6)
    bnb, bnb_u = Codebook.bnb_dynamic(True), Codebook.bnb_dynamic(False)
    mx = ScaleRule.MX_FLOOR
    out = [
        BlockFormat("mxfp8_e4m3", e4m3, (32,), mx, e8m0),
        BlockFormat("mxfp8_e5m2", f["float8_e5m2"], (32,), mx, e8m0),
        BlockFormat("mxfp6_e2m3", f["float6_e2m3fn"], (32,), mx, e8m0),
        BlockFormat("mxfp6_e3m2", f["float6_e3m2fn"], (32,), mx, e8m0),
        BlockFormat("mxfp4_e2m1", f["float4_e2m1fn"], (32,), mx, e8m0),
        BlockFormat("mxint8", mxint8, (32,), mx, e8m0),
        BlockFormat("nvfp4", f["float4_e2m1fn"], (16,), ScaleRule.NVFP4, e4m3),
        BlockFormat("int8_block256", int8_sym, (256,), ScaleRule.ABSMAX, flatten=True),
        BlockFormat("int8_block2048", int8_sym, (2048,), ScaleRule.ABSMAX, flatten=True),
        BlockFormat("bnb_dynamic8_block256", bnb, (256,), ScaleRule.ABSMAX, flatten=True),
        BlockFormat("bnb_dynamic8_block2048", bnb, (2048,), ScaleRule.ABSMAX, flatten=True),
        BlockFormat("bnb_dynamic8u_block256", bnb_u, (256,), ScaleRule.ABSMAX, flatten=True),
        BlockFormat("fp8_e4m3_block256", e4m3, (256,), ScaleRule.ABSMAX, eps=1e-12, flatten=True),
        BlockFormat("e4m3_tensor", e4m3, None, ScaleRule.TE),
        BlockFormat("e4m3_tensor_pow2", e4m3, None, ScaleRule.TE, pow2=True),
        BlockFormat("e5m2_tensor", f["float8_e5m2"], None, ScaleRule.TE),
        BlockFormat("e4m3_row", e4m3, (-1,), ScaleRule.TE),
        BlockFormat("e4m3_block128", e4m3, (128,), ScaleRule.TE, pow2=True),
        BlockFormat("e4m3_tile128", e4m3, (128, 128), ScaleRule.TE, pow2=True),
    ]
    return tuple(out)


RECIPES: Mapping[str, BlockFormat] = MappingProxyType({r.name: r for r in _presets()})
"""Block-format presets by name (read-only). Build others with :class:`BlockFormat`."""
