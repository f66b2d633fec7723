"""What the README says is true: its code blocks run, its tables and file references match.

Every ``python`` and ``bash`` block of README.md runs here (Python blocks in a fresh namespace,
bash blocks command by command through ``fpsim``'s entry point, both in a temporary folder),
except a block preceded by the line ``<!-- readme-test: skip REASON -->``; a skipped block must
say why, and the reasons are listed in the test ids. The ``fpsim formats`` table must equal what
the command prints, the figures it shows must be the ones ``fpsim figures`` writes, the link to
the trace format specification must point to it, every file it names must exist, and
``.ci/run`` must run the README's test command.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SKIP = re.compile(r"<!-- readme-test: skip (?P<reason>[^>]+?) -->\s*$")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")


def _blocks(text: str) -> list[tuple[int, str, str, str | None]]:
    """(line, language, code, skip reason or None) of every fenced block, in order."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.match(before)
        out.append((i + 1, m["lang"], "\n".join(lines[i + 1 : end]), skip["reason"] if skip else None))
        i = end + 1
    return out


BLOCKS = [b for b in _blocks(README) if b[1] in ("python", "bash")]
RUN = [b for b in BLOCKS if b[3] is None]


def _commands(code: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", code)
    return [line.split(" #")[0].strip() for line in joined.splitlines() if line.strip()]


def test_blocks_are_found_and_every_skip_says_why():
    assert len(BLOCKS) >= 8 and RUN
    assert all(len(reason) > 10 for *_, reason in BLOCKS if reason is not None)
    assert _blocks("<!-- readme-test: skip a long reason -->\n```bash\nfpsim x\n```\n") == [
        (2, "bash", "fpsim x", "a long reason")
    ]
    assert _commands("fpsim a --x 1 \\\n    --y 2   # note\n") == ["fpsim a --x 1 --y 2"]


@pytest.mark.parametrize("block", RUN, ids=[f"line{b[0]}-{b[1]}" for b in RUN])
def test_readme_block_runs(block, tmp_path, monkeypatch, capsys):
    line, lang, code, _ = block
    monkeypatch.chdir(tmp_path)  # whatever a block writes lands here
    if lang == "python":
        exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
        return
    from fpsim.cli import main

    for command in _commands(code):
        argv = shlex.split(command)
        assert argv[0] == "fpsim", f"README.md:{line}: only fpsim commands run here, or skip with a reason"
        assert main(argv[1:]) == 0, f"README.md:{line}: {command}"


def test_formats_table_is_what_fpsim_formats_prints():
    from fpsim.cli import main
    from fpsim.cli.app import format_rows

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["formats"]) == 0
    printed = {}
    lines = out.getvalue().splitlines()
    heads = re.split(r"\s{2,}", lines[0].strip())
    for row in lines[1:]:
        cells = row.split()
        if len(cells) >= len(heads) - 2:  # the element formats' table (inf code may be "-")
            printed[cells[0]] = dict(zip(heads, cells))
    lines = README.splitlines()
    start = next(i for i, r in enumerate(lines) if r.startswith("| format | bits |"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    names = [h.strip() for h in lines[start].strip("|").split("|")]
    table = lines[start + 2 : end]
    assert {r.split("`")[1] for r in table} == {r["name"] for r in format_rows() if r["kind"] == "float"}
    for row in table:
        cells = [c.strip().strip("`") for c in row.strip("|").split("|")]
        got = printed[cells[0]]
        for name, cell in zip(names[1:], cells[1:]):
            assert got[name] == cell, (cells[0], name)


def test_figures_shown_are_the_ones_fpsim_figures_writes():
    from fpsim.report.figures import FIGURES

    shown = set(re.findall(r"!\[[^\]]*\]\(figures/([^)]+)\)", README))
    assert shown and shown <= set(FIGURES)
    assert {p.name for p in (ROOT / "figures").glob("*.png")} == set(FIGURES)


def test_trace_format_link_points_to_the_specification():
    import fpsim.trace

    assert "[`fpsim/trace/__init__.py`](fpsim/trace/__init__.py)" in README
    assert "manifest.json" in fpsim.trace.__doc__ and (ROOT / "fpsim" / "trace" / "__init__.py").exists()


def test_ci_runs_the_readme_test_command():
    command = re.search(r'```bash\n(pip install -e "\.\[test\]".*)\n```', README)[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"{command} --durations=15" in ci.splitlines()
    assert "ruff check ." in ci.splitlines() and 'python -m pip install "torch==2.13.0"' in ci


def test_every_file_the_readme_names_exists():
    named = set(re.findall(r"`((?:tests|benchmarks|notebooks|fpsim|kernels|figures|\.ci)/[\w./-]+)`", README))
    named |= set(re.findall(r"\]\(((?:fpsim|figures|notebooks)/[\w./-]+)\)", README))
    named |= {f"benchmarks/{m}" for m in re.findall(r"`(bench_\w+\.py)`", README)}
    assert len(named) > 10
    assert not sorted(p for p in named if not (ROOT / p).exists())
