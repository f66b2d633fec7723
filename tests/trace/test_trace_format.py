"""The safetensors reader/writer (against the safetensors library) and the trace folder format."""

from __future__ import annotations

import gc
import json
import mmap
import os
import struct
import sys
import tracemalloc
import warnings

import ml_dtypes
import numpy as np
import pytest

from fpsim.trace import TensorEntry, Trace, TraceError, TraceWriter, open_trace
from fpsim.trace.safetensors_io import read_header, read_tensor, write_safetensors

RNG = np.random.default_rng(0)


def mapped(a: np.ndarray) -> mmap.mmap | None:
    """The memory map under an array, if any."""
    base = a
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    return base


def numpy_arrays() -> dict[str, np.ndarray]:
    return {
        "f32": RNG.standard_normal((3, 5)).astype(np.float32),
        "f16": RNG.standard_normal(7).astype(np.float16),
        "f64": RNG.standard_normal((2, 2, 2)),
        "i32": RNG.integers(-100, 100, (4, 1), dtype=np.int32),
        "u8": RNG.integers(0, 255, 9, dtype=np.uint8),
        "b": np.array([True, False, True]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "strided": RNG.standard_normal((6, 6)).astype(np.float32)[::2, 1::2],
    }


def read_all(path) -> dict[str, np.ndarray]:
    header = read_header(path)
    return {k: read_tensor(header, k) for k in header.tensors}


# --- against the safetensors library ---------------------------------------------------------


def test_writer_is_read_by_safetensors_numpy(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    arrays = numpy_arrays()
    write_safetensors(tmp_path / "a.safetensors", arrays, {"note": "hi"})
    back = st.load_file(tmp_path / "a.safetensors")
    assert set(back) == set(arrays)
    for k, a in arrays.items():
        assert back[k].dtype == a.dtype and back[k].shape == a.shape
        np.testing.assert_array_equal(back[k], a)
    from safetensors import safe_open

    with safe_open(tmp_path / "a.safetensors", framework="np") as f:
        assert f.metadata() == {"note": "hi"}


def test_reader_reads_safetensors_numpy_files(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    arrays = {k: np.ascontiguousarray(v) for k, v in numpy_arrays().items()}
    st.save_file(arrays, tmp_path / "b.safetensors", metadata={"m": "1"})
    assert read_header(tmp_path / "b.safetensors").metadata == {"m": "1"}
    got = read_all(tmp_path / "b.safetensors")
    for k, a in arrays.items():
        assert got[k].dtype == a.dtype and got[k].shape == a.shape
        np.testing.assert_array_equal(got[k], a)


TORCH_SMALL = ["bfloat16", "float8_e4m3fn", "float8_e5m2"]


@pytest.mark.parametrize("name", TORCH_SMALL)
def test_small_floats_both_ways_with_safetensors_torch(tmp_path, name):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    if name == "bfloat16":  # a spread of codes, signs and NaNs included
        view, np_view, codes = torch.int16, np.int16, torch.arange(-32768, 32768, 97)
    else:  # every code
        view, np_view, codes = torch.uint8, np.uint8, torch.arange(256)
    t = codes.to(view).view(getattr(torch, name)).reshape(-1, 1)
    st.save_file({"t": t}, tmp_path / "lib.safetensors")
    mine = read_all(tmp_path / "lib.safetensors")["t"]
    assert mine.dtype == np.dtype(getattr(ml_dtypes, name)) and mine.shape == tuple(t.shape)
    np.testing.assert_array_equal(mine.view(np_view), t.view(view).numpy())

    write_safetensors(tmp_path / "mine.safetensors", {"t": np.asarray(mine)})
    back = st.load_file(tmp_path / "mine.safetensors")["t"]
    assert back.dtype == getattr(torch, name)
    assert torch.equal(back.view(view), t.view(view))


def test_header_is_aligned_and_output_deterministic(tmp_path):
    arrays = numpy_arrays()
    write_safetensors(tmp_path / "1.safetensors", arrays, {"a": "b"})
    write_safetensors(tmp_path / "2.safetensors", arrays, {"a": "b"})
    raw = (tmp_path / "1.safetensors").read_bytes()
    assert raw == (tmp_path / "2.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0


def test_unsupported_dtype_is_refused(tmp_path):
    with pytest.raises(TypeError, match="complex64"):
        write_safetensors(tmp_path / "c.safetensors", {"c": np.zeros(2, np.complex64)})


# --- lazy reads ------------------------------------------------------------------------------


def test_read_is_a_fresh_array_of_the_tensor_bytes_and_holds_no_file(tmp_path):
    a = np.arange(1000, dtype=np.float32)
    b = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    write_safetensors(tmp_path / "m.safetensors", {"a": a, "b": b})
    header = read_header(tmp_path / "m.safetensors")
    assert header.tensors["b"].offset == header.tensors["a"].offset + a.nbytes
    assert header.tensors["b"].offset % 8 == 0
    mb = read_tensor(header, "b")
    assert mapped(mb) is None  # no memory map: nothing can SIGBUS
    np.testing.assert_array_equal(mb, b)
    np.testing.assert_array_equal(read_tensor(header, "b", 5, 11), b.reshape(-1)[5:11])
    with pytest.raises(ValueError, match="outside tensor"):
        read_tensor(header, "b", 5, 25)
    other = tmp_path / "other.safetensors"
    write_safetensors(other, {"a": a * 0, "b": b * 0})
    os.replace(other, tmp_path / "m.safetensors")  # another file of the same size in its place
    np.testing.assert_array_equal(mb, b)  # the array holds its own copy of the bytes
    with pytest.raises(TraceError, match="changed since"):
        read_tensor(header, "b")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/fd")
def test_many_live_arrays_hold_no_file_descriptor(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.write_step(0, {"grad": {f"w{i}": np.full(3, i, np.float32) for i in range(300)}})
    t = open_trace(tmp_path / "t")
    before = len(os.listdir("/proc/self/fd"))
    arrays = [t.read(e) for e in t.entries()]
    assert len(os.listdir("/proc/self/fd")) <= before
    assert all(mapped(a) is None and not a.flags.writeable for a in arrays)
    assert [float(a[0]) for a in arrays] == list(range(300))
    del arrays
    gc.collect()


def test_file_changed_after_opening_is_an_error_not_a_crash(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.write_step(0, {"grad": {"w": np.ones(100, np.float32)}})
    t = open_trace(tmp_path / "t")
    f = tmp_path / "t" / "step_000000.safetensors"
    f.write_bytes(f.read_bytes()[:-40])
    with pytest.raises(TraceError, match="changed since the trace was opened") as info:
        t.read(t.entries()[0])
    assert str(f) in str(info.value)


def test_read_chunks_streams_without_loading_the_tensor(tmp_path):
    n = 8 * 1024 * 1024  # 32 MB of float32
    with TraceWriter(tmp_path / "t") as w:
        w.write_step(0, {"grad": {"big": np.arange(n, dtype=np.float32)}})
    trace = open_trace(tmp_path / "t")
    (entry,) = trace.entries()
    tracemalloc.start()
    total, count, last = 0.0, 0, None
    for chunk in trace.read_chunks(entry, 1 << 20):
        total += float(chunk.sum(dtype=np.float64))
        count += chunk.size
        last = chunk
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == n and total == n * (n - 1) / 2 and last[-1] == n - 1
    assert peak < 3 * 4 * (1 << 20)  # a chunk or two of 4 MB alive at a time, far below the 32 MB tensor


# --- corrupt safetensors files ---------------------------------------------------------------


def _file(tmp_path, header: dict | bytes, data: bytes = b"", length: int | None = None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return p


def _raw(tmp_path, data: bytes):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(data)
    return p


def _entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda t: _raw(t, b"\x01\x02"), "truncated"),
        (lambda t: _file(t, {"x": _entry()}, b"\0" * 8, length=10**12), "header length"),
        (lambda t: _file(t, b"{not json", b""), "not valid UTF-8 JSON"),
        (lambda t: _file(t, b"[1, 2]", b""), "JSON object is required"),
        (lambda t: _file(t, {"x": _entry(dtype="F7")}, b"\0" * 8), "unknown dtype 'F7'"),
        (lambda t: _file(t, {"x": _entry(shape=(-1,))}, b"\0" * 8), "non-negative"),
        (lambda t: _file(t, {"x": _entry(offsets=(0, 4))}, b"\0" * 4), "needs 8"),
        (lambda t: _file(t, {"x": _entry(offsets=(4, 2))}, b"\0" * 8), "0 <= begin <= end"),
        (lambda t: _file(t, {"x": _entry(), "y": _entry(offsets=(4, 12))}, b"\0" * 12), "overlaps"),
        (lambda t: _file(t, {"x": _entry(offsets=(4, 12))}, b"\0" * 12), "hole"),
        (lambda t: _file(t, {"x": _entry()}, b"\0" * 5), "truncated"),
        (lambda t: _file(t, {"x": _entry()}, b"\0" * 9), "after the last tensor"),
        (lambda t: _file(t, {"__metadata__": {"a": 1}}, b""), "__metadata__"),
        (lambda t: _file(t, b'{"x": {}, "x": {}}', b""), "'x' appears twice"),
    ],
)
def test_corrupt_safetensors_files_name_the_file_and_problem(tmp_path, make, problem):
    path = make(tmp_path)
    with pytest.raises(TraceError, match=problem) as info:
        read_header(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_truncated_step_file_is_reported_when_the_trace_opens(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.write_step(1, {"grad": {"w": np.ones(100, np.float32)}})
    f = tmp_path / "t" / "step_000001.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(TraceError, match="truncated") as info:
        open_trace(tmp_path / "t")
    assert str(f) in str(info.value)


# --- the trace folder ------------------------------------------------------------------------


@pytest.fixture
def trace_dir(tmp_path):
    path = tmp_path / "trace"
    with TraceWriter(path, metadata={"model": "test"}) as w:
        for step in (0, 5, 10):
            w.write_step(
                step,
                {
                    "grad": {
                        "a.weight": np.full((2, 3), step, np.float32),
                        "b": np.arange(4, dtype=np.float16),
                    },
                    "param": {"a.weight": np.ones((2, 3), np.float32)},
                    "state.exp_avg": {"a.weight": np.zeros((2, 3), ml_dtypes.bfloat16)},
                    "state.count": {"b": np.arange(3, dtype=np.int32)},
                },
                loss=1.0 / (step + 1),
                lr=0.1 if step else None,
            )
    return path


def test_trace_api(trace_dir):
    t = open_trace(trace_dir)
    assert isinstance(t, Trace) and t.path == trace_dir
    assert t.steps == [0, 5, 10]
    assert t.metadata == {"model": "test"}
    assert t.loss(5) == pytest.approx(1 / 6) and t.lr(0) is None and t.lr(10) == 0.1
    assert t.roles == ("grad", "param", "state.count", "state.exp_avg")
    assert t.names() == ["a.weight", "b"] and t.names("param") == ["a.weight"]
    assert len(t.entries()) == 15 and len(t.entries(step=5)) == 5
    assert [e.step for e in t.entries(role="grad")] == [0, 0, 5, 5, 10, 10]
    assert t.entries(role="state.momentum_buffer") == []
    e = t.entry(10, "a.weight")
    assert e == TensorEntry(
        10, "grad", "a.weight", "grad:a.weight", (2, 3), "float32", trace_dir / e.file.name
    )
    assert e.size == 6 and e.is_float and e.file.name == "step_000010.safetensors"
    a = t.read(e)
    assert not a.flags.writeable and (a == 10).all()
    bf = t.entry(0, "a.weight", role="state.exp_avg")
    assert bf.dtype == "bfloat16" and t.read(bf).dtype == ml_dtypes.bfloat16
    ints = t.entry(0, "b", role="state.count")
    assert ints.dtype == "int32" and not ints.is_float
    chunks = list(t.read_chunks(t.entry(5, "b"), 3))
    assert [c.size for c in chunks] == [3, 1]
    np.testing.assert_array_equal(np.concatenate(chunks), np.arange(4))
    assert "steps=3" in repr(t)


def test_trace_api_errors(trace_dir, tmp_path):
    t = open_trace(trace_dir)
    with pytest.raises(ValueError, match=r"step 7 is not in trace .*steps: 0, 5, 10"):
        t.loss(7)
    with pytest.raises(ValueError, match="role must be"):
        t.entries(role="grads")
    with pytest.raises(ValueError, match="no grad tensor 'zz'"):
        t.entry(0, "zz")
    with pytest.raises(ValueError, match="chunk_elements"):
        list(t.read_chunks(t.entries()[0], 0))
    foreign = TensorEntry(0, "grad", "x", "grad:x", (1,), "float32", tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="does not belong"):
        t.read(foreign)


def _edit_manifest(path, change):
    """Apply ``change`` to the manifest with its steps (from the step log) and write both back."""
    m = json.loads((path / "manifest.json").read_text())
    log = path / "steps.jsonl"
    m["steps"] = [json.loads(line) for line in log.read_text().splitlines()]
    change(m)
    steps = m.pop("steps", [])
    log.write_text("".join(json.dumps(item) + "\n" for item in steps))
    (path / "manifest.json").write_text(json.dumps(m))


def _tensor(m, step_index, key):
    return next(t for t in m["steps"][step_index]["tensors"] if t["key"] == key)


@pytest.mark.parametrize(
    "change, problem, names",
    [
        (lambda m: m["steps"].append(dict(m["steps"][1])), "step 5 is listed twice", "steps.jsonl"),
        (lambda m: m["steps"][1].update(file="step_000099.safetensors"), "is missing", "step_0000"),
        (
            lambda m: _tensor(m, 1, "grad:b").update(shape=[5]),
            r"float16\[4\] in the file but float16\[5\]",
            "step_0000",
        ),
        (lambda m: _tensor(m, 1, "grad:b").update(dtype="float32"), "in the file but float32", "step_0000"),
        (
            lambda m: _tensor(m, 1, "grad:b").update(key="grad:c", name="c"),
            "'grad:c' listed in the manifest is missing from the file",
            "step_0000",
        ),
        (lambda m: m["steps"][1]["tensors"].pop(), "not listed in the manifest", "step_0000"),
        (lambda m: m.update(fpsim_trace=3), "unsupported trace version 3", "manifest.json"),
        (lambda m: m.update(fpsim_trace=True), "unsupported trace version True", "manifest.json"),
        (lambda m: m.pop("fpsim_trace"), "not an fpsim trace manifest", "manifest.json"),
        (
            lambda m: m["steps"][0].update(file="../x.safetensors"),
            "file name inside the trace folder",
            "steps.jsonl",
        ),
        (
            lambda m: m["steps"][0].update(file="manifest.json"),
            "file name inside the trace folder",
            "steps.jsonl",
        ),
        (lambda m: _tensor(m, 0, "grad:b").update(role="gradient"), "role must be", "steps.jsonl"),
        (lambda m: _tensor(m, 0, "grad:b").update(key="b"), "'key' must be grad:b", "steps.jsonl"),
        (lambda m: _tensor(m, 0, "grad:b").update(dtype=["F32"]), "unknown dtype", "steps.jsonl"),
        (lambda m: m["steps"][0].update(loss="big"), "expected a number or null", "steps.jsonl"),
        # the listing and the step file's __metadata__ must agree
        (
            lambda m: m["steps"][0].update(loss=0.5),
            "loss is 1.0 in the file's __metadata__ but 0.5",
            "step_000000",
        ),
        (
            lambda m: m["steps"][1].update(lr=0.2),
            "lr is 0.1 in the file's __metadata__ but 0.2",
            "step_000005",
        ),
        (
            lambda m: m["steps"][1].update(update=7),
            "update is None in the file's __metadata__ but 7",
            "step_000005",
        ),
        (
            lambda m: m["steps"][2].update(skipped=True),
            "skipped is False in the file's __metadata__",
            "step_000010",
        ),
        (
            lambda m: m["steps"][1].update(step=6, file="step_000005.safetensors"),
            "step is 5 in the file's __metadata__ but 6",
            "step_000005",
        ),
    ],
)
def test_manifest_that_disagrees_with_files_is_an_error(trace_dir, change, problem, names):
    _edit_manifest(trace_dir, change)
    with pytest.raises(TraceError, match=problem) as info:
        open_trace(trace_dir)
    assert str(trace_dir / names) in str(info.value)


def test_corrupt_manifest_json(trace_dir):
    (trace_dir / "manifest.json").write_text('{"fpsim_trace": 2, "metadata": {')
    with pytest.raises(TraceError, match="corrupt trace manifest") as info:
        open_trace(trace_dir)
    assert str(trace_dir / "manifest.json") in str(info.value)


def test_unlisted_step_file_is_ignored_with_a_warning(trace_dir):
    _edit_manifest(trace_dir, lambda m: m["steps"].pop())
    with pytest.warns(RuntimeWarning, match="step_000010.safetensors"):
        t = open_trace(trace_dir)
    assert t.steps == [0, 5]


def test_trace_opens_through_its_manifest_and_without_it(trace_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_trace(trace_dir / "manifest.json").steps == [0, 5, 10]
    (trace_dir / "manifest.json").unlink()
    t = open_trace(trace_dir)  # a folder of step files: roles, loss and lr come from the files
    assert t.steps == [0, 5, 10] and t.roles == ("grad", "param", "state.count", "state.exp_avg")
    assert t.loss(5) == pytest.approx(1 / 6) and t.lr(10) == 0.1 and t.lr(0) is None
    np.testing.assert_array_equal(t.read(t.entry(10, "a.weight")), np.full((2, 3), 10, np.float32))


def test_unpadded_header_from_other_writers_reads_unaligned(tmp_path):
    data = np.array([1.5, -2.0, 3.25], np.float32)
    path = _file(tmp_path, {"x": _entry(shape=(3,), offsets=(0, 12))}, data.tobytes())
    assert read_header(path).tensors["x"].offset % 4 != 0
    np.testing.assert_array_equal(read_tensor(read_header(path), "x"), data)
