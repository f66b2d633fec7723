"""Validation of block-encode kernels (:mod:`fpsim.kernels.validate`), against the block recipes.

:func:`validate_blocks` runs a block-encode kernel (:func:`fpsim.kernels.blocks.encode_blocks`
or any callable with its signature) on inputs where block scaling can go wrong and compares
its element codes and scale codes with :func:`fpsim.emulate.blocks.encode_blocks`, zero tolerance:

* ``specials``: a ragged last block, an all-zero block, blocks holding +-inf and NaN,
  float32 subnormals (MX scale exponents clamped at -127), a block whose amax rounds up
  under the EVEN / CEIL / RCEIL rules, a block beyond the E8M0 range (NaN scale) and a
  block of quiet and signaling NaNs of both signs after a huge value (a NaN-skipping amax
  must give the huge value, a NaN-propagating one the NaN);
* ``random``: values over 40 binades;
* ``shape ...``: odd shapes (ragged blocks along every axis);
* ``trace``: tensors of the bundled sample trace (last step when quick).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fpsim.formats import FORMATS, RECIPES, BlockFormat, Codebook, RoundMode, ScaleRule

from .common import SHOWN, Case, Mismatch, input_bits, trace_tensors

# quiet and signaling NaNs, both signs, several payloads (0x7F97C976: issue 27's, which numpy's
# SIMD fmax mishandled)
_NAN_BITS = np.array(
    [0x7F97C976, 0xFF800001, 0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0xFFBFFFFF, 0x7FBFFFFF, 0xFFC00000],
    np.uint32,
)


def _shapes(bf: BlockFormat, quick: bool) -> list[tuple]:
    if bf.block is not None and len(bf.block) == 2:
        return [(1, 1), (130, 135)] if quick else [(1, 1), (130, 135), (2, 129, 7)]
    return [(1,), (3, 5, 7)] if quick else [(1,), (33,), (3, 5, 7), (2, 2049)]


def _specials(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    x = np.ldexp(rng.standard_normal(shape), rng.integers(-20, 20, shape)).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    flat[: min(40, n)] = 0
    flat[40:48] = (rng.standard_normal(8) * 2.0**-140).astype(np.float32)[: max(0, min(8, n - 40))]
    if n > 200:
        flat[64:96] = np.float32(448 * 1.0625)
        flat[96:128] *= np.float32(2.0**100)
        flat[160] = np.float32(3.0e38)
        flat.view(np.uint32)[161:192:4] = _NAN_BITS
        flat[-3], flat[-9], flat[-20] = np.nan, np.inf, -np.inf
    return x


def input_blocks(bf: BlockFormat, quick: bool, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array) input sets for a block recipe (see the module doc)."""
    rng = np.random.default_rng(seed)
    two_d = bf.block is not None and len(bf.block) == 2
    out = [("specials", _specials(rng, (130, 135) if two_d else (5, 301)))]
    if not quick:
        out.append(("random", _specials(rng, (257, 131) if two_d else (4099,))))
    out += [(f"shape {s}", _specials(rng, s)) for s in _shapes(bf, quick)]
    for name, arrays in trace_tensors(quick):
        for i, a in enumerate(arrays[:4] if quick else arrays):
            if a.size == 0:
                continue
            if two_d and a.ndim < 2:
                a = a.reshape(1, -1)
            out.append((f"{name} #{i} {tuple(a.shape)}", np.array(a, np.float32, order="C")))  # writable copy
    return out


def recipes() -> dict[str, BlockFormat]:
    """The block kernel's rows: every preset of :data:`~fpsim.formats.block.RECIPES`, and for
    each scale rule no preset uses, the first float element preset of the rule's scale format
    under that rule (named ``<preset>_<rule>``), so that every rule is validated."""
    out = dict(RECIPES)
    used = {bf.rule for bf in RECIPES.values()}
    for rule in ScaleRule:
        if rule in used:
            continue
        want = rule.traits.scale_format
        base = next(
            bf
            for bf in RECIPES.values()
            if bf.scale_format.name == want and not isinstance(bf.element, Codebook) and bf.block is not None
        )
        name = f"{base.name}_{rule.value}"
        out[name] = BlockFormat(
            name, base.element, base.block, rule, FORMATS[want], base.pow2, base.eps, base.flatten, base.pad
        )
    return out


def applies(bf: BlockFormat, mode: RoundMode) -> bool:
    """Whether ``blocks.encode_blocks`` has a row for the recipe and mode: codebook recipes
    round to the nearest entry only; lookup-table codebooks have no kernel."""
    if isinstance(bf.element, Codebook):
        return mode is RoundMode.NEAREST_EVEN and not bf.element.lut_bins
    return True


def validate_blocks(
    fn: Any, bf: BlockFormat, rounding: RoundMode, *, cases: str, device: str, name: str
) -> list[Case]:
    """One :class:`~fpsim.kernels.validate.Case` comparing ``fn`` with the emulator on every
    input set: codes and scales counted together, the first mismatches kept (codes)."""
    import torch

    from fpsim.emulate.blocks import encode_blocks as ref

    case = Case(name, bf.name, rounding.value, {"recipe": True})
    rng = np.random.default_rng(1)
    for set_name, x in input_blocks(bf, cases == "quick"):
        kw: dict[str, Any] = {"rounding": rounding}
        if rounding is RoundMode.STOCHASTIC:
            kw["random_bits"] = rng.integers(0, 2**32, x.shape, dtype=np.uint32)
        want = ref(x, bf, **kw)
        try:
            got = fn(torch.from_numpy(x).to(device), bf, **kw)
        except Exception as e:  # noqa: BLE001 - reported in the case
            case.error = f"{set_name}: {type(e).__name__}: {e}"
            break
        codes, scales = got[0].cpu().numpy(), got[1].cpu().numpy()
        bad_c = codes != want.codes
        bad_s = scales.reshape(want.scales.shape) != want.scales
        ts_bad = got[2] != want.tensor_scale and not (
            got[2] is not None
            and want.tensor_scale is not None
            and math.isnan(got[2])
            and math.isnan(want.tensor_scale)
        )
        case.compared += codes.size + scales.size
        case.mismatches += int(bad_c.sum() + bad_s.sum() + ts_bad)
        for i in np.flatnonzero(bad_c.reshape(-1))[: max(0, SHOWN - len(case.first))]:
            v = x.reshape(-1)[i : i + 1]
            e, g = int(want.codes.reshape(-1)[i]), int(codes.reshape(-1)[i])
            case.first.append(
                Mismatch(set_name, int(i), input_bits(v), float(v[0]), e, g, f"code {e:#x}", f"code {g:#x}")
            )
    return [case]
