"""Tests of the Triton kernels (``kernels/``, imported as ``fpsim.kernels``).

A package, so that its ``conftest.py`` is ``kernels.conftest`` and does not replace
``tests/conftest.py``, whose helpers the other test modules import as ``conftest``.
"""
