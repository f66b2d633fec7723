"""What the report commands (``analyze``, ``replay``) share: ``--backend``, and what they print
(the JSON summary, or the table and the files written)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from typing import Any

from .._compiled import Backend

__all__ = [
    "add_backend_argument",
    "add_figures_argument",
    "emit",
    "format_name",
    "missing_dependency",
    "non_negative",
    "non_negative_int",
    "positive_int",
]


def emit(summary: Mapping[str, Any], text: str, paths: Mapping[str, Any], as_json: bool) -> int:
    """Print a command's JSON summary or its table and the files it wrote; returns 0.

    Args:
        summary: the result's JSON summary (non-finite floats already spelled as strings).
        text: the table to print without ``--json``.
        paths: the files written, by kind.
        as_json: print ``summary`` as JSON instead of ``text`` and ``paths``.
    """
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        print(text)
        print(f"\nwrote {', '.join(str(p) for p in paths.values())}")
    return 0


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--backend {auto,numpy,compiled}`` (where the hot loops run, :class:`fpsim.Backend`)."""
    parser.add_argument(
        "--backend",
        choices=["auto", *(b.value for b in Backend)],
        default="auto",
        help="where the hot loops run: numpy, compiled (numba) or auto (default: compiled when "
        "numba is installed)",
    )


def add_figures_argument(parser: argparse.ArgumentParser, names: str) -> None:
    """Add ``--figures/--no-figures`` (default: no figures; ``names``: the files drawn)."""
    parser.add_argument(
        "--figures",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=f"also draw {names} (matplotlib: most of the time of a run on a small trace; "
        "default: --no-figures)",
    )


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (argparse names the flag in the error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative(text: str) -> float:
    """An argparse type: a finite number >= 0 (argparse names the flag in the error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (argparse names the flag in the error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def format_name(text: str) -> str:
    """An argparse type: the name of an element format or block recipe (:func:`fpsim.get_format`;
    argparse names the flag in the error, which lists the known names)."""
    from ..formats import get_format

    try:
        get_format(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def missing_dependency(err: ImportError, command: str) -> str:
    """One line saying which optional dependency ``command`` lacks and how to install it.

    The extra to install is the smallest of fpsim's extras (in the installed package's metadata,
    i.e. pyproject.toml) that has the module: torch is ``capture`` (.pt traces, captures), except
    for ``validate-kernels``, which needs ``kernels`` (torch and triton). A message that already
    says ``pip install`` is kept as it is.
    """
    if "pip install" in str(err):
        return str(err)
    module = (err.name or "").split(".")[0]
    extra = "kernels" if command == "validate-kernels" and module in ("torch", "triton") else None
    extra = extra or _extras().get(module.lower())
    how = f"pip install 'fpsim[{extra}]'" if extra else f"pip install {module or '<the missing module>'}"
    return f"needs {module or 'a module'}, which is not installed ({err}): {how}"


def _extras() -> dict[str, str]:
    """Module name -> the smallest fpsim extra that installs it, from the package metadata
    (``dask[distributed]`` counts for both dask and distributed); empty when not installed."""
    import re
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("fpsim") or []
    except PackageNotFoundError:
        return {}
    members: dict[str, list[str]] = {}
    for req in reqs:
        m = re.fullmatch(r'\s*([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?[^;]*;\s*extra\s*==\s*"([^"]+)"\s*', req)
        if m:
            names = [m[1], *(m[2].split(",") if m[2] else [])]
            members.setdefault(m[3], []).extend(n.strip().lower().replace("-", "_") for n in names)
    out: dict[str, str] = {}
    for extra, names in sorted(members.items(), key=lambda item: len(item[1])):
        for name in names:
            out.setdefault(name, extra)
    return out
