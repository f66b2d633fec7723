"""The fixed cost of each ``fpsim`` verb on small inputs, as a ratio to ``python -c "import fpsim"``.

Run: ``python benchmarks/bench_cli.py [--repeats 5] [--json OUT]``.

Each command runs in a fresh interpreter (``python -c "from fpsim.cli import main; ..."``, what
the ``fpsim`` script runs), best wall time of ``--repeats`` interleaved rounds after one
warm-up round (numba's cache, bytecode caches, the OS file cache), next to the baselines
measured in the same rounds: ``python -c pass`` (the interpreter) and ``python -c "import
fpsim"``. The inputs are
small, so what is measured is the fixed cost (imports, set-up, report files): a trace of 2
steps of 500 float32 gradient elements (a 16x25 weight and a 100-element bias, parameters at
the first step), written here with :class:`fpsim.trace.TraceWriter` into a temporary folder.

Verbs: ``fpsim formats``; ``fpsim analyze TRACE`` with its default formats, as a user types it
(and ``--figures``, ``--no-figures`` where the CLI has them); ``fpsim replay TRACE`` with its
default configurations; ``fpsim diff A B`` of two analyze reports. The fpsim measured is the
one ``python`` imports (the script prints its path): ``PYTHONPATH=OLD python
benchmarks/bench_cli.py``, run from outside this checkout (``python -c`` puts the current
folder first on the path), measures the checkout OLD.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MAIN = "import sys; from fpsim.cli import main; sys.exit(main(sys.argv[1:]))"


def _trace(folder: Path) -> None:
    from fpsim.trace import TraceWriter

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((16, 25)).astype(np.float32), rng.standard_normal(100).astype(np.float32)
    with TraceWriter(folder, metadata={"bench": "bench_cli"}) as writer:
        for step in (1, 2):
            grads = {"w": w * np.float32(1e-3 * step), "b": b * np.float32(1e-4 * step)}
            tensors = {"grad": grads, **({"param": {"w": w, "b": b}} if step == 1 else {})}
            writer.write_step(step, tensors, loss=1.0 / step, lr=1e-3, update=step)


# The children write bytecode caches, as an installed package has them (pip compiles them), even
# where the environment says not to (PYTHONDONTWRITEBYTECODE): else every module is compiled anew.
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _run(argv: list[str]) -> float:
    t = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_ENV)
    elapsed = time.perf_counter() - t
    if done.returncode not in (0, 1):  # fpsim diff exits 1 when the reports differ
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def commands(work: Path) -> dict[str, list[str]]:
    """The measured command lines, by label (baselines first)."""
    py = [sys.executable]
    fpsim = [*py, "-c", MAIN]
    trace = str(work / "trace")
    help_text = subprocess.run([*fpsim, "analyze", "--help"], capture_output=True, text=True, env=_ENV).stdout
    cmds = {
        "python -c pass": [*py, "-c", "pass"],
        'python -c "import fpsim"': [*py, "-c", "import fpsim"],
        "fpsim formats": [*fpsim, "formats"],
        "fpsim analyze": [*fpsim, "analyze", trace, "--out", str(work / "a"), "--quiet"],
    }
    if "--figures" in help_text:
        cmds["fpsim analyze --figures"] = [*cmds["fpsim analyze"], "--figures"]
        cmds["fpsim analyze --no-figures"] = [*cmds["fpsim analyze"], "--no-figures"]
    cmds["fpsim replay"] = [*fpsim, "replay", trace, "--out", str(work / "r"), "--quiet"]
    cmds["fpsim diff"] = [*fpsim, "diff", str(work / "a"), str(work / "b")]
    return cmds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    args = parser.parse_args()
    where = subprocess.run(
        [sys.executable, "-c", "import fpsim; print(fpsim.__file__)"], capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench_cli_") as tmp:
        work = Path(tmp)
        _trace(work / "trace")
        cmds = commands(work)
        fpsim = [sys.executable, "-c", MAIN]  # a second report for diff: other formats
        _run(
            [
                *fpsim,
                "analyze",
                str(work / "trace"),
                "--out",
                str(work / "b"),
                "--quiet",
                "--format",
                "float16",
            ]
        )
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for round_ in range(args.repeats + 1):  # round 0 warms up
            for label, argv in cmds.items():
                elapsed = _run(argv)
                if round_:
                    times[label].append(elapsed)
    best = {k: min(v) for k, v in times.items()}
    base = best['python -c "import fpsim"']
    print(f"fpsim: {where}")
    print(f"python: {sys.executable}, {os.cpu_count()} CPUs; best of {args.repeats} rounds")
    print(f"{'command':<30} {'best s':>8} {'x import fpsim':>15}")
    for label, t in best.items():
        print(f"{label:<30} {t:8.3f} {t / base:15.2f}")
    if args.json:
        rows = [{"command": k, "best_s": t, "ratio_to_import": t / base} for k, t in best.items()]
        Path(args.json).write_text(json.dumps({"fpsim": where, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
