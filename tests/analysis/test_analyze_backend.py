"""``analyze(backend=...)`` and ``measure(backend=...)``: the same partials on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.analysis import analyze
from fpsim.analysis.metrics import measure

pytestmark = pytest.mark.dispatch  # .ci/run reruns these with the SIMD dispatch masked

RECIPES = ["bnb_dynamic8_block256", "bnb_dynamic8u_block256", "int8_block256", "float8_e4m3fn"]
STEPS = (10, 199, 200)  # of the bundled trace: the first, and two late ones (its small gradients)


def test_analyze_numpy_and_compiled_give_the_same_partials():
    pytest.importorskip("numba")
    kw = dict(steps=STEPS, progress=False, swamping=False)
    got = {b: analyze(None, RECIPES, backend=b, **kw) for b in ("numpy", "compiled")}
    assert got["numpy"].results.keys() == got["compiled"].results.keys()
    assert {k[0] for k in got["numpy"].results} == set(STEPS)
    for k, p in got["numpy"].results.items():
        assert p.totals() == got["compiled"].results[k].totals(), k
        assert np.array_equal(p.hist, got["compiled"].results[k].hist), k


def test_measure_takes_a_backend():
    pytest.importorskip("numba")
    x = np.random.default_rng(1).standard_normal((3, 1000)).astype(np.float32)
    a = measure(x, "bnb_dynamic8_block256", backend="numpy", with_hist=True)
    b = measure(x, "bnb_dynamic8_block256", backend="compiled", with_hist=True)
    assert a.totals() == b.totals() and np.array_equal(a.hist, b.hist)


def test_analyze_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="auto, numpy, compiled"):
        analyze(None, ["float16"], progress=False, backend="gpu")
