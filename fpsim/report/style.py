"""The one shared figure style of fpsim (reports, README figures, notebooks).

Figures are ``matplotlib.figure.Figure`` objects created without pyplot, so drawing needs
no display and leaves no global state; save them with ``fig.savefig``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["new_figure", "palette", "style", "text_table", "STYLE"]

STYLE: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "figure.dpi": 110,
    "savefig.bbox": "tight",
}

_PALETTE = ("#1b6ca8", "#d1495b", "#edae49", "#00798c", "#66a182", "#8d96a3", "#2e4057", "#b5838d")


def palette() -> tuple[str, ...]:
    """Colours assigned to formats in order (colour-blind friendly)."""
    return _PALETTE


def style():
    """Context manager: draw inside it so every artist takes the fpsim style."""
    import matplotlib

    return matplotlib.rc_context(STYLE)


def new_figure(nrows: int = 1, ncols: int = 1, **kwargs: Any):
    """A Figure and its axes (``squeeze`` etc. as in ``subplots``); call inside :func:`style`."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=kwargs.pop("figsize", (6, 4)), layout="constrained")
    return fig, fig.subplots(nrows, ncols, **kwargs)


def text_table(heads: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Aligned plain-text table: the first ``left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]

    def line(vals: list[str]) -> str:
        return "  ".join(v.ljust(w) if i < left else v.rjust(w) for i, (v, w) in enumerate(zip(vals, widths)))

    return "\n".join([line(heads), *(line(r) for r in rows)])
