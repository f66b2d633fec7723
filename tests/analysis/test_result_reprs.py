"""What a person sees of a result: short reprs, HTML tables, ``summary_table()`` DataFrames.

A full analysis or replay holds megabytes (partials, histograms, final parameters); its repr
is a headline and the totals per format/configuration, bounded in length, and equal to the
numbers ``summary()`` (the JSON of the reports) gives.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fpsim
from fpsim.analysis.run import REPR_ROWS, analyze
from fpsim.replay import replay

REPR_LIMIT = 3000  # characters: a screenful


@pytest.fixture(scope="module")
def analysis():
    return analyze(
        None, ["float16", "float8_e4m3fn", "mxfp8_e4m3"], steps=[10, 20], progress=False, backend="numpy"
    )


@pytest.fixture(scope="module")
def replayed():
    return replay(None, ["bf16-master", "fp8-states"], steps=range(190, 193), progress=False, backend="numpy")


def test_analysis_repr_is_short_and_says_the_totals(analysis):
    text = repr(analysis)
    assert len(text) < REPR_LIMIT and str(analysis) == text
    assert "2 steps" in text and "3 formats x 1 rounding" in text
    rows = {r["format"]: r for r in analysis.summary()["results"]}
    for name, r in rows.items():
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(name + " "))
        assert f"{100 * r['underflow'] / r['nonzero']:.4g}" in line.split()
    html = analysis._repr_html_()
    assert "<table" in html and html.count("<tr") == 1 + len(rows)


def test_analysis_summary_table_is_the_summary(analysis):
    df = analysis.summary_table()
    results = analysis.summary()["results"]
    assert list(df["format"]) == [r["format"] for r in results]
    for (_, row), r in zip(df.iterrows(), results):
        assert row["underflow"] == r["underflow"] and row["elements"] == r["elements"]
        want = r["swamping_nearest_even"]["swamped_share"] if "swamping_nearest_even" in r else math.nan
        assert row.get("swamping_nearest_even_swamped_share") == pytest.approx(want, nan_ok=True)
    assert df["sqnr_db"].dtype == np.float64  # json_safe's strings are floats again


def test_a_long_analysis_repr_is_cut(analysis):
    many = [f"float{b}" for b in (16, 32)] + [n for n in fpsim.FORMATS if n.startswith("float8")]
    many += ["int8", "mxfp8_e4m3", "nvfp4", "mxfp4_e2m1"]
    assert len(many) > REPR_ROWS
    big = analyze(None, many, steps=[10], swamping=False, progress=False)
    text = repr(big)
    assert len(text) < REPR_LIMIT and "..." in text and len(text.splitlines()) <= REPR_ROWS + 3


def test_replay_repr_is_short_and_one_line_per_config(replayed):
    text = repr(replayed)
    assert len(text) < REPR_LIMIT
    assert "3 step(s)" in text and "2 configurations" in text
    lines = text.splitlines()
    for r in replayed.summary()["results"]:
        line = next(ln for ln in lines if ln.split()[0] == r["config"])
        assert f"{r['bytes_per_param']:.4g}" == line.split()[-1]
    assert "<table" in replayed._repr_html_()


def test_replay_summary_table_is_the_summary(replayed):
    df = replayed.summary_table()
    results = replayed.summary()["results"]
    assert list(df["config"]) == ["reference", "bf16-master", "fp8-states"]
    for got, want in zip(df.to_dict("records"), results):
        want = {k: math.nan if v is None else v for k, v in want.items()}  # None: not measured
        assert got == pytest.approx(want, nan_ok=True)
    assert math.isnan(df.loc[0, "swamped_share"])  # the reference's own rounding: not measured


def test_array_holders_show_shapes_not_arrays():
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    codes = fpsim.encode(x, "mxfp8_e4m3")
    assert repr(codes) == "BlockCodes(codes=uint8[64, 256], scales=uint8[64, 8], tensor_scale=None)"
    policy = fpsim.DelayedScaling()
    _, state = policy.step(policy.init(), x)
    text = repr(state)
    assert text.startswith(f"DelayedState(scale={state.scale!r}, history=float32[1024]")
    assert f"amax max={float(np.abs(x).max()):.6g}" in text
    _, info = fpsim.sum(x, axis=1, accumulator="bfloat16", return_info=True)
    text = repr(info)
    assert len(text) < 200 and f"lost={int(info.lost.sum()):,} of {int(info.nonzero_adds.sum()):,}" in text


def test_partial_repr_is_one_line_of_counts(analysis):
    """A Partial's repr gives its counts and derived errors, not its exact sums or histogram."""
    part = next(iter(analysis.totals().values()))
    text = repr(part)
    assert "\n" not in text and len(text) < 400
    assert f"elements={part.elements:,}" in text and f"underflow={part.underflow:,}" in text
