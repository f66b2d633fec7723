"""The layout the README's Architecture section describes, checked on the source tree.

One package per stage of the data flow; each import points down the flow, never up, and no
two modules import each other (directly or through others, lazy imports included); modules
stay small; ``import fpsim`` loads none of the heavy optional dependencies; no file cites a
document the repository does not contain.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fpsim"

# Rank of each stage in the data flow: a module may import its own stage or a lower rank.
STAGES = {
    "fpsim._compiled": 0,
    "fpsim.trace": 0,
    "fpsim.formats": 0,
    "fpsim.emulate": 1,
    "fpsim.accumulate": 2,
    "fpsim.analysis": 3,
    "fpsim.replay": 4,
    "fpsim.kernels": 5,
    "fpsim.distributed": 5,
    "fpsim.train": 5,
    "fpsim.report": 6,
    "fpsim.cli": 7,
    "fpsim": 8,  # the package's __init__: the public API re-exports every stage
}
HEAVY = ("numba", "torch", "triton", "jax", "pandas", "matplotlib", "dask")


def _modules() -> dict[str, Path]:
    """Every module of fpsim by dotted name."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["fpsim", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The fpsim modules ``name`` imports anywhere in its file (module level or inside a
    function): ``from . import x`` counts as an import of the submodule ``x`` where one exists."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "fpsim")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "fpsim":
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            found.update(subs or [target])
            if len(subs) < len(node.names):
                found.add(target)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _stage(module: str) -> str:
    return max((s for s in STAGES if module == s or module.startswith(s + ".")), key=len)


def test_top_level_holds_the_stages_only():
    """fpsim/ holds ``__init__.py`` and one package per stage of STAGES (kernels among them),
    no loose modules."""
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__")
    stages = sorted(s.removeprefix("fpsim.") for s in STAGES if s != "fpsim")
    assert entries == sorted(["__init__.py", *stages]), entries


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_at_most_600_lines(name):
    lines = MODULES[name].read_text().count("\n")
    assert lines <= 600, f"{MODULES[name].relative_to(ROOT)}: {lines} lines"


def test_imports_point_down_the_data_flow():
    upward = [
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if STAGES[_stage(a)] < STAGES[_stage(b)]
    ]
    assert not upward, upward


def _private_names_imported(name: str, path: Path) -> list[str]:
    """``module.name`` for each underscored name ``name`` imports from another fpsim module (a
    private module imported as a module, ``from .. import _compiled``, is the package's own)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        if target.split(".")[0] != "fpsim":
            continue
        for a in node.names:
            private = a.name.startswith("_") and not a.name.startswith("__")
            if private and f"{target}.{a.name}" not in MODULES:
                out.append(f"{target}.{a.name}")
    return out


def test_no_private_name_is_imported_across_modules():
    """A helper two modules share is public in one of them (a shared module), not an underscored
    name reached into from outside."""
    found = {name: _private_names_imported(name, path) for name, path in MODULES.items()}
    assert {k: v for k, v in found.items() if v} == {}


def test_a_private_import_is_found(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from .cast import _encode_args, Launch\nfrom .. import _compiled\n")
    assert _private_names_imported("fpsim.kernels.blocks", path) == ["fpsim.kernels.cast._encode_args"]


def _kernel_module_calls() -> list[tuple[str, str]]:
    """``(calling module's file stem, name)`` of every ``kernel_module("name", ...)`` in fpsim/kernels."""
    calls = []
    for path in sorted((PACKAGE / "kernels").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)) != "kernel_module":
                continue
            arg = node.args[0] if node.args else None
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), (
                f"{path.name}:{node.lineno}: kernel_module needs the file name as a string literal"
            )
            calls.append((path.stem, arg.value))
    return calls


def test_kernel_sources_are_paired_with_their_hosts_by_name():
    """Each Triton kernel source ``_X_kernel.py`` of fpsim.kernels has its host ``X.py``, which
    loads it with ``kernel_module("_X_kernel", ...)``; every ``kernel_module`` name is such a
    source loaded by its host, or a shared helper source (no ``_kernel`` suffix, such as
    ``_intcast``) loaded by kernel sources or other helper sources."""
    kernels = PACKAGE / "kernels"
    calls = _kernel_module_calls()
    sources = sorted(p.stem for p in kernels.glob("_*_kernel.py"))
    assert sources, "no kernel source found"
    unpaired = [s for s in sources if (s[1:].removesuffix("_kernel"), s) not in calls]
    assert not unpaired, f"kernel sources without a host X.py calling kernel_module('_X_kernel'): {unpaired}"
    wrong = []
    for caller, name in calls:
        if not (kernels / f"{name}.py").is_file():
            wrong.append(f"{caller}.py loads {name!r}: no such file")
        elif name.endswith("_kernel"):
            if caller != name[1:].removesuffix("_kernel"):
                wrong.append(
                    f"{caller}.py loads {name!r}, the kernel source of {name[1:].removesuffix('_kernel')}.py"
                )
        elif not caller.startswith("_"):
            wrong.append(f"{caller}.py loads {name!r}: a host loads its own _X_kernel source only")
    assert not wrong, wrong


def test_the_emulator_never_imports_a_kernel():
    users = sorted(a for a, t in GRAPH.items() if any(_stage(b) == "fpsim.kernels" for b in t))
    # fpsim.train's CUDA path runs the Triton optimizer kernel (fpsim.train.cuda)
    assert all(_stage(a) in ("fpsim.kernels", "fpsim.train", "fpsim.cli") for a in users), users


def test_no_import_cycle():
    """Depth-first search for a back edge; the message names the cycle."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(GRAPH[m]):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, " -> ".join(cycle)


def test_a_cycle_is_found(monkeypatch):
    """The cycle check can fail: two modules importing each other."""
    monkeypatch.setitem(GRAPH, "fpsim.formats.element", {"fpsim.formats.block"})
    with pytest.raises(AssertionError, match="fpsim.formats.block -> fpsim.formats.element"):
        test_no_import_cycle()


def test_import_fpsim_loads_no_heavy_dependency():
    code = f"import sys, fpsim; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_no_file_cites_a_missing_document():
    cited = ("DESIGN.md", "REFERENCE.md")
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    files += [*(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "benchmarks").glob("*.py")]
    here = Path(__file__).resolve()
    bad = [
        str(p.relative_to(ROOT))
        for p in files
        if p.resolve() != here and any(c in p.read_text() for c in cited)
    ]
    assert not bad, bad


CITED_PATH = re.compile(
    r"(?<![\w/.])((?:tests|fpsim|benchmarks|notebooks|figures)/[\w/.-]*\w\.(?:py|ipynb|md|png))"
)
SYNTHETIC = ("tests/test_complexity.py", "tests/formats/test_codes.py")  # build trees of made-up files


def test_every_cited_repository_file_exists():
    """A path like ``tests/formats/test_codes.py`` named in a docstring, comment, notebook or the
    README is a file of the repository (a moved or renamed file leaves no stale citation)."""
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    files += [*(ROOT / "notebooks").glob("*.ipynb"), ROOT / "README.md"]
    missing = [
        f"{p.relative_to(ROOT)}: {m.group(1)}"
        for p in files
        if str(p.relative_to(ROOT)) not in SYNTHETIC
        for m in CITED_PATH.finditer(p.read_text())
        if not (ROOT / m.group(1)).exists()
    ]
    assert not missing, missing
