"""Tests of the Triton kernels (``kernels/``, imported as ``fpsim.kernels``).

A package, so that its ``conftest.py`` (Triton's interpreter switched on) is
``kernels.conftest`` beside ``tests/conftest.py``; the shared oracle helpers are in
``tests/oracles``.
"""
