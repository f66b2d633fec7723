"""``fpsim analyze`` and :func:`fpsim.analysis.run.analyze` on real traces.

Oracles: ml_dtypes casts of tensors read with the ``safetensors`` library (not fpsim's
reader) for the bundled trace, and gradients copied straight out of a torch training loop for
a trace captured from a different model.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pandas as pd
import pytest

from fpsim.analysis import analyze
from fpsim.analysis.run import select_entries, tensor_seed
from fpsim.cli.app import main
from fpsim.trace import TraceWriter, open_trace, sample_trace_path
from fpsim.trace.remote import index_trace

PLAIN = {
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}


def direct_counts(x: np.ndarray, dtype) -> dict[str, int]:
    with np.errstate(over="ignore", invalid="ignore"):
        q = x.astype(dtype).astype(np.float32)
    nz = np.isfinite(x) & (x != 0)
    return {
        "nonzero": int(nz.sum()),
        "underflow": int((nz & (q == 0)).sum()),
        "overflow": int((np.isfinite(x) & ~np.isfinite(q)).sum()),
    }


def test_bundled_trace_underflow_equals_direct_ml_dtypes_counts():
    st = pytest.importorskip("safetensors.numpy")
    result = analyze(None, list(PLAIN), progress=False, swamping=False)
    manifest = json.loads((sample_trace_path() / "manifest.json").read_text())
    checked = 0
    for step in manifest["steps"]:
        tensors = st.load_file(str(sample_trace_path() / step["file"]))
        for t in step["tensors"]:
            if t["role"] != "grad":
                continue
            x = tensors[t["key"]]
            for name, dtype in PLAIN.items():
                p = result.results[(step["step"], "grad", t["name"], name, "nearest_even")]
                want = direct_counts(x, dtype)
                assert (p.nonzero, p.underflow, p.overflow) == (
                    want["nonzero"],
                    want["underflow"],
                    want["overflow"],
                ), (step["step"], t["name"], name)
                checked += 1
    assert checked == len(manifest["steps"]) * 18 * len(PLAIN)
    # the sample trace really shows the effect fpsim is for: e4m3 flushes gradients to zero
    assert result.totals()["float8_e4m3fn", "nearest_even"].underflow > 1000


def test_trace_captured_from_a_different_model(tmp_path):
    """A small CNN trained a few steps; counts from fpsim equal counts on the live .grad tensors."""
    torch = pytest.importorskip("torch")
    from fpsim.trace import TorchCapture

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 3, (16,))
    live = {}
    with TorchCapture(model, tmp_path / "cnn", every=2, params=True, optimizer=opt) as cap:
        for step in range(6):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x) * 1e-3, y)
            loss.backward()
            if cap.step(step, loss=loss.item()):
                live[step] = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()}
            opt.step()
    result = analyze(tmp_path / "cnn", list(PLAIN), progress=False)
    assert sorted(live) == [0, 2, 4]
    for step, grads in live.items():
        for name, g in grads.items():
            for fmt, dtype in PLAIN.items():
                p = result.results[(step, "grad", name, fmt, "nearest_even")]
                want = direct_counts(g, dtype)
                assert (p.nonzero, p.underflow, p.overflow) == (
                    want["nonzero"],
                    want["underflow"],
                    want["overflow"],
                )
    # params and lr were recorded, so swamping is measured for every element format
    assert ("float16", "stochastic") in result.swamping_totals()


def test_cli_writes_every_output_and_json_has_the_required_keys(tmp_path, capsys):
    out = tmp_path / "rep"
    code = main(
        [
            "analyze",
            "--format",
            "float16",
            "--format",
            "float8_e4m3fn",
            "--recipe",
            "mxfp8_e4m3",
            "--rounding",
            "nearest_even",
            "--rounding",
            "stochastic",
            "--out",
            str(out),
            "--json",
            "--quiet",
            "--figures",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert [(r["format"], r["rounding"]) for r in summary["results"]] == [
        ("float16", "nearest_even"),
        ("float16", "stochastic"),
        ("float8_e4m3fn", "nearest_even"),
        ("float8_e4m3fn", "stochastic"),
        ("mxfp8_e4m3", "nearest_even"),
        ("mxfp8_e4m3", "stochastic"),
    ]
    required = {
        "format",
        "rounding",
        "elements",
        "nonzero",
        "underflow",
        "subnormal",
        "overflow",
        "saturated",
        "sqnr_db",
        "rel_l2_error",
        "underflow_energy_share",
    }
    for r in summary["results"]:
        assert required <= set(r)
    assert summary["results"][0]["swamping_nearest_even"]["swamped_share"] > 0.5
    assert json.loads((out / "summary.json").read_text()) == summary
    table = pd.read_csv(out / "metrics.csv")
    assert list(table.columns) == ["step", "role", "tensor", "format", "rounding", "metric", "value"]
    one = table[
        (table.step == 200)
        & (table.tensor == "head.weight")
        & (table.format == "float16")
        & (table.rounding == "nearest_even")
    ]
    assert set(one.metric) >= required - {"format", "rounding"}
    assert (out / "magnitudes.png").stat().st_size > 10_000 and (out / "underflow_by_tensor.png").exists()
    assert "![magnitude histogram](magnitudes.png)" in (out / "report.md").read_text()


def test_cli_prints_a_readable_table(tmp_path, capsys):
    assert main(["analyze", "--format", "bfloat16", "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "29 steps, 18 tensors" in out and "bfloat16" in out and "underflow" in out


def _npz_trace(folder: Path, arrays: dict[str, np.ndarray]) -> Path:
    folder.mkdir()
    np.savez(folder / "grads_step7.npz", **arrays)
    return folder


def test_nan_and_inf_gradients_are_counted_not_fatal(tmp_path, capsys):
    g = np.array([1.0, np.nan, np.inf, -np.inf, 1e-9], np.float32)
    trace = _npz_trace(tmp_path / "t", {"w": g})
    assert (
        main(
            ["analyze", str(trace), "--format", "float16", "--out", str(tmp_path / "o"), "--json", "--quiet"]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out)["results"][0]
    assert (r["nan_in"], r["inf_in"], r["nonzero"], r["underflow"]) == (1, 2, 2, 1)


@pytest.mark.parametrize("kind", ["missing", "truncated", "non_float", "manifest"])
def test_bad_input_is_a_clear_error_naming_the_file(kind, tmp_path, capsys):
    if kind == "missing":
        path = tmp_path / "nope"
    elif kind == "non_float":
        path = _npz_trace(tmp_path / "t", {"w": np.ones(3, np.float32), "idx": np.arange(3)})
    else:
        path = tmp_path / "copy"
        path.mkdir()
        for f in sample_trace_path().iterdir():
            (path / f.name).write_bytes(f.read_bytes())
        if kind == "truncated":
            f = path / "step_000050.safetensors"
            f.write_bytes(f.read_bytes()[:1000])
        else:
            (path / "step_000050.safetensors").unlink()
    code = main(["analyze", str(path), "--format", "float16", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code != 0
    if kind == "missing":
        assert str(path) in err
    elif kind == "non_float":
        assert "grads_step7.npz" in err and "idx" in err and "not a float" in err
    else:
        assert "step_000050.safetensors" in err


def test_trace_and_its_index_select_the_same_tensors(tmp_path):
    """What the Dask plan measures (an index's locations) is what analyze measures (a trace's
    entries), seeded alike; a non-float tensor is named by its file (an index: its URL)."""
    tr = open_trace(sample_trace_path())
    entries = select_entries(tr, ["param", "grad"], [tr.steps[-1]])
    located = select_entries(index_trace(tr), ("param", "grad"), {tr.steps[-1]})
    assert entries and [t.entry for t in located] == entries
    assert {e.role for e in entries} == {"grad", "param"} and {e.step for e in entries} == {tr.steps[-1]}
    assert tensor_seed(7, 3, "grad", "w") == 7 ^ zlib.crc32(b"3:grad:w")
    with pytest.raises(ValueError, match="no tensors with roles"):
        select_entries(index_trace(tr), ["state.none"], None)
    path = _npz_trace(tmp_path / "t", {"w": np.ones(3, np.float32), "idx": np.arange(3)})
    for source in (open_trace(path), index_trace(path)):
        with pytest.raises(TypeError, match="grads_step7.npz: tensor 'grad:idx' has dtype int64"):
            select_entries(source, ["grad"], None)


def test_unknown_format_lists_the_choices(capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "--format", "float7"])
    err = capsys.readouterr().err
    assert "invalid choice: 'float7'" in err and "float8_e4m3fn" in err


def test_single_files_and_pt_folders_are_accepted(tmp_path):
    torch = pytest.importorskip("torch")
    g = torch.randn(50, 20) * 1e-6
    (tmp_path / "pt").mkdir()
    torch.save({"layer.weight": g, "layer.bias": g[0].to(torch.bfloat16)}, tmp_path / "pt" / "step_3.pt")
    res = analyze(tmp_path / "pt", ["float16"], progress=False)
    p = res.results[(3, "grad", "layer.weight", "float16", "nearest_even")]
    assert p.underflow == direct_counts(g.numpy(), np.float16)["underflow"] > 0
    bias = res.results[(3, "grad", "layer.bias", "float16", "nearest_even")]
    assert bias.elements == 20
    with TraceWriter(tmp_path / "w") as w:
        w.write_step(5, {"grad": {"a": g.numpy()}}, lr=0.1)
    single = analyze(tmp_path / "w" / "step_000005.safetensors", ["float16"], progress=False)
    assert single.results[(5, "grad", "a", "float16", "nearest_even")].totals() == p.totals()
