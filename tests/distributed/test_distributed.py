"""``fpsim.distributed.analyze_distributed`` against the single-process ``fpsim.analysis.analyze``.

The oracle is the single-process run: every partial (counts, exact rational sums, maxima,
histograms, swamping) and every key, in order, must be equal -- no tolerance. The cluster is a
real LocalCluster of two worker processes (one thread each), started once for the module. The
gradients hold NaNs of every kind (quiet and signaling, both signs, several payloads).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from oracles import NAN_BITS32, with_nans

distributed = pytest.importorskip("distributed")
pytest.importorskip("fsspec")

from fpsim.analysis import Analysis, analyze  # noqa: E402
from fpsim.analysis.metrics import CHUNK  # noqa: E402
from fpsim.cli.distributed import add_dask_argument, run_analyze  # noqa: E402
from fpsim.distributed import analyze as distributed_analyze  # noqa: E402
from fpsim.distributed import analyze_distributed, replay_distributed  # noqa: E402
from fpsim.distributed import plan as distributed_plan  # noqa: E402
from fpsim.distributed.replay import tensor_groups  # noqa: E402
from fpsim.emulate.random import random_bits_at, shifted_seed  # noqa: E402
from fpsim.replay import PRESETS, ReplayResult, replay  # noqa: E402
from fpsim.trace import TensorEntry, TraceError, TraceWriter, open_trace, sample_trace_path  # noqa: E402
from fpsim.trace.remote import RangeReader, TensorLocation  # noqa: E402
from fpsim.trace.safetensors_io import write_safetensors  # noqa: E402

SAMPLE_FORMATS = [
    "float8_e4m3fn",
    "bfloat16",
    "e4m3_tensor",
    "nvfp4",
    "e4m3_row",
    "mxfp8_e4m3",
    "bnb_dynamic8_block256",
]
BOTH = ["nearest_even", "stochastic"]


def assert_same_analysis(got: Analysis, want: Analysis, *, same_trace: bool = True) -> None:
    """Exact equality of two analyses: keys in the same order, every field of every partial."""
    if same_trace:
        assert got.trace == want.trace
    assert (got.formats, got.roundings) == (want.formats, want.roundings)
    for name in ("results", "swamping", "hist", "shapes"):
        g, w = getattr(got, name), getattr(want, name)
        assert list(g) == list(w), f"{name}: keys differ"
        for key, wv in w.items():
            gv = g[key]
            if isinstance(wv, np.ndarray):
                assert gv.dtype == wv.dtype and np.array_equal(gv, wv), (name, key)
            elif isinstance(wv, tuple):
                assert gv == wv, (name, key)
            else:
                assert type(gv) is type(wv), (name, key)
                for f in fields(wv):
                    a, b = getattr(gv, f.name), getattr(wv, f.name)
                    if isinstance(b, np.ndarray):
                        assert a.dtype == b.dtype and np.array_equal(a, b), (name, key, f.name)
                    else:  # ints, Fractions (exact sums), floats (maxima): identical values and types
                        assert type(a) is type(b) and a == b, (name, key, f.name, a, b)


@pytest.fixture(scope="module")
def client():
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def inproc_client():
    """Workers as threads of this process: they see this process's fsspec memory:// files."""
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0") as c:
        yield c


def _grads(shape: tuple[int, ...], seed: int, huge: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    x = rng.standard_normal(n, dtype=np.float32) * np.exp(rng.normal(-10, 4, n)).astype(np.float32)
    x[rng.integers(0, n, 40)] = 0
    x[rng.integers(0, n, 4)] = np.nan
    x[rng.integers(0, n, 3)] = np.inf
    x[rng.integers(0, n, 3)] = -np.inf
    if huge:  # overflows every small format (not where swamping is measured: see the report)
        x[rng.integers(0, n, 3)] = 1e30
    return with_nans(x, start=n // 4, spacing=n // 12 | 1, rounds=1).reshape(shape)


@pytest.fixture(scope="module")
def large_trace(tmp_path_factory) -> Path:
    """Two steps of tensors of several canonical chunks; parameters and lr in step 1 only."""
    shapes = {"w": (1000, 3000), "b": (1_500_000,), "h": (1024, 1025)}
    path = tmp_path_factory.mktemp("dist") / "large"
    with TraceWriter(path) as w:
        for step in range(2):
            g = {k: _grads(s, 10 * step + i, huge=step == 0) for i, (k, s) in enumerate(shapes.items())}
            with np.errstate(invalid="ignore"):  # (signaling NaNs raise the flag in the cast)
                g["h"] = g["h"].astype(ml_dtypes.bfloat16)
            tensors = {"grad": g}
            if step == 1:
                rng = np.random.default_rng(99)
                tensors["param"] = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
            w.write_step(step, tensors, loss=1.0, lr=3e-4 if step == 1 else None)
    assert sum(-(-int(np.prod(s)) // CHUNK) for s in shapes.values()) == 7  # several chunks each
    return path


# --- exact equality with the single-process analysis -------------------------------------


def test_bundled_trace_equals_single_process(client):
    kw = dict(roundings=BOTH, steps=[10, 100, 190, 200], progress=False)  # early, middle, late
    want = analyze(None, SAMPLE_FORMATS, **kw)
    got = analyze_distributed(None, SAMPLE_FORMATS, scheduler=client, **kw)
    assert_same_analysis(got, want)
    assert len(got.results) == 4 * 18 * len(SAMPLE_FORMATS) * 2 and len(got.swamping) == 4 * 18 * 2 * 2
    assert got.totals()["float8_e4m3fn", "nearest_even"].underflow > 1000
    assert got.summary() == want.summary()


def test_large_trace_equals_single_process(client, large_trace):
    fmts = ["float8_e4m3fn", "nvfp4", "e4m3_row"]  # element; tensor amax (two passes); whole rows
    want = analyze(large_trace, fmts, roundings=BOTH, progress=False)
    got = analyze_distributed(large_trace, fmts, roundings=BOTH, scheduler=client, progress=False)
    assert_same_analysis(got, want)
    assert len(got.swamping) == 3 * 2  # step 1 only, one element format x two roundings
    p = got.results[0, "grad", "w", "nvfp4", "stochastic"]
    assert p.elements == 3_000_000 and p.nan_in == 4 + len(NAN_BITS32)
    assert p.overflow == 0 and p.saturated >= 3


def test_result_does_not_depend_on_batching(client, monkeypatch):
    """One chunk per task, and every tensor through the two-pass amax, give the same answer."""
    kw = dict(roundings=BOTH, steps=[10, 200], progress=False)
    want = analyze(None, ["nvfp4", "e4m3_tensor", "float8_e5m2"], **kw)
    monkeypatch.setattr(distributed_analyze, "_BATCH_WORK", 1)
    monkeypatch.setattr(distributed_plan, "AMAX_PART", 7)  # every tensor of > 7 elements takes the amax pass
    got = analyze_distributed(None, ["nvfp4", "e4m3_tensor", "float8_e5m2"], scheduler=client, **kw)
    assert_same_analysis(got, want)


def test_edge_cases_equal(client, tmp_path):
    """Duplicate formats/roundings, empty and 0-d tensors, float16/float64/bf16, other roles."""
    path = tmp_path / "edge"
    rng = np.random.default_rng(3)
    with TraceWriter(path) as w:
        grads = {
            "empty": np.zeros((0, 8), np.float32),
            "scalar": np.float32(3e-9),
            "half": (rng.standard_normal((64, 33)) * 1e-3).astype(np.float16),
            "double": rng.standard_normal(1000) * 1e-7,
            "brain": rng.standard_normal((16, 16)).astype(ml_dtypes.bfloat16),
        }
        state = {"exp_avg": rng.standard_normal(100).astype(np.float32)}
        w.write_step(5, {"grad": grads, "param": grads, "state.exp_avg": state}, lr=0.5)
    fmts = ["float8_e4m3fn", "bfloat16", "float8_e4m3fn", "int8_block256"]
    kw = dict(roundings=["stochastic", "nearest_even", "stochastic"], roles=["grad", "state.exp_avg"])
    want = analyze(path, fmts, progress=False, **kw)
    got = analyze_distributed(path, fmts, scheduler=client, progress=False, **kw)
    assert_same_analysis(got, want)
    assert got.results[5, "grad", "empty", "bfloat16", "nearest_even"].elements == 0


def test_trace_object_and_file_url(client):
    kw = dict(roundings=["stochastic"], steps=[30], progress=False)
    want = analyze(None, ["e4m3_tensor", "float8_e5m2"], **kw)
    tr = open_trace(sample_trace_path())
    for trace in (tr, sample_trace_path().absolute().as_uri()):
        got = analyze_distributed(trace, ["e4m3_tensor", "float8_e5m2"], scheduler=client, **kw)
        assert_same_analysis(got, want)


def test_imported_folders_npz_and_bare_safetensors_keys(client, tmp_path):
    """Imports: .npz read on the worker through open_trace; bare safetensors keys mapped."""
    rng = np.random.default_rng(7)
    (tmp_path / "npz").mkdir()
    (tmp_path / "st").mkdir()
    for step in (1, 2):
        arrays = {"fc.weight": _grads((40, 30), step), "fc.bias": _grads((30,), 10 + step)}
        np.savez(tmp_path / "npz" / f"grads_{step}.npz", **arrays)
        write_safetensors(
            tmp_path / "st" / f"grads_{step}.safetensors",
            {**arrays, "param:fc.weight": rng.standard_normal((40, 30)).astype(np.float32)},
            {"lr": "0.01"},
        )
    for folder in ("npz", "st"):
        want = analyze(tmp_path / folder, ["nvfp4", "float8_e4m3fn"], roundings=BOTH, progress=False)
        got = analyze_distributed(
            tmp_path / folder, ["nvfp4", "float8_e4m3fn"], roundings=BOTH, scheduler=client, progress=False
        )
        assert_same_analysis(got, want)
    assert len(got.swamping) == 2 * 2  # fc.weight has a parameter in each step


@pytest.mark.parametrize("backend", ["numpy", "compiled"])
def test_backend_reaches_the_workers_with_the_same_result(inproc_client, backend):
    """``backend=`` is resolved on the client and the workers measure with it, bit for bit."""
    if backend == "compiled":
        pytest.importorskip("numba")
    kw = dict(roundings=BOTH, steps=[190, 200], progress=False)
    fmts = ["float8_e4m3fn", "nvfp4", "int8_block256"]
    want = analyze(None, fmts, backend="numpy", **kw)
    got = analyze_distributed(None, fmts, scheduler=inproc_client, backend=backend, **kw)
    assert_same_analysis(got, want)
    with pytest.raises(ValueError):
        analyze_distributed(None, fmts, scheduler=inproc_client, backend="gpu", **kw)


def test_remote_trace_folder_through_fsspec(inproc_client):
    """A trace folder on a non-local fsspec file system: manifest on the client, bytes on workers."""
    import fsspec

    fs = fsspec.filesystem("memory")
    root = "/fpsim-test-trace"
    if fs.exists(root):
        fs.rm(root, recursive=True)
    for p in sample_trace_path().iterdir():
        fs.pipe(f"{root}/{p.name}", p.read_bytes())
    kw = dict(roundings=BOTH, steps=[10, 20, 30], progress=False)
    want = analyze(None, ["nvfp4", "e4m3_row", "float8_e4m3fn"], **kw)
    got = analyze_distributed(
        f"memory://{root}", ["nvfp4", "e4m3_row", "float8_e4m3fn"], scheduler=inproc_client, **kw
    )
    assert got.trace == f"memory://{root}"
    assert_same_analysis(got, want, same_trace=False)

    # a corrupt step file is found by the worker that reads it, and named
    fs.pipe(f"{root}/step_000020.safetensors", b"\x00" * 4)
    with pytest.raises(TraceError, match="step_000020.safetensors: truncated safetensors file"):
        analyze_distributed(f"memory://{root}", ["float8_e4m3fn"], scheduler=inproc_client, **kw)
    fs.rm(root, recursive=True)


# --- scheduler forms, CLI helper, errors ----------------------------------------------------


def test_scheduler_address_via_cli_helper(client):
    parser = add_dask_argument(argparse.ArgumentParser())
    parser.add_argument("trace", nargs="?")
    args = parser.parse_args(["--dask", client.scheduler.address, "--workers", "3"])
    assert args.workers == 3
    args.rounding, args.quiet, args.no_swamping = ["stochastic"], True, True
    got = run_analyze(args, ["float8_e4m3fn"])
    want = analyze(None, ["float8_e4m3fn"], roundings=["stochastic"], swamping=False, progress=False)
    assert_same_analysis(got, want)
    assert parser.parse_args([]).dask is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--dask", "local", "--workers", "0"])
    with pytest.raises(ValueError, match="--dask"):
        run_analyze(parser.parse_args([]), ["float8_e4m3fn"])


def test_local_cluster_is_started_and_closed():
    kw = dict(steps=[200], progress=False)
    want = analyze(None, ["mxfp8_e4m3", "float8_e4m3fn"], **kw)
    got = analyze_distributed(None, ["mxfp8_e4m3", "float8_e4m3fn"], scheduler="local", n_workers=1, **kw)
    assert_same_analysis(got, want)


def test_bad_arguments_fail_like_analyze(tmp_path):
    with pytest.raises(ValueError, match="at least one format"):
        analyze_distributed(None, [], progress=False)
    with pytest.raises(ValueError, match="no tensors with roles"):
        analyze_distributed(None, ["float16"], roles=["state.nope"], progress=False)
    with pytest.raises(TypeError, match="scheduler must be"):
        analyze_distributed(None, ["float16"], scheduler=3, steps=[10], progress=False)
    with pytest.raises(ValueError, match="n_workers must be a positive int"):
        analyze_distributed(None, ["float16"], n_workers=0, steps=[10], progress=False)
    with TraceWriter(tmp_path / "ints") as w:
        w.write_step(0, {"grad": {"counts": np.arange(6, dtype=np.int32)}})
    with pytest.raises(TypeError, match=r"step_000000.safetensors: tensor 'grad:counts' has dtype int32"):
        analyze_distributed(tmp_path / "ints", ["float16"], progress=False)
    with pytest.raises(TraceError, match="no such file"):
        analyze_distributed(tmp_path / "missing", ["float16"], progress=False)


def test_worker_reader_checks_the_file(tmp_path):
    """The worker-side reader validates the header and the byte range (no cluster needed)."""
    path = tmp_path / "t"
    with TraceWriter(path) as w:
        w.write_step(0, {"grad": {"a": np.arange(10, dtype=np.float32)}})
    f = path / "step_000000.safetensors"

    def loc(name: str, dtype: str) -> TensorLocation:
        return TensorLocation(str(f), TensorEntry(0, "grad", name, f"grad:{name}", (10,), dtype, f))

    src = loc("a", "float32")
    with RangeReader({}) as rd:
        np.testing.assert_array_equal(rd.read(src, 3, 7), np.arange(3, 7, dtype=np.float32))
        with pytest.raises(TraceError, match="float32\\[10\\] in the file but float16\\[10\\]"):
            rd.read(loc("a", "float16"), 0, 1)
        with pytest.raises(TraceError, match="'grad:b' is missing"):
            rd.read(loc("b", "float32"), 0, 1)
    data = f.read_bytes()
    f.write_bytes(data[:-8])
    with RangeReader({}) as rd, pytest.raises(TraceError, match="truncated safetensors file"):
        rd.read(src, 0, 10)
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert header["grad:a"]["data_offsets"] == [0, 40]


def test_seed_shift_gives_the_bits_of_the_chunk_offset():
    """Swamping chunks shift the seed so measure_swamping draws the bits of offset + i."""
    for seed, offset in ((0, 0), (12345, CHUNK), (2**63 + 5, 7 * CHUNK + 3)):
        shifted = shifted_seed(seed, offset)
        np.testing.assert_array_equal(random_bits_at(shifted, 0, 1000), random_bits_at(seed, offset, 1000))


# --- replay split by tensor -----------------------------------------------------------------


def _same_value(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return type(b) is float and (a == b or (a != a and b != b))
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dataclass_fields__"):
        names = [f.name for f in fields(a)]
        return type(a) is type(b) and all(_same_value(getattr(a, n), getattr(b, n)) for n in names)
    return a == b


def assert_same_replay(got: ReplayResult, want: ReplayResult) -> None:
    assert (got.trace, got.steps) == (want.trace, want.steps)
    assert [c.name for c in got.configs] == [c.name for c in want.configs]
    for name in (
        "mode",
        "trace_skipped",
        "stats",
        "scale",
        "skipped",
        "sizes",
        "final_params",
        "final_states",
    ):
        assert _same_value(getattr(got, name), getattr(want, name)), name
    for c in want.configs:  # sums over tensors in the same order: the same floats
        assert _same_value(got.per_step(c.name), want.per_step(c.name)), c.name
    assert got.summary() == want.summary()


def test_replay_split_by_tensor_equals_single_process(client):
    """Every preset (loss-scaled ones run whole, the others split over tensor groups)."""
    want = replay(None, list(PRESETS), steps=range(190, 201), progress=False)
    got = replay_distributed(None, list(PRESETS), steps=range(190, 201), scheduler=client, progress=False)
    assert_same_replay(got, want)


def test_replay_each_mode_split_equals_single_process(client):
    """mode='each' on the bundled (sparse) trace: every recorded step one update, split by tensor."""
    cfgs = ["bf16-master-sr", "bnb-8bit-all", "fp16-grads-dynamic"]
    want = replay(None, cfgs, mode="each", progress=False)
    got = replay_distributed(None, cfgs, mode="each", scheduler=client, progress=False)
    assert want.mode == "each" and len(want.steps) == 29
    assert_same_replay(got, want)


def test_replay_loss_scaler_couples_tensors(client, tmp_path):
    """An overflow in one tensor skips the step for all: loss-scaled configs are not split."""
    rng = np.random.default_rng(1)
    with TraceWriter(tmp_path / "t") as w:
        for step in range(1, 5):
            g = {n: rng.standard_normal(300).astype(np.float32) * 1e-3 for n in ("a", "b", "c")}
            if step == 2:
                g["a"][7] = 2.0  # 2 * 65536 overflows float16
            if step == 3:
                g["b"] = with_nans(g["b"], start=100, spacing=23, rounds=1)  # NaNs of every kind
            extra = {"param": {n: np.ones(300, np.float32) for n in g}} if step == 1 else {}
            w.write_step(step, {"grad": g, **extra}, lr=1e-2)
    cfgs = ["fp16-grads-dynamic", "bf16-master-sr", "fp8-grads-delayed", "bnb-8bit-all"]
    want = replay(tmp_path / "t", cfgs, progress=False)
    got = replay_distributed(tmp_path / "t", cfgs, scheduler=client, progress=False)
    assert_same_replay(got, want)
    assert got.skipped[2, "fp16-grads-dynamic"] and got.stats[2, "c", "fp16-grads-dynamic"].updates == 0


def test_tensor_groups_are_balanced():
    sizes = {"a": 100, "b": 60, "c": 50, "d": 10, "e": 1}
    groups = tensor_groups(sizes, 2)
    assert sorted(n for g in groups for n in g) == sorted(sizes)
    assert sorted(sum(sizes[n] for n in g) for g in groups) == [110, 111]
    assert tensor_groups({"a": 1}, 4) == [["a"]]
