"""benchmarks/complexity.py counts parameters and lines and marks Triton kernels as written:
checked on a small tree made here, where every number is known by construction."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from scripts import loaded

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "complexity.py"

KERNEL = """import triton
import triton.language as tl

_jit = (lambda fn: fn) if FLAG else triton.jit


@triton.jit
def k(a, b, c, N: tl.constexpr):
    pass


@triton.jit(do_not_specialize=["a"])
def k2(a, b):
    pass


@_jit
def helper(a, *rest, **kw):
    pass
"""
PACKAGE = """from numba import njit as jit


@jit
def loop(a, b, c, d, e):
{body}

class C:
    def method(self, x, /, y, *, z):
        def inner(q):
            return q
        return inner
"""


@pytest.fixture(scope="module")
def script():
    with loaded("complexity") as mod:
        yield mod


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "fpsim" / "kernels").mkdir(parents=True)
    (tmp_path / "fpsim" / "sub").mkdir(parents=True)
    (tmp_path / "fpsim" / "kernels" / "k.py").write_text(KERNEL)
    body = "\n".join(f"    x{i} = {i}" for i in range(85))  # def line + 85 body lines = 86
    (tmp_path / "fpsim" / "sub" / "m.py").write_text(PACKAGE.format(body=body))
    return tmp_path


def test_counts_and_marks(script, tree):
    found = {f.name: f for f in script.collect(tree)}
    assert set(found) == {"k", "k2", "helper", "loop", "C.method", "C.method.inner"}
    assert [found[n].params for n in ("k", "k2", "helper", "loop", "C.method", "C.method.inner")] == [
        4, 2, 3, 5, 4, 1,
    ]  # fmt: skip
    assert {n for n, f in found.items() if f.jit} == {"k", "k2", "helper"}  # not numba's jit
    assert found["loop"].length == 86 and found["loop"].path == "fpsim/sub/m.py"
    assert found["C.method"].length == 4


def test_report_lists_the_top_signatures_and_the_long_functions(script, tree):
    out = script.report(script.collect(tree), top=3, lines=80).splitlines()
    assert out[0].startswith("largest signatures (top 3 of 6 functions")
    top = ["     5       fpsim/sub/m.py:5 loop", "     4  jit  fpsim/kernels/k.py:8 k"]
    assert out[2:5] == [*top, "     4       fpsim/sub/m.py:93 C.method"]  # ties by path, then line
    assert out[6:] == [
        "functions over 80 lines (1)",
        " lines  jit  function",
        "    86       fpsim/sub/m.py:5 loop",
    ]


def test_runs_as_a_script_and_refuses_bad_arguments(tree):
    run = [sys.executable, str(SCRIPT), str(tree), "--top", "1"]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert "     5       fpsim/sub/m.py:5 loop" in out and "fpsim/kernels/k.py:8 k" not in out
    bad = subprocess.run([*run[:-1], "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--top and --lines must be positive, got 0" in bad.stderr


def test_before_compares_with_a_git_revision(script, tree, capsys):
    """``--before REV`` reads REV's sources from git (nothing checked out) and prints both."""
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "fpsim"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    (tree / "fpsim" / "sub" / "m.py").write_text("def loop(a):\n    return a\n")  # 5 -> 1 parameter
    before = script.collect_at(tree, "HEAD")
    assert {f.name: f.params for f in before}["loop"] == 5  # the committed file, not the edited one
    script.main([str(tree), "--before", "HEAD", "--top", "1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "before (HEAD)" and "     5       fpsim/sub/m.py:5 loop" in out
    assert out[-1] == "largest signature 5 -> 4; functions over 80 lines 1 -> 0"
    with pytest.raises(SystemExit):
        script.main([str(tree), "--before", "no-such-rev"])
    assert "--before no-such-rev: git archive of" in capsys.readouterr().err
