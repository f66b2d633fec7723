"""benchmarks/gpu_validate_and_bench.py runs only on a GPU; here: it imports, parses its
arguments, splits the validation work, and refuses cleanly without CUDA."""

from __future__ import annotations

import pytest
from scripts import loaded


@pytest.fixture(scope="module")
def script():
    with loaded("gpu_validate_and_bench") as mod:
        yield mod


def test_arguments(script):
    a = script.parse_args([])
    assert a.peak_gbps == 4800.0 and a.n == 1 << 28 and not a.quick and a.budget_s < 300
    a = script.parse_args(
        ["--peak-gbps", "3350", "--quick", "--workers", "3", "--json", "out.json", "--format", "int8"]
    )
    assert (
        a.peak_gbps == 3350.0 and a.quick and a.workers == 3 and a.json == "out.json" and a.format == ["int8"]
    )
    with pytest.raises(SystemExit):
        script.parse_args(["--peak-gbps", "0"])


def test_split_formats(script):
    groups = script.split_formats(list("abcdefg"), 3)
    assert groups == [["a", "d", "g"], ["b", "e"], ["c", "f"]]
    assert script.split_formats(["a"], 16) == [["a"]]


def test_refuses_without_cuda(script, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run the script itself")
    assert script.main(["--skip-bench"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_validation_orchestration_on_the_cpu(script, tmp_path, capsys):
    """The parallel validate-kernels processes and the merged report, in the interpreter."""
    out = tmp_path / "r.json"
    argv = ["--device", "cpu", "--quick", "--workers", "2", "--format", "int4", "--format", "uint4"]
    argv += ["--rounding", "nearest_even"]
    assert script.main(argv + ["--json", str(out)]) == 0
    import json

    result = json.loads(out.read_text())
    rep = result["validation"]
    assert rep["mismatches"] == 0 and rep["unfinished"] == [] and "bandwidth" not in result
    assert {r["format"] for r in rep["cases"]} == {"int4", "uint4"}
    assert "0 mismatches" in capsys.readouterr().out
