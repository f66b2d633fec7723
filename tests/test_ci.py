"""What ``.ci/run`` checks beyond the README's test command: the suite with SIGINT ignored, and
the CPU-dispatch matrix (the tests marked ``dispatch`` again with numpy's SIMD dispatch masked
and numba compiling for a generic CPU), which is real only if the masks take effect."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI = (ROOT / ".ci" / "run").read_text()

TIER_COMPARISONS = (
    "analysis/test_compiled_analysis.py",  # compiled analysis vs the numpy tier
    "analysis/test_analyze_backend.py",
    "emulate/test_compiled_encode.py",  # compiled encode vs the numpy tier
    "emulate/test_block_backend.py",
    "emulate/test_jax.py",  # JAX vs the numpy tier
    "emulate/test_scaling_rules.py",  # the numpy tier's block scaling vs the oracles
    "emulate/test_scaling_oracles.py",
    "formats/test_amax.py",  # the amax every tier's block scaling rests on
    "replay/test_compiled.py",  # compiled replay loops vs the numpy tier
    "replay/test_compiled_states.py",  # the compiled training step's state formats vs numpy
)
MASKS = ("X86_V4 AVX512_ICL AVX512_SPR", "X86_V3 X86_V4 AVX512_ICL AVX512_SPR")


def test_ci_ignores_sigint_before_the_suite():
    lines = CI.splitlines()
    suite = next(i for i, line in enumerate(lines) if "python -m pytest -n auto --durations=15" in line)
    assert "trap '' INT" in lines[:suite]


def test_ci_reruns_the_dispatch_tests_under_each_mask_with_generic_numba():
    loop = re.search(r"for mask in (.*); do\n(.*?)\ndone", CI, re.S)
    assert loop, ".ci/run has no loop over dispatch masks"
    assert tuple(re.findall(r'"([^"]+)"', loop[1])) == MASKS
    body = loop[2]
    assert 'NPY_DISABLE_CPU_FEATURES="$mask" NUMBA_CPU_NAME=generic python -m pytest' in body
    assert "-m dispatch" in body


@pytest.mark.parametrize("path", TIER_COMPARISONS)
def test_tier_comparisons_are_in_the_dispatch_matrix(path):
    text = (ROOT / "tests" / path).read_text()
    assert re.search(r"^pytestmark = pytest\.mark\.dispatch\b", text, re.M), f"tests/{path} is not marked"


def test_every_marked_file_is_listed_as_a_tier_comparison():
    marked = {
        str(p.relative_to(ROOT / "tests"))
        for p in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"^pytestmark = pytest\.mark\.dispatch\b", p.read_text(), re.M)
    }
    assert marked == set(TIER_COMPARISONS)


def test_notebooks_are_in_the_dispatch_matrix():
    """Every notebook with compared text outputs runs in the matrix (the first six at least)."""
    import test_notebooks

    params = test_notebooks._run_params()
    marked = {p.values[0].stem for p in params if any(m.name == "dispatch" for m in p.marks)}
    wanted = {p.stem for p in test_notebooks.NOTEBOOKS if test_notebooks.compares_text(p)}
    assert marked == wanted and len(marked) >= 6, (marked, wanted)


@pytest.mark.dispatch
def test_the_mask_takes_effect():
    """Under ``NPY_DISABLE_CPU_FEATURES``, every feature it names that numpy dispatches on is
    off at run time, and numba compiles for the CPU ``NUMBA_CPU_NAME`` names; without them (the
    suite's default run) there is nothing to check."""
    mask, cpu = os.environ.get("NPY_DISABLE_CPU_FEATURES"), os.environ.get("NUMBA_CPU_NAME")
    if not mask and not cpu:
        pytest.skip("no dispatch mask in this run (.ci/run sets one for the tests marked dispatch)")
    if mask:
        from numpy._core import _multiarray_umath as umath

        known = [f for f in mask.split() if f in umath.__cpu_features__]
        assert known, f"numpy knows none of {mask!r}"
        assert not [f for f in known if umath.__cpu_features__[f]], umath.__cpu_features__
    if cpu:
        numba = pytest.importorskip("numba")
        assert numba.config.CPU_NAME == cpu
