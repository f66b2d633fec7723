"""Each scale rule carries the facts every tier reads (:class:`fpsim.formats.block.RuleTraits`):
its number for the compiled and Triton tiers, the NaN policy of its amax, whether it needs the
tensor amax, its factor and decode kinds and its scale format. Checked here against the rules'
definitions (the ScaleRule docstring's sources) and against what the tiers do with them."""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.emulate import blocks
from fpsim.formats import FORMATS, RECIPES, BlockFormat, Codebook, ScaleRule
from fpsim.formats.codes import DecodeKind, FactorKind

# fixed for good, as fpsim.formats.codes' numbers (numba caches and kernels take them)
FIXED = dict(TE=0, ABSMAX=1, MX_FLOOR=2, MX_CEIL=3, MX_EVEN=4, MX_RCEIL=5, NVFP4=6, UE8M0_CEIL=8)
CODEBOOK_RULE = 7  # the Triton block kernel's codebook branch


def test_codes_are_fixed_and_unique():
    codes = {r.name: r.code for r in ScaleRule}
    assert {k: codes[k] for k in FIXED} == FIXED
    assert len(set(codes.values())) == len(codes) and CODEBOOK_RULE not in codes.values(), codes
    assert all(type(c) is int and c >= 0 for c in codes.values())


def test_a_member_keeps_its_name_as_value():
    assert ScaleRule("mx_rceil") is ScaleRule.MX_RCEIL and ScaleRule.TE.value == "te"


def test_traits_follow_the_sources():
    """fmaxf (TE, NVFP4) skips NaN, torch.amax (absmax, MX) propagates it; NVFP4 alone needs the
    tensor amax; E8M0 rules scale and decode by exact powers of two."""
    ignores = {r for r in ScaleRule if r.amax_ignores_nan}
    assert ignores == {ScaleRule.TE, ScaleRule.NVFP4}
    assert {r for r in ScaleRule if r.needs_tensor_amax} == {ScaleRule.NVFP4}
    for r in ScaleRule:
        e8m0 = r.traits.scale_format == "float8_e8m0fnu"
        assert (r.factor is FactorKind.POW2) == e8m0 == (r.decode is DecodeKind.POW2), r
    assert ScaleRule.ABSMAX.factor is FactorKind.QUOTIENT and ScaleRule.TE.factor is FactorKind.PRODUCT
    assert ScaleRule.NVFP4.decode is DecodeKind.TENSOR


def test_the_nan_policy_is_the_rules_or_the_codebooks():
    for bf in RECIPES.values():
        assert bf.amax_ignores_nan == (bf.rule.amax_ignores_nan or isinstance(bf.element, Codebook)), bf.name


@pytest.mark.parametrize("name", ["e4m3_row", "int8_block256", "mxfp8_e4m3", "bnb_dynamic8_block256"])
def test_the_numpy_tier_follows_the_nan_policy(name):
    """A NaN in a block: scale NaN (propagated) or the scale of the other elements (skipped)."""
    bf = RECIPES[name]
    x = np.linspace(-3, 3, 256, dtype=np.float32).reshape(1, 256)
    y = x.copy()
    y[0, 5] = np.nan
    a, b = blocks.encode_blocks(x, bf), blocks.encode_blocks(y, bf)
    same = np.array_equal(a.scales, b.scales)
    assert same == bf.amax_ignores_nan, name


def test_scale_format_is_checked_from_the_traits():
    e4m3 = FORMATS["float8_e4m3fn"]
    for r in ScaleRule:
        want = r.traits.scale_format
        other = FORMATS["float32" if want != "float32" else "float8_e8m0fnu"]
        with pytest.raises(ValueError, match=f"stores? {want} scales"):
            BlockFormat("bad", e4m3, (32,), r, other)
        assert BlockFormat("ok", e4m3, (32,), r, FORMATS[want]).rule is r


def test_the_triton_codes_are_derived_and_unknown_rules_refused(monkeypatch):
    from fpsim.kernels import _codes

    assert {m.name: int(m) for m in _codes.Rule} == {
        **{r.name: r.code for r in ScaleRule},
        "CODEBOOK": CODEBOOK_RULE,
    }
    bf = RECIPES["mxfp8_e4m3"]
    assert _codes.rule_code(bf) is _codes.Rule.MX_FLOOR
    monkeypatch.setattr(_codes, "BLOCK_KERNEL_RULES", frozenset(ScaleRule) - {ScaleRule.MX_FLOOR})
    with pytest.raises(
        ValueError, match=r"mxfp8_e4m3: the Triton block kernel has no scale rule ScaleRule.MX_FLOOR"
    ):
        _codes.rule_code(bf)
