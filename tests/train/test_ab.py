"""fpsim.train.ab and ``fpsim ab``: the same start and batches for every configuration, the
measured state bytes, the outputs."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fpsim.cli import main  # noqa: E402
from fpsim.train.ab import MODELS, digits, digits_data, run_ab, state_bytes  # noqa: E402
from fpsim.train.gemm import GEMM_RECIPES  # noqa: E402
from fpsim.train.torch import AdamW, convert, gemm_stats  # noqa: E402


def _train_by_hand(model, opt, batches) -> list[float]:
    """The loop one writes by hand: its losses, step by step."""
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses


def test_digits_are_deterministic_and_in_range():
    x, y = digits(3, n=256)
    x2, y2 = digits(3, n=256)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert x.shape == (256, 64) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    assert set(np.unique(y)) == set(range(10))


def test_run_ab_matches_a_hand_written_loop():
    """Each run equals the loop one would write by hand with the same start and batches, and
    its held-out accuracy is that of the hand-written loop's final model."""
    m = MODELS["digits-mlp"]
    batches = m.batches(0, 6)
    held_x, held_y = m.data(0).held_out()
    res = run_ab(
        m.build, batches, ["fp32", "int8-states"], steps=6, lr=1e-2, progress=False, held_out=(held_x, held_y)
    )
    torch.manual_seed(0)
    model = m.build()
    opt = AdamW(model.named_parameters(), lr=1e-2, config="int8-states")
    losses = _train_by_hand(model, opt, batches)
    assert res.losses["int8-states"] == losses
    with torch.no_grad():
        right = sum(int(model(held_x[i : i + 1]).argmax()) == int(held_y[i]) for i in range(len(held_y)))
    assert res.accuracy["int8-states"] == right / len(held_y)
    assert res.summary()["results"][1]["accuracy"] == right / len(held_y)
    assert res.losses["fp32"][0] == losses[0]  # same start, same first batch
    measured = state_bytes(opt) / res.parameters
    assert res.bytes_per_param["int8-states"] == measured < 2.1
    assert res.bytes_per_param["fp32"] == 8.0


def test_digits_mlp_trains_on_the_real_uci_digits_where_scikit_learn_is_installed():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    data = digits_data(1)
    assert data.source.startswith("UCI digits (scikit-learn load_digits): 1,437 training images, 360 held")
    assert MODELS["digits-mlp"].data(1).source == data.source
    bunch = sklearn_datasets.load_digits()  # the oracle: every image once, in training or held out

    def rows(images, labels):
        table = np.column_stack([images.astype(np.float64), labels])
        return table[np.lexsort(table.T[::-1])]

    mine = rows(np.concatenate([data.x, data.test_x]), np.concatenate([data.y, data.test_y]))
    np.testing.assert_array_equal(mine, rows(bunch.data / 16, bunch.target))
    assert data.x.dtype == np.float32 and len(data.test_y) == 360 and set(data.test_y) == set(range(10))


def test_without_scikit_learn_the_digits_are_the_synthetic_glyphs(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # as if not installed
    data = MODELS["digits-mlp"].data(0)
    assert data.source.endswith("seed 0; scikit-learn is not installed)")
    np.testing.assert_array_equal(data.x, digits(0)[0])
    np.testing.assert_array_equal(data.test_x, digits(1, n=512)[0])
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        digits_data(0, uci=True)


def test_run_ab_refuses_bad_input():
    m = MODELS["digits-mlp"]
    with pytest.raises(ValueError, match="batches gave 2 items"):
        run_ab(m.build, m.batches(0, 2), ["fp32"], steps=3, progress=False)
    with pytest.raises(ValueError, match="distinct names"):
        run_ab(m.build, m.batches(0, 2), ["fp32", "fp32"], steps=2, progress=False)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        run_ab(m.build, m.batches(0, 2), ["fp32"], steps=2, optimizer="lion", progress=False)


def test_cli_ab_writes_csv_png_and_json(tmp_path, capsys):
    rc = main(
        ["ab", "--steps", "3", "--config", "bnb-8bit-all", "--out", str(tmp_path), "--json", "--no-progress"]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["data"] == MODELS["digits-mlp"].data(0).source
    assert [r["config"] for r in out["results"]] == ["fp32", "bnb-8bit-all"]
    assert all(0 <= r["accuracy"] <= 1 for r in out["results"])
    assert out["results"][0]["first_nonfinite_step"] is None and out["results"][0]["steps"] == 3
    import pandas as pd

    frame = pd.read_csv(tmp_path / "ab.csv")
    assert list(frame.columns) == ["step", "run", "config", "gemm", "loss"] and len(frame) == 6
    assert set(frame["gemm"]) == {"fp32"} and list(frame["run"].unique()) == ["fp32", "bnb-8bit-all"]
    assert (tmp_path / "ab.png").stat().st_size > 1000


def test_cli_ab_refuses_an_unknown_config(capsys):
    with pytest.raises(SystemExit):
        main(["ab", "--config", "nope"])
    assert "invalid choice" in capsys.readouterr().err


def _worst_layers(rows, step):
    """The oracle of the underflow ranking, written out: per module its largest underflow at
    ``step`` and where, modules by it, largest first."""
    modules = list(dict.fromkeys(r["module"] for r in rows if r["step"] == step))
    out = []
    for m in modules:
        mine = [r for r in rows if r["step"] == step and r["module"] == m]
        top = max(r["underflow_pct"] for r in mine)
        first = next(r for r in mine if r["underflow_pct"] == top)
        out.append({"module": m, "underflow_pct": top, "gemm": first["gemm"], "role": first["role"]})
    return sorted(out, key=lambda w: (-w["underflow_pct"], modules.index(w["module"])))


def test_run_ab_with_gemm_recipes_same_start_same_batches():
    """Each (config, recipe) run is the loop one writes by hand with ``convert``; a recipe run
    twice (under another name) gives the same bits, bf16 GEMMs do not, and the underflow
    ranking is the one the hand-run model's ``gemm_stats`` gives."""
    m = MODELS["tiny-transformer"]
    batches = m.batches(0, 3)
    again = dataclasses.replace(GEMM_RECIPES["bf16"], name="bf16-again")
    res = run_ab(
        m.build, batches, ["fp32"], steps=3, gemm=["fp32", "bf16", again, "nvfp4"], lr=3e-3, progress=False
    )
    assert res.names == ["fp32/fp32", "fp32/bf16", "fp32/bf16-again", "fp32/nvfp4"]
    assert [(r.config, r.gemm) for r in res.runs][2] == ("fp32", "bf16-again")
    assert res.losses["fp32/bf16"] == res.losses["fp32/bf16-again"]
    assert res.losses["fp32/bf16"][0] != res.losses["fp32/fp32"][0]
    assert "fp32/fp32" not in res.gemm_stats and "fp32/fp32" not in res.underflow
    torch.manual_seed(0)
    model = convert(m.build(), "nvfp4", stats=True)
    opt = AdamW(model.named_parameters(), lr=3e-3, config="fp32")
    losses = _train_by_hand(model, opt, batches)
    assert res.losses["fp32/nvfp4"] == losses
    rows = gemm_stats(model)
    assert res.gemm_stats["fp32/nvfp4"] == rows
    ranking = _worst_layers(rows, 3)
    assert len(ranking) == 5 and ranking[0]["underflow_pct"] > ranking[-1]["underflow_pct"]
    assert res.underflow["fp32/nvfp4"] == ranking
    summary = res.summary()["results"]
    assert [(r["run"], r["config"], r["gemm"]) for r in summary][3] == ("fp32/nvfp4", "fp32", "nvfp4")
    assert summary[3]["underflow_ranking"] == ranking and "underflow_ranking" not in summary[0]


def test_a_run_stopped_at_a_non_finite_loss_ranks_its_last_full_step():
    """The run stops at the non-finite loss of step 3: its statistics hold that step's forward,
    the ranking is the one of step 2 (the last step with a backward)."""
    m = MODELS["digits-mlp"]
    batches = m.batches(0, 4)

    def loss_fn(model, batch):
        loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
        return loss * float("nan") if batch is batches[2] else loss

    res = run_ab(m.build, batches, ["fp32"], steps=4, gemm=["mxfp8"], loss_fn=loss_fn, progress=False)
    rows = res.gemm_stats["fp32/mxfp8"]
    assert res.summary()["results"][0]["first_nonfinite_step"] == 3 and len(res.losses["fp32/mxfp8"]) == 3
    assert {r["gemm"] for r in rows if r["step"] == 3} == {"fprop"}
    assert res.underflow["fp32/mxfp8"] == _worst_layers(rows, 2) != []


def test_run_ab_refuses_bad_gemm_recipes():
    m = MODELS["digits-mlp"]
    b = m.batches(0, 1)
    allowed = "allowed: fp32, bf16, fp8-current, fp8-delayed, fp8-block, mxfp8, nvfp4"
    with pytest.raises(ValueError, match=f"unknown GEMM recipe 'fp9'; {allowed}$"):
        run_ab(m.build, b, ["fp32"], steps=1, gemm=["fp32", "fp9"], progress=False)
    with pytest.raises(
        TypeError, match=r"gemm takes a list of recipes, got the single 'mxfp8': pass \['mxfp8'\]"
    ):
        run_ab(m.build, b, ["fp32"], steps=1, gemm="mxfp8", progress=False)
    with pytest.raises(ValueError, match="gemm needs at least one recipe"):
        run_ab(m.build, b, ["fp32"], steps=1, gemm=[], progress=False)
    with pytest.raises(ValueError, match="distinct names, got 'mxfp8' twice"):
        run_ab(m.build, b, ["fp32"], steps=1, gemm=["mxfp8", GEMM_RECIPES["mxfp8"]], progress=False)
    fake = dataclasses.replace(GEMM_RECIPES["bf16"], name="fp32")
    with pytest.raises(ValueError, match="may not be named 'fp32'"):
        run_ab(m.build, b, ["fp32"], steps=1, gemm=[fake], progress=False)
    with pytest.raises(TypeError, match="or a GemmRecipe, got int"):
        run_ab(m.build, b, ["fp32"], steps=1, gemm=[3], progress=False)


def test_cli_ab_gemm_runs_every_config_with_every_recipe(tmp_path, capsys):
    """``--config`` x ``--gemm``, fp32 first in both; the fp32/fp32 run is run_ab's FP32 run."""
    argv = ["ab", "--steps", "2", "--config", "int8-states", "--gemm", "mxfp8", "--out", str(tmp_path)]
    torch.set_num_threads(2)  # the command trains on one thread and restores the count
    assert main([*argv, "--json", "--no-progress"]) == 0
    assert torch.get_num_threads() == 2
    out = json.loads(capsys.readouterr().out)
    assert out["configs"] == ["fp32", "int8-states"] and out["gemm"] == ["fp32", "mxfp8"]
    runs = [r["run"] for r in out["results"]]
    assert runs == ["fp32/fp32", "fp32/mxfp8", "int8-states/fp32", "int8-states/mxfp8"]
    assert ["underflow_ranking" in r for r in out["results"]] == [False, True, False, True]
    assert [u["module"] for u in out["results"][1]["underflow_ranking"]] != []
    m = MODELS["digits-mlp"]
    alone = run_ab(m.build, m.batches(0, 2), ["fp32"], steps=2, lr=m.lr, progress=False)
    assert out["results"][0]["final_loss"] == alone.losses["fp32"][-1]
    assert main([*argv, "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "layers that underflow most at the end" in text and "  int8-states/mxfp8: " in text


def test_cli_ab_refuses_an_unknown_gemm_recipe(capsys):
    with pytest.raises(SystemExit):
        main(["ab", "--gemm", "fp9"])
    err = capsys.readouterr().err
    assert "invalid choice: 'fp9'" in err and "'fp8-delayed'" in err and "'fp32'" in err
