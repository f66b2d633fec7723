"""The one shared figure style of fpsim (reports, README figures, notebooks).

Figures are :class:`fpsim.report.figure.Figure` objects (a ``matplotlib.figure.Figure`` with
a PNG representation) created without pyplot, so drawing needs no display and leaves no global
state; save them with ``fig.savefig``. In Jupyter a figure shows itself as an image when it is
the value of a cell (``_repr_png_``), whether or not pyplot or the inline backend is loaded.

Every format, recipe and replay configuration has one colour in every figure:
:func:`colour_for` looks it up in a fixed table and gives any other name a colour from a stable
hash of the name (not Python's salted ``hash``), so the same name is drawn in the same colour
in every figure and every run.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "STYLE",
    "colour_for",
    "colours_for",
    "markdown_table",
    "new_figure",
    "style",
    "text_table",
]

STYLE: dict[str, Any] = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "savefig.bbox": "tight",
}

# Colours that stay apart from each other (Okabe-Ito and Tableau hues, no light tints).
_BLACK, _BLUE, _RED, _ORANGE, _GREEN = "#222222", "#1f77b4", "#d62728", "#e69f00", "#009e73"
_PURPLE, _BROWN, _PINK, _SKY, _OLIVE = "#7b3294", "#8c564b", "#cc79a7", "#56b4e9", "#8a8a00"
_GREY, _NAVY, _TEAL, _VERMILION = "#7f7f7f", "#253494", "#17becf", "#f0592b"

_FALLBACK = (_BLUE, _RED, _ORANGE, _GREEN, _PURPLE, _BROWN, _PINK, _SKY, _OLIVE, _GREY, _NAVY, _TEAL)

# One colour per known name. Names drawn together (the analysis' default formats, the
# spacing figure's formats, the replay presets, the accumulation settings) get distinct colours;
# formats and replay configurations never share a figure, so the two groups reuse hues.
_COLOURS: dict[str, str] = {
    # element formats
    "float32": _BLACK,
    "bfloat16": _BLUE,
    "float16": _RED,
    "float8_e4m3fn": _ORANGE,
    "float8_e4m3": _ORANGE,
    "float8_e4m3fnuz": _ORANGE,
    "float8_e5m2": _GREEN,
    "float8_e5m2fnuz": _GREEN,
    "float8_e3m4": _OLIVE,
    "float8_e4m3b11fnuz": _BROWN,
    "float6_e2m3fn": _PINK,
    "float6_e3m2fn": _BROWN,
    "float4_e2m1fn": _PURPLE,
    # block recipes
    "e4m3_tensor": _SKY,
    "e4m3_tensor_pow2": _TEAL,
    "e5m2_tensor": _TEAL,
    "e4m3_row": _NAVY,
    "e4m3_block128": _NAVY,
    "e4m3_tile128": _NAVY,
    "mxfp8_e4m3": _PINK,
    "mxfp8_e5m2": _OLIVE,
    "mxfp6_e2m3": _PINK,
    "mxfp6_e3m2": _BROWN,
    "mxfp4_e2m1": _PURPLE,
    "mxint8": _GREY,
    "nvfp4": _PURPLE,
    "int8_block256": _BROWN,
    "int8_block2048": _GREY,
    "bnb_dynamic8_block256": _TEAL,
    "bnb_dynamic8_block2048": _TEAL,
    "bnb_dynamic8u_block256": _TEAL,
    "fp8_e4m3_block256": _VERMILION,
    # replay configurations (the presets) and the FP32 reference
    "reference": _BLACK,
    "fp32": _BLACK,
    "bf16-master": _BLUE,
    "bf16-master-sr": _SKY,
    "bf16-master-kahan": _PURPLE,
    "bf16-states": _OLIVE,
    "int8-states": _BROWN,
    "fp8-states": _ORANGE,
    "bnb-8bit": _GREEN,
    "bnb-8bit-all": _TEAL,
    "bnb-8bit-cpu": _GREY,
    "torchao-8bit": _NAVY,
    "torchao-4bit": _PINK,
    "torchao-fp8": _VERMILION,
    "msamp-o2": _RED,
    "fp16-grads-dynamic": _RED,
    "fp8-grads-delayed": _OLIVE,
    # the settings of fpsim accumulate --deepseek
    "E4M3 per-tensor, FP32 accumulator": _BLACK,
    "E4M3 per-tensor, 14-bit RNE": _SKY,
    "E4M3 per-tensor, 14-bit RZ": _RED,
    "E4M3 per-tensor, 14-bit RNE, promote 128": _BLUE,
    "E4M3 per-tensor, 14-bit RZ, promote 128": _ORANGE,
    "E4M3 1x128/128x128, 14-bit RZ, promote 128": _GREEN,
}


def colour_for(name: str) -> str:
    """The colour of a format, recipe, replay configuration or accumulation setting.

    Known names take their entry of a fixed table; any other name a colour chosen by the CRC-32
    of its UTF-8 bytes, so it is the same in every figure, process and Python version.
    """
    if name in _COLOURS:
        return _COLOURS[name]
    return _FALLBACK[zlib.crc32(name.encode()) % len(_FALLBACK)]


def colours_for(names: Iterable[str]) -> dict[str, str]:
    """Colours of names drawn together: :func:`colour_for`, except that a name outside the
    fixed table whose hashed colour is already taken in this figure takes the next free
    colour (in the order of ``names``), so that no two lines of one figure look alike."""
    names = list(dict.fromkeys(names))
    out = {n: _COLOURS[n] for n in names if n in _COLOURS}
    for n in names:
        if n in out:
            continue
        c = colour_for(n)
        if c in out.values():
            start = _FALLBACK.index(c)
            free = [_FALLBACK[(start + i) % len(_FALLBACK)] for i in range(len(_FALLBACK))]
            c = next((f for f in free if f not in out.values()), c)
        out[n] = c
    return out


def style():
    """Context manager: draw inside it so every artist takes the fpsim style."""
    import matplotlib

    return matplotlib.rc_context(STYLE)


def new_figure(nrows: int = 1, ncols: int = 1, **kwargs: Any):
    """A :class:`~fpsim.report.figure.Figure` and its axes (``squeeze`` etc. as in ``subplots``);
    call inside :func:`style`."""
    from .figure import Figure

    fig = Figure(figsize=kwargs.pop("figsize", (6, 4)), layout="constrained")
    return fig, fig.subplots(nrows, ncols, **kwargs)


def text_table(heads: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Aligned plain-text table: the first ``left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]

    def line(vals: list[str]) -> str:
        return "  ".join(v.ljust(w) if i < left else v.rjust(w) for i, (v, w) in enumerate(zip(vals, widths)))

    return "\n".join([line(heads), *(line(r) for r in rows)])


def markdown_table(heads: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A GitHub Markdown table: the first ``left`` columns left-aligned, the rest right-aligned;
    ``|`` inside a cell is escaped."""

    def line(vals: Sequence[str]) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in vals) + " |"

    align = ["---" if i < left else "---:" for i in range(len(heads))]
    return "\n".join([line(heads), "|" + "|".join(align) + "|", *(line(r) for r in rows)])
