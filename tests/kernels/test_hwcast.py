"""Hardware casts (fpsim.kernels.hwcast): validated on a GPU; on the CPU only the float16
target runs (the interpreter's numpy float16 cast is exact), the others say why not."""

from __future__ import annotations

import numpy as np
import pytest
from oracles import assert_codes_equal, nan_patterns, targeted_points

import fpsim

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from fpsim.kernels import hwcast, validate  # noqa: E402  (after the skips)

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device (the GPU half of the validation runs where one is lent)",
)


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("subnormals", [True, False])
def test_float16_hardware_cast_in_the_interpreter(saturate, subnormals):
    x = np.concatenate([nan_patterns(np.float32), targeted_points("float16", 20000, seed=4)])
    got = hwcast.encode(torch.from_numpy(x), "float16", saturate=saturate, subnormals=subnormals)
    want = fpsim.encode(x, "float16", saturate=saturate, subnormals=subnormals)
    assert_codes_equal(got.numpy(), want, "float16", inputs=x, nan_by_class=True)


def test_reasons_on_the_cpu():
    for name in ("float8_e4m3fn", "float8_e5m2", "bfloat16"):
        reason = hwcast.unavailable_reason(name, "cpu")
        assert "interpreter" in reason and "GPU" in reason
        with pytest.raises(hwcast.HardwareCastUnavailable, match="interpreter"):
            hwcast.encode(torch.ones(3), name)
    assert "no hardware cast" in hwcast.unavailable_reason("float6_e2m3fn", "cpu")
    assert "nearest even" in hwcast.unavailable_reason("float16", "cpu", "toward_zero")
    assert hwcast.unavailable_reason("float16", "cpu") is None


@needs_gpu
@pytest.mark.parametrize("fmt", list(hwcast.HW_FORMATS))
def test_hardware_casts_on_the_gpu(fmt):
    reason = hwcast.unavailable_reason(fmt, "cuda")
    if reason:
        pytest.skip(reason)
    cases = validate.validate(
        hwcast.encode, fmt, "nearest_even", cases="quick", device="cuda", nan_by_class=True
    )
    for c in cases:
        assert c.ok, "\n".join([f"{c.options}: {c.mismatches} mismatches"] + [m.describe() for m in c.first])


@needs_gpu
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float4_e2m1fn", "bfloat16", "int8", "float8_e8m0fnu"])
@pytest.mark.parametrize("mode", ["nearest_even", "stochastic", "toward_negative"])
def test_portable_kernels_on_the_gpu(fmt, mode):
    from fpsim.kernels import cast

    for c in validate.validate(cast.encode, fmt, mode, cases="quick", device="cuda"):
        assert c.ok, "\n".join([f"{c.options}: {c.mismatches} mismatches"] + [m.describe() for m in c.first])
    x = np.random.default_rng(0).standard_normal(4097).astype(np.float32)
    got = cast.encode(torch.from_numpy(x).cuda(), fmt, rounding="stochastic", seed=5).cpu().numpy()
    from fpsim.kernels.philox import philox_bits

    want = fpsim.encode(x, fmt, rounding="stochastic", random_bits=philox_bits(5, x.size))
    assert np.array_equal(got, want)
