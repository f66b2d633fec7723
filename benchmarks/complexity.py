"""The largest function signatures and the longest functions of fpsim/ (its Triton kernels included).

Run: ``python benchmarks/complexity.py [--top 10] [--lines 80] [--before REV] [ROOT]``.

Reads the source with the standard library's :mod:`ast` only (nothing is imported, so it runs
without numba, triton or torch) and prints two tables: the ``--top`` functions with the most
parameters (every positional, keyword-only and ``*args``/``**kwargs`` parameter counts one;
``@triton.jit`` kernels are marked ``jit``), and every function longer than ``--lines`` lines
(from its ``def`` line, decorators excluded, to its last line), longest first. With
``--before REV`` it prints the same tables for git revision ``REV`` of ``ROOT`` first (read
with ``git archive``, nothing checked out or written), then a line comparing the two: the
largest signature and the number of long functions, before and after.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ("fpsim",)


@dataclass(frozen=True)
class Function:
    """One function or method definition found in the source.

    Attributes:
        path: file path relative to the repository root.
        name: qualified name (``Class.method``, ``outer.inner``).
        line: line of the ``def``.
        params: number of parameters (``self`` and ``cls`` included, as written).
        length: lines from the ``def`` to the last line of the body.
        jit: decorated with ``triton.jit`` or a module-level name bound to it (numba's ``jit`` is
            not marked).
    """

    path: str
    name: str
    line: int
    params: int
    length: int
    jit: bool


def _is_triton_jit(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "jit"
        and isinstance(node.value, ast.Name)
        and node.value.id == "triton"
    )


def _jit_aliases(tree: ast.Module) -> set[str]:
    """Module-level names bound to ``triton.jit``: ``from triton import jit`` or ``_jit = ... triton.jit``."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "triton":
            names |= {a.asname or a.name for a in node.names if a.name == "jit"}
        elif isinstance(node, ast.Assign) and any(_is_triton_jit(n) for n in ast.walk(node.value)):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _is_jit(node: ast.FunctionDef | ast.AsyncFunctionDef, aliases: set[str]) -> bool:
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if _is_triton_jit(target) or (isinstance(target, ast.Name) and target.id in aliases):
            return True
    return False


def _count_params(args: ast.arguments) -> int:
    n = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
    return n + (args.vararg is not None) + (args.kwarg is not None)


def functions(path: Path, root: Path) -> list[Function]:
    """Every function and method defined in one source file, nested ones included."""
    return functions_in(path.read_text(), str(path.relative_to(root)))


def functions_in(source: str, rel: str) -> list[Function]:
    """Every function and method defined in ``source`` (the file ``rel``), nested ones included."""
    tree = ast.parse(source, filename=rel)
    found: list[Function] = []
    aliases = _jit_aliases(tree)

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                length = child.end_lineno - child.lineno + 1
                found.append(
                    Function(
                        rel, name, child.lineno, _count_params(child.args), length, _is_jit(child, aliases)
                    )
                )
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def collect(root: Path) -> list[Function]:
    """The functions of every ``.py`` file under ``fpsim/`` and ``kernels/`` of ``root``."""
    out: list[Function] = []
    for tree in TREES:
        for path in sorted((root / tree).rglob("*.py")):
            out.extend(functions(path, root))
    return out


def collect_at(root: Path, rev: str) -> list[Function]:
    """The functions of every ``.py`` file under ``fpsim/`` at git revision ``rev`` of ``root``.

    Raises:
        ValueError: ``root`` is not a git repository or has no revision ``rev`` (git's message).
    """
    run = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", rev, "--", *TREES], capture_output=True
    )
    if run.returncode:
        err = run.stderr.decode(errors="replace").strip()
        raise ValueError(f"--before {rev}: git archive of {root} failed: {err}")
    out: list[Function] = []
    with tarfile.open(fileobj=io.BytesIO(run.stdout)) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if member.isfile() and member.name.endswith(".py"):
                source = tar.extractfile(member).read().decode()
                out.extend(functions_in(source, member.name))
    return out


def summary(before: list[Function], after: list[Function], lines: int) -> str:
    """One line: the largest signature and the count of functions over ``lines`` lines, before -> after."""

    def numbers(found: list[Function]) -> tuple[int, int]:
        return max((f.params for f in found), default=0), sum(f.length > lines for f in found)

    (p0, n0), (p1, n1) = numbers(before), numbers(after)
    return f"largest signature {p0} -> {p1}; functions over {lines} lines {n0} -> {n1}"


def report(found: list[Function], top: int, lines: int) -> str:
    """The two tables as text: the ``top`` largest signatures, the functions over ``lines`` lines."""
    rows = [f"largest signatures (top {top} of {len(found)} functions; jit = @triton.jit kernel)"]
    rows.append(f"{'params':>6}  {'jit':3}  function")
    for f in sorted(found, key=lambda f: (-f.params, f.path, f.line))[:top]:
        rows.append(f"{f.params:>6}  {'jit' if f.jit else '':3}  {f.path}:{f.line} {f.name}")
    long = sorted((f for f in found if f.length > lines), key=lambda f: (-f.length, f.path, f.line))
    rows.append("")
    rows.append(f"functions over {lines} lines ({len(long)})")
    rows.append(f"{'lines':>6}  {'jit':3}  function")
    for f in long:
        rows.append(f"{f.length:>6}  {'jit' if f.jit else '':3}  {f.path}:{f.line} {f.name}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=ROOT, help="repository root")
    parser.add_argument("--top", type=int, default=10, help="how many signatures to list")
    parser.add_argument("--lines", type=int, default=80, help="list functions longer than this")
    parser.add_argument(
        "--before", metavar="REV", help="also the tables of git revision REV, and a comparison"
    )
    args = parser.parse_args(argv)
    if args.top < 1 or args.lines < 1:
        parser.error(f"--top and --lines must be positive, got {args.top} and {args.lines}")
    root = args.root.resolve()
    now = collect(root)
    if args.before is None:
        print(report(now, args.top, args.lines))
        return
    try:
        before = collect_at(root, args.before)
    except ValueError as e:
        parser.error(str(e))
    print(f"before ({args.before})\n{report(before, args.top, args.lines)}\n")
    print(f"now\n{report(now, args.top, args.lines)}\n")
    print(summary(before, now, args.lines))


if __name__ == "__main__":
    main()
