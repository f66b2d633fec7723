"""What a person reads: text tables, Markdown reports and figures, in one shared style.

- :mod:`.style`: the plot style, one colour per format and configuration (``colour_for``), the
  plain-text and Markdown tables.
- :mod:`.figure`: the figure class, a matplotlib Figure that Jupyter shows as an image.
- :mod:`.analysis`: the tables and figures of ``fpsim analyze``.
- :mod:`.replay`: those of ``fpsim replay``.
- :mod:`.accumulate`: those of ``fpsim accumulate``.
- :mod:`.figures`: ``fpsim figures``, every figure of ``figures/``.

Everything here consumes result tables; nothing here computes a metric.
"""
