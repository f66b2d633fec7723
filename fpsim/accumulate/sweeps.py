"""How the error of a low-precision sum grows with its length K: the sweeps of
``fpsim accumulate``, each a tidy table (a pandas DataFrame, one row per setting x K).

* :func:`random_sweep`: independent dot products (or sums) of length K of random data,
  inputs drawn once at the largest K and cut to each K (so the curves are nested);
* :func:`trace_sweep`: gradient accumulation, the sum of a trace's first K gradient steps in
  the accumulator (elementwise over every gradient tensor);
* :func:`deepseek_sweep`: DeepSeek-V3's observation (arXiv 2412.19437, section 3.3.2): FP8
  (E4M3) GEMMs accumulated in about 14 bits on Hopper, with and without promotion of the
  partial sums to FP32 every 128 products.

Errors are measured against exact references: ``math.fsum`` of the exact products (random
data, traces), and for the scaled GEMMs the exact K-block sums (every E4M3 x E4M3 product
and their sums up to K = 16384 are exact in float64) times the exact scale products.
pandas (and tqdm for the progress bar) are imported when a sweep runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..formats import Format, RoundMode, get_format
from ._operands import blocked_operand, round_operand
from .exact import error_summary, exact_dot, exact_sum
from .spec import AccumulatorSpec, Compensation, Order, Rounding
from .verbs import dot_spec, scaled_matmul_spec, sum_spec

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DEEPSEEK_K",
    "DEEPSEEK_QUICK_K",
    "DEFAULT_K",
    "QUICK_K",
    "Setting",
    "deepseek_settings",
    "deepseek_sweep",
    "random_sweep",
    "trace_sweep",
]

DEFAULT_K = (16, 64, 256, 1024, 4096, 16384)
QUICK_K = (16, 64, 256)
DEEPSEEK_K = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DEEPSEEK_QUICK_K = (128, 256, 512)
_SHORT = {
    RoundMode.NEAREST_EVEN: "RNE",
    RoundMode.NEAREST_AWAY: "RNA",
    RoundMode.TOWARD_ZERO: "RZ",
    RoundMode.TOWARD_POSITIVE: "RU",
    RoundMode.TOWARD_NEGATIVE: "RD",
    RoundMode.STOCHASTIC: "SR",
    RoundMode.ODD: "RO",
}
_COLUMNS = ("accumulator", "rounding", "order", "block", "promote_every", "compensated")


@dataclass(frozen=True)
class Setting:
    """One accumulation setting of a sweep and its label.

    The fields are keywords of :func:`fpsim.accumulate.dot` as given (None: not given, the
    verb's default); the table's columns show them as given.
    """

    label: str
    accumulator: str | Format | int | None = None
    rounding: RoundMode | str | None = None
    order: Order | str | None = None
    block: int | None = None
    promote_every: int | None = None
    compensated: Compensation | bool | str | None = None

    @classmethod
    def make(
        cls,
        accumulator: Any = "float32",
        rounding: RoundMode | str = "nearest_even",
        order: Order | str = "sequential",
        block: int | None = None,
        promote_every: int | None = None,
        compensated: Compensation | bool | str = False,
    ) -> Setting:
        """A setting labelled from its keywords, e.g. ``"p14 RZ seq +128"``."""
        kind = Order.parse(order)
        comp = Compensation.parse(compensated)
        name = f"p{accumulator}" if isinstance(accumulator, int) else str(accumulator)
        parts = [name, _SHORT[RoundMode.parse(rounding)]]
        parts.append({Order.SEQUENTIAL: "seq", Order.PAIRWISE: "pairwise"}.get(kind, f"blocked/{block}"))
        if comp is not Compensation.NONE:
            parts.append(comp.value)
        if promote_every:
            parts.append(f"+{promote_every}")
        return cls(
            " ".join(parts),
            accumulator,
            rounding,
            order,
            block if kind is Order.BLOCKED else None,
            promote_every or None,
            compensated,
        )

    def spec(self, *, seed: int | None, product_format: Any = None, recipes: tuple | None = None):
        """The :class:`~fpsim.accumulate.spec.AccumulatorSpec` of this setting (``recipes``:
        the two block recipes of a scaled matmul)."""
        return AccumulatorSpec.build(
            accumulator="float32" if self.accumulator is None else self.accumulator,
            rounding=self.rounding or RoundMode.NEAREST_EVEN,
            order=self.order or Order.SEQUENTIAL,
            block=self.block,
            promote_every=self.promote_every,
            compensated=self.compensated,
            seed=seed,
            product_format=product_format,
            input_format=recipes,
            always_promote=recipes is not None,
        )


def _draw(rng: np.random.Generator, data: str):
    draw = {"normal": rng.standard_normal, "uniform": rng.random}.get(data)
    if draw is None:
        raise ValueError(f"data must be 'normal' or 'uniform'; got {data!r}")
    return draw


def _row(setting: Setting, k: int, approx, exact, magnitude, info, **extra: Any) -> dict[str, Any]:
    row = {"setting": setting.label, "K": k, **extra}
    for key in _COLUMNS:
        v = getattr(setting, key)
        row[key] = str(v) if v is not None else None
    row.update(error_summary(approx, exact, magnitude=magnitude))
    row["lost_share"] = info.lost_share if info is not None else math.nan
    return row


def _progress(total: int, quiet: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=quiet, leave=False, desc="accumulate")


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(rows)


def random_sweep(
    settings: list[Setting],
    ks: tuple[int, ...] = DEFAULT_K,
    *,
    kind: str = "dot",
    outputs: int = 256,
    data: str = "normal",
    input_format: Any = None,
    product_format: Any = None,
    seed: int = 0,
    quiet: bool = True,
) -> pd.DataFrame:
    """Error of each setting at each K on random data (module doc); one row per setting x K.

    Args:
        settings: the accumulation settings.
        ks: the reduction lengths.
        kind: ``"dot"`` (products of two inputs) or ``"sum"`` (the inputs themselves).
        outputs: independent reductions per K (vectorised).
        data: ``"normal"`` (standard normal: the sum random-walks, with cancellation) or
            ``"uniform"`` ([0, 1): the sum grows linearly, the worst case for swamping).
        input_format: rounding of the inputs before the reduction (e.g. ``"bfloat16"``).
        product_format: rounding of each product (None: exact, i.e. fused multiply-add).
        seed: the random data's seed, also the stochastic roundings' seed.
        quiet: no progress bar.
    """
    if kind not in ("dot", "sum"):
        raise ValueError(f"kind must be 'dot' or 'sum'; got {kind!r}")
    draw = _draw(np.random.default_rng(seed), data)
    a = draw((outputs, max(ks))).astype(np.float32)
    b = draw((outputs, max(ks))).astype(np.float32) if kind == "dot" else None
    if input_format is not None:
        rounding = Rounding(get_format(input_format), RoundMode.NEAREST_EVEN)
        a = round_operand(a, rounding, None, "a")
        b = None if b is None else round_operand(b, rounding, None, "b")
    specs = [s.spec(seed=seed, product_format=product_format if b is not None else None) for s in settings]
    rows = []
    with _progress(len(settings) * len(ks), quiet) as bar:
        for k in ks:
            ak = a[:, :k]
            bk = None if b is None else b[:, :k]
            terms = ak.astype(np.float64) if bk is None else ak.astype(np.float64) * bk
            exact = exact_sum(terms.astype(np.float32), axis=-1) if bk is None else exact_dot(ak, bk)
            magnitude = np.abs(terms).sum(axis=-1)
            for s, spec in zip(settings, specs):
                if bk is None:
                    approx, info = sum_spec(spec, ak, -1, None, True)
                else:
                    approx, info = dot_spec(spec, ak, bk, None, True)
                rows.append(_row(s, k, approx, exact, magnitude, info, kind=kind, data=data))
                bar.update()
    return _frame(rows)


def trace_sweep(
    path: Any, settings: list[Setting], ks: tuple[int, ...] | None = None, *, quiet: bool = True
) -> pd.DataFrame:
    """Gradient accumulation over a trace: the sum of the first K gradient steps of every
    gradient tensor (elementwise), in each setting, against the exact sum.

    ``ks`` defaults to 1, 2, 4, ... and the number of steps. Tensors are read per step (a
    trace larger than memory is read one step at a time per K).
    """
    from ..trace import open_trace

    trace = open_trace(path)
    steps = trace.steps
    if not steps:
        raise ValueError(f"trace {trace.path} has no steps")
    names = trace.names("grad")
    if not names:
        raise ValueError(f"trace {trace.path} has no gradient tensors")
    if ks is None:
        ks = tuple(sorted({*(2**i for i in range(len(steps).bit_length())), len(steps)}))  # 2**i <= n
    ks = tuple(k for k in ks if 1 <= k <= len(steps))
    if not ks:
        raise ValueError(f"no K in the sweep fits the trace's {len(steps)} steps")

    def step_vector(step: int) -> np.ndarray:
        parts = [np.asarray(trace.read(trace.entry(step, n)), np.float32).reshape(-1) for n in names]
        return np.concatenate(parts)

    grads = np.stack([step_vector(s) for s in steps[: max(ks)]])  # (steps, elements)
    specs = [s.spec(seed=0) for s in settings]
    rows = []
    with _progress(len(settings) * len(ks), quiet) as bar:
        for k in ks:
            g = grads[:k]
            exact = exact_sum(g, axis=0)
            magnitude = np.abs(g.astype(np.float64)).sum(axis=0)
            for s, spec in zip(settings, specs):
                approx, info = sum_spec(spec, g, 0, None, True)
                rows.append(_row(s, k, approx, exact, magnitude, info, kind="trace", data=str(trace.path)))
                bar.update()
    return _frame(rows)


def deepseek_settings() -> list[tuple[Setting, tuple[str, str]]]:
    """The settings of ``fpsim accumulate --deepseek`` with their (activation, weight) recipes."""
    tensor = ("e4m3_tensor", "e4m3_tensor")
    fine = ("e4m3_block128", "e4m3_tile128")
    rz = RoundMode.TOWARD_ZERO.value
    return [
        (Setting("E4M3 per-tensor, FP32 accumulator", accumulator="float32"), tensor),
        (Setting("E4M3 per-tensor, 14-bit RNE", accumulator=14), tensor),
        (Setting("E4M3 per-tensor, 14-bit RZ", accumulator=14, rounding=rz), tensor),
        (Setting("E4M3 per-tensor, 14-bit RNE, promote 128", accumulator=14, promote_every=128), tensor),
        (
            Setting(
                "E4M3 per-tensor, 14-bit RZ, promote 128", accumulator=14, rounding=rz, promote_every=128
            ),
            tensor,
        ),
        (Setting("E4M3 1x128/128x128, 14-bit RZ, promote 128", accumulator=14, rounding=rz), fine),
    ]


def deepseek_sweep(
    ks: tuple[int, ...] = DEEPSEEK_K,
    *,
    m: int = 64,
    n: int = 64,
    data: str = "normal",
    seed: int = 0,
    quiet: bool = True,
) -> pd.DataFrame:
    """DeepSeek-V3 section 3.3.2: an (m, K) x (K, n) GEMM of random data (``"normal"`` or
    ``"uniform"`` in [0, 1)), quantized to E4M3, accumulated as each
    :func:`deepseek_settings` entry says (:func:`fpsim.accumulate.scaled_matmul`), against
    the exact product of the quantized operands (exact K-block sums times exact scales)."""
    draw = _draw(np.random.default_rng(seed), data)
    a_all = draw((m, max(ks))).astype(np.float32)
    b_all = draw((max(ks), n)).astype(np.float32)
    rows = []
    settings = deepseek_settings()
    specs = [s.spec(seed=seed, recipes=recipes) for s, recipes in settings]
    with _progress(len(settings) * len(ks), quiet) as bar:
        for k in ks:
            a, b = a_all[:, :k], np.ascontiguousarray(b_all[:k])
            fp64 = a.astype(np.float64) @ b.astype(np.float64)
            for (s, (ra, rb)), spec in zip(settings, specs):
                exact, magnitude = _scaled_reference(a, b, spec.inputs)
                approx, info = scaled_matmul_spec(spec, a, b, None, True)
                extra = dict(kind="deepseek", data=data, recipe_a=ra, recipe_b=rb)
                row = _row(s, k, approx, exact, magnitude, info, **extra)
                row["rel_l2_err_vs_unquantized"] = float(np.linalg.norm(approx - fp64) / np.linalg.norm(fp64))
                rows.append(row)
                bar.update()
    return _frame(rows)


def _scaled_reference(a: np.ndarray, b: np.ndarray, recipes: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``sum_j s_a s_b sum_{k in block j} qa qb`` (to float64) and ``sum |terms|``."""
    ra, rb = (Rounding(r.format, RoundMode.NEAREST_EVEN) for r in recipes)
    va, (ka, sa), ta = blocked_operand(a, ra, None, "a")
    vb, (kb, sb), tb = blocked_operand(np.ascontiguousarray(b.T), rb, None, "b")
    seg = math.gcd(ka, kb)
    k = a.shape[1]
    exact = np.zeros((a.shape[0], b.shape[1]))
    magnitude = np.zeros_like(exact)
    for c in range(0, k, seg):
        blk = slice(c, min(k, c + seg))
        inner = va[:, blk].astype(np.float64) @ vb[:, blk].astype(np.float64).T  # exact for E4M3
        absin = np.abs(va[:, blk]).astype(np.float64) @ np.abs(vb[:, blk]).astype(np.float64).T
        scale = sa[:, c // ka].astype(np.float64)[:, None] * sb[:, c // kb].astype(np.float64)[None, :]
        scale *= (ta or 1.0) * (tb or 1.0)
        exact += scale * inner
        magnitude += np.abs(scale) * absin
    return exact, magnitude
