"""Philox4x32-10 in numpy (fpsim.kernels.philox) against the published known answers; no
torch or triton needed (test_stochastic_kernels.py compares it with ``tl.randint``)."""

from __future__ import annotations

import numpy as np
import pytest

from fpsim.kernels.philox import philox4x32, philox_bits

# Random123 kat_vectors (Salmon et al., SC 2011): counter, key -> the four output words.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,want", KAT)
def test_known_answers(counter, key, want):
    got = philox4x32(tuple(np.array([c], np.uint32) for c in counter), key)
    assert tuple(int(w[0]) for w in got) == want


def test_philox_bits_is_the_first_word_of_the_counter_index():
    assert philox_bits(0, 1)[0] == 0x6627E8D5  # the first word of the all-zero counter and key in KAT
    seed, idx = 0x1234_5678_9ABC, np.array([0, 1, 7, 2**32 - 1, 2**32, 2**32 + 5], np.uint64)
    words = [philox_bits(seed, 1, offset=int(i))[0] for i in idx]
    c0, c1 = (idx & 0xFFFFFFFF).astype(np.uint32), (idx >> np.uint64(32)).astype(np.uint32)
    z = np.zeros(idx.size, np.uint32)
    assert np.array_equal(words, philox4x32((c0, c1, z, z), (seed & 0xFFFFFFFF, seed >> 32))[0])
    assert np.array_equal(philox_bits(seed, 10, offset=3), philox_bits(seed, 13)[3:])


def test_philox_bits_argument_errors():
    with pytest.raises(ValueError, match="seed"):
        philox_bits(2**64, 3)
    with pytest.raises(TypeError, match="seed"):
        philox_bits(1.5, 3)
    with pytest.raises(ValueError, match="n and offset"):
        philox_bits(1, -1)
