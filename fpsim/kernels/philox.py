"""Philox4x32-10 in numpy: the random words of Triton's ``tl.randint`` for the emulator.

The cast kernels' in-kernel stochastic rounding (``seed=``) draws element ``i``'s word with
``tl.randint(seed, i)``. That is the first output word of the Philox4x32-10 counter-based
generator (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
SC 2011) with counter ``[i mod 2**32, i >> 32, 0, 0]`` and key
``[seed mod 2**32, (seed >> 32) mod 2**32]`` (``triton/language/random.py``). This module
computes the same words with numpy, so that::

    bits = philox_bits(seed, x.size).reshape(x.shape)
    fpsim.emulate.element.encode(x, fmt, rounding="stochastic", random_bits=bits)

equals the kernel's ``fpsim.kernels.cast.encode(x, fmt, rounding="stochastic", seed=seed)``.
Only numpy is needed (no torch, no triton). The known answer of the Random123 distribution
(counter 0, key 0 gives ``6627e8d5 e169c58d bc57ac4c 9b00dbd8``) is checked in the tests.
"""

from __future__ import annotations

import numpy as np

__all__ = ["philox4x32", "philox_bits"]

# Round multipliers and Weyl key increments (Random123 philox.h, Triton random.py).
_MUL_A = np.uint64(0xD2511F53)
_MUL_B = np.uint64(0xCD9E8D57)
_KEY_A = np.uint32(0x9E3779B9)
_KEY_B = np.uint32(0xBB67AE85)
_LO = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def philox4x32(
    counter: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    key: tuple[int, int],
    rounds: int = 10,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The Philox4x32 bijection of counters ``(c0, c1, c2, c3)`` (uint32 arrays) under ``key``.

    Args:
        counter: four uint32 arrays of one shape.
        key: ``(k0, k1)``, each in ``[0, 2**32)``.
        rounds: number of rounds (10 is the standard Philox4x32-10 and Triton's default).

    Returns:
        The four uint32 output words.
    """
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint32) for c in counter)
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    with np.errstate(over="ignore"):
        for _ in range(rounds):
            p0 = _MUL_A * c0.astype(np.uint64)  # exact: 32 x 32 bits fit in 64
            p2 = _MUL_B * c2.astype(np.uint64)
            hi0, lo0 = (p0 >> _32).astype(np.uint32), (p0 & _LO).astype(np.uint32)
            hi2, lo2 = (p2 >> _32).astype(np.uint32), (p2 & _LO).astype(np.uint32)
            c0, c1, c2, c3 = hi2 ^ c1 ^ k0, lo2, hi0 ^ c3 ^ k1, lo0
            k0 = np.uint32((int(k0) + int(_KEY_A)) & 0xFFFFFFFF)
            k1 = np.uint32((int(k1) + int(_KEY_B)) & 0xFFFFFFFF)
    return c0, c1, c2, c3


def philox_bits(seed: int, n: int, offset: int = 0) -> np.ndarray:
    """The uint32 words ``tl.randint(seed, offset + arange(n))`` gives, as a numpy array.

    Args:
        seed: the kernel's seed, an int in ``[-2**63, 2**64)``. Triton passes it as int32,
            int64 or uint64 and widens it to uint64 (a negative seed sign-extends), so the key
            is ``seed mod 2**64`` split into its low and high 32-bit words.
        n: how many words (one per element of the flattened tensor).
        offset: the first element index (the counter of element ``i`` is ``offset + i``).

    Returns:
        A uint32 array of shape ``(n,)``.

    Raises:
        ValueError: for a seed outside ``[-2**63, 2**64)`` or a negative ``n`` or ``offset``.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"philox_bits: seed must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"philox_bits: seed must be in [-2**63, 2**64), got {seed}")
    if n < 0 or offset < 0:
        raise ValueError(f"philox_bits: n and offset must be >= 0, got n={n}, offset={offset}")
    key = seed & ((1 << 64) - 1)
    idx = np.arange(offset, offset + n, dtype=np.uint64)
    lo = (idx & _LO).astype(np.uint32)
    hi = (idx >> _32).astype(np.uint32)
    zero = np.zeros(n, np.uint32)
    out = np.empty(n, np.uint32)
    step = 1 << 20  # bounded temporaries
    for i in range(0, n, step):
        sl = slice(i, i + step)
        z = zero[sl]
        out[sl] = philox4x32((lo[sl], hi[sl], z, z), (key & 0xFFFFFFFF, key >> 32))[0]
    return out
