"""Which optimizer updates a replay runs, and the update count of each (Adam's ``t``).

A replay answers "what would this optimizer have done with these gradients"; that needs the
optimizer's own update count at every step, and, for a sequence, every update in between.

The update count of a recorded step is the trace's ``update`` (recorded by
:class:`fpsim.trace.TorchCapture` from the optimizer, by :func:`fpsim.trace.capture_jax` from
its ``update`` argument); a trace without counts uses its step numbers, which must then be
1-based update counts. ``first_update=N`` renumbers: the first replayed step is update ``N``
and the others keep their distance to it. A step the recorded run skipped (its ``skipped``
flag, or the next recorded step carrying the same count) updates nothing, as in torch, where
``GradScaler.step`` does not call ``optimizer.step()`` and the count stays.

:class:`Mode` ``SEQUENCE`` replays consecutive updates and refuses a selection with missing
updates (naming them); ``EACH`` replays every recorded step as one update from its own
recorded parameters and states.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Mode", "Planned", "plan_updates", "select_steps"]


class Mode(enum.Enum):
    """How a replay treats the recorded steps.

    ``SEQUENCE``: one run of consecutive updates from the first replayed step's recorded
    parameters and states (a gap in the update counts is an error). ``EACH``: every recorded
    step is one update from its own recorded parameters and states (the one-update error).
    """

    SEQUENCE = "sequence"
    EACH = "each"

    @classmethod
    def resolve(cls, mode: Mode | str) -> Mode:
        """A :class:`Mode` from a member or its name (``"sequence"``, ``"each"``).

        Raises:
            ValueError: an unknown name (the message lists the allowed ones).
        """
        if isinstance(mode, cls):
            return mode
        try:
            return cls(mode)
        except ValueError:
            raise ValueError(f"mode must be one of sequence, each; got {mode!r}") from None


@dataclass(frozen=True)
class Planned:
    """One recorded step of a replay: its step number, its update count ``t`` (1-based) and
    whether the recorded run skipped its update."""

    step: int
    t: int
    skipped: bool = False


def select_steps(trace: Any, steps: Iterable[int] | None) -> list[int]:
    """The recorded steps a replay runs, in increasing order (each once).

    Args:
        trace: a :class:`fpsim.trace.Trace`.
        steps: the steps asked for (None: all of the trace's).

    Raises:
        ValueError: a step the trace does not have, or no step at all.
    """
    wanted = sorted(trace.steps if steps is None else set(steps))
    missing = [s for s in wanted if s not in trace.steps]
    if missing:
        raise ValueError(f"{trace.path}: steps {missing} are not in the trace (it has {trace.steps})")
    if not wanted:
        raise ValueError(f"{trace.path}: no step to replay")
    return wanted


def plan_updates(trace: Any, steps: list[int], mode: Mode, first_update: int | None = None) -> list[Planned]:
    """The update count of each of ``steps`` (recorded, else the step number; renumbered by
    ``first_update``) and whether the recorded run skipped it.

    Raises:
        ValueError: a count below 1, counts that decrease, or (``SEQUENCE``) missing updates;
            the messages name the steps and what to do.
    """
    if first_update is not None and (isinstance(first_update, bool) or not isinstance(first_update, int)):
        raise ValueError(f"first_update must be an integer >= 1, got {first_update!r}")
    recorded = [trace.update(s) for s in steps]
    if any(u is not None for u in recorded) and any(u is None for u in recorded):
        unknown = [s for s, u in zip(steps, recorded) if u is None]
        raise ValueError(f"{trace.path}: steps {unknown[:5]} have no recorded update count, others have one")
    counts = [s if u is None else u for s, u in zip(steps, recorded)]
    source = "step numbers" if recorded[0] is None else "recorded update counts"
    if first_update is not None:
        counts = [c - counts[0] + first_update for c in counts]
        source = f"update counts from first_update={first_update}"
    if counts[0] < 1:
        raise ValueError(
            f"{trace.path}: step {steps[0]} would be update {counts[0]}, but the optimizer counts its "
            f"updates from 1 (taken from the {source}); pass first_update= (--first-update) with the "
            "update count of that step, e.g. 1 for a loop that numbers its steps from 0"
        )
    flags = [trace.skipped(s) for s in steps]
    for i in range(len(steps) - 1):
        if counts[i + 1] == counts[i]:
            flags[i] = True  # the count did not advance: the recorded run skipped step i
        elif counts[i + 1] < counts[i]:
            raise ValueError(
                f"{trace.path}: update counts decrease from step {steps[i]} ({counts[i]}) "
                f"to step {steps[i + 1]} ({counts[i + 1]})"
            )
    planned = [Planned(s, t, k) for s, t, k in zip(steps, counts, flags)]
    if mode is Mode.SEQUENCE:
        _check_consecutive(trace, planned, source)
    return planned


def _check_consecutive(trace: Any, planned: list[Planned], source: str) -> None:
    """A sequence replay needs every update between its first and last step."""
    gaps = []
    for a, b in zip(planned, planned[1:]):
        expected = a.t + (0 if a.skipped else 1)
        if b.t > expected:
            gaps.append((a, b, expected))
    if not gaps:
        return
    shown = "; ".join(
        f"updates {lo}..{b.t - 1} between steps {a.step} and {b.step}"
        if b.t - 1 > lo
        else f"update {lo} between steps {a.step} and {b.step}"
        for a, b, lo in gaps[:3]
    )
    more = f" and {len(gaps) - 3} more gaps" if len(gaps) > 3 else ""
    runs = _consecutive_runs(planned)
    longest = max(runs, key=lambda r: (len(r), r[-1].step))
    raise ValueError(
        f"{trace.path}: a sequence replay needs consecutive updates, but {shown}{more} are not recorded "
        f"(counts from the {source}). Replay each recorded step as one update with mode='each' "
        f"(--mode each), or a consecutive part, e.g. steps {longest[0].step}..{longest[-1].step} "
        f"(--steps {longest[0].step}:{longest[-1].step})"
    )


def _consecutive_runs(planned: list[Planned]) -> list[list[Planned]]:
    runs = [[planned[0]]]
    for a, b in zip(planned, planned[1:]):
        if b.t == a.t + (0 if a.skipped else 1):
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs
