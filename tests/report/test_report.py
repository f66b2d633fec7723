"""fpsim.report: one colour per name in every figure, Markdown tables, the DeepSeek rows of
``fpsim accumulate --deepseek``, the replay report's memory table, the step axis of the
underflow figure."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fpsim.analysis import DEFAULT_FORMATS
from fpsim.replay import DEFAULT_CONFIGS, PRESETS
from fpsim.report.style import _COLOURS, colour_for, colours_for, markdown_table


def test_known_names_have_fixed_distinct_colours_where_drawn_together():
    from fpsim.accumulate.sweeps import deepseek_settings
    from fpsim.report.figures import SPACING_NARROW, SPACING_WIDE

    groups = [
        DEFAULT_FORMATS,
        SPACING_WIDE,
        SPACING_NARROW,
        ("reference", *DEFAULT_CONFIGS),
        ("bf16-master", "bf16-master-sr", "bf16-master-kahan", "bnb-8bit-all", "fp8-states", "int8-states"),
        ("reference", "bf16-states", "fp8-states", "int8-states", "bnb-8bit-all"),
        [s.label for s, _ in deepseek_settings()],
    ]
    for names in groups:
        assert all(n in _COLOURS for n in names), names
        assert len({colour_for(n) for n in names}) == len(names), names
    assert set(PRESETS) <= set(_COLOURS)


def test_an_unknown_name_has_the_same_colour_in_every_process():
    code = "from fpsim.report.style import colour_for; print(colour_for('my-own-config'))"
    got = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert got == {colour_for("my-own-config")}


def test_colours_of_one_figure_differ_even_when_hashes_collide():
    names = [f"cfg{i}" for i in range(40)]
    first = colour_for(names[0])
    clash = next(n for n in names[1:] if colour_for(n) == first)
    colours = colours_for([names[0], clash, "float16"])
    assert colours[names[0]] == first and colours[clash] != first
    assert colours["float16"] == colour_for("float16")
    assert len(set(colours.values())) == 3


def test_markdown_table():
    text = markdown_table(["config", "total"], [["a|b", "1.000"]])
    assert text.splitlines() == ["| config | total |", "|---|---:|", "| a\\|b | 1.000 |"]


def test_underflow_figure_says_how_the_steps_are_spaced():
    from fpsim.report.analysis import _step_ticks

    steps = [*range(10, 191, 10), *range(191, 201)]
    ticks, text = _step_ticks(steps)
    assert text == "columns: recorded steps, every 10th step from 10 to 190, then each step from 190 to 200"
    assert ticks[0] == 0 and ticks[-1] == len(steps) - 1 and steps.index(190) in ticks
    assert all(b - a >= 3 for a, b in zip(ticks, ticks[1:]))


def test_deepseek_rows_are_marked_and_described():
    pd = pytest.importorskip("pandas")
    from fpsim.accumulate.sweeps import deepseek_sweep
    from fpsim.report.accumulate import deepseek_note, table_text

    df = deepseek_sweep((128, 4096), m=4, n=4)
    text = table_text(df)
    marked = [line for line in text.splitlines() if line.endswith("<- DeepSeek ~2%")]
    assert len(marked) == 2
    assert all(line.startswith("E4M3 per-tensor, 14-bit R") and " 4096 " in line for line in marked)
    assert not any("promote" in line for line in marked)
    no_promotion = ["E4M3 per-tensor, 14-bit RNE", "E4M3 per-tensor, 14-bit RZ"]
    rows = df[(df["K"] == 4096) & df["setting"].isin(no_promotion)]
    assert len(rows) == 2
    note = " ".join(deepseek_note(df).split())
    for _, r in rows.iterrows():
        assert f"{r['rel_l2_err']:.2%}" in note
    other = pd.DataFrame({"setting": ["float16 RNE seq"], "K": [16], "kind": ["dot"], "rel_l2_err": [0.1]})
    assert "DeepSeek" not in table_text(other) and deepseek_note(other) == ""
    short = deepseek_sweep((128,), m=4, n=4)
    assert "K = 4096 is not in this run" in " ".join(deepseek_note(short).split())
    assert "<- DeepSeek" not in table_text(short)


def test_replay_report_memory_section_is_a_markdown_table(tmp_path):
    pd = pytest.importorskip("pandas")
    from fpsim.replay import replay
    from fpsim.replay.optim import Adam
    from fpsim.report.replay import write_replay_report

    configs = ["bf16-master", "bnb-8bit-all"]
    res = replay(None, configs, optimizer=Adam(), steps=range(190, 192), progress=False)
    paths = write_replay_report(res, tmp_path)
    text = paths["markdown"].read_text()
    section = text.split("## Memory (bytes per parameter)\n\n")[1].split("\n\n")[0].splitlines()
    memory = pd.read_csv(paths["memory"])
    assert section[0] == "| " + " | ".join(memory.columns) + " |"
    assert section[1] == "|---|" + "---:|" * (len(memory.columns) - 1)
    for line, (_, row) in zip(section[2:], memory.iterrows(), strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == row["config"]
        assert [float(c) for c in cells[1:]] == pytest.approx(list(row.iloc[1:]), abs=5e-4)
