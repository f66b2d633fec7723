"""The fixed cost of the verbs: on a small trace ``fpsim formats``, ``analyze``, ``replay`` and
``diff`` import none of the heavy libraries (figures only with ``--figures``, the numba loops
only from :data:`fpsim._compiled.COMPILED_FROM` elements, CSV files without pandas, ml_dtypes
only for the small float types); ``benchmarks/bench_cli.py`` times them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fpsim import Backend
from fpsim._compiled import COMPILED_FROM, available
from fpsim.cli.app import _COMMANDS, build_parser
from fpsim.trace import TraceWriter

HEAVY = ("matplotlib", "pandas", "numba", "scipy", "ml_dtypes", "torch", "jax", "dask")


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    """2 steps of 500 float32 gradients, parameters at the first (the benchmark's trace)."""
    path = tmp_path_factory.mktemp("cost") / "trace"
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 25)).astype(np.float32)
    with TraceWriter(path) as writer:
        for step in (1, 2):
            tensors = {
                "grad": {"w": w * np.float32(1e-3 * step)},
                **({"param": {"w": w}} if step == 1 else {}),
            }
            writer.write_step(step, tensors, loss=1.0, lr=1e-3, update=step)
    return path


def test_the_verbs_import_none_of_the_heavy_libraries(small_trace, tmp_path):
    a, b, r = (str(tmp_path / n) for n in ("a", "b", "r"))
    code = f"""
import sys
from fpsim.cli import main
assert main(["formats"]) == 0
assert main(["analyze", {str(small_trace)!r}, "--out", {a!r}, "--quiet"]) == 0
assert main(["analyze", {str(small_trace)!r}, "--out", {b!r}, "--quiet", "--format", "float16"]) == 0
assert main(["replay", {str(small_trace)!r}, "--out", {r!r}, "--quiet"]) == 0
assert main(["diff", {a!r}, {b!r}]) == 1
print([m for m in {HEAVY!r} if m in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert not list((tmp_path / "a").glob("*.png")) and not list((tmp_path / "r").glob("*.png"))
    assert (
        "(Figures not drawn: `fpsim analyze --figures` draws them.)"
        in (tmp_path / "a" / "report.md").read_text()
    )
    assert "(Not drawn: `fpsim replay --figures`.)" in (tmp_path / "r" / "report.md").read_text()


def test_auto_runs_small_work_on_numpy():
    assert Backend.resolve("auto", elements=COMPILED_FROM - 1) is Backend.NUMPY
    big = Backend.COMPILED if available() else Backend.NUMPY
    assert Backend.resolve("auto", elements=COMPILED_FROM) is big and Backend.resolve("auto") is big
    if available():  # an explicit choice is kept, whatever the size
        assert Backend.resolve("compiled", elements=1) is Backend.COMPILED


def test_the_parser_of_one_command_is_that_command_s():
    full = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(full.choices) == list(_COMMANDS)  # the names main looks for are the commands'
    one = next(a for a in build_parser("diff")._actions if a.dest == "command")
    assert list(one.choices) == ["diff"]
