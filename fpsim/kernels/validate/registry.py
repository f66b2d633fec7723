"""The registry of kernels that ``fpsim validate-kernels`` runs (:data:`KERNELS`) and
:func:`validate_all`, which runs every registered kernel x format x rounding mode."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fpsim.formats import FORMATS, AnyFormat, RoundMode

from . import accumulate, optim
from .blocks import applies as blocks_applies
from .blocks import recipes as blocks_recipes
from .blocks import validate_blocks
from .cast import validate, validate_decode
from .common import SHOWN, Case


@dataclass(frozen=True)
class KernelSpec:
    """A kernel known to :func:`validate_all`.

    Attributes:
        name: its name in reports and on the command line.
        run: ``run(fmt, rounding, cases=..., device=...) -> list[Case]``.
        applies: whether the kernel exists for a format and rounding mode (rows are made
            only for those).
        skip: why it cannot run for (format, rounding, device), or None.
        recipes: the kernel takes block recipes (:data:`fpsim.formats.block.RECIPES`) instead
            of element formats (:data:`fpsim.FORMATS`).
        formats: the kernel's own format table, ``formats() -> {name: format}`` (e.g. the
            accumulators of ``accumulate.matmul``), used instead of FORMATS / RECIPES.
    """

    name: str
    run: Callable[..., list[Case]]
    applies: Callable[[AnyFormat, RoundMode], bool] = lambda f, m: True
    skip: Callable[[AnyFormat, RoundMode, str], str | None] = lambda f, m, d: None
    recipes: bool = False
    formats: Callable[[], Mapping[str, Any]] | None = None


KERNELS: dict[str, KernelSpec] = {}
"""The registered kernels, by name."""


def register_kernel(spec: KernelSpec) -> KernelSpec:
    """Add (or replace) a kernel in :data:`KERNELS`; returns it."""
    KERNELS[spec.name] = spec
    return spec


def _cast(kind: str, input_dtype: str = "float32", random: str = "bits") -> Callable[..., list[Case]]:
    def run(fmt, rounding, *, cases, device, name):
        from fpsim.kernels import cast

        fn = cast.encode if kind == "encode" else cast.quantize
        return validate(
            fn,
            fmt,
            rounding,
            cases=cases,
            device=device,
            name=name,
            kind=kind,
            input_dtype=input_dtype,
            random=random,
        )

    return run


def _decode_run(fmt, rounding, *, cases, device, name):
    from fpsim.kernels import cast

    return validate_decode(cast.decode, fmt, cases=cases, device=device, name=name)


def _hw_run(fmt, rounding, *, cases, device, name):
    from fpsim.kernels import hwcast

    return validate(
        hwcast.encode, fmt, rounding, cases=cases, device=device, name=name, nan_by_class=True, sets=None
    )


def _hw_applies(fmt: AnyFormat, mode: RoundMode) -> bool:
    hw = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
    return fmt.name in hw and mode is RoundMode.NEAREST_EVEN


def _hw_skip(fmt, rounding, device):
    from fpsim.kernels import hwcast

    return hwcast.unavailable_reason(fmt, device, rounding)


def _blocks_run(fmt, rounding, *, cases, device, name):
    from fpsim.kernels import blocks

    return validate_blocks(blocks.encode_blocks, fmt, rounding, cases=cases, device=device, name=name)


def _stochastic_only(fmt: AnyFormat, mode: RoundMode) -> bool:
    return mode is RoundMode.STOCHASTIC


def _nearest_even_only(fmt: AnyFormat, mode: RoundMode) -> bool:
    return mode is RoundMode.NEAREST_EVEN


for _spec in (
    KernelSpec("cast.encode", _cast("encode")),
    KernelSpec("cast.encode[float16 in]", _cast("encode", "float16")),
    KernelSpec("cast.encode[bfloat16 in]", _cast("encode", "bfloat16")),
    KernelSpec("cast.encode[seed]", _cast("encode", random="seed"), applies=_stochastic_only),
    KernelSpec("cast.quantize", _cast("quantize")),
    KernelSpec("cast.decode", _decode_run, applies=_nearest_even_only),
    KernelSpec("hwcast.encode", _hw_run, applies=_hw_applies, skip=_hw_skip),
    # every preset, and a recipe for each scale rule no preset uses
    KernelSpec("blocks.encode_blocks", _blocks_run, applies=blocks_applies, formats=blocks_recipes),
    # the emulated matmul with limited-precision accumulation, per accumulator format
    KernelSpec("accumulate.matmul", accumulate.run, formats=accumulate.accumulators),
    # the fused optimizer step: one row per 8-bit / FP8 state recipe x master rounding
    KernelSpec("optim.adamw_step", optim.run, applies=optim.applies, recipes=True),
):
    register_kernel(_spec)


def validate_all(
    device: str = "cpu",
    quick: bool = False,
    *,
    formats: Sequence[str] | None = None,
    kernels: Sequence[str] | None = None,
    roundings: Sequence[str] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Validate every registered kernel x format x rounding mode against the emulator.

    Args:
        device: "cpu" (Triton's interpreter) or "cuda".
        quick: fewer inputs per case (:func:`~fpsim.kernels.validate.input_sets` with ``cases="quick"``).
        formats: only these format names (default: all of :data:`fpsim.FORMATS`, for the
            block kernel every recipe and rule (:func:`fpsim.kernels.validate.blocks.recipes`),
            for the optimizer all of :data:`fpsim.formats.block.RECIPES`; recipe names and the
            names of kernels' own format tables, ``KernelSpec.formats``, are accepted too).
        kernels: only these kernels (names in :data:`KERNELS`).
        roundings: only these rounding modes.
        progress: show a progress bar.

    Returns:
        ``{"device", "quick", "seconds", "compared", "mismatches", "errors", "skipped",
        "cases": [...]}``; one case row per kernel x format x rounding with its ``kernel``,
        ``format``, ``rounding``, ``compared`` and ``mismatches`` summed over the option
        variants, plus ``variants``, ``skipped``, ``errors`` and the ``first`` mismatches
        (with their options).
    """
    from tqdm.auto import tqdm

    plan = plan_rows(formats, kernels, roundings)
    t0 = time.perf_counter()
    rows = [
        run_row(spec, fmt, mode, quick, device)
        for spec, fmt, mode in tqdm(plan, disable=not progress, desc="validate-kernels", unit="case")
    ]
    return report_of(rows, device, quick, time.perf_counter() - t0)


def report_of(rows: list[dict[str, Any]], device: str, quick: bool, seconds: float) -> dict[str, Any]:
    """The :func:`validate_all` report of the case rows done so far (``fpsim validate-kernels``
    writes it after every row, so that an interrupted run keeps its rows)."""
    return {
        "device": device,
        "quick": quick,
        "seconds": round(seconds, 3),
        "compared": sum(r["compared"] for r in rows),
        "mismatches": sum(r["mismatches"] for r in rows),
        "errors": sum(len(r["errors"]) for r in rows),
        "skipped": sum(r["skipped"] is not None for r in rows),
        "cases": rows,
    }


def plan_rows(
    formats: Sequence[str] | None, kernels: Sequence[str] | None, roundings: Sequence[str] | None
) -> list[tuple[KernelSpec, Any, RoundMode]]:
    """(kernel, format, mode) of every row, names resolved (ValueError for unknown ones)."""
    from fpsim.formats import RECIPES

    own = [n for s in KERNELS.values() if s.formats is not None for n in s.formats()]
    fmts = _pick(formats, list(dict.fromkeys([*FORMATS, *RECIPES, *own])), "format")
    specs = [KERNELS[k] for k in _pick(kernels, list(KERNELS), "kernel")]
    modes = [RoundMode.parse(m) for m in _pick(roundings, [m.value for m in RoundMode], "rounding")]
    return [
        (s, table[f], m)
        for s in specs
        for table in [s.formats() if s.formats is not None else RECIPES if s.recipes else FORMATS]
        for f in fmts
        if f in table
        for m in modes
        if s.applies(table[f], m)
    ]


def run_row(spec: KernelSpec, fmt: Any, mode: RoundMode, quick: bool, device: str) -> dict[str, Any]:
    """One report row: the kernel's cases for (format, mode) summed over their variants."""
    row: dict[str, Any] = {"kernel": spec.name, "format": fmt.name, "rounding": mode.value}
    row.update(compared=0, mismatches=0, variants=0, skipped=None, errors=[], first=[])
    reason = spec.skip(fmt, mode, device)
    if reason is not None:
        row["skipped"] = reason
        return row
    if spec.name == "cast.decode":
        row["rounding"] = "-"
    for c in spec.run(fmt, mode, cases="quick" if quick else "full", device=device, name=spec.name):
        row["variants"] += 1
        row["compared"] += c.compared
        row["mismatches"] += c.mismatches
        if c.error:
            row["errors"].append({"options": c.options, "error": c.error})
        for m in c.first[: max(0, SHOWN - len(row["first"]))]:
            row["first"].append({"options": c.options, **asdict(m)})
    return row


def _pick(asked: Sequence[str] | None, known: list[str], what: str) -> list[str]:
    """The known names that were asked for, in known order (all when none were)."""
    if not asked:
        return known
    bad = [a for a in asked if a not in known]
    if bad:
        raise ValueError(f"unknown {what} {bad[0]!r}; known: {', '.join(known)}")
    return [k for k in known if k in asked]
