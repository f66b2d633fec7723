"""The compiled pieces of an emulated GEMM operand: the Hadamard transform against the numpy
tier's butterfly, and a format the fused quantize-dequantize does not cover, said so once.
(The operands themselves on both backends: tests/train/test_gemm.py; the fused cast:
tests/emulate/test_fused.py.)"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fpsim
from fpsim import _compiled
from fpsim.formats import FORMATS
from fpsim.train import gemm as G

pytest.importorskip("numba")


def test_compiled_hadamard_is_the_numpy_butterfly():
    """Bit for bit (NaN by class) over many binades, with infinities (inf - inf), NaN, -0,
    subnormals and values whose float64 sums round to float32."""
    rng = np.random.default_rng(3)
    a = np.ldexp(rng.standard_normal((37, 64)), rng.integers(-140, 120, (37, 64))).astype(np.float32)
    a[0, :6] = [np.nan, np.inf, -np.inf, -0.0, 1e-45, 3e38]
    a[1, :3] = [np.inf, np.inf, -np.inf]
    want = G.hadamard16(a)
    got = G.hadamard16(a, fpsim.Backend.COMPILED)
    nan = np.isnan(want)
    assert nan.sum() > 16 and np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    with pytest.raises(ValueError, match="divisible by 16"):
        G.hadamard16(a[:, :40], fpsim.Backend.COMPILED)


def test_an_uncovered_format_is_said_once_and_runs_unfused(monkeypatch):
    monkeypatch.setattr(_compiled, "_warned", set())
    op = G.OperandRecipe(FORMATS["float32"])
    a = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for _ in range(3):
            q, _ = G.quantize_operand(a, op, fpsim.Backend.COMPILED)
    said = [str(w.message) for w in got if issubclass(w.category, fpsim.FallbackWarning)]
    assert len(said) == 1 and "float32: formats of 32 bits" in said[0], said
    assert np.array_equal(q, a)  # float32 stores float32 as it is
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        h = G.hadamard16(a.astype(np.float64), fpsim.Backend.COMPILED)
    said = [str(w.message) for w in got if issubclass(w.category, fpsim.FallbackWarning)]
    assert len(said) == 1 and "Hadamard transform of float64" in said[0], said
    assert np.array_equal(h, G.hadamard16(a))


def test_operands_that_transpose_are_their_transposed_cast():
    """OperandRecipe.transposes (the layer casts such a role once per step and reads it
    transposed in the other GEMM) holds on the numpy tier: fpsim.quantize of x^T is that of x,
    transposed, bit for bit (NaN by class), on ragged tiles; the operands it excludes differ."""
    ops = {
        op.format.name: op
        for r in G.GEMM_RECIPES.values()
        for op in (r.input, r.weight, r.grad_output)
        if not isinstance(op.format, fpsim.DelayedScaling)  # (cast once per step by design)
    }
    shared = {name for name, op in ops.items() if op.transposes}
    assert shared == {"bfloat16", "e4m3_tensor", "e5m2_tensor", "e4m3_tile128", "nvfp4_tile16"}
    rng = np.random.default_rng(4)
    x = np.ldexp(rng.standard_normal((150, 40)), rng.integers(-30, 30, (150, 40))).astype(np.float32)
    x[3, 5], x[7, 1], x[140, 39] = np.nan, np.inf, -0.0
    for name, op in ops.items():
        a = np.asarray(fpsim.quantize(np.ascontiguousarray(x.T), op.format, backend="numpy"))
        b = np.asarray(fpsim.quantize(x, op.format, backend="numpy")).T
        nan = np.isnan(a)
        same = np.array_equal(nan, np.isnan(b)) and np.array_equal(
            a[~nan].view(np.uint32), b[~nan].view(np.uint32)
        )
        assert same == (name in shared), name
