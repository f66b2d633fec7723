"""Random words for stochastic rounding: given, drawn from a generator, or counter-based.

Stochastic rounding takes one uint32 word per element, so the emulator and a kernel fed the
same words must agree bit for bit:

- :func:`random_words`: the words the verbs ``encode``/``quantize`` use: the caller's
  ``random_bits``, or ``rng.integers(0, 2**32)`` of a numpy Generator or an int seed.
- :func:`stochastic_words`: the same, for a rounding mode: None unless it is stochastic,
  with ``stochastic_bits`` checked (what the verbs of every kind of format call).
- :func:`random_bits_at`: counter-based words for flat positions ``start .. start + n``
  (SplitMix64 of the seed and the index, Steele, Lea and Flood, "Fast splittable
  pseudorandom number generators", OOPSLA 2014), so that a chunk of a tensor draws the same
  words wherever and in whatever order it is processed: the analysis, the replay and the
  accumulation use them, and the replay's compiled bfloat16 rounding computes them in its
  loop (:mod:`fpsim._compiled.loops`); :func:`shifted_seed` moves a seed along the counter, so
  that a chunk numbered from 0 on its own draws the words of its place in the tensor.

The Triton kernels' in-kernel source is Philox4x32-10 (``tl.randint4x``);
:func:`fpsim.kernels.philox.philox_bits` is its numpy twin, so a kernel run with in-kernel
random numbers can be replayed by the emulator with ``random_bits=philox_bits(...)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..formats import RoundMode

__all__ = [
    "SEED_MULTIPLIER",
    "check_random_args",
    "random_bits_at",
    "random_words",
    "shifted_seed",
    "stochastic_words",
]

SEED_MULTIPLIER = 0x9E3779B97F4A7C15
"""The odd multiplier of the seed in :func:`random_bits_at` (SplitMix64's golden gamma)."""
_SEED_MULTIPLIER_INV = pow(SEED_MULTIPLIER, -1, 1 << 64)


def random_bits_at(seed: int, start: int, n: int) -> np.ndarray:
    """uint32 words for flat positions ``start .. start+n`` (SplitMix64 of seed and index).

    Counter-based, so a chunk draws the same bits wherever it is processed.
    """
    z = np.arange(start, start + n, dtype=np.uint64) + np.uint64((seed * SEED_MULTIPLIER) % (1 << 64))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))).astype(np.uint32)


def shifted_seed(seed: int, offset: int) -> int:
    """The seed whose random bits at flat position ``i`` are those of ``seed`` at ``offset + i``.

    :func:`random_bits_at` hashes ``i + seed * G (mod 2**64)`` with ``G`` (:data:`SEED_MULTIPLIER`)
    odd, so ``seed + offset * G**-1 (mod 2**64)`` gives exactly that.

    Args:
        seed: the seed of the whole sequence.
        offset: the flat position that becomes position 0.

    Returns:
        A seed in ``[0, 2**64)``: ``random_bits_at(shifted_seed(seed, offset), 0, n)`` equals
        ``random_bits_at(seed, offset, n)``.
    """
    return (seed + offset * _SEED_MULTIPLIER_INV) % (1 << 64)


def random_words(xp: Any, random_bits: Any, rng: Any, shape: tuple) -> Any:
    """The uint32 words of a stochastic rounding: ``random_bits`` checked (uint32, ``shape``),
    or drawn from ``rng`` (a numpy Generator or an int seed) as an array of the namespace
    ``xp`` (numpy or jax.numpy).

    Raises:
        ValueError: neither is given, or ``random_bits`` has another shape.
        TypeError: ``random_bits`` is not a uint32 array, or ``rng`` is neither a numpy
            Generator nor an int seed.
    """
    check_random_args(random_bits, rng, 32)
    if random_bits is None:
        if rng is None:
            raise ValueError(
                "stochastic rounding needs random_bits= (uint32, x's shape) "
                "or rng= (a numpy Generator or an int seed)"
            )
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        random_bits = xp.asarray(gen.integers(0, 1 << 32, size=shape, dtype=np.uint32))
    if random_bits.dtype != np.uint32:
        raise TypeError(f"random_bits must be uint32, got {random_bits.dtype}")
    if tuple(random_bits.shape) != tuple(shape):
        raise ValueError(f"random_bits has shape {tuple(random_bits.shape)}; x has {tuple(shape)}")
    return random_bits


def stochastic_words(
    xp: Any, mode: RoundMode, random_bits: Any, rng: Any, shape: tuple, stochastic_bits: int
) -> Any:
    """The words a rounding in ``mode`` uses: None for a deterministic mode, else
    :func:`random_words` (``random_bits`` checked, or drawn from ``rng``).

    Raises:
        TypeError, ValueError: as :func:`check_random_args` (for every mode: a wrong
            argument is an error even where it is not used), and as :func:`random_words`.
    """
    check_random_args(random_bits, rng, stochastic_bits)
    if mode is not RoundMode.STOCHASTIC:
        return None
    return random_words(xp, random_bits, rng, shape)


def check_random_args(random_bits: Any, rng: Any, stochastic_bits: Any) -> None:
    """Check the random arguments every verb takes, before any is used.

    Args:
        random_bits: None or an array with a ``dtype`` and ``shape`` (numpy, JAX, ...).
        rng: None, a ``numpy.random.Generator`` or a non-negative int seed.
        stochastic_bits: an int in [1, 32].

    Raises:
        TypeError: a value of the wrong type, naming the argument and what it accepts.
        ValueError: a negative seed, or ``stochastic_bits`` outside [1, 32].
    """
    if random_bits is not None and not (hasattr(random_bits, "dtype") and hasattr(random_bits, "shape")):
        raise TypeError(
            f"random_bits must be None or a uint32 array of x's shape (numpy or JAX), "
            f"got {_short(random_bits)}"
        )
    if rng is not None and not isinstance(rng, np.random.Generator):
        if isinstance(rng, bool) or not isinstance(rng, (int, np.integer)):
            raise TypeError(f"rng must be None, a numpy.random.Generator or an int seed, got {_short(rng)}")
        if rng < 0:
            raise ValueError(f"rng: an int seed must be non-negative, got {rng}")
    if isinstance(stochastic_bits, bool) or not isinstance(stochastic_bits, (int, np.integer)):
        raise TypeError(f"stochastic_bits must be an int in [1, 32], got {_short(stochastic_bits)}")
    if not 1 <= stochastic_bits <= 32:
        raise ValueError(f"stochastic_bits must be in [1, 32], got {stochastic_bits}")


def _short(value: Any) -> str:
    """``value``'s type and (shortened) repr, for messages."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
