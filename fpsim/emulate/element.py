"""Tier 2: encode, decode and quantize arrays (numpy, or JAX under ``jax.jit``).

Codes are unsigned integers (uint8 up to 8 bits, uint16 up to 16, uint32 for float32);
values are float32. Bit-exactness is always judged on codes. Tested against ml_dtypes and
torch casts (nearest-even), against :mod:`fpsim.emulate.reference` for every mode, and the JAX path
against the numpy path.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import numpy as np

from .. import _compiled
from .._compiled import Backend
from ..formats import AnyFormat, Encoding, Format, IntFormat, RoundMode, get_format
from ..formats.params import format_params
from . import _bitcore
from .random import stochastic_words

__all__ = ["encode", "decode", "quantize"]

# Names the other stages use (they hold resolved formats and modes): encode_array,
# decode_array, decode_table, element_format, as_float_array, as_float32, is_ml_float.


def encode(
    x: Any,
    fmt: str | AnyFormat,
    *,
    rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
    saturate: bool = False,
    subnormals: bool = True,
    random_bits: Any = None,
    rng: np.random.Generator | int | None = None,
    stochastic_bits: int = 32,
    backend: Backend | str = "auto",
) -> Any:
    """Round ``x`` to ``fmt`` and return the codes.

    Args:
        x: numpy array (float16/32/64, bfloat16 or another ml_dtypes float, integers),
            Python number or sequence, or a JAX array (also inside ``jax.jit``). float64
            inputs are rounded once, directly (ml_dtypes goes through float32 first and can
            round twice). Integers go through float64 (exact up to 2**53; int64 beyond is
            rounded there first); JAX integers wider than 16 bits need jax x64.
        fmt: a :class:`~fpsim.Format`, :class:`~fpsim.IntFormat` or a registry name.
        rounding: a :class:`~fpsim.RoundMode` or its name.
        saturate: clamp every out-of-range value, +-inf included, to +-max (NVIDIA
            ``satfinite``, torch's float8_e4m3fn cast). NaN stays NaN. For integer formats
            False wraps modulo ``2**bits``.
        subnormals: False flushes subnormal results to a zero of the same sign after
            rounding (PTX ``.ftz``).
        random_bits: for stochastic rounding, a uint32 array of ``x``'s shape; element i
            uses its low ``stochastic_bits`` bits (see :class:`~fpsim.RoundMode`).
        rng: when ``random_bits`` is None, a ``numpy.random.Generator`` or an int seed
            from which they are drawn.
        stochastic_bits: how many random bits one stochastic rounding uses, 1 to 32.
        backend: where numpy input is encoded (:class:`~fpsim.Backend` or its name):
            ``"compiled"`` runs the loop of :mod:`fpsim._compiled.measure` on all cores,
            ``"numpy"`` the numpy tier; the same codes either way (tested against each other
            on every format and mode). ``"auto"``: compiled where numba is installed.
            JAX input always runs under JAX.

    Returns:
        Unsigned integer codes of ``x``'s shape (numpy, or JAX for JAX input). NaN gives
        the format's NaN code (:attr:`Format.code_of_nan`, with the input's sign where the
        format has one); formats without NaN give +0. Unsigned formats give NaN for
        negatives; E8M0 gives NaN for zero and its smallest value for anything below it.
    """
    fmt, mode, backend = element_format(fmt), RoundMode.parse(rounding), Backend.resolve(backend)
    xp, x = as_float_array(x)
    rand = stochastic_words(xp, mode, random_bits, rng, x.shape, stochastic_bits)
    return encode_array(
        x,
        fmt,
        mode,
        saturate=saturate,
        subnormals=subnormals,
        rand=rand,
        nbits=stochastic_bits,
        backend=backend,
    )


def encode_array(
    x: Any,
    fmt: AnyFormat,
    mode: RoundMode,
    *,
    saturate: bool = False,
    subnormals: bool = True,
    rand: Any = None,
    nbits: int = 32,
    backend: Backend = Backend.NUMPY,
) -> Any:
    """:func:`encode` of resolved arguments, for the stages that hold objects already.

    Args:
        x: a float32 or float64 array (numpy or JAX), as :func:`as_float_array` gives.
        fmt: the element format; mode: the rounding mode.
        saturate, subnormals: as for :func:`encode`.
        rand: the uint32 words of a stochastic rounding, of ``x``'s shape (checked ones:
            :func:`fpsim.emulate.random.stochastic_words`), else None.
        nbits: random bits per rounding, 1 to 32.
        backend: :attr:`Backend.COMPILED` runs numpy input through the compiled loop.
    """
    xp = _namespace(x)
    if xp is np and backend is Backend.COMPILED:
        return _encode_compiled(x, fmt, mode, saturate, subnormals, rand, nbits)
    if isinstance(fmt, IntFormat):
        if xp is np:
            return _bitcore.encode_int_numpy(x, fmt, mode, saturate, rand, nbits)
        return _bitcore.encode_int(xp, x, fmt, mode, saturate, rand, nbits)
    ftz = not (subnormals and fmt.subnormals)
    if xp is np:
        return _bitcore.encode_float_numpy(x, fmt, mode, saturate, ftz, rand, nbits)
    return _bitcore.encode_float(xp, x, fmt, mode, saturate, ftz, rand, nbits)


PIECE = 1 << 18
"""Elements per task when the compiled encode runs on the thread pool."""
_NO_WORDS = np.zeros(0, np.uint32)  # the words of a rounding that draws none (never written)
_SEED0 = np.uint64(0)


@cache
def loop_params(fmt: AnyFormat, saturate: bool, ftz: bool) -> tuple[int, ...]:
    """The :class:`~fpsim.formats.params.FormatParams` of ``fmt`` for the loops of
    :mod:`fpsim._compiled.measure`, as a plain tuple (numba types a NamedTuple argument about
    12 us slower per call); ``ftz``: flush subnormal results."""
    return tuple(format_params(fmt, saturate=saturate, ftz=ftz))


@cache
def loop_table(fmt: AnyFormat) -> np.ndarray:
    """float32 value of each code (:func:`decode_table`, a writable copy: numba compiles
    read-only arrays as another type); one dummy entry for formats wider than 16 bits."""
    return np.array(decode_table(fmt) if fmt.bits <= 16 else np.zeros(1, np.float32), np.float32)


_pool: tuple[int, ThreadPoolExecutor] | None = None  # (the pid of the process that made it, the pool)


def pool() -> ThreadPoolExecutor:
    """The thread pool the compiled loops run on (one thread per core; they release the GIL),
    made once per process: a child forked after its parent made one makes its own (the parent's
    threads do not exist in the child, so a task given to the parent's pool would wait forever).
    Tested in tests/test_fork.py: the compiled encode, the analysis, the replay and the training
    optimizers run again in a forked child."""
    global _pool
    made, pid = _pool, os.getpid()
    if made is None or made[0] != pid:
        made = _pool = (pid, ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="fpsim"))
    return made[1]


def _encode_compiled(x: np.ndarray, fmt: AnyFormat, mode: RoundMode, saturate, subnormals, rand, nbits):
    """:func:`encode_array` by :func:`fpsim._compiled.measure.codes_tile`, piece by piece on the pool."""
    ftz = isinstance(fmt, Format) and not (subnormals and fmt.subnormals)
    p = loop_params(fmt, bool(saturate), ftz)
    flat = _compiled.frozen(x)  # (the words stay writable, as the tallies' own empty ones)
    out = np.empty(flat.size, fmt.code_dtype)
    r = np.ascontiguousarray(rand, np.uint32).reshape(-1) if rand is not None else _NO_WORDS
    r = r if r.flags.writeable else r.copy()
    code, loops = mode.code, _compiled.load_measure()
    if flat.size <= PIECE:  # one piece, on this thread
        loops.codes_tile(flat, p, code, nbits, _SEED0, 0, r, out)
        return out.reshape(np.shape(x))

    def run(a: int) -> None:
        b = min(flat.size, a + PIECE)
        loops.codes_tile(flat[a:b], p, code, nbits, _SEED0, 0, r[a:b] if r.size else r, out[a:b])

    list(pool().map(run, range(0, flat.size, PIECE)))
    return out.reshape(np.shape(x))


def decode(codes: Any, fmt: str | AnyFormat) -> Any:
    """Values (float32) of ``codes`` in ``fmt``.

    Codes of formats up to 16 bits go through a table built once per format; float32 codes
    are reinterpreted. NaN codes give NaN, in formats without subnormals the subnormal codes
    give zero. numpy codes are range-checked (ValueError); JAX codes cannot be checked inside
    ``jit``, and out-of-range ones give unspecified values.
    """
    return decode_array(codes, element_format(fmt))


def decode_array(codes: Any, fmt: AnyFormat) -> Any:
    """:func:`decode` with the format resolved (numpy or JAX codes, range-checked on numpy)."""
    xp = _namespace(codes)
    codes = xp.asarray(codes)
    if not np.issubdtype(codes.dtype, np.integer):
        raise TypeError(f"decode: codes must be an integer array, got dtype {codes.dtype}")
    fits = codes.dtype.kind == "u" and codes.dtype.itemsize * 8 <= fmt.bits
    if xp is np and not fits and codes.size and (codes.min() < 0 or codes.max() >= (1 << fmt.bits)):
        raise ValueError(
            f"decode: codes out of range for {fmt.name} ({fmt.bits} bits): "
            f"min {codes.min()}, max {codes.max()}"
        )
    if fmt.bits == 32:
        return _bitcore.bitcast(xp, codes.astype(np.uint32), np.float32)
    if fmt.bits > 16:  # too wide for a table: build the values from the fields
        if xp is not np:
            raise TypeError(f"decode: {fmt.name} ({fmt.bits} bits) is decoded on numpy arrays only")
        return _float_table(fmt, codes.astype(np.int64))
    table = decode_table(fmt)
    if xp is np:
        return table[codes]
    return xp.asarray(table)[codes.astype(np.int32)]


def quantize(x: Any, fmt: str | AnyFormat, **kwargs: Any) -> Any:
    """``decode(encode(x, fmt, **kwargs), fmt)``: ``x`` rounded to ``fmt``, as float32
    (``backend`` as :func:`encode` takes it)."""
    fmt = element_format(fmt)
    return decode_array(encode(x, fmt, **kwargs), fmt)


@cache
def decode_table(fmt: AnyFormat) -> np.ndarray:
    """float32 value of every code of a format of at most 16 bits (read-only array)."""
    if fmt.bits > 16:
        raise ValueError(f"decode_table: {fmt.name} has {fmt.bits} bits; at most 16")
    code = np.arange(1 << fmt.bits, dtype=np.int64)
    if isinstance(fmt, IntFormat):
        value = np.where(fmt.signed & (code >> (fmt.bits - 1) == 1), code - (1 << fmt.bits), code)
        table = np.ldexp(value.astype(np.float64), -fmt.fraction_bits).astype(np.float32)
    else:
        table = _float_table(fmt, code)
    table.flags.writeable = False
    return table


def _float_table(fmt: Format, code: np.ndarray) -> np.ndarray:
    e_bits, m_bits = fmt.exponent_bits, fmt.mantissa_bits
    mag = code & ((1 << (e_bits + m_bits)) - 1)
    field, frac = mag >> m_bits, mag & ((1 << m_bits) - 1)
    normal = (field > 0) | (not fmt.has_zero)
    scale = np.where(normal, field - fmt.bias, fmt.min_exponent) - m_bits
    signif = np.where(normal, frac + (1 << m_bits), frac if fmt.subnormals else 0)
    value = np.ldexp(signif.astype(np.float64), scale)
    value = np.where(code & fmt.sign_mask, -value, value)
    if fmt.encoding is Encoding.IEEE:
        top = field == (1 << e_bits) - 1
        value = np.where(top, np.where(frac == 0, np.copysign(np.inf, value), np.nan), value)
    elif fmt.encoding is Encoding.FN:
        value = np.where(mag == (1 << (e_bits + m_bits)) - 1, np.nan, value)
    elif fmt.encoding is Encoding.FNUZ:
        value = np.where(code == fmt.sign_mask, np.nan, value)
    return value.astype(np.float32)


def element_format(fmt: Any) -> AnyFormat:
    """The element format ``fmt`` names (or is); TypeError for a block format."""
    if isinstance(fmt, (Format, IntFormat)):
        return fmt
    fmt = get_format(fmt)
    if not isinstance(fmt, (Format, IntFormat)):
        raise TypeError(f"{fmt.name} is a block format: use fpsim.encode / fpsim.decode for it")
    return fmt


def _namespace(a: Any) -> Any:
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(a, jax.Array):
        return jax.numpy
    return np


def as_float_array(x: Any) -> tuple[Any, Any]:
    """(xp, array) with the array float32 or float64, converted exactly where possible.

    ``xp`` is numpy or jax.numpy, after the input. Raises TypeError for other dtypes.
    """
    xp = _namespace(x)
    if xp is np:
        x = np.asarray(x)
    dt = np.dtype(x.dtype)
    if dt in (np.float32, np.float64):
        return xp, x
    if dt.kind in "iub" or dt == np.float16 or is_ml_float(dt):
        wide = dt.kind in "iu" and dt.itemsize > 2
        if wide and xp is not np and not _jax_x64():
            raise TypeError(
                f"encode: a JAX {dt} array is not exact in float32; enable jax x64 or pass floats"
            )
        return xp, x.astype(np.float64 if wide else np.float32)
    raise TypeError(f"encode: cannot encode arrays of dtype {dt}; give floats or integers")


def _jax_x64() -> bool:
    import jax

    return bool(jax.config.read("jax_enable_x64"))


def as_float32(x: Any) -> np.ndarray:
    """``x`` as a float32 numpy array: exact for float16, bfloat16 and the other ml_dtypes
    floats and for integers up to 2**24, float64 rounded to nearest (overflow gives inf, a
    signaling NaN a NaN: neither warns)."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        return as_float_array(x)[1].astype(np.float32)


def is_ml_float(dt: np.dtype) -> bool:
    """Whether ``dt`` is an ml_dtypes floating-point type of at most 16 bits (bfloat16, the
    float8/6/4 types): those convert to float32 exactly."""
    try:
        import ml_dtypes

        ml_dtypes.finfo(dt)
    except (TypeError, ValueError):
        return False
    return dt.itemsize <= 2
