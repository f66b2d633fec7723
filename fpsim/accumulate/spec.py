"""The settings of an emulated reduction, resolved once: :class:`AccumulatorSpec`.

The public verbs (:func:`fpsim.accumulate.sum`, ``dot``, ``matmul``, ``scaled_matmul``) and
the Triton wrapper :mod:`fpsim.kernels.accumulate` take names and plain values; they build
one :class:`AccumulatorSpec` at entry with :meth:`AccumulatorSpec.build` (names resolved
through :func:`fpsim.formats.get_format`, :class:`~fpsim.RoundMode`, :class:`Order` and
:class:`Compensation`, every value checked) and pass it down. What each setting means is
defined in the :mod:`fpsim.accumulate` package docstring.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..formats import FORMATS, AnyFormat, BlockFormat, Format, RoundMode, get_format

__all__ = [
    "AccumulatorSpec",
    "Compensation",
    "Order",
    "Rounding",
    "SeedStream",
    "accumulator_format",
    "tree_width",
]


class Order(enum.Enum):
    """The order of the additions: a tree of width ``W`` over a chunk's addends.

    Attributes:
        SEQUENTIAL: ``W = n``, the plain left-to-right sum.
        PAIRWISE: ``W = 2``, a balanced binary tree.
        BLOCKED: ``W = block``, groups of ``block`` summed left to right, then their sums.
    """

    SEQUENTIAL = "sequential"
    PAIRWISE = "pairwise"
    BLOCKED = "blocked"

    @classmethod
    def parse(cls, order: Order | str) -> Order:
        """Accept an Order or its name; raise ValueError naming ``order`` and the names otherwise."""
        if isinstance(order, cls):
            return order
        try:
            return cls(order)
        except (ValueError, TypeError):
            names = ", ".join(o.value for o in cls)
            raise ValueError(f"order must be one of {names}; got {order!r}") from None


class Compensation(enum.Enum):
    """Compensated summation, per group of the tree.

    Attributes:
        NONE: plain rounded additions.
        KAHAN: Kahan 1965 (Higham, Accuracy and Stability, Alg. 4.2).
        NEUMAIER: Neumaier 1974 (the larger operand's error is carried).
    """

    NONE = "none"
    KAHAN = "kahan"
    NEUMAIER = "neumaier"

    @classmethod
    def parse(cls, compensated: Compensation | bool | str | None) -> Compensation:
        """Accept a Compensation, its name, or a bool (False / None: none, True: Kahan).

        Raises:
            ValueError: anything else, naming ``compensated`` and the allowed values.
        """
        if isinstance(compensated, cls):
            return compensated
        if compensated is None or isinstance(compensated, (bool, np.bool_)):
            return cls.KAHAN if compensated else cls.NONE
        if isinstance(compensated, str):
            try:
                return cls(compensated)
            except ValueError:
                pass
        raise ValueError(
            f"compensated must be False, True, 'kahan' or 'neumaier' (or a Compensation); got {compensated!r}"
        )


class SeedStream(enum.IntEnum):
    """The counter-based random streams of one ``seed``: stream ``4 * seed + value``."""

    ACCUMULATOR = 0  # accumulator and promotion roundings
    PRODUCT = 1  # product roundings
    INPUT_A = 2  # input rounding of a (or x)
    INPUT_B = 3  # input rounding of b


@dataclass(frozen=True)
class Rounding:
    """A rounding into a format: inputs (element format or block recipe) and products.

    Attributes:
        format: the resolved format.
        mode: the rounding mode.
    """

    format: AnyFormat
    mode: RoundMode


def accumulator_format(spec: str | Format | int) -> Format:
    """The accumulator format named by ``spec``.

    Args:
        spec: a registry name (``"float32"``, ``"bfloat16"``, ...), a :class:`~fpsim.Format`,
            or an int ``p`` in [2, 24]: float32's exponent range with ``p`` significant bits
            (``mantissa_bits = p - 1``), named ``"float32_p<p>"``.

    Raises:
        ValueError / TypeError: for unknown names, block recipes, integer formats, unsigned
            formats or formats without zero (E8M0).
    """
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        if not 2 <= spec <= 24:
            raise ValueError(f"accumulator: p must be in [2, 24] significant bits, got {spec}")
        return replace(FORMATS["float32"], name=f"float32_p{int(spec)}", mantissa_bits=int(spec) - 1)
    fmt = get_format(spec)
    if not isinstance(fmt, Format) or not fmt.signed or not fmt.has_zero:
        raise ValueError(
            f"accumulator: need a signed float format with a zero (a name, a Format or an int p), got {fmt}"
        )
    return fmt


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _pair(value: Any, what: str) -> tuple:
    """``(for a, for b)`` from a pair or one value for both."""
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ValueError(f"{what}: a pair (for a, for b) or one value for both; got {value!r}")
        return value
    return value, value


@dataclass(frozen=True)
class AccumulatorSpec:
    """Every setting of one reduction, resolved (meanings: the :mod:`fpsim.accumulate` doc).

    Attributes:
        accumulator: the accumulator's format.
        rounding: its rounding mode.
        order: the order of the additions.
        block: the tree width ``W`` of :attr:`Order.BLOCKED` (None for the other orders).
        promote_every: chunk length ``N`` of the promotion; None: no promotion.
        promote_to: the promoted accumulator's format (None without promotion).
        promote_rounding: its rounding mode.
        compensation: compensated summation per group.
        stochastic_bits: random bits per stochastic rounding.
        seed: the counter-based random streams' seed (None: no seed).
        inputs: the rounding of each operand before the reduction (``(x, None)`` for a sum).
        product: the rounding of each product (None: exact products, a fused multiply-add).
    """

    accumulator: Format
    rounding: RoundMode = RoundMode.NEAREST_EVEN
    order: Order = Order.SEQUENTIAL
    block: int | None = None
    promote_every: int | None = None
    promote_to: Format | None = None
    promote_rounding: RoundMode = RoundMode.NEAREST_EVEN
    compensation: Compensation = Compensation.NONE
    stochastic_bits: int = 32
    seed: int | None = None
    inputs: tuple[Rounding | None, Rounding | None] = (None, None)
    product: Rounding | None = None

    @classmethod
    def build(
        cls,
        *,
        accumulator: str | Format | int = "float32",
        rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
        order: Order | str = Order.SEQUENTIAL,
        block: int | None = None,
        promote_every: int | None = None,
        promote_to: str | Format | int = "float32",
        promote_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
        compensated: Compensation | bool | str = False,
        stochastic_bits: int | None = None,
        seed: int | None = None,
        input_format: Any = None,
        input_rounding: Any = RoundMode.NEAREST_EVEN,
        product_format: Any = None,
        product_rounding: RoundMode | str = RoundMode.NEAREST_EVEN,
        operands: tuple[str, ...] = ("a", "b"),
        always_promote: bool = False,
    ) -> AccumulatorSpec:
        """The spec of the verbs' keywords, every name resolved and every value checked.

        Args:
            accumulator ... product_rounding: the keywords of :func:`fpsim.accumulate.dot`
                (``input_format`` / ``input_rounding`` may be pairs for two operands).
            operands: the operands' names, ``("x",)`` for a sum (one input rounding).
            always_promote: resolve ``promote_to`` even without ``promote_every`` (the
                scaled matmul, whose chunk is set later by :meth:`with_chunk`).

        Raises:
            ValueError: a bad value, naming the argument (and the allowed values).
            TypeError: a seed that is not an int.
        """
        acc = accumulator_format(accumulator)
        if promote_every is not None and (not _is_int(promote_every) or promote_every < 1):
            raise ValueError(f"promote_every must be None or an int >= 1; got {promote_every!r}")
        promoted = promote_every is not None or always_promote
        promote = accumulator_format(promote_to) if promoted else None
        order = Order.parse(order)
        if seed is not None and not _is_int(seed):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if len(operands) == 2:
            formats, modes = _pair(input_format, "input_format"), _pair(input_rounding, "input_rounding")
        else:
            formats, modes = (input_format, None), (input_rounding, None)
        inputs = tuple(
            None if f is None else _rounding(f, m, seed, f"{name}: stochastic input rounding needs seed=")
            for f, m, name in zip(formats, modes, operands)
        )
        return cls(
            accumulator=acc,
            rounding=RoundMode.parse(rounding),
            order=order,
            block=_checked_block(order, block),
            promote_every=None if promote_every is None else int(promote_every),
            promote_to=promote,
            promote_rounding=RoundMode.parse(promote_rounding),
            compensation=Compensation.parse(compensated),
            stochastic_bits=_stochastic_bits(stochastic_bits, acc, promote),
            seed=None if seed is None else int(seed),
            inputs=inputs + (None,) * (2 - len(inputs)),
            product=_product(product_format, product_rounding, seed),
        )

    def with_chunk(self, chunk: int) -> AccumulatorSpec:
        """The same spec promoting every ``chunk`` addends (``promote_to`` must be resolved)."""
        assert self.promote_to is not None, "build the spec with always_promote=True"
        return replace(self, promote_every=int(chunk))

    @property
    def width(self) -> int | None:
        """The tree width ``W``; None for the sequential order (one group)."""
        return tree_width(self.order, self.block)

    @property
    def promoted(self) -> bool:
        """Whether chunk values are added into the ``promote_to`` accumulator."""
        return self.promote_to is not None

    @property
    def stochastic(self) -> bool:
        """Whether an accumulator or promotion rounding is stochastic (needs random words)."""
        modes = (self.rounding, self.promote_rounding if self.promoted else None)
        return RoundMode.STOCHASTIC in modes

    def stream(self, which: SeedStream) -> int | None:
        """The seed of one counter-based random stream (``4 * seed + which``); None without seed."""
        return None if self.seed is None else 4 * self.seed + int(which)


def _rounding(fmt: Any, mode: Any, seed: int | None, missing_seed: str) -> Rounding:
    r = Rounding(get_format(fmt), RoundMode.parse(mode))
    if r.mode is RoundMode.STOCHASTIC and seed is None:
        raise ValueError(missing_seed)
    return r


def _product(fmt: Any, mode: Any, seed: int | None) -> Rounding | None:
    if fmt is None:
        return None
    if isinstance(get_format(fmt), BlockFormat):
        raise ValueError("product_format must be an element format, not a block recipe")
    return _rounding(fmt, mode, seed, "stochastic product rounding needs seed=")


def tree_width(order: Order | str, block: Any = None) -> int | None:
    """The tree width ``W`` of an order: None (one group) for sequential, 2 for pairwise,
    ``block`` (checked: an int >= 2) for blocked."""
    order = Order.parse(order)
    if order is Order.SEQUENTIAL:
        return None
    return 2 if order is Order.PAIRWISE else _checked_block(order, block)


def _checked_block(order: Order, block: Any) -> int | None:
    """``block`` checked for :attr:`Order.BLOCKED` (ignored, as None, for the other orders)."""
    if order is not Order.BLOCKED:
        return None
    if not _is_int(block) or block < 2:
        raise ValueError(f"order='blocked' needs block=W, an int >= 2 (the tree width); got {block!r}")
    return int(block)


def _stochastic_bits(stochastic_bits: Any, acc: Format, promote: Format | None) -> int:
    """Bits per stochastic rounding: at most ``51 - mantissa_bits`` of every accumulator, so the
    round-to-odd bit of the exact sum lies below them (the :mod:`fpsim.accumulate` doc)."""
    grids = [acc] + ([promote] if promote else [])
    cap = min(32, *(51 - f.mantissa_bits for f in grids))
    nbits = cap if stochastic_bits is None else int(stochastic_bits)
    if not 1 <= nbits <= cap:
        raise ValueError(
            f"stochastic_bits must be in [1, {cap}] for a {grids[-1].name} accumulator "
            f"(at most 51 - mantissa_bits, see fpsim.accumulate); got {stochastic_bits}"
        )
    return nbits
