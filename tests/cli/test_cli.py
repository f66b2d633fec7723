"""The command line: ``fpsim formats``, the exhaustive check on a small range, ``--backend``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import fpsim
from fpsim.cli.app import main


def test_formats_table_lists_every_format(capsys):
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    formats, recipes = out.strip().split("\n\n")
    lines = formats.splitlines()
    assert lines[0].split()[0] == "format"
    assert [ln.split()[0] for ln in lines[1:]] == list(fpsim.FORMATS)
    rec = recipes.splitlines()
    assert rec[0].split()[0] == "recipe"
    assert [ln.split()[0] for ln in rec[1:]] == list(fpsim.RECIPES)
    mx = next(ln for ln in rec if ln.startswith("mxfp4_e2m1 "))
    assert mx.split()[-1] == "4.25"  # 4 bits + an 8-bit scale per 32 elements
    e4m3 = next(ln for ln in lines if ln.startswith("float8_e4m3fn "))
    assert "448" in e4m3.split() and "0x7e" in e4m3.split()


def test_formats_json_matches_the_formats(capsys):
    assert main(["formats", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == [*fpsim.FORMATS, *fpsim.RECIPES]
    for r in rows:
        if r["kind"] == "block":
            recipe = fpsim.get_format(r["name"])
            assert r["bits_per_element"] == recipe.bits_per_element and r["element"] == recipe.element.name
            continue
        fmt = fpsim.get_format(r["name"])
        assert r["max"] == float(fmt.max) and r["bits"] == fmt.bits
        if r["kind"] == "float":
            assert r["code_of_nan"] == fmt.code_of_nan and r["min_subnormal"] == fmt.min_subnormal


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "fpsim.cli.app", "formats", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)[0]["name"] == "float32"


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "bfloat16"])
def test_exhaustive_on_a_slice_reports_no_mismatch(fmt, capsys):
    # the slice holds 1.0 .. 2.0 and its neighbours, plus the NaN/inf patterns
    assert main(["exhaustive", fmt, "--start", "0x3f700000", "--stop", "0x3f900000", "--quiet"]) == 0
    assert main(["exhaustive", fmt, "--start", "0x7f700000", "--stop", "0x80000000", "--quiet"]) == 0
    assert "0 mismatches" in capsys.readouterr().out


def test_exhaustive_reports_an_injected_disagreement(capsys, monkeypatch):
    """An encoder that is wrong on exactly two inputs: both are counted and the first named."""
    import fpsim.analysis.exhaustive as ex

    right = ex._encoder

    def wrong(fmt, backend):
        enc = right(fmt, backend)

        def run(x):
            codes = enc(x).copy()
            bits = x.view(np.uint32)
            codes[(bits == 0x3F800000) | (bits == 0x3F800001)] ^= 1  # 1.0 and its neighbour
            return codes

        return run

    monkeypatch.setattr(ex, "_encoder", wrong)
    code = main(["exhaustive", "float8_e4m3fn", "--start", "0x3f700000", "--stop", "0x3f900000", "--quiet"])
    out = capsys.readouterr().out
    assert code == 1 and "2 mismatches" in out and "input 0x3f800000" in out, out


def test_exhaustive_e8m0_from_float32_subnormals(capsys):
    """E8M0 from float32 subnormals (README, "Conventions (and where other tools differ)"):
    ml_dtypes 0.6 rounds (2**-127, 2**-126) up, a real disagreement on 1048575 inputs; 0.7
    rounds them to nearest, as fpsim does."""
    import ml_dtypes

    code = main(["exhaustive", "float8_e8m0fnu", "--start", "0x00400000", "--stop", "0x00500000", "--quiet"])
    out = capsys.readouterr().out
    if tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2]) < (0, 7):
        assert code == 1 and "1048575 mismatches" in out and "input 0x00400001" in out
    else:
        assert code == 0 and "0 mismatches" in out, out


def test_exhaustive_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        main(["exhaustive", "int8"])
    assert "invalid choice" in capsys.readouterr().err
    assert main(["exhaustive", "float16", "--start", "5", "--stop", "5", "--quiet"]) == 2
    assert "--start 0x5 must be below --stop 0x5" in capsys.readouterr().err


def test_analyze_backend_flag_gives_the_same_summary(capsys, tmp_path, monkeypatch):
    """``--backend numpy`` and ``--backend compiled`` reach analyze() and give the same summary."""
    pytest.importorskip("numba")
    import fpsim.analysis.run as run

    seen = []
    real = run.analyze
    monkeypatch.setattr(run, "analyze", lambda *a, **kw: seen.append(kw["backend"]) or real(*a, **kw))
    args = ["analyze", "--format", "float8_e4m3fn", "--recipe", "nvfp4", "--no-swamping", "--quiet", "--json"]
    summaries = []
    for backend in ("numpy", "compiled"):
        assert main([*args, "--backend", backend, "--out", str(tmp_path / backend)]) == 0
        summaries.append(json.loads(capsys.readouterr().out))
    assert seen == ["numpy", "compiled"]
    assert summaries[0] == summaries[1]


def test_replay_backend_flag_reaches_replay(capsys, tmp_path, monkeypatch):
    import fpsim.replay as replay_package

    seen = []
    real = replay_package.replay
    spy = lambda *a, **kw: seen.append(kw["backend"]) or real(*a, **kw)  # noqa: E731
    monkeypatch.setattr(replay_package, "replay", spy)
    argv = ["replay", "--config", "bf16-master", "--steps", "190:192", "--quiet", "--json"]
    assert main([*argv, "--backend", "numpy", "--out", str(tmp_path)]) == 0
    assert seen == ["numpy"] and json.loads(capsys.readouterr().out)["results"][1]["config"] == "bf16-master"
    with pytest.raises(SystemExit):
        main(["replay", "--backend", "gpu"])
    assert "invalid choice" in capsys.readouterr().err
