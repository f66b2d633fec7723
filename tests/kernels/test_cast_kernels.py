"""The portable cast kernels (fpsim.kernels.cast) against their emulator twins, bit for bit,
in Triton's CPU interpreter: every format x every rounding mode, saturate and flush
variants, float32 / float16 / bfloat16 inputs, odd shapes, and the argument errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from oracles import ALL_FORMATS, MODES, assert_codes_equal, fmt_id, mode_id, nan_patterns, targeted_points

import fpsim
from fpsim import Format, IntFormat, RoundMode

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from fpsim.kernels import cast  # noqa: E402  (after the skips)

SR = RoundMode.STOCHASTIC
EDGE_WORDS = np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF], dtype=np.uint32)
SPECIALS = np.concatenate(
    [
        np.array(
            [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF]
            + [0x00000001, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF],
            dtype=np.uint32,
        ).view(np.float32),
        nan_patterns(np.float32),  # quiet and signaling NaNs of both signs, several payloads
    ]
)


def points(fmt, n: int = 3000) -> np.ndarray:
    return np.concatenate([targeted_points(fmt, n, seed=11), SPECIALS])


def words(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 1 << 32, size=n, dtype=np.uint32)
    w[: EDGE_WORDS.size * 40] = np.repeat(EDGE_WORDS, 40)
    return w


def variants(fmt, mode):
    subs = (True, False) if isinstance(fmt, Format) and fmt.subnormals and fmt.mantissa_bits else (True,)
    nbits = (32, 3) if mode is SR else (32,)
    return [(sat, sub, nb) for sat in (False, True) for sub in subs for nb in nbits]


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=fmt_id)
def test_encode_matches_emulator(fmt, mode):
    x = points(fmt)
    xt = torch.from_numpy(x)
    rbits = words(x.size)
    for sat, sub, nbits in variants(fmt, mode):
        kw = {"rounding": mode, "saturate": sat, "subnormals": sub}
        if mode is SR:
            kw.update(random_bits=rbits, stochastic_bits=nbits)
        want = fpsim.encode(x, fmt, **kw)
        if mode is SR:  # the kernel takes the words as a torch int32 bit-pattern tensor
            kw["random_bits"] = torch.from_numpy(rbits.view(np.int32))
        got = cast.encode(xt, fmt, **kw)
        assert got.dtype == getattr(torch, fmt.code_dtype)
        assert_codes_equal(
            got.numpy(), want, fmt, inputs=x, context=f"saturate={sat} subnormals={sub} n={nbits}"
        )


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=fmt_id)
def test_fused_quantize_matches_emulator(fmt, mode):
    x = points(fmt, 1500)
    kw = {"rounding": mode}
    if mode is SR:
        kw["random_bits"] = words(x.size, 1)
    got = cast.quantize(torch.from_numpy(x), fmt, **kw)
    want = fpsim.quantize(x, fmt, **kw)
    assert got.dtype == torch.float32
    bad = got.numpy().view(np.uint32) != want.view(np.uint32)  # NaN bits too: 0x7fc00000
    assert not bad.any(), f"{fmt.name} {mode.value}: {bad.sum()} values differ, first at x={x[bad][:4]}"


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=fmt_id)
def test_decode_every_code(fmt):
    if fmt.bits <= 16:
        codes = np.arange(1 << fmt.bits).astype(fmt.code_dtype)
    else:
        codes = np.random.default_rng(0).integers(0, 1 << 32, size=50000, dtype=np.uint32)
        codes[:6] = [0x7FC00001, 0xFFFFFFFF, 0x00000001, 0x80000001, 0x7F800000, 0xFF800000]
    want = fpsim.decode(codes, fmt).view(np.uint32)
    t = torch.from_numpy(codes.view(np.int32)).view(torch.uint32) if fmt.bits == 32 else None
    if t is None:
        t = torch.from_numpy(codes.astype(np.int32)).to(getattr(torch, fmt.code_dtype))
    got = cast.decode(t, fmt).numpy().view(np.uint32)
    bad = got != want  # exact bits, NaN payloads of float32 codes included
    assert not bad.any(), f"{fmt.name}: codes {codes[bad][:8]} decode to {got[bad][:8]} not {want[bad][:8]}"
    # other integer dtypes holding the same codes
    wide = torch.from_numpy(codes.astype(np.int64))
    assert np.array_equal(cast.decode(wide, fmt).numpy().view(np.uint32), want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=fmt_id)
def test_every_16_bit_input(fmt, dtype):
    """float16 and bfloat16 inputs are widened to float32 in the kernel: every bit pattern."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    x16 = torch.from_numpy(bits.view(np.int16)).view(getattr(torch, dtype))
    x32 = bits.view(np.float16 if dtype == "float16" else ml_dtypes.bfloat16).astype(np.float32)
    for mode in (RoundMode.NEAREST_EVEN, RoundMode.TOWARD_NEGATIVE, SR):
        kw = {"rounding": mode, "saturate": mode is SR}
        if mode is SR:
            kw["random_bits"] = words(bits.size, 2)
        want = fpsim.encode(x32, fmt, **kw)
        assert_codes_equal(cast.encode(x16, fmt, **kw).numpy(), want, fmt, inputs=x32, context=dtype)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (1023,), (3, 5, 7), (2, 0, 3)])
def test_shapes(shape):
    rng = np.random.default_rng(1)
    x = np.asarray(rng.standard_normal(shape) * 100, dtype=np.float32)
    got = cast.encode(torch.from_numpy(x), "float8_e4m3fn")
    assert tuple(got.shape) == shape and got.dtype == torch.uint8
    assert np.array_equal(got.numpy(), fpsim.encode(x, "float8_e4m3fn"))
    codes = torch.from_numpy(fpsim.encode(x, "float8_e4m3fn"))
    assert np.array_equal(
        cast.decode(codes, "float8_e4m3fn").numpy(), fpsim.decode(codes.numpy(), "float8_e4m3fn")
    )
    q = cast.quantize(torch.from_numpy(x), "float8_e4m3fn")
    assert tuple(q.shape) == shape and q.dtype == torch.float32


def test_non_contiguous_and_many_programs():
    rng = np.random.default_rng(2)
    base = torch.from_numpy((rng.standard_normal((40, 25)) * 3).astype(np.float32))
    x = base.t()  # non-contiguous view
    assert not x.is_contiguous()
    want = fpsim.encode(x.numpy(), "float6_e3m2fn", rounding="toward_positive")
    got = cast.encode(x, "float6_e3m2fn", rounding="toward_positive", launch=cast.Launch(block=128))
    assert np.array_equal(got.numpy(), want)  # 8 programs, the last one partly masked
    r = torch.from_numpy(words(x.numel(), 3).view(np.int32).reshape(x.shape))
    want = fpsim.encode(x.numpy(), "int4", rounding="stochastic", random_bits=r.numpy().view(np.uint32))
    got = cast.encode(x, "int4", rounding="stochastic", random_bits=r, launch=cast.Launch(block=64))
    assert np.array_equal(got.numpy(), want)


def test_random_bits_as_uint32_int32_or_numpy_agree():
    x = torch.linspace(-3, 3, 999)
    w = words(999, 4)
    a = cast.encode(x, "bfloat16", rounding="stochastic", random_bits=torch.from_numpy(w.view(np.int32)))
    b = cast.encode(
        x,
        "bfloat16",
        rounding="stochastic",
        random_bits=torch.from_numpy(w.view(np.int32)).view(torch.uint32),
    )
    c = cast.encode(x, "bfloat16", rounding="stochastic", random_bits=w)
    assert torch.equal(a, b) and torch.equal(a, c)


def test_custom_formats():
    from dataclasses import replace

    f16_ftz = replace(fpsim.get_format("float16"), name="float16_ftz", subnormals=False)
    e3m3 = Format("e3m3_ieee", 3, 3, 3)
    q88 = IntFormat("q8_8", 16, fraction_bits=8)
    x = points(fpsim.get_format("float16"))
    for f in (f16_ftz, e3m3, q88):
        for mode in ("nearest_even", "odd"):
            assert_codes_equal(
                cast.encode(torch.from_numpy(x), f, rounding=mode).numpy(),
                fpsim.encode(x, f, rounding=mode),
                f,
            )
        codes = np.arange(1 << f.bits).astype(f.code_dtype)
        got = cast.decode(torch.from_numpy(codes.astype(np.int32)), f).numpy().view(np.uint32)
        assert np.array_equal(got, fpsim.decode(codes, f).view(np.uint32))


def test_argument_errors():
    x = torch.ones(4)
    with pytest.raises(TypeError, match="float64"):
        cast.encode(x.double(), "float8_e4m3fn")
    with pytest.raises(TypeError, match="torch tensor"):
        cast.encode(np.ones(4, np.float32), "float8_e4m3fn")
    with pytest.raises(TypeError, match="block format"):
        cast.encode(x, "mxfp8_e4m3")
    with pytest.raises(ValueError, match="unknown rounding mode"):
        cast.encode(x, "float8_e4m3fn", rounding="up")
    with pytest.raises(ValueError, match="random_bits= .* or seed="):
        cast.encode(x, "float8_e4m3fn", rounding="stochastic")
    with pytest.raises(ValueError, match="not both"):
        cast.encode(
            x, "float8_e4m3fn", rounding="stochastic", seed=1, random_bits=torch.zeros(4, dtype=torch.int32)
        )
    with pytest.raises(ValueError, match="shape"):
        cast.encode(x, "float8_e4m3fn", rounding="stochastic", random_bits=torch.zeros(5, dtype=torch.int32))
    with pytest.raises(TypeError, match="random_bits"):
        cast.encode(x, "float8_e4m3fn", rounding="stochastic", random_bits=torch.zeros(4))
    with pytest.raises(ValueError, match="stochastic_bits"):
        cast.encode(x, "float8_e4m3fn", rounding="stochastic", seed=1, stochastic_bits=33)
    with pytest.raises(ValueError, match="seed"):
        cast.encode(x, "float8_e4m3fn", rounding="stochastic", seed=2**64)
    with pytest.raises(ValueError, match="out of range"):
        cast.decode(torch.tensor([0, 300]), "float8_e4m3fn")
    with pytest.raises(ValueError, match="out of range"):
        cast.decode(torch.tensor([16], dtype=torch.uint8), "float4_e2m1fn")
    with pytest.raises(TypeError, match="integer"):
        cast.decode(torch.ones(3), "float8_e4m3fn")
    with pytest.raises(ValueError, match="power of two"):
        cast.encode(x, "float8_e4m3fn", launch=cast.Launch(block=100))
