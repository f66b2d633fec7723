"""``fpsim accumulate``: how the error of a low-precision sum grows with its length K.

Three sweeps, each a tidy table (one row per setting x K) that is printed, written as CSV and
JSON, and drawn as error-vs-K figures:

* random data (default): ``--outputs`` independent dot products (or sums) of length K, inputs
  drawn once at the largest K and cut to each K (so the curves are nested);
* ``--trace PATH``: gradient accumulation, the sum of the trace's first K gradient steps in
  the accumulator (elementwise over every gradient tensor);
* ``--deepseek``: DeepSeek-V3's observation (arXiv 2412.19437, section 3.3.2): FP8 (E4M3)
  GEMMs accumulated in about 14 bits on Hopper, with and without promotion of the partial
  sums to FP32 every 128 products.

Errors are measured against exact references: ``math.fsum`` of the exact products (random
data, traces), and for the scaled GEMMs the exact K-block sums (every E4M3 x E4M3 product
and their sums up to K = 16384 are exact in float64) times the exact scale products.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .. import accumulate as acc
from ..formats import RoundMode

__all__ = [
    "Setting",
    "add_parser",
    "cmd_accumulate",
    "deepseek_sweep",
    "error_figure",
    "random_sweep",
    "table_text",
    "trace_sweep",
    "write_outputs",
]

DEFAULT_K = (16, 64, 256, 1024, 4096, 16384)
QUICK_K = (16, 64, 256)
DEEPSEEK_K = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DEEPSEEK_QUICK_K = (128, 256, 512)
_SHORT = {
    "nearest_even": "RNE",
    "nearest_away": "RNA",
    "toward_zero": "RZ",
    "toward_positive": "RU",
    "toward_negative": "RD",
    "stochastic": "SR",
    "odd": "RO",
}


@dataclass(frozen=True)
class Setting:
    """One accumulation setting: keywords of :func:`fpsim.accumulate.dot` and a label."""

    label: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def make(
        cls,
        accumulator: Any = "float32",
        rounding: str = "nearest_even",
        order: str = "sequential",
        block: int | None = None,
        promote_every: int | None = None,
        compensated: str | bool = False,
    ) -> Setting:
        """A setting labelled from its keywords, e.g. ``"p14 RZ seq +128"``."""
        name = f"p{accumulator}" if isinstance(accumulator, int) else str(accumulator)
        parts = [name, _SHORT[RoundMode.parse(rounding).value]]
        parts.append({"sequential": "seq", "pairwise": "pairwise"}.get(order, f"blocked/{block}"))
        if compensated:
            parts.append("kahan" if compensated is True else str(compensated))
        if promote_every:
            parts.append(f"+{promote_every}")
        kw = dict(accumulator=accumulator, rounding=rounding, order=order, compensated=compensated)
        if order == "blocked":
            kw["block"] = block
        if promote_every:
            kw["promote_every"] = promote_every
        return cls(" ".join(parts), kw)


def _draw(rng: np.random.Generator, data: str):
    draw = {"normal": rng.standard_normal, "uniform": rng.random}.get(data)
    if draw is None:
        raise ValueError(f"data must be 'normal' or 'uniform'; got {data!r}")
    return draw


def _row(setting: Setting, k: int, approx, exact, magnitude, info, **extra) -> dict[str, Any]:
    row = {"setting": setting.label, "K": k, **extra}
    for key in ("accumulator", "rounding", "order", "block", "promote_every", "compensated"):
        v = setting.kwargs.get(key)
        row[key] = str(v) if v is not None else None
    row.update(acc.error_summary(approx, exact, magnitude=magnitude))
    row["lost_share"] = info.lost_share if info is not None else math.nan
    return row


def _progress(total: int, quiet: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=quiet, leave=False, desc="accumulate")


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
        kind: ``"dot"`` (products of two inputs) or ``"sum"`` (the inputs themselves).
        outputs: independent reductions per K (vectorised).
        data: ``"normal"`` (standard normal: the sum random-walks, with cancellation) or
            ``"uniform"`` ([0, 1): the sum grows linearly, the worst case for swamping).
        input_format: rounding of the inputs before the reduction (e.g. ``"bfloat16"``).
        product_format: rounding of each product (None: exact, i.e. fused multiply-add).
    """
    if kind not in ("dot", "sum"):
        raise ValueError(f"kind must be 'dot' or 'sum'; got {kind!r}")
    rng = np.random.default_rng(seed)
    kmax = max(ks)
    draw = _draw(rng, data)
    a = draw((outputs, kmax)).astype(np.float32)
    b = draw((outputs, kmax)).astype(np.float32) if kind == "dot" else None
    if input_format is not None:
        a = acc._inputs(a, input_format, "nearest_even", None, "a")
        b = None if b is None else acc._inputs(b, input_format, "nearest_even", None, "b")
    rows = []
    with _progress(len(settings) * len(ks), quiet) as bar:
        for k in ks:
            ak = a[:, :k]
            bk = None if b is None else b[:, :k]
            terms = ak.astype(np.float64) if bk is None else ak.astype(np.float64) * bk
            exact = acc.exact_sum(terms.astype(np.float32), axis=-1) if bk is None else acc.exact_dot(ak, bk)
            magnitude = np.abs(terms).sum(axis=-1)
            for s in settings:
                kw = dict(s.kwargs, seed=seed, return_info=True)
                if bk is None:
                    approx, info = acc.sum(ak, axis=-1, **kw)
                else:
                    approx, info = acc.dot(ak, bk, product_format=product_format, **kw)
                rows.append(_row(s, k, approx, exact, magnitude, info, kind=kind, data=data))
                bar.update()
    return pd.DataFrame(rows)


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
        ks = tuple(sorted({*(2**i for i in range(int(math.log2(len(steps))) + 1)), len(steps)}))
    ks = tuple(k for k in ks if 1 <= k <= len(steps))
    if not ks:
        raise ValueError(f"no K in the sweep fits the trace's {len(steps)} steps")

    def step_vector(step: int) -> np.ndarray:
        parts = [np.asarray(trace.read(trace.entry(step, n)), np.float32).reshape(-1) for n in names]
        return np.concatenate(parts)

    grads = np.stack([step_vector(s) for s in steps[: max(ks)]])  # (steps, elements)
    rows = []
    with _progress(len(settings) * len(ks), quiet) as bar:
        for k in ks:
            g = grads[:k]
            exact = acc.exact_sum(g, axis=0)
            magnitude = np.abs(g.astype(np.float64)).sum(axis=0)
            for s in settings:
                approx, info = acc.sum(g, axis=0, seed=0, return_info=True, **s.kwargs)
                rows.append(_row(s, k, approx, exact, magnitude, info, kind="trace", data=str(trace.path)))
                bar.update()
    return pd.DataFrame(rows)


def deepseek_settings() -> list[tuple[Setting, tuple[str, str]]]:
    """The settings of ``--deepseek`` with their (activation, weight) recipes."""
    tensor = ("e4m3_tensor", "e4m3_tensor")
    fine = ("e4m3_block128", "e4m3_tile128")
    out = []
    for label, kw, recipes in [
        ("E4M3 per-tensor, FP32 accumulator", dict(accumulator="float32"), tensor),
        ("E4M3 per-tensor, 14-bit RNE", dict(accumulator=14), tensor),
        ("E4M3 per-tensor, 14-bit RZ", dict(accumulator=14, rounding="toward_zero"), tensor),
        ("E4M3 per-tensor, 14-bit RNE, promote 128", dict(accumulator=14, promote_every=128), tensor),
        (
            "E4M3 per-tensor, 14-bit RZ, promote 128",
            dict(accumulator=14, rounding="toward_zero", promote_every=128),
            tensor,
        ),
        ("E4M3 1x128/128x128, 14-bit RZ, promote 128", dict(accumulator=14, rounding="toward_zero"), fine),
    ]:
        out.append((Setting(label, kw), recipes))
    return out


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
    rng = np.random.default_rng(seed)
    kmax = max(ks)
    draw = _draw(rng, data)
    a_all = draw((m, kmax)).astype(np.float32)
    b_all = draw((kmax, n)).astype(np.float32)
    rows = []
    settings = deepseek_settings()
    with _progress(len(settings) * len(ks), quiet) as bar:
        for k in ks:
            a, b = a_all[:, :k], np.ascontiguousarray(b_all[:k])
            fp64 = a.astype(np.float64) @ b.astype(np.float64)
            for s, (ra, rb) in settings:
                exact, magnitude = _scaled_reference(a, b, ra, rb)
                approx, info = acc.scaled_matmul(a, b, ra, rb, seed=seed, return_info=True, **s.kwargs)
                extra = dict(kind="deepseek", data=data, recipe_a=ra, recipe_b=rb)
                row = _row(s, k, approx, exact, magnitude, info, **extra)
                row["rel_l2_err_vs_unquantized"] = float(np.linalg.norm(approx - fp64) / np.linalg.norm(fp64))
                rows.append(row)
                bar.update()
    return pd.DataFrame(rows)


def _scaled_reference(a: np.ndarray, b: np.ndarray, ra: str, rb: str) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``sum_j s_a s_b sum_{k in block j} qa qb`` (to float64) and ``sum |terms|``."""
    from ..formats import get_format

    va, (ka, sa), ta = acc._blocked_operand(a, get_format(ra), "nearest_even", None, "a")
    vb, (kb, sb), tb = acc._blocked_operand(
        np.ascontiguousarray(b.T), get_format(rb), "nearest_even", None, "b"
    )
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


# --- output -----------------------------------------------------------------------------

_TABLE = [
    ("setting", "setting", "{}"),
    ("K", "K", "{:d}"),
    ("max_rel_err", "max rel err", "{:.3e}"),
    ("mean_rel_err", "mean rel err", "{:.3e}"),
    ("rel_l2_err", "rel L2 err", "{:.3e}"),
    ("max_scaled_err", "max err/sum|t|", "{:.3e}"),
    ("lost_share", "lost %", "{:.2f}"),
]


def table_text(df: pd.DataFrame) -> str:
    """The printed table: one line per setting x K."""
    cells = []
    for r in df.to_dict("records"):
        line = []
        for key, _, spec in _TABLE:
            v = r.get(key)
            if key == "lost_share":
                v = 100 * v if v is not None and not math.isnan(v) else None
            line.append("-" if v is None else spec.format(int(v) if key == "K" else v))
        cells.append(line)
    heads = [h for _, h, _ in _TABLE]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(heads, widths)))]
    lines += [
        "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths)))
        for c in cells
    ]
    return "\n".join(lines)


def error_figure(df: pd.DataFrame, title: str):
    """Max and mean elementwise relative error and the norm-wise (L2) relative error vs K
    (log-log), one line per setting."""
    from ..report.style import new_figure, palette, style

    keys = ("max_rel_err", "mean_rel_err", "rel_l2_err")
    names = ("max relative error", "mean relative error", "relative L2 error (norm-wise)")
    with style():
        fig, axes = new_figure(1, 3, figsize=(13, 4))
        colours = itertools.cycle(palette())
        styles = itertools.cycle(["-", "--", ":", "-."])
        for (label, g), colour in zip(df.groupby("setting", sort=False), colours):
            ls = next(styles) if len(df["setting"].unique()) > len(palette()) else "-"
            g = g.sort_values("K")
            for ax, key in zip(axes, keys):
                y = g[key].where(g[key] > 0)
                ax.plot(g["K"], y, marker="o", ms=3, color=colour, ls=ls, label=label)
        for ax, name in zip(axes, names):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("K (addends per output)")
            ax.set_ylabel(name)
        axes[0].legend(fontsize=7)
        fig.suptitle(title)
    return fig


def write_outputs(df: pd.DataFrame, out: str | Path, title: str, meta: dict[str, Any]) -> dict[str, Path]:
    """Write ``accumulate.csv``, ``accumulate.json`` (rows and settings) and the figure."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "accumulate.csv", "json": out / "accumulate.json", "figure": out / "error_vs_k.png"}
    df.to_csv(paths["csv"], index=False)
    rows = json.loads(df.to_json(orient="records"))
    paths["json"].write_text(json.dumps({"title": title, **meta, "rows": rows}, indent=1))
    error_figure(df, title).savefig(paths["figure"])
    return paths


# --- command line -----------------------------------------------------------------------


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(t, 0) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes comma-separated integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"--k values must be >= 1, got {text!r}")
    return ks


def _acc(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``accumulate`` command to an ``argparse`` sub-parser set; returns its parser."""
    p = subparsers.add_parser(
        "accumulate",
        help="error growth of low-precision sums and dot products with K (swamping, promotion)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--k", type=_ks, default=None, help="comma-separated K values (default 16..16384)")
    p.add_argument("--kind", choices=["dot", "sum"], default="dot", help="random data: dot products or sums")
    p.add_argument(
        "--accumulator",
        action="append",
        type=_acc,
        metavar="A",
        help="accumulator (repeatable): a format name or p significant bits, e.g. 14 "
        "(default: float32, bfloat16, float16, 14)",
    )
    modes = [m.value for m in RoundMode]
    p.add_argument("--rounding", action="append", choices=modes, metavar="M", help=", ".join(modes))
    p.add_argument("--order", action="append", choices=["sequential", "pairwise", "blocked"], metavar="O")
    p.add_argument("--block", type=int, default=32, help="tree width W for --order blocked (default 32)")
    p.add_argument("--promote-every", action="append", type=int, metavar="N", help="0 = no promotion")
    p.add_argument("--compensated", action="append", choices=["none", "kahan", "neumaier"], metavar="C")
    p.add_argument("--input-format", default=None, help="round inputs first (element format or recipe)")
    p.add_argument("--product-format", default=None, help="round products (default: exact, fused)")
    p.add_argument("--data", choices=["normal", "uniform"], default="normal")
    p.add_argument("--outputs", type=int, default=256, help="independent reductions per K (random data)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", default=None, help="sum the gradient steps of this trace instead")
    p.add_argument("--deepseek", action="store_true", help="DeepSeek-V3 FP8 GEMM preset (14-bit, promotion)")
    p.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    p.add_argument("--out", default="fpsim-accumulate", help="output folder (default: fpsim-accumulate)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=cmd_accumulate)
    return p


def _settings(args: argparse.Namespace, default_acc: list) -> list[Setting]:
    accs = args.accumulator or default_acc
    promos = [p or None for p in (args.promote_every or [0])]
    comps = [{"none": False}.get(c, c) for c in (args.compensated or ["none"])]
    grid = itertools.product(
        accs, args.rounding or ["nearest_even"], args.order or ["sequential"], promos, comps
    )
    return [Setting.make(a, r, o, args.block, p, c) for a, r, o, p, c in grid]


def cmd_accumulate(args: argparse.Namespace) -> int:
    """Run the sweep the arguments ask for, print it, write CSV/JSON/figure; returns 0."""
    if args.deepseek:
        ks = args.k or (DEEPSEEK_QUICK_K if args.quick else DEEPSEEK_K)
        size = 8 if args.quick else 64
        df = deepseek_sweep(ks, m=size, n=size, data=args.data, seed=args.seed, quiet=args.quiet)
        title = f"DeepSeek-V3 FP8 GEMM ({size} x K x {size}, {args.data} data): accumulation error vs K"
        meta = {"preset": "deepseek", "m": size, "n": size, "data": args.data, "seed": args.seed}
    elif args.trace:
        settings = _settings(args, ["bfloat16", "float16", 14, "float32"])
        df = trace_sweep(args.trace, settings, args.k, quiet=args.quiet)
        title = f"gradient accumulation of {args.trace}: error vs steps"
        meta = {"preset": "trace", "trace": str(args.trace)}
    else:
        ks = args.k or (QUICK_K if args.quick else DEFAULT_K)
        outputs = min(args.outputs, 32) if args.quick else args.outputs
        settings = _settings(args, ["float32", "bfloat16", "float16", 14])
        df = random_sweep(
            settings,
            ks,
            kind=args.kind,
            outputs=outputs,
            data=args.data,
            input_format=args.input_format,
            product_format=args.product_format,
            seed=args.seed,
            quiet=args.quiet,
        )
        title = f"random {args.kind} ({args.data}, {outputs} outputs): accumulation error vs K"
        meta = {
            "preset": "random",
            "kind": args.kind,
            "data": args.data,
            "outputs": outputs,
            "seed": args.seed,
        }
    paths = write_outputs(df, args.out, title, meta)
    if args.json:
        print(df.to_json(orient="records", indent=1))
    else:
        print(title)
        print(table_text(df))
        print(f"\nwrote {', '.join(str(p) for p in paths.values())}")
    return 0
