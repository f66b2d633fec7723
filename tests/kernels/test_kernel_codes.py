"""The Triton tier takes the shared numbering: every ``tl.constexpr`` copy of a rounding mode,
an encoding, a state kind or a weight decay in the kernel files equals the member's code
(:attr:`fpsim.formats.RoundMode.code`, :attr:`fpsim.formats.Encoding.code`,
:mod:`fpsim.formats.codes`), and the host passes ``mode.code`` and ``fmt.encoding.code``. The
numpy and compiled tiers and the scan for a second numbering are in tests/formats/test_codes.py."""

from __future__ import annotations

import pytest

from fpsim.formats import FORMATS, RECIPES, Encoding, Format, RoundMode, get_format
from fpsim.formats import codes as shared
from fpsim.replay.optim import Adam, AdamW

pytest.importorskip("triton")
from fpsim.kernels import _codes, optim_args  # noqa: E402  (after the skip)
from fpsim.kernels._loader import kernel_module  # noqa: E402
from fpsim.kernels.format_args import format_args, rounding_codes  # noqa: E402

# the enums whose constants each kernel file compares with (a kernel file may name a constant of
# another numbering alike, e.g. _blocks_kernel's _CODEBOOK is Rule.CODEBOOK)
READS = {
    "_intcast": (RoundMode, Encoding),
    "_accumulate_kernel": (RoundMode,),
    "_blocks_kernel": (RoundMode, Encoding),
    "_optim_kernel": (shared.StateKind, shared.Decay),
}
COVERS = {  # the constants each file must have: the members its kernels branch on
    "_intcast": {*(f"_{m.name}" for m in RoundMode if m is not RoundMode.STOCHASTIC), "_IEEE", "_FN"},
    "_accumulate_kernel": {f"_{m.name}" for m in RoundMode},
    "_optim_kernel": {"_FP32", "_CODEBOOK", "_INT", "_DECOUPLED", "_L2"},
}


def _code(member) -> int:
    return member.code if isinstance(member, (RoundMode, Encoding)) else int(member)


@pytest.mark.parametrize("name", sorted(READS))
def test_kernel_constexprs_equal_the_shared_codes(name):
    import triton.language as tl

    mod = kernel_module(name, interpret=True)
    seen = {}
    for kind in READS[name]:
        for m in kind:
            const = getattr(mod, f"_{m.name}", None)
            if const is not None:
                assert isinstance(const, tl.constexpr), f"{name}._{m.name}"
                seen[f"_{m.name}"] = (const.value, _code(m))
    assert set(seen) >= COVERS.get(name, set()), sorted(seen)
    assert all(type(got) is int and got == want for got, want in seen.values()), seen


def test_the_kernels_use_the_shared_enums():
    assert _codes.StateKind is shared.StateKind and _codes.Decay is shared.Decay
    assert {_codes.state_kind(None), *(_codes.state_kind(get_format(r)) for r in RECIPES)} <= set(
        shared.StateKind
    )


@pytest.mark.parametrize("mode", list(RoundMode), ids=lambda m: m.value)
def test_the_cast_host_passes_the_shared_codes(mode):
    for fmt in (f for f in FORMATS.values() if isinstance(f, Format)):
        (mode_code, _), (_, paths) = rounding_codes(fmt, mode), format_args(fmt)
        assert mode_code == mode.code and paths.ENC == fmt.encoding.code, fmt.name


def test_the_optimizer_host_passes_the_numpy_steps_decay():
    for opt in (Adam(), Adam(weight_decay=0.1), AdamW(weight_decay=0.1)):
        decay, _ = optim_args.adam_args(opt, 1e-3, 3)
        assert decay is shared.Decay(opt.scalars(1e-3, 3).mode)
        assert decay is shared.Decay.of(opt.weight_decay, opt.decoupled)
