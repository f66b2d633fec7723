"""The figure class of fpsim: a matplotlib Figure that Jupyter shows as an image.

fpsim draws without pyplot (no global state, no display needed), so Jupyter's inline backend,
which registers its image formatter only when pyplot is loaded, would print a figure as
``<Figure size ... with 1 Axes>``. This class gives the figure its own ``_repr_png_``, the PNG
that ``savefig`` writes, so a figure that is the value of a cell shows as an image with or
without pyplot (and without changing what the inline backend does when it is loaded).
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure as _MplFigure

__all__ = ["DPI", "Figure"]

DPI = 110
"""Resolution of saved and displayed figures (dots per inch)."""


class Figure(_MplFigure):
    """A ``matplotlib.figure.Figure`` with a PNG representation for Jupyter (``_repr_png_``)."""

    def _repr_png_(self) -> bytes:
        """The figure as PNG bytes (tight bounding box, :data:`DPI`, no time stamp)."""
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
        return buf.getvalue()
