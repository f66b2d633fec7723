"""``fpsim analyze --by role`` and ``--te`` on a small capture with operands (oracles: numpy, ml_dtypes)."""

from __future__ import annotations

import contextlib
import io
import json

import ml_dtypes
import numpy as np
import pytest

from fpsim.analysis.roles import te_view
from fpsim.cli.app import main
from fpsim.trace import TorchCapture, open_trace

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    path = tmp_path_factory.mktemp("cap") / "t"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 8) * 3, torch.randint(0, 4, (32,))
    with TorchCapture(model, path, operands=True) as cap:
        for step in range(4):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            cap.step(step, loss=loss)
            opt.step()
    return path


@pytest.fixture(scope="module")
def analyzed(capture, tmp_path_factory):
    """One ``fpsim analyze --by role --te delayed --json`` run: (printed JSON, output folder)."""
    out = tmp_path_factory.mktemp("report")
    argv = [str(capture), "--format", "float16", "--format", "float8_e5m2", "--no-swamping", "--quiet"]
    argv += ["--backend", "numpy", "--by", "role", "--te", "delayed", "--out", str(out), "--json"]
    capture_out = io.StringIO()
    with contextlib.redirect_stdout(capture_out):
        assert main(["analyze", *argv]) == 0
    return json.loads(capture_out.getvalue()), out


def test_by_role_totals_per_format_and_role(capture, analyzed):
    summary, out = analyzed
    rows = summary["by_role"]
    assert {(r["format"], r["role"]) for r in rows} == {
        (f, role) for f in ("float16", "float8_e5m2") for role in ("grad", "input", "grad_output")
    }
    trace = open_trace(capture)
    for r in rows:
        xs = [np.asarray(trace.read(e), np.float32).ravel() for e in trace.entries(role=r["role"])]
        x = np.concatenate(xs)
        q = x.astype(ml_dtypes.float8_e5m2 if r["format"] == "float8_e5m2" else np.float16).astype(np.float32)
        assert r["elements"] == x.size and r["nonzero"] == np.count_nonzero(x)
        assert r["underflow"] == np.count_nonzero((x != 0) & (q == 0)), r
    assert json.loads((out / "by_role.json").read_text()) == rows


def test_te_view_delayed_scaling_over_the_recorded_steps(capture, analyzed):
    view = analyzed[0]["te_view"]
    assert view["scaling"] == "delayed" and view["every_step"] is True
    trace = open_trace(capture)
    for row in view["roles"]:
        fmt, fmax = (
            (ml_dtypes.float8_e4m3fn, 448.0) if row["role"] == "input" else (ml_dtypes.float8_e5m2, 57344.0)
        )
        underflow = saturated = 0
        for name in trace.names(row["role"]):
            history = []
            for step in trace.steps:
                x = np.asarray(trace.read(trace.entry(step, name, row["role"])), np.float32).ravel()
                scale = np.float32(1) if not history else np.float32(fmax) / np.float32(max(history))
                y = x * scale
                saturated += np.count_nonzero(np.abs(y) > fmax)
                q = np.clip(y, -fmax, fmax).astype(fmt).astype(np.float32)
                underflow += np.count_nonzero((x != 0) & (q == 0))
                history.append(np.abs(x).max())
        assert (row["underflow"], row["saturated"]) == (underflow, saturated), row
    assert {r["role"] for r in view["roles"]} == {"input", "grad_output"}


def test_te_view_current_scaling(capture):
    view = te_view(capture, "current", backend="numpy").summary()
    assert view["scaling"] == "current"
    trace = open_trace(capture)
    for row in view["roles"]:
        fmt, fmax = (
            (ml_dtypes.float8_e4m3fn, 448.0) if row["role"] == "input" else (ml_dtypes.float8_e5m2, 57344.0)
        )
        assert row["format"] == ("e4m3_tensor" if row["role"] == "input" else "e5m2_tensor")
        underflow = saturated = 0
        for e in trace.entries(role=row["role"]):
            x = np.asarray(trace.read(e), np.float32).ravel()
            scale = np.float32(fmax) / np.abs(x).max()
            el = np.clip(x * scale, -fmax, fmax).astype(fmt).astype(np.float32)
            q = el * (np.float32(1) / scale)  # decoded with the float32 decode scale
            # saturated, as the analysis defines it: the element is +-max and |x| > |q|
            saturated += np.count_nonzero((np.abs(el) == fmax) & (np.abs(x) > np.abs(q)))
            underflow += np.count_nonzero((x != 0) & (q == 0))
        assert (row["underflow"], row["saturated"]) == (underflow, saturated), row


def test_te_view_needs_operands(tmp_path, capsys):
    from fpsim.trace import sample_trace_path

    assert (
        main(["analyze", str(sample_trace_path()), "--te", "current", "--quiet", "--out", str(tmp_path)]) == 2
    )
    assert "no GEMM operands" in capsys.readouterr().err
