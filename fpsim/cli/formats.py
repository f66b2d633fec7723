"""``fpsim formats [--json]``: every registered format and block recipe with its derived properties.

:func:`format_rows` gives the rows (the ``--json`` output); without ``--json`` they are
printed as two tables, element formats then block recipes.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..formats import FORMATS, RECIPES, AnyFormat, BlockFormat, Format

__all__ = ["add_parser", "format_rows", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``formats`` command to an argparse ``subparsers`` object; returns its parser."""
    f = subparsers.add_parser("formats", help="table of every registered format and its derived properties")
    f.add_argument("--json", action="store_true", help="print the same as JSON")
    f.set_defaults(run=run)
    return f


def run(args: argparse.Namespace) -> int:
    """Print the rows as JSON or as tables; returns the exit status (0)."""
    rows = format_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows)
    return 0


def format_rows() -> list[dict[str, Any]]:
    """One dict per registered format and block recipe: the rows of ``fpsim formats --json``."""
    return [_row(f) for f in FORMATS.values()] + [_recipe_row(r) for r in RECIPES.values()]


def _recipe_row(r: BlockFormat) -> dict[str, Any]:
    return {
        "name": r.name,
        "kind": "block",
        "element": r.element.name,
        "block": None if r.block is None else list(r.block),
        "flatten": r.flatten,
        "rule": r.rule.value,
        "scale_format": r.scale_format.name,
        "pow2": r.pow2,
        "eps": r.eps,
        "bits_per_element": r.bits_per_element,
        "bytes_per_element": r.bytes_per_element,
    }


def _row(f: AnyFormat) -> dict[str, Any]:
    if not isinstance(f, Format):
        return {
            "name": f.name,
            "kind": "int",
            "bits": f.bits,
            "signed": f.signed,
            "max": float(f.max),
            "min": float(f.min),
            "bytes_per_element": f.bytes_per_element,
            "code_of_max": f.code_of_max,
        }
    return {
        "name": f.name,
        "kind": "float",
        "bits": f.bits,
        "exponent_bits": f.exponent_bits,
        "mantissa_bits": f.mantissa_bits,
        "bias": f.bias,
        "signed": f.signed,
        "encoding": f.encoding.value,
        "subnormals": f.subnormals,
        "max": f.max,
        "min_normal": f.min_normal,
        "min_subnormal": f.min_subnormal,
        "eps": f.eps,
        "dynamic_range_binades": f.dynamic_range,
        "code_of_max": f.code_of_max,
        "code_of_nan": f.code_of_nan,
        "code_of_inf": f.code_of_inf,
        "bytes_per_element": f.bytes_per_element,
    }


_COLUMNS = [
    ("name", "format"),
    ("bits", "bits"),
    ("exponent_bits", "E"),
    ("mantissa_bits", "M"),
    ("bias", "bias"),
    ("encoding", "special"),
    ("max", "max"),
    ("min_normal", "min normal"),
    ("min_subnormal", "min subnormal"),
    ("eps", "eps"),
    ("dynamic_range_binades", "binades"),
    ("code_of_max", "max code"),
    ("code_of_nan", "NaN code"),
    ("code_of_inf", "inf code"),
]


def _cell(key: str, value: Any, bits: int) -> str:
    if value is None:
        return "-"
    if key.startswith("code_of"):
        return f"0x{value:0{(bits + 3) // 4}x}"
    if isinstance(value, float):
        return f"{value:.1f}" if key == "dynamic_range_binades" else f"{value:.6g}"
    return str(value)


_BLOCK_COLUMNS = [
    ("name", "recipe"),
    ("element", "element"),
    ("block", "block"),
    ("rule", "scale rule"),
    ("scale_format", "scale format"),
    ("bits_per_element", "bits/element"),
]


def _block_cell(key: str, value: Any, row: dict[str, Any]) -> str:
    if key == "block":
        shape = "tensor" if value is None else "x".join("all" if b == -1 else str(b) for b in value)
        return shape + (" (flat)" if row["flatten"] else "")
    if key == "rule" and row["pow2"]:
        return f"{value}, pow2"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _print_table(rows: list[dict[str, Any]]) -> None:
    _print_cells(
        [[_cell(k, r.get(k), r["bits"]) for k, _ in _COLUMNS] for r in rows if r["kind"] != "block"],
        [h for _, h in _COLUMNS],
    )
    print()
    _print_cells(
        [[_block_cell(k, r[k], r) for k, _ in _BLOCK_COLUMNS] for r in rows if r["kind"] == "block"],
        [h for _, h in _BLOCK_COLUMNS],
    )


def _print_cells(cells: list[list[str]], heads: list[str]) -> None:
    from ..report.style import text_table

    print(text_table(heads, cells))
