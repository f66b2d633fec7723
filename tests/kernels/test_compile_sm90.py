"""The compiled (GPU) kernels build for sm_90 without a GPU: Triton lowers them to PTX and
ptxas assembles them on the CPU, which catches type and lowering errors that the
interpreter does not see (it runs the same source with numpy)."""

from __future__ import annotations

import re

import pytest

from fpsim import get_format

triton = pytest.importorskip("triton")

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # pragma: no cover - older triton
    pytest.skip("this triton has no ASTSource/GPUTarget", allow_module_level=True)

from fpsim.formats import RoundMode  # noqa: E402
from fpsim.kernels import hwcast  # noqa: E402
from fpsim.kernels._loader import kernel_module  # noqa: E402
from fpsim.kernels.format_args import format_args, rounding_codes  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
_PTR = {"uint8": "*u8", "uint16": "*u16", "uint32": "*u32"}


def _tuple_spec(fn, tuples: dict) -> tuple[dict, dict, dict]:
    """Signature types, constants and attributes of runtime tuple arguments as a launch
    specialises them (Triton's own specialize_impl: a field equal to 1 becomes a constant,
    one divisible by 16 is marked so)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    sig, consts, attrs = {}, {}, {}
    for name, value in tuples.items():
        i = fn.arg_names.index(name)
        types, keys = native_specialize_impl(BaseBackend, value, False, True, True)
        sig[name] = types
        for j, (t, k) in enumerate(zip(types, keys)):
            if t == "constexpr":
                consts[(i, j)] = k
            elif k == "D":
                attrs[(i, j)] = [["tt.divisibility", 16]]
    return sig, consts, attrs


def _compile(fn, types: dict[str, str], consts: dict, tuples: dict | None = None):
    names = fn.arg_names
    tsig, tconsts, tattrs = _tuple_spec(fn, tuples or {})
    sig = {n: ("constexpr" if n in consts else tsig.get(n, types.get(n, "i32"))) for n in names}
    cidx = {(names.index(k),): v for k, v in consts.items()} | tconsts
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4) if sig[names[i]] != "constexpr"} | tattrs
    try:
        return triton.compile(
            ASTSource(fn=fn, signature=sig, constexprs=cidx, attrs=attrs),
            target=TARGET,
            options={"num_warps": 4, "enable_fp_fusion": False},
        )
    except RuntimeError as e:  # no ptxas / CUDA backend in this triton build
        if "ptxas" in str(e).lower():
            pytest.skip(f"cannot assemble for sm_90 here: {e}")
        raise


ENCODE = [
    # format, mode, source (0 f32, 1 f16, 2 bf16), random (0, 1 bits, 2 seed), fused quantize
    ("float8_e4m3fn", "nearest_even", 0, 0, False),
    ("bfloat16", "stochastic", 0, 1, False),
    ("float8_e8m0fnu", "toward_positive", 2, 0, False),
    ("float8_e5m2fnuz", "odd", 1, 0, True),
    ("float4_e2m1fn", "stochastic", 0, 2, True),
    ("int8", "nearest_away", 0, 0, True),
    ("float32", "toward_negative", 2, 0, False),
]


@pytest.mark.parametrize("fmt,mode,src,rand,quant", ENCODE)
def test_encode_kernel_compiles_for_sm90(fmt, mode, src, rand, quant):
    f = get_format(fmt)
    mod = kernel_module("_cast_kernel", interpret=False)
    fa, fp = format_args(f, ftz=True)
    mode_code, ovf = rounding_codes(f, RoundMode.parse(mode))
    xt = "*i32" if src == 0 else "*i16"
    types = {
        "x_ptr": xt,
        "r_ptr": "*i32" if rand == 1 else xt,
        "out_ptr": "*i32" if quant else _PTR[f.code_dtype],
    }
    consts = dict(FMT=fp, MODE=mode_code, OVF=ovf, SRC=src, RAND=rand, QUANT=quant, BLOCK=2048, I64=False)
    k = _compile(mod.encode_kernel, types, consts, {"fmt": fa})
    ptx = k.asm["ptx"]
    assert "ld.global.v4" in ptx or src != 0  # vectorised 128-bit loads
    assert not re.search(r"\b(add|sub|mul|fma|div|min|max)(\.[a-z]+)*\.f(16|32|64)\b", ptx)  # integer-only


@pytest.mark.parametrize("fmt", ["float16", "float8_e8m0fnu", "float32", "int4", "uint8"])
def test_decode_kernel_compiles_for_sm90(fmt):
    f = get_format(fmt)
    fa, fp = format_args(f)
    k = _compile(
        kernel_module("_cast_kernel", interpret=False).decode_kernel,
        {"c_ptr": _PTR[f.code_dtype], "out_ptr": "*i32"},
        dict(FMT=fp, BLOCK=2048, I64=False),
        {"fmt": fa},
    )
    assert "st.global.v4" in k.asm["ptx"]


@pytest.mark.parametrize("fmt", list(hwcast.HW_FORMATS))
def test_hardware_cast_kernel_compiles_for_sm90(fmt):
    f = get_format(fmt)
    consts = dict(hwcast.hw_consts(f, saturate=False, subnormals=False), BLOCK=2048, I64=False)
    k = _compile(
        kernel_module("_hwcast_kernel", interpret=False).hw_encode_kernel,
        {"x_ptr": "*fp32", "out_ptr": _PTR[f.code_dtype]},
        consts,
    )
    want = {"float16": "cvt.rn.f16x2.f32", "bfloat16": "cvt.rn.bf16x2.f32"}.get(fmt, "cvt.rn.satfinite.e")
    assert want in k.asm["ptx"]
