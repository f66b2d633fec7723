"""In-kernel random words: Triton's ``tl.randint`` and the kernels' own Philox equal
fpsim.kernels.philox.philox_bits in the interpreter, and in-kernel stochastic rounding
(``seed=``) equals the emulator fed those words."""

from __future__ import annotations

import os

import numpy as np
import pytest
from oracles import with_nans

import fpsim
from fpsim.kernels._loader import interpreter_patches_restored
from fpsim.kernels.philox import philox_bits

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _draw_randint(out_ptr, seed, start, BLOCK: tl.constexpr):
    offs = start + tl.arange(0, BLOCK).to(tl.int64)
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.randint(seed, offs).to(tl.int32, bitcast=True))


_PORTABLE = None  # fpsim.kernels' interpreted kernel module, set by the test below


@triton.jit
def _draw_portable(out_ptr, seed_lo, seed_hi, start, BLOCK: tl.constexpr):
    offs = start + tl.arange(0, BLOCK).to(tl.int64)
    word = _PORTABLE.philox_word(seed_lo.to(tl.uint32), seed_hi.to(tl.uint32), offs)
    tl.store(out_ptr + tl.arange(0, BLOCK), word.to(tl.int32, bitcast=True))


SEEDS = [0, 1, 12345, 2**31 + 5, 2**40 + 3, 2**64 - 1, -1, -(2**63)]


@pytest.mark.parametrize("seed", SEEDS)
def test_tl_randint_equals_philox_bits(seed):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before tests/kernels/conftest.py could select the interpreter")
    for start in (0, 2**32 - 8):  # the second crosses into the counter's high word
        out = torch.empty(16, dtype=torch.int32)
        with interpreter_patches_restored():  # keep triton.language usable for compiling
            _draw_randint[(1,)](out, seed, start, BLOCK=16)
        assert np.array_equal(out.numpy().view(np.uint32), philox_bits(seed, 16, offset=start)), (seed, start)


def test_kernel_philox_word_with_64_bit_offsets():
    """The kernels' own Philox (used instead of tl.randint) on counters >= 2**32."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before tests/kernels/conftest.py could select the interpreter")
    from fpsim.kernels._loader import kernel_module

    global _PORTABLE
    _PORTABLE = kernel_module("_intcast", interpret=True)
    seed = 2**40 + 77
    out = torch.empty(16, dtype=torch.int32)
    with interpreter_patches_restored():  # a nested @jit call: Triton 3.9 leaks its patches
        _draw_portable[(1,)](out, seed & 0xFFFFFFFF, seed >> 32, 2**33 - 3, BLOCK=16)
    assert np.array_equal(out.numpy().view(np.uint32), philox_bits(seed, 16, offset=2**33 - 3))


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "bfloat16", "float4_e2m1fn", "int8", "float8_e8m0fnu"])
@pytest.mark.parametrize("nbits", [32, 5])
def test_in_kernel_stochastic_rounding_equals_emulator_with_philox_bits(fmt, nbits):
    from fpsim.kernels import cast

    rng = np.random.default_rng(3)
    x = (rng.standard_normal(2991) * 2.0 ** rng.integers(-12, 12, 2991)).astype(np.float32).reshape(3, 997, 1)
    x = with_nans(x, start=990)  # quiet and signaling NaNs of both signs
    for seed in (0, 2**33 + 1, -5):
        got = cast.encode(torch.from_numpy(x), fmt, rounding="stochastic", seed=seed, stochastic_bits=nbits)
        bits = philox_bits(seed, x.size).reshape(x.shape)
        want = fpsim.encode(x, fmt, rounding="stochastic", random_bits=bits, stochastic_bits=nbits)
        assert np.array_equal(got.numpy(), want), (fmt, seed)
        q = cast.quantize(torch.from_numpy(x), fmt, rounding="stochastic", seed=seed, stochastic_bits=nbits)
        assert np.array_equal(q.numpy().view(np.uint32), fpsim.decode(want, fmt).view(np.uint32))


def test_seed_mode_is_independent_of_the_block_size():
    from fpsim.kernels import cast

    x = torch.from_numpy(np.random.default_rng(0).standard_normal(5000).astype(np.float32))
    a = cast.encode(x, "float8_e5m2", rounding="stochastic", seed=9)
    b = cast.encode(x, "float8_e5m2", rounding="stochastic", seed=9, launch=cast.Launch(block=512))
    assert torch.equal(a, b)
    c = cast.encode(x, "float8_e5m2", rounding="stochastic", seed=10)
    assert not torch.equal(a, c)
