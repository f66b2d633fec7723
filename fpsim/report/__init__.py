"""What a person reads: text tables, Markdown reports and figures, in one shared style.

- :mod:`.style`: the plot style, colours and the plain-text table.
- :mod:`.analysis`: the tables and figures of ``fpsim analyze``.
- :mod:`.replay`: those of ``fpsim replay``.
- :mod:`.figures`: ``fpsim figures``, every figure of the README.

Everything here consumes result tables; nothing here computes a metric.
"""
