"""Which steps a capture records, which tensors, and when it records optimizer state.

A :class:`CaptureSchedule` is resolved once, when a capture is made, from the options
``when=``, ``last=``, ``total_steps=``, ``tensors=`` and ``states=`` (see
:class:`~fpsim.trace.TorchCapture`), and then only answered:

* :meth:`CaptureSchedule.records` -- whether a step is recorded: ``when`` (an int N: steps
  that are multiples of N; a set, frozenset or range of step numbers; or a callable
  ``step -> bool``), or one of the final ``last`` steps of a run of ``total_steps`` steps
  (steps ``total_steps - last`` to ``total_steps - 1``, the loop counting from 0);
* :meth:`CaptureSchedule.records_states` -- whether a recorded step also gets the optimizer
  state: ``"every"`` recorded step, only the ``"first"`` one that has any (what the replay
  reads; PyTorch optimizers create their state in their first ``step()``), or every k-th
  recorded step (``states=k``: the 1st, (k+1)-th, ... recorded step);
* :meth:`CaptureSchedule.selects` -- whether a tensor name matches ``tensors`` (shell-style
  patterns, :func:`fnmatch.fnmatchcase`; None: every tensor).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CaptureSchedule"]


@dataclass(frozen=True)
class CaptureSchedule:
    """The resolved recording schedule of a capture (see the module docstring).

    Attributes:
        when: an int >= 1 (every N steps), a frozenset of steps, a range, or a callable.
        last: record the final ``last`` steps too (needs ``total_steps``); None: not.
        total_steps: the run length (steps ``0 .. total_steps - 1``), or None.
        tensors: the name patterns, or None for every tensor.
        states: ``"every"``, ``"first"`` or an int k >= 1 (every k-th recorded step).
    """

    when: int | frozenset[int] | range | Callable[[int], bool] = 1
    last: int | None = None
    total_steps: int | None = None
    tensors: tuple[str, ...] | None = None
    states: str | int = "every"

    @classmethod
    def resolve(
        cls,
        when: Any = 1,
        last: Any = None,
        total_steps: Any = None,
        tensors: Any = None,
        states: Any = "every",
    ) -> CaptureSchedule:
        """Check and normalise the user's options.

        Raises:
            ValueError: a bad value, naming the option and what it accepts.
            TypeError: an option of the wrong type.
        """
        if _is_int(when):
            if when < 1:
                raise ValueError(f"when= as an int is a period and must be >= 1, got {when}")
            when = int(when)
        elif isinstance(when, range):
            pass
        elif isinstance(when, (set, frozenset, list, tuple)):
            bad = [s for s in when if not _is_int(s) or s < 0]
            if bad:
                raise ValueError(f"when= as a collection must hold non-negative int steps, got {bad[:3]}")
            when = frozenset(int(s) for s in when)
        elif not callable(when):
            raise TypeError(
                f"when= must be an int (every N steps), a set/range of steps or a callable, got {when!r}"
            )
        if last is not None:
            if not _is_int(last) or last < 1:
                raise ValueError(f"last= must be a positive int (the final K steps), got {last!r}")
            if total_steps is None:
                raise ValueError("last= needs total_steps= (the run length) to know which steps are last")
        if total_steps is not None and (not _is_int(total_steps) or total_steps < 1):
            raise ValueError(f"total_steps= must be a positive int, got {total_steps!r}")
        if tensors is not None:
            if isinstance(tensors, str):
                tensors = (tensors,)
            tensors = tuple(tensors)
            if not tensors or not all(isinstance(p, str) and p for p in tensors):
                raise ValueError(f"tensors= must be a non-empty list of name patterns, got {tensors!r}")
        if states not in ("every", "first") and not (_is_int(states) and states >= 1):
            raise ValueError(f"states= must be 'every', 'first' or a positive int period, got {states!r}")
        return cls(when, None if last is None else int(last), total_steps, tensors, states)

    def records(self, step: int) -> bool:
        """Whether ``step`` is recorded."""
        if self.last is not None and self.total_steps - self.last <= step < self.total_steps:
            return True
        when = self.when
        if isinstance(when, int):
            return step % when == 0
        if isinstance(when, (frozenset, range)):
            return step in when
        answer = when(step)
        if not isinstance(answer, (bool, np.bool_)):
            raise TypeError(f"when= callable returned {answer!r} for step {step}; expected True or False")
        return bool(answer)

    def records_states(self, recorded_before: int, with_states_before: int) -> bool:
        """Whether a recorded step gets the optimizer state.

        Args:
            recorded_before: the steps recorded before this one.
            with_states_before: how many of them hold optimizer state.
        """
        if self.states == "every":
            return True
        if self.states == "first":
            return with_states_before == 0
        return recorded_before % self.states == 0

    def selects(self, name: str) -> bool:
        """Whether the tensor ``name`` is recorded (matches one of ``tensors``)."""
        return self.tensors is None or any(fnmatch.fnmatchcase(name, p) for p in self.tensors)

    def check_patterns(self, names: Iterable[str], what: str) -> None:
        """Raise ValueError naming each pattern of ``tensors`` that matches none of ``names``."""
        if self.tensors is None:
            return
        known: Collection[str] = list(names)
        unmatched = [p for p in self.tensors if not any(fnmatch.fnmatchcase(n, p) for n in known)]
        if unmatched:
            shown = ", ".join(list(known)[:6]) + (", ..." if len(known) > 6 else "")
            raise ValueError(f"tensors= patterns {unmatched} match none of the {what} ({shown})")


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)
