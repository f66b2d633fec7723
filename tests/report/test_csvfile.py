"""fpsim.report.csvfile writes the bytes pandas' ``to_csv(index=False)`` writes (the oracle, run
here), without importing pandas: the reports' tables and columns of every kind."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fpsim.report.csvfile import write_csv


def _same_as_pandas(tmp_path, columns, rows):
    mine = write_csv(tmp_path / "mine.csv", columns, rows).read_bytes()
    pd.DataFrame(rows, columns=list(columns)).to_csv(tmp_path / "pandas.csv", index=False)
    assert mine == (tmp_path / "pandas.csv").read_bytes()


@pytest.mark.parametrize(
    "column",
    [
        [1, 2, 3],  # integers stay integers
        [1, 2.5, 3],  # one float makes the column float: 1.0, 3.0
        [1, None, 3],  # a missing value too
        [0.1, 1e-05, 1e16, 123456789.125, -0.0, 5e-324, 1.7976931348623157e308],
        [math.nan, math.inf, -math.inf, 2.0],
        [np.float64(0.1), np.int64(7), np.float32(0.1)],
        ["a", "b,c", 'say "x"', "line\nbreak", None],
        ["a", 1, 2.5],  # an object column: each as it prints
        [True, False, True],
    ],
)
def test_columns_of_every_kind_are_written_as_pandas_writes_them(tmp_path, column):
    _same_as_pandas(tmp_path, ["i", "value"], list(enumerate(column)))


def test_empty_table(tmp_path):
    _same_as_pandas(tmp_path, ["step", "value"], [])


def test_the_reports_tables_are_written_as_pandas_writes_them(tmp_path):
    from fpsim.analysis.run import analyze
    from fpsim.replay import memory_table, replay

    opts = {"steps": [190, 191], "progress": False, "backend": "numpy"}
    analysis = analyze(None, ["float16", "float8_e4m3fn", "mxfp8_e4m3"], **opts)
    _same_as_pandas(tmp_path, analysis.COLUMNS, analysis.rows())
    result = replay(None, ["bf16-master", "fp8-states"], **opts)
    _same_as_pandas(tmp_path, result.COLUMNS, result.rows())
    mem = memory_table(result.configs, result.sizes)
    _same_as_pandas(tmp_path, list(mem[0]), [list(r.values()) for r in mem])
