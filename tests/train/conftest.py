"""Shared by the tests of fpsim.train: torch on one thread (the tiny models run faster than with
threads handing work around)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread():
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
