"""Smoke tests of ``fpsim accumulate`` (--quick sizes), through its own argparse parser."""

from __future__ import annotations

import argparse
import json

import pandas as pd
import pytest

from fpsim.cli import accumulate as accumulate_cli
from fpsim.trace import sample_trace_path


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="fpsim")
    accumulate_cli.add_parser(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["accumulate", *argv])
    return args.run(args)


def test_random_sweep_quick(tmp_path, capsys):
    out = tmp_path / "r"
    assert (
        run(["--quick", "--quiet", "--out", str(out), "--accumulator", "bfloat16", "--accumulator", "14"])
        == 0
    )
    text = capsys.readouterr().out
    assert "bfloat16 RNE seq" in text and "p14 RNE seq" in text
    df = pd.read_csv(out / "accumulate.csv")
    assert sorted(df["K"].unique()) == [16, 64, 256] and len(df) == 6
    assert (df["max_rel_err"] > 0).all()
    # bfloat16 loses more than 14 bits at every K
    piv = df.pivot(index="K", columns="setting", values="rel_l2_err")
    assert (piv["bfloat16 RNE seq"] > piv["p14 RNE seq"]).all()
    meta = json.loads((out / "accumulate.json").read_text())
    assert meta["preset"] == "random" and len(meta["rows"]) == 6
    assert (out / "error_vs_k.png").stat().st_size > 1000


def test_settings_grid_and_json(tmp_path, capsys):
    argv = ["--quick", "--quiet", "--json", "--out", str(tmp_path), "--k", "8,32", "--kind", "sum"]
    argv += ["--accumulator", "float16", "--order", "sequential", "--order", "blocked", "--block", "4"]
    argv += [
        "--compensated",
        "none",
        "--compensated",
        "kahan",
        "--promote-every",
        "0",
        "--promote-every",
        "8",
    ]
    assert run(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 * 2 * 2 * 2
    assert {r["setting"] for r in rows} >= {"float16 RNE blocked/4 kahan +8", "float16 RNE seq"}


def test_deepseek_quick(tmp_path, capsys):
    assert run(["--deepseek", "--quick", "--quiet", "--out", str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "accumulate.csv")
    assert sorted(df["K"].unique()) == [128, 256, 512]
    at512 = df[df["K"] == 512].set_index("setting")
    fp32 = at512.loc["E4M3 per-tensor, FP32 accumulator"]
    rz = at512.loc["E4M3 per-tensor, 14-bit RZ"]
    promoted = at512.loc["E4M3 per-tensor, 14-bit RZ, promote 128"]
    assert fp32["rel_l2_err"] < 1e-6 < promoted["rel_l2_err"] < rz["rel_l2_err"]
    assert "DeepSeek-V3" in capsys.readouterr().out


def test_trace_gradient_accumulation(tmp_path):
    argv = ["--trace", str(sample_trace_path()), "--k", "1,2,4", "--accumulator", "bfloat16"]
    assert run([*argv, "--accumulator", "float32", "--quiet", "--out", str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "accumulate.csv").set_index(["setting", "K"])
    assert df.loc[("float32 RNE seq", 1), "max_rel_err"] == 0.0  # one float32 step is exact
    assert df.loc[("bfloat16 RNE seq", 4), "rel_l2_err"] > df.loc[("float32 RNE seq", 4), "rel_l2_err"]


def test_bad_k_is_a_usage_error():
    with pytest.raises(SystemExit):
        run(["--k", "0,4"])
