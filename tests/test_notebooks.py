"""The notebooks are stored with their outputs, show their figures as images, and give those
outputs again when run.

Every notebook in ``notebooks/`` runs top to bottom in a fresh kernel by the function that
regenerates them (``python notebooks/execute.py``); an error fails the test, and so does a
failed ``assert`` in a cell: the notebooks assert every number their text states, so a stale
sentence fails here. The stored text outputs must equal the fresh ones (stale outputs fail: rerun
``python notebooks/execute.py``), except in cells tagged ``machine-dependent``: those print what
torch computes (a training loss), which depends on the CPU's SIMD width and thread count, so only
their assertions and figures are checked. Every figure a cell shows must come out as a PNG image,
in the stored notebook and when run headless.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_BYTES = 500_000  # a few hundred kB at most: small figures, no data dumps


def _runner():
    """notebooks/execute.py, the one way the notebooks are run (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("notebooks_execute", ROOT / "notebooks" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def _text(cell) -> str:
    """What a reader reads in a cell's outputs: stdout and the plain-text results, in order
    (stderr, where warnings and progress bars go, is left out)."""
    parts = []
    for o in cell.outputs:
        if o.output_type == "stream" and o.name == "stdout":
            parts.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            parts.append(o.data.get("text/plain", ""))
    return "".join(parts)


MACHINE_DEPENDENT = "machine-dependent"
"""The cell tag of outputs computed by torch on the CPU (not compared as text)."""


def _images(cell) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.outputs)


def _figures_without_image(nb) -> list[int]:
    """Indices of code cells that show a matplotlib figure as text only (no PNG next to it)."""
    bad = []
    for i, cell in enumerate(_code_cells(nb)):
        for o in cell.outputs:
            data = o.get("data", {})
            if data.get("text/plain", "").startswith("<Figure size") and "image/png" not in data:
                bad.append(i)
    return bad


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 6


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_executed_with_its_figures(path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    cells = _code_cells(nb)
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name} is not stored as run top to bottom: python notebooks/execute.py {path.name[:2]}"
    )
    assert not [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert not _figures_without_image(nb), f"{path.name}: a figure stored as text, not as an image"
    assert path.stat().st_size <= MAX_BYTES, f"{path.name}: {path.stat().st_size:,} bytes"


def test_a_figure_shown_as_text_only_is_found():
    nbformat = pytest.importorskip("nbformat")
    cell = nbformat.v4.new_code_cell("fig")
    cell.outputs = [
        nbformat.v4.new_output("execute_result", {"text/plain": "<Figure size 880x462 with 1 Axes>"})
    ]
    assert _figures_without_image(nbformat.v4.new_notebook(cells=[cell])) == [0]


def test_a_figure_renders_itself_as_png():
    pytest.importorskip("matplotlib")
    from fpsim.report.style import new_figure, style

    with style():
        fig, ax = new_figure()
        ax.plot([0, 1], [1, 0])
    png = fig._repr_png_()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def compares_text(path: Path) -> bool:
    """Whether the notebook has a code cell whose text output is compared (not tagged
    ``machine-dependent``); read from the stored file (JSON, without nbformat)."""
    import json

    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code" or MACHINE_DEPENDENT in cell.get("metadata", {}).get("tags", []):
            continue
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if o.get("name") == "stdout" or ("text/plain" in data and "image/png" not in data):
                return True
    return False


def _run_params():
    """The notebooks, those with compared text in the dispatch matrix (``.ci/run`` reruns them
    with the SIMD dispatch masked). A notebook whose every output is torch's training (07, 08)
    has nothing there to compare: what fpsim computes in it is in the matrix's tier comparisons."""
    return [
        pytest.param(p, id=p.stem, marks=[pytest.mark.dispatch] if compares_text(p) else [])
        for p in NOTEBOOKS
    ]


@pytest.mark.parametrize("path", _run_params())
def test_notebook_runs_and_gives_its_stored_outputs(path, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    stored = nbformat.read(path, as_version=4)
    fresh = _runner().execute(path, workdir=tmp_path)  # CellExecutionError names the failing cell
    assert not _figures_without_image(fresh), f"{path.name}: a figure did not render as an image"
    old, new = _code_cells(stored), _code_cells(fresh)
    assert len(old) == len(new)
    for i, (a, b) in enumerate(zip(old, new)):
        hint = f"{path.name} code cell {i}: stale outputs; python notebooks/execute.py {path.name[:2]}"
        if MACHINE_DEPENDENT not in b.metadata.get("tags", []):
            assert _text(a) == _text(b), hint
        assert _images(a) == _images(b), hint
