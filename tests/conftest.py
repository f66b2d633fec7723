"""Fixtures shared by the whole suite; the oracle helpers are in :mod:`oracles`."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def random_f32() -> np.ndarray:
    """10**7 float32 numbers from uniform random bit patterns (every exponent, NaNs, infs)."""
    rng = np.random.default_rng(20240607)
    a = rng.integers(0, 1 << 32, size=10**7, dtype=np.uint32).view(np.float32)
    a.flags.writeable = False
    return a
