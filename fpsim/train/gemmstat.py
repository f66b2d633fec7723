"""Records of emulated-GEMM statistics, shared by the torch and the JAX layers (no framework).

:class:`GemmStat` is one operand of one GEMM of one layer at one step under one recipe; the
torch layer (:mod:`fpsim.train.linear`) appends them to ``module.gemm_stats``. The JAX layer
(:mod:`fpsim.train.jax_gemm`) records them from host callbacks that JAX may run more than once
for the same values (rematerialization, a function traced again), so it keeps them in a
:class:`StatLog`, keyed by (step, GEMM, role, recipe): a second record of a key with the same
statistics is dropped, one with other statistics is refused (tests/train/test_jax_gemm_stats.py).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

from .gemm import Gemm
from .opstats import OperandStats

__all__ = ["GemmStat", "StatLog"]


@dataclass(frozen=True)
class GemmStat:
    """The statistics of one operand of one GEMM of one module at one step, under the recipe
    trained with or a what-if recipe (``recipe``: its name)."""

    module: str
    recipe: str
    step: int
    gemm: str
    role: str
    stats: OperandStats

    def row(self) -> dict:
        """A flat dict (module, recipe, step, gemm, role and the :class:`OperandStats` fields)."""
        return {
            "module": self.module,
            "recipe": self.recipe,
            "step": self.step,
            "gemm": self.gemm,
            "role": self.role,
            **vars(self.stats),
        }


def _same(a: OperandStats, b: OperandStats) -> bool:
    """Field by field equal, NaN equal to NaN."""
    for f in fields(OperandStats):
        u, v = getattr(a, f.name), getattr(b, f.name)
        both_nan = isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v)
        if not (u == v or both_nan):
            return False
    return True


_GEMM_ORDER = {g: i for i, g in enumerate(Gemm)}


class StatLog:
    """One layer's :class:`GemmStat` records, at most one per (step, GEMM, role, recipe).

    Args:
        module: the layer's name.
        order: the position of each (GEMM, role, recipe name) within a step, among the records
            of its GEMM (:meth:`records` sorts by step, GEMM, then this position).
    """

    def __init__(self, module: str, order: Mapping[tuple[Gemm, str, str], int]) -> None:
        self.module, self._order = module, dict(order)
        self._records: dict[tuple[int, Gemm, str, str], GemmStat] = {}
        self._lock = threading.Lock()  # host callbacks of one jitted call may run on several threads

    def add(self, entries: Iterable[tuple[str, int, Gemm, str, OperandStats]]) -> None:
        """Record each ``(recipe, step, gemm, role, stats)``, all or none: a key recorded
        already keeps its record if ``stats`` equals it.

        Raises:
            ValueError: a key holds other statistics (two calls passed the same step), or is not
                one ``order`` knows; nothing of ``entries`` is recorded then.
        """
        entries = list(entries)
        for recipe, _, gemm, role, _ in entries:
            if (gemm, role, recipe) not in self._order:
                raise ValueError(
                    f"{self.module}: no {role} operand of {gemm.value} is recorded under {recipe!r}"
                )
        with self._lock:
            fresh = {}
            for recipe, step, gemm, role, stats in entries:
                key = (step, gemm, role, recipe)
                old = self._records.get(key) or fresh.get(key)
                if old is None:
                    fresh[key] = GemmStat(self.module, recipe, step, gemm.value, role, stats)
                elif not _same(old.stats, stats):
                    raise ValueError(
                        f"{self.module}: step {step}, {role} in {gemm.value} under {recipe!r} is "
                        f"recorded already with other statistics ({old.stats} before, {stats} now): "
                        "each call of the layer must pass a step of its own"
                    )
            self._records.update(fresh)

    def records(self, *, clear: bool = False) -> list[tuple[tuple[int, int, int], GemmStat]]:
        """Each record with its sort key (step, GEMM, position), sorted by it; with ``clear``
        the log is emptied in the same step (a record added meanwhile is kept for the next
        call), and a step run again afterwards is recorded again."""
        with self._lock:
            recs = list(self._records.values())
            if clear:
                self._records = {}
        keyed = [
            ((r.step, _GEMM_ORDER[Gemm(r.gemm)], self._order[(Gemm(r.gemm), r.role, r.recipe)]), r)
            for r in recs
        ]
        return sorted(keyed, key=lambda kr: kr[0])
