"""fpsim's emulated GEMM recipes against torchao's emulated float8 and MX linears, bit for bit.

The relation stated in :mod:`fpsim.train.gemm`'s module doc, held to torchao 0.18 on the machine
at hand (skipped without torchao):

- ``fp8-current`` vs ``Float8Linear`` with ``Float8LinearConfig(emulate=True)`` (tensorwise):
  the same element codes and scale for x, W (E4M3) and dy (E5M2); fpsim dequantizes with TE's
  ``f32(1 / scale)``, torchao divides by the scale, so the operands differ by at most one ulp
  where the scale is not a power of two, and so do y, dx and dW. With power-of-two scales on
  both sides (TE ``pow2``, torchao ``round_scales_to_power_of_2``) y, dx, dW and db are equal.
  Two corners differ (pinned): torchao clamps the amax at 1e-12 (fpsim's ``eps=1e-12`` gives
  its codes), and its power-of-two rounding takes the power of two above a scale one ulp below it.
- ``mxfp8`` vs ``MXFP8Linear(kernel_preference=EMULATED)`` (RCEIL, its default): y, dx, dW, db
  equal, the blocks along each GEMM's contraction axis (tokens for wgrad) on both sides; a
  block whose ``amax / 448`` lies just above a power of two gets a scale one binade smaller in
  torchao (its float32 log2 rounds to the integer). torchao's FLOOR mode equals fpsim's
  ``ScaleRule.MX_FLOOR``.

Every comparison is of float32 bit patterns, zero tolerance.
"""

from __future__ import annotations

import copy
import dataclasses

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao.float8")
mx_linear = pytest.importorskip("torchao.prototype.moe_training.mxfp8_linear")

import fpsim  # noqa: E402
from fpsim import Backend  # noqa: E402
from fpsim.formats import FORMATS, BlockFormat, ScaleRule  # noqa: E402
from fpsim.train.gemm import GEMM_RECIPES, GemmRecipe, OperandRecipe, quantize_operand  # noqa: E402
from fpsim.train.torch import convert  # noqa: E402

F32 = np.float32
M, K, N = 96, 64, 96  # tokens (4 x 24), in_features, out_features: multiples of 32 for torchao MX


def bits(t) -> np.ndarray:
    a = t.detach().contiguous().numpy() if isinstance(t, torch.Tensor) else np.ascontiguousarray(t)
    return a.astype(F32).view(np.uint32)


def assert_bits_equal(got, want, what: str) -> None:
    g, w = bits(got), bits(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
    assert bad.size == 0, f"{what}: {bad.size} of {g.size} differ, first at {bad[:4]}"


def data(seed: int = 0):
    """A linear, an input (4, 24, 64) whose tokens span 16 binades (powers of two, exact), an
    output gradient."""
    torch.manual_seed(seed)
    lin = torch.nn.Linear(K, N)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(F32) * np.ldexp(F32(1), rng.integers(-8, 8, (M, 1))).astype(F32)
    dy = (rng.standard_normal((M, N)) * 2.0**-10).astype(F32)
    return lin, torch.from_numpy(x).reshape(4, 24, K), torch.from_numpy(dy).reshape(4, 24, N)


def step(module, x, dy):
    """y, dx, dW, db of one forward and backward."""
    x = x.clone().requires_grad_(True)
    y = module(x)
    y.backward(dy)
    return y.detach(), x.grad, module.weight.grad, module.bias.grad


def pow2_recipe() -> GemmRecipe:
    e4m3, e5m2 = (
        OperandRecipe(BlockFormat(f"{f}_pow2", FORMATS[f], None, ScaleRule.TE, pow2=True))
        for f in ("float8_e4m3fn", "float8_e5m2")
    )
    return GemmRecipe("fp8-current-pow2", e4m3, e4m3, e5m2)


def float8(lin, pow2: bool):
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    return Float8Linear.from_float(
        copy.deepcopy(lin), Float8LinearConfig(emulate=True, round_scales_to_power_of_2=pow2)
    )


def mxfp8(lin, mode: str):
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    out = mx_linear.MXFP8Linear(
        K, N, kernel_preference=KernelPreference.EMULATED, scale_calculation_mode=ScaleCalculationMode(mode)
    )
    out.load_state_dict(lin.state_dict())
    return out


def ao_cast(t: np.ndarray, dtype: str, pow2: bool = False):
    """torchao's tensorwise cast of ``t`` to ``dtype``: codes (uint8), ``f32(1 / scale)``, the
    codes' values (decoded by ml_dtypes) and torchao's Float8TrainingTensor."""
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    ao = hp_tensor_to_float8_dynamic(
        torch.from_numpy(t), getattr(torch, dtype), LinearMMConfig(), round_scales_to_power_of_2=pow2
    )
    codes = ao._data.view(torch.uint8).numpy()
    return codes, F32(1) / F32(ao._scale.item()), codes.view(getattr(ml_dtypes, dtype)).astype(F32), ao


def scale_inv_of(enc) -> np.ndarray:
    """fpsim's stored per-tensor scale (``f32(1 / scale)``) as a float32 scalar."""
    return np.asarray(enc.scales).view(F32).reshape(())


@pytest.mark.parametrize(
    ("role", "dtype", "preset"),
    [("input", "float8_e4m3fn", "e4m3_tensor"), ("weight", "float8_e4m3fn", "e4m3_tensor"),
     ("grad_output", "float8_e5m2", "e5m2_tensor")],
)  # fmt: skip
def test_fp8_current_operands_equal_torchao_codes_dequantized_the_te_way(role, dtype, preset):
    """Per role: torchao's tensorwise cast and fpsim's share codes and scale; fpsim's operand is
    ``value * f32(1 / scale)`` (TE's scale_inv), torchao's emulated GEMM reads ``value / scale``:
    one ulp apart on some elements."""
    lin, x, dy = data(1)
    t = {"input": x.reshape(M, K), "weight": lin.weight.detach(), "grad_output": dy.reshape(M, N)}[role]
    codes, scale_inv, value, ao = ao_cast(t.numpy(), dtype)
    assert ao._scale.item() != 2.0 ** np.frexp(ao._scale.item())[1] / 2, "needs a scale off a power of two"
    enc = fpsim.encode(t.numpy(), preset)
    np.testing.assert_array_equal(enc.codes, codes, err_msg=f"{role}: element codes")
    assert_bits_equal(scale_inv_of(enc), scale_inv, f"{role}: fpsim's f32(1/scale)")
    q, _ = quantize_operand(t.numpy(), GEMM_RECIPES["fp8-current"].operand(role), Backend.NUMPY)
    assert_bits_equal(q, value * scale_inv, f"{role}: fpsim operand = value * f32(1/scale)")
    ulps = np.abs(bits(q).astype(np.int64) - bits(ao._data.float() / ao._scale).astype(np.int64))
    assert ulps.max() == 1, f"{role}: torchao's value / scale is at most one ulp away, and is for some"


def test_fp8_current_linear_equals_torchao_with_pow2_scales_and_not_without():
    """One nn.Linear, forward and backward: with power-of-two scales on both sides y, dx, dW and
    db are equal bit for bit; with torchao's default (exact ``448 / amax``) scales y, dx and dW
    differ (the dequantization above), db (FP32 ``dy.sum``) does not."""
    lin, x, dy = data()
    got = step(convert(copy.deepcopy(lin), pow2_recipe()), x, dy)
    want = step(float8(lin, pow2=True), x, dy)
    for name, g, w in zip(("y", "dx", "dW", "db"), got, want):
        assert_bits_equal(g, w, f"pow2 {name}")
    got = step(convert(copy.deepcopy(lin), "fp8-current"), x, dy)
    want = step(float8(lin, pow2=False), x, dy)
    for name, g, w in zip(("y", "dx", "dW"), got, want):
        assert (bits(g) != bits(w)).any(), f"default scales: {name} should differ from torchao's"
    assert_bits_equal(got[3], want[3], "db")
    # fpsim's y is the FP32 GEMM of torchao's codes dequantized with f32(1/scale), plus the bias
    x_ao, w_ao = (ao_cast(t.numpy(), "float8_e4m3fn") for t in (x.reshape(M, K), lin.weight.detach()))
    x_te, w_te = (torch.from_numpy(value * scale_inv) for _, scale_inv, value, _ in (x_ao, w_ao))
    y = torch.matmul(x_te, w_te.T) + lin.bias.detach()
    assert_bits_equal(got[0].reshape(M, N), y, "y from torchao's codes, dequantized TE's way")


def test_mxfp8_linear_equals_torchao_emulated_rceil():
    """``mxfp8`` (TE's MX_RCEIL) and torchao's emulated MXFP8Linear (RCEIL): y, dx, dW, db equal
    bit for bit on tokens spanning 16 binades (blocks along the wrong axis would differ)."""
    lin, x, dy = data()
    got = step(convert(copy.deepcopy(lin), "mxfp8"), x, dy)
    want = step(mxfp8(lin, "rceil"), x, dy)
    for name, g, w in zip(("y", "dx", "dW", "db"), got, want):
        assert_bits_equal(g, w, f"mxfp8 {name}")


def test_mxfp8_torchao_floor_is_fpsim_mx_floor():
    """torchao's FLOOR mode (the OCP rule, its ``to_mx`` default) is not ``mxfp8`` but equals a
    recipe with ``ScaleRule.MX_FLOOR``."""
    lin, x, dy = data()
    want = step(mxfp8(lin, "floor"), x, dy)
    rceil = step(convert(copy.deepcopy(lin), "mxfp8"), x, dy)
    assert (bits(rceil[0]) != bits(want[0])).any(), "RCEIL and FLOOR should differ"
    e4m3, e8m0 = FORMATS["float8_e4m3fn"], FORMATS["float8_e8m0fnu"]
    op = OperandRecipe(BlockFormat("mxfp8_e4m3_floor", e4m3, (32,), ScaleRule.MX_FLOOR, e8m0))
    got = step(convert(copy.deepcopy(lin), GemmRecipe("mxfp8-floor", op, op, op)), x, dy)
    for name, g, w in zip(("y", "dx", "dW", "db"), got, want):
        assert_bits_equal(g, w, f"floor {name}")


def test_mxfp8_block_just_above_a_power_of_two_differs_from_torchao():
    """A block of x with amax 0x1.c00002p+24 (amax/448 = 0x1.000002p+16): fpsim's scale is 2**17
    (cvt.rp rounds up), torchao's 2**16 (log2 rounds to 16), so 1152 in the same block is
    2**-7 * 1.125 at fpsim's scale, a subnormal E4M3 that rounds to 2**-7 (1024), and exact at
    torchao's: y differs in that token's row only."""
    lin, x, dy = data()
    x = x.clone()
    x[0, 0, 0], x[0, 0, 1] = float.fromhex("0x1.c00002p+24"), 1152.0
    got = step(convert(copy.deepcopy(lin), "mxfp8"), x, dy)
    want = step(mxfp8(lin, "rceil"), x, dy)
    y, ao_y = got[0].reshape(M, N), want[0].reshape(M, N)
    assert (bits(y[0]) != bits(ao_y[0])).any(), "the token with the block should differ"
    assert_bits_equal(y[1:], ao_y[1:], "the other tokens")
    assert_bits_equal(got[1], want[1], "dx (x takes no part)")


def test_fp8_amax_below_1e_12_torchao_clamps_it():
    """torchao clamps the amax at 1e-12 (fpsim's ``eps``); TE's current scaling has none: a
    tensor of amax 4.4e-14 gets other codes, and equal ones with ``eps=1e-12``."""
    t = (np.random.default_rng(0).standard_normal((16, 16)) * 2.0**-46).astype(F32)
    codes, scale_inv, *_ = ao_cast(t, "float8_e4m3fn")
    fmt = fpsim.get_format("e4m3_tensor")
    assert (fpsim.encode(t, fmt).codes != codes).all()
    enc = fpsim.encode(t, dataclasses.replace(fmt, eps=1e-12))
    np.testing.assert_array_equal(enc.codes, codes)
    assert_bits_equal(scale_inv_of(enc), scale_inv, "scale_inv with eps=1e-12")


def test_fp8_pow2_scale_one_ulp_below_a_power_of_two_torchao_rounds_up():
    """amax ``f32(1.75 * (1 + 2**-23))`` makes ``448 / amax`` one ulp below 256: TE's ``pow2``
    (fpsim) keeps the exponent, 128; torchao's ``exp2(floor(log2(s)))`` takes 256 (float32 log2
    rounds to 8), so its largest element saturates at 448 where fpsim codes 224."""
    t = np.array([[F32(1.75) * F32(1 + 2.0**-23), 1.0]], F32)
    codes, scale_inv, *_ = ao_cast(t, "float8_e4m3fn", pow2=True)
    enc = fpsim.encode(t, "e4m3_tensor_pow2")
    assert (scale_inv, codes[0, 0]) == (2.0**-8, 0x7E)  # 448
    assert_bits_equal(scale_inv_of(enc), F32(2.0**-7), "fpsim pow2 scale_inv")
    assert enc.codes[0, 0] == 0x76  # 224
