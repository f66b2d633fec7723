"""``fpsim diff REPORT_A REPORT_B``: what changed between two analyze or two replay reports.

The reports are the summary.json files the commands write; the changed values are made by
editing one report (so the expected difference is known exactly)."""

from __future__ import annotations

import json
import shutil

import pytest

from fpsim.cli.app import main
from fpsim.report.diff import diff_reports


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Two report folders as the commands write them (summary.json is ``result.summary()``, see
    fpsim.report; written here without the figures, which take longer), plus replay.csv."""
    from fpsim.analysis.run import analyze
    from fpsim.replay import replay

    root = tmp_path_factory.mktemp("reports")
    opts = {"steps": [190, 191], "progress": False, "backend": "numpy"}
    results = {
        "analysis": analyze(None, ["float16", "float8_e4m3fn"], swamping=False, **opts),
        "replay": replay(None, ["bf16-master", "fp8-states"], **opts),
    }
    for name, result in results.items():
        (root / name).mkdir()
        (root / name / "summary.json").write_text(json.dumps(result.summary(), indent=2))
    results["replay"].table().to_csv(root / "replay" / "replay.csv", index=False)
    return root


def _edited(reports, tmp_path, kind, edit):
    copy = tmp_path / f"{kind}-b"
    shutil.copytree(reports / kind, copy)
    summary = json.loads((copy / "summary.json").read_text())
    edit(summary)
    (copy / "summary.json").write_text(json.dumps(summary))
    return copy


def test_a_report_equals_itself(reports, capsys):
    for kind, entries in (("analysis", 2), ("replay", 3)):
        assert main(["diff", str(reports / kind), str(reports / kind / "summary.json")]) == 0
        out = capsys.readouterr().out
        assert out.splitlines()[0] == f"{kind} reports" and f"no differences ({entries} entries)" in out


def test_analysis_changes_per_format(reports, tmp_path, capsys):
    a = json.loads((reports / "analysis" / "summary.json").read_text())
    old = a["results"][1]["underflow"]

    def edit(s):
        s["results"][1]["underflow"] = 2 * old
        s["results"][0]["rounding"] = "stochastic"

    b = _edited(reports, tmp_path, "analysis", edit)
    assert main(["diff", str(reports / "analysis"), str(b)]) == 1
    out = capsys.readouterr().out
    assert "only in A: float16/nearest_even" in out and "only in B: float16/stochastic" in out
    assert "float8_e4m3fn/nearest_even:" in out
    assert f"underflow  {old:,} -> {2 * old:,}  (+100.00%)" in out
    assert "1 of 1 entries changed" in out
    d = diff_reports(reports / "analysis", b)
    assert [(c.entry, c.metric, c.a, c.b) for c in d.changes] == [
        ("float8_e4m3fn/nearest_even", "underflow", old, 2 * old)
    ]


def test_replay_changes_per_config_and_json(reports, tmp_path, capsys):
    def edit(s):
        s["results"][2]["mean_update_cosine"] = "nan"
        s["parameters"] += 1

    b = _edited(reports, tmp_path, "replay", edit)
    assert main(["diff", str(reports / "replay"), str(b), "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["kind"] == "replay" and got["entries"] == 3
    changes = {(c["entry"], c["metric"]): c for c in got["changes"]}
    assert set(changes) == {("", "parameters"), ("fp8-states", "mean_update_cosine")}
    assert changes["fp8-states", "mean_update_cosine"]["b"] == "nan"
    assert changes["", "parameters"]["relative"] == pytest.approx(1 / changes["", "parameters"]["a"])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda r, t: (r / "analysis", r / "replay"), "is an analysis report and"),
        (lambda r, t: (r / "analysis", t / "nothing"), "no such report"),
        (lambda r, t: (r / "analysis", r / "replay" / "replay.csv"), "not a JSON summary"),
        (
            lambda r, t: (r / "analysis", _write(t / "x.json", {"a": 1})),
            "expected a summary with a 'results'",
        ),
    ],
)
def test_bad_reports_are_refused(reports, tmp_path, capsys, make, message):
    a, b = make(reports, tmp_path)
    assert main(["diff", str(a), str(b)]) == 2
    assert message in capsys.readouterr().err


def _write(path, obj):
    path.write_text(json.dumps(obj))
    return path
