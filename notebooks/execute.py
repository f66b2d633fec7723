"""Execute the notebooks of this folder and store them with their outputs (figures included).

    python notebooks/execute.py            # every notebook, in place
    python notebooks/execute.py 02 05      # those whose name starts with 02 or 05

Each notebook runs top to bottom in a fresh ``python3`` kernel (nbclient) with this folder as
its working directory; an error stops the run and leaves the file as it was. Execution time
stamps are dropped, so rerunning on unchanged code changes nothing but what the code prints.
``tests/test_notebooks.py`` runs the same function and compares its outputs with the stored
ones, so a notebook whose stored outputs are stale, or whose assertions fail, fails CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 600
"""Per-cell limit of one notebook execution, in seconds."""


def notebooks(prefixes: list[str] | None = None) -> list[Path]:
    """The notebooks of this folder (those whose name starts with one of ``prefixes``)."""
    paths = sorted(HERE.glob("*.ipynb"))
    if prefixes:
        paths = [p for p in paths if any(p.name.startswith(x) for x in prefixes)]
    return paths


def execute(path: Path, workdir: Path | None = None):
    """Run the notebook at ``path`` in a fresh kernel; returns the executed ``NotebookNode``.

    Raises ``nbclient.exceptions.CellExecutionError`` (naming the cell) on any error.
    """
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = nbclient.NotebookClient(
        nb,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir or path.parent)}},
    )
    client.execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nb


def main(argv: list[str]) -> int:
    """Execute the notebooks ``argv`` names (all when none) and write them back; returns 0."""
    import nbformat

    paths = notebooks(argv)
    if not paths:
        print(f"no notebook in {HERE} starts with {' or '.join(argv)}", file=sys.stderr)
        return 2
    for path in paths:
        nb = execute(path)
        nbformat.write(nb, path)
        print(f"{path.name}: {path.stat().st_size / 1024:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
