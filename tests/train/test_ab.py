"""fpsim.train.ab and ``fpsim ab``: the same start and batches for every configuration, the
measured state bytes, the outputs."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fpsim.cli import main  # noqa: E402
from fpsim.train.ab import MODELS, digits, digits_data, run_ab, state_bytes  # noqa: E402
from fpsim.train.torch import AdamW  # noqa: E402


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
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
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
    assert list(frame.columns) == ["step", "config", "loss"] and len(frame) == 6
    assert (tmp_path / "ab.png").stat().st_size > 1000


def test_cli_ab_refuses_an_unknown_config(capsys):
    with pytest.raises(SystemExit):
        main(["ab", "--config", "nope"])
    assert "invalid choice" in capsys.readouterr().err
