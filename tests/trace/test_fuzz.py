"""Trace files from strangers: every hostile input ends in a clear error naming the file or a
correct result; nothing hangs, nothing outside the trace folder is read or written, and only
one writer works on a folder at a time.

Every test runs under a 90 s alarm (a FIFO that blocked a reader would fail the test, not
hang the suite); cases that could kill a process (SIGBUS, SIGKILL) run in a subprocess.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import sys
import time
import warnings
import zipfile

import numpy as np
import pytest
from children import fork, wait

from fpsim.trace import TraceError, TraceWriter, open_trace

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="POSIX files, signals and mounts"
)


@pytest.fixture(autouse=True)
def _bounded():
    """Fail (never hang) a case that blocks: SIGALRM interrupts a blocking open or read."""

    def expire(signum, frame):
        raise TimeoutError("the case did not finish within 90 s (a hang)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(90)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _trace(path, steps=(0, 1, 2)):
    with TraceWriter(path, metadata={"m": 1}) as w:
        for s in steps:
            w.write_step(s, {"grad": {"w": np.full((4, 8), s, np.float32)}}, loss=float(s), lr=0.1)
    return path


def _snapshot(folder):
    """Every file under ``folder`` with its bytes (symlinks as their targets)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for n in files + dirs:
            p = os.path.join(root, n)
            if os.path.islink(p):
                out[p] = ("link", os.readlink(p))
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    out[p] = f.read()
    return out


def _refused(path, match, name=None):
    with pytest.raises(TraceError, match=match) as info:
        open_trace(path)
    assert str(name or path) in str(info.value)
    return str(info.value)


# --- hostile safetensors headers --------------------------------------------------------------


def _st(tmp_path, header, data=b"", name="h_1.safetensors"):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    p = tmp_path / name
    p.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return p


def _entry(**kw):
    return {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], **kw}}


DEEP = b"[" * 5000 + b"]" * 5000


@pytest.mark.parametrize(
    "header, data, match",
    [
        (b'{"w": ' + DEEP + b"}", b"", "nested too deeply"),
        (b'{"__metadata__": {"a": ' + DEEP + b"}}", b"", "nested too deeply"),
        (
            b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 8]}}',
            b"",
            "5000 digits",
        ),
        (_entry(dtype=["F32"]), b"\0" * 8, "unknown dtype"),
        (_entry(dtype={"a": 1}), b"\0" * 8, "unknown dtype"),
        (_entry(shape=[0, 2**62, 2**62], data_offsets=[0, 0]), b"", "too many elements"),
        (_entry(shape=[1] * 65, data_offsets=[0, 4]), b"\0" * 4, "at most 64"),
        (_entry(shape=[True, 2]), b"\0" * 8, "not a list of non-negative integers"),
        (_entry(data_offsets=[False, 8]), b"\0" * 8, "data_offsets"),
        (b'{"w": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 8]}}', b"", "NaN"),
        (b'{"w": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 8]}}', b"", "overflows"),
        (b'{"a": 1, "a": 2}', b"", "appears twice"),
        (b'{"w": "\xff\xfe"}', b"", "UTF-8"),
        (_entry(data_offsets=[0, 2**70]), b"\0" * 8, "data_offsets"),
        ({"__metadata__": {"loss": "[" * 5000}}, b"", "nested too deeply"),
        ({"__metadata__": {"loss": '"big"'}}, b"", "expected a number"),
        ({"__metadata__": {"fpsim_trace_step": "1e3"}}, b"", "fpsim_trace_step"),
        ({"__metadata__": {"skipped": "1"}}, b"", "skipped"),
        ({"__metadata__": {"update": "0"}}, b"", "update"),
        ({"__metadata__": ["x"]}, b"", "__metadata__"),
        ([1, 2], b"", "JSON object"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_hostile_safetensors_header_is_refused_naming_the_file(tmp_path, header, data, match):
    f = _st(tmp_path, header, data)
    _refused(f, match, f)
    _refused(tmp_path, match, f)  # as a folder import too


def test_header_length_past_the_end_and_truncated_files(tmp_path):
    f = tmp_path / "t_1.safetensors"
    f.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    _refused(f, "does not fit")
    for size in (0, 3, 8):
        f.write_bytes(b"\0" * size)
        _refused(f, "truncated|does not fit|not valid UTF-8 JSON")


# --- hostile manifests and step logs ----------------------------------------------------------


@pytest.mark.parametrize(
    "target, text, match",
    [
        (
            "manifest.json",
            '{"fpsim_trace": 2, "metadata": ' + "[" * 5000 + "]" * 5000 + "}",
            "nested too deeply",
        ),
        ("manifest.json", '{"fpsim_trace": ' + "2" * 5000 + "}", "5000 digits"),
        ("manifest.json", '{"fpsim_trace": [2]}', "unsupported trace version"),
        ("manifest.json", '{"fpsim_trace": 2, "metadata": {}, "steps": []}', "lists no 'steps'"),
        ("manifest.json", '{"fpsim_trace": 2, "metadata": []}', "'metadata' must be a JSON object"),
        ("manifest.json", '{"fpsim_trace": 2, "fpsim_trace": 2}', "appears twice"),
        ("manifest.json", "", "not valid UTF-8 JSON"),
        ("steps.jsonl", "[1]\n", "is not an object"),
        ("steps.jsonl", '{"step": 0}\n{"step": \n{"step": 2}\n', "line 2"),
        ("steps.jsonl", '{"step": ' + "1" * 5000 + "}\n", "5000 digits"),
        ("steps.jsonl", "[" * 5000 + "\n", "nested too deeply"),
        (
            "steps.jsonl",
            '{"step": 0, "file": "/etc/passwd", "tensors": []}\n',
            "file name inside the trace folder",
        ),
    ],
)
def test_hostile_manifest_or_log_is_refused_naming_it(tmp_path, target, text, match):
    path = _trace(tmp_path / "t")
    (path / target).write_text(text)
    _refused(path, match, path / target)


def test_torn_last_log_line_is_an_incomplete_step_never_a_wrong_one(tmp_path):
    path = _trace(tmp_path / "t")
    log = path / "steps.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    for cut in (1, len(lines[-1]) // 2, len(lines[-1]) - 1):  # every torn prefix of the last line
        log.write_bytes(b"".join(lines[:-1]) + lines[-1][:cut])
        with pytest.warns(RuntimeWarning, match="incomplete step"):
            t = open_trace(path)
        assert t.steps == [0, 1]
        assert (t.read(t.entry(1, "w")) == 1).all()
    log.write_bytes(b"".join(lines[:-1]) + b'{"step": 2}')  # a torn line that happens to parse
    with pytest.warns(RuntimeWarning, match="incomplete step"):
        assert open_trace(path).steps == [0, 1]
    with TraceWriter(path) as w:  # the next writer cuts it off and goes on
        assert w.steps == [0, 1]
        w.write_step(2, {"grad": {"w": np.full((4, 8), 7, np.float32)}})
    assert (
        log.read_bytes().endswith(b"\n")
        and (open_trace(path).read(open_trace(path).entry(2, "w")) == 7).all()
    )


def test_writer_on_a_corrupt_trace_refuses_and_deletes_nothing(tmp_path):
    path = _trace(tmp_path / "t")
    for log in ('{"step": 0}\n', '{"step": 0, "file": "step_000000.safetensors", "tensors": []}\n'):
        (path / "steps.jsonl").write_text(log)  # a listing that does not match the step files
        before = _snapshot(path)
        with pytest.raises(TraceError):
            TraceWriter(path)
        assert _snapshot(path) == before  # no step file taken for a leftover and deleted


def test_missing_step_log_is_an_error(tmp_path):
    path = _trace(tmp_path / "t")
    (path / "steps.jsonl").unlink()
    _refused(path, "step log .* is missing", path / "steps.jsonl")


def test_version_1_trace_still_reads_and_a_writer_converts_it(tmp_path):
    path = _trace(tmp_path / "t")
    items = [json.loads(line) for line in (path / "steps.jsonl").read_text().splitlines()]
    (path / "manifest.json").write_text(json.dumps({"fpsim_trace": 1, "metadata": {"m": 1}, "steps": items}))
    (path / "steps.jsonl").unlink()
    t = open_trace(path)
    assert t.steps == [0, 1, 2] and t.loss(2) == 2.0 and (t.read(t.entry(2, "w")) == 2).all()
    with TraceWriter(path) as w:
        w.write_step(3, {"grad": {"w": np.full((4, 8), 3, np.float32)}})
    assert json.loads((path / "manifest.json").read_text())["fpsim_trace"] == 2
    assert open_trace(path).steps == [0, 1, 2, 3] and open_trace(path).metadata == {"m": 1}


# --- symlinks in and out, FIFOs and other non-regular files ------------------------------------


def test_step_file_symlink_leaving_the_folder_is_refused(tmp_path):
    path = _trace(tmp_path / "t")
    outside = tmp_path / "outside.safetensors"
    (path / "step_000001.safetensors").rename(outside)
    for target in (outside, "../outside.safetensors"):
        (path / "step_000001.safetensors").unlink(missing_ok=True)
        (path / "step_000001.safetensors").symlink_to(target)
        msg = _refused(path, "leads outside the trace folder", path / "step_000001.safetensors")
        assert "refused" in msg
    folder = tmp_path / "imports"  # a folder import too
    folder.mkdir()
    (folder / "g_1.safetensors").symlink_to(outside)
    _refused(folder, "leads outside", folder / "g_1.safetensors")


def test_symlink_inside_the_folder_is_followed(tmp_path):
    path = _trace(tmp_path / "t")
    (path / "data").mkdir()
    (path / "step_000001.safetensors").rename(path / "data" / "one.safetensors")
    (path / "step_000001.safetensors").symlink_to("data/one.safetensors")
    t = open_trace(path)
    assert (t.read(t.entry(1, "w")) == 1).all()


@pytest.mark.parametrize("name", ["manifest.json", "steps.jsonl", "step_000001.safetensors"])
def test_manifest_log_or_step_file_linking_outside_is_refused(tmp_path, name):
    path = _trace(tmp_path / "t")
    outside = tmp_path / f"outside_{name}"
    (path / name).rename(outside)
    (path / name).symlink_to(outside)
    _refused(path, "leads outside", path / name)


@pytest.mark.parametrize("name", ["manifest.json", "steps.jsonl", "step_000001.safetensors"])
def test_fifo_or_folder_in_place_of_a_file_is_refused_without_blocking(tmp_path, name):
    path = _trace(tmp_path / "t")
    (path / name).unlink()
    os.mkfifo(path / name)
    _refused(path, "a FIFO, not a regular file", path / name)
    os.unlink(path / name)
    (path / name).mkdir()
    _refused(path, "a folder, not a regular file", path / name)


def test_fifo_given_as_a_file_or_in_an_import_folder_does_not_block(tmp_path):
    fifo = tmp_path / "g_3.safetensors"
    os.mkfifo(fifo)
    _refused(fifo, "a FIFO")
    _refused(tmp_path, "a FIFO", fifo)
    for suffix in (".pt", ".npz"):
        other = tmp_path / "x" / f"g_4{suffix}"
        other.parent.mkdir(exist_ok=True)
        other.unlink(missing_ok=True)
        os.mkfifo(other)
        _refused(other, "a FIFO")


def test_writer_never_follows_planted_symlinks(tmp_path):
    """Dangling links at every name the writer creates point outside: nothing is created
    there, no file outside changes, and the folder ends up a valid trace."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    path = _trace(tmp_path / "t", steps=(0, 1))
    pid = os.getpid()
    for name in (
        f".manifest.json.{pid}.tmp",
        f".step_000002.safetensors.{pid}.tmp",
        ".step_000002.safetensors.x.tmp",
        "step_000002.safetensors",  # an unlisted name: removed as an orphan (the link only)
    ):
        (path / name).symlink_to(outside / f"created_{len(name)}")
    (path / "step_000003.safetensors").symlink_to(outside / "keep.txt")
    before = _snapshot(outside)
    with TraceWriter(path, metadata={"new": 1}) as w:
        w.write_step(2, {"grad": {"w": np.full((4, 8), 2, np.float32)}})
        w.write_step(3, {"grad": {"w": np.full((4, 8), 3, np.float32)}})
    assert _snapshot(outside) == before
    assert not (path / "manifest.json").is_symlink()
    t = open_trace(path)
    assert t.steps == [0, 1, 2, 3] and (t.read(t.entry(3, "w")) == 3).all()


@pytest.mark.parametrize("name", [".fpsim_writer.lock", "steps.jsonl"])
def test_writer_refuses_a_symlinked_lock_or_log(tmp_path, name):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    path = _trace(tmp_path / "t")
    (path / name).unlink(missing_ok=True)
    (path / name).symlink_to(outside)
    with pytest.raises(TraceError) as info:
        TraceWriter(path)
    assert str(path / name) in str(info.value)
    assert outside.read_text() == "precious"


# --- pickles and other importer hazards --------------------------------------------------------


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickles_are_refused_and_never_run(tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "pwned"
    pt = tmp_path / "evil_1.pt"
    torch.save({"w": torch.ones(2), "x": _Payload(marker)}, pt)
    _refused(pt, "weights_only")
    raw = tmp_path / "raw_2.pt"
    raw.write_bytes(pickle.dumps({"w": _Payload(marker)}))
    _refused(raw, "weights_only|cannot load")
    npz = tmp_path / "evil_3.npz"
    np.savez(npz, w=np.array([_Payload(marker)], dtype=object))
    _refused(npz, "object dtype")
    assert not marker.exists()


def test_meta_tensor_and_absurd_npz_member_are_refused(tmp_path):
    torch = pytest.importorskip("torch")
    pt = tmp_path / "m_1.pt"
    torch.save({"w": torch.empty(3, device="meta")}, pt)
    _refused(pt, "meta")
    npz = tmp_path / "big_2.npz"
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, np.float32))
    header["shape"] = (2**40,)  # 4 TiB of float32 declared, a few bytes stored
    buf = __import__("io").BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    with zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("w.npy", buf.getvalue() + b"\0" * 16)
    _refused(npz, "declares .* bytes")


# --- truncation: never SIGBUS -----------------------------------------------------------------


def test_truncation_at_open_and_while_in_use_is_an_error_never_sigbus(tmp_path):
    """Run in a child: a SIGBUS (the old reader's memory map) would kill it, not the suite."""
    path = _trace(tmp_path / "t")
    f = path / "step_000001.safetensors"

    def body():
        t = open_trace(path)
        e = t.entry(1, "w")
        a = t.read(e)  # the old reader returned a view of a memory map here
        chunks = t.read_chunks(e, 4)
        first = next(chunks)
        os.truncate(f, 64)  # someone truncates the file
        assert (a == 1).all() and (first == 1).all()  # arrays already read stay valid
        for call in (lambda: t.read(e), lambda: next(chunks)):
            with pytest.raises(TraceError) as info:
                call()
            assert str(f) in str(info.value)

    assert wait(fork(body)) == 0
    _refused(path, "truncated|does not fit", f)


def test_truncated_uncompressed_npz_is_an_error_never_sigbus(tmp_path):
    f = tmp_path / "a_1.npz"
    np.savez(f, w=np.arange(4096, dtype=np.float32))
    t = open_trace(f)
    os.truncate(f, 2000)
    with pytest.raises(TraceError) as info:
        t.read(t.entry(1, "w"))
    assert str(f) in str(info.value)


# --- one writer at a time, crashes, SIGKILL ---------------------------------------------------


def test_second_writer_in_the_same_process_is_refused_naming_the_pid(tmp_path):
    w = TraceWriter(tmp_path / "t")
    with pytest.raises(TraceError, match=f"another TraceWriter \\(pid {os.getpid()} ") as info:
        TraceWriter(tmp_path / "t")
    assert str(tmp_path / "t") in str(info.value)
    w.write_step(0, {"grad": {"w": np.ones(2, np.float32)}})
    w.close()
    with TraceWriter(tmp_path / "t") as w2:  # released on close
        w2.write_step(1, {"grad": {"w": np.ones(2, np.float32)}})
    assert open_trace(tmp_path / "t").steps == [0, 1]


def test_writer_in_another_process_is_refused_naming_its_pid(tmp_path):
    path = tmp_path / "t"
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()

    def holder():
        w = TraceWriter(path)
        os.write(ready_w, b"x")
        os.read(go_r, 1)  # hold the lock until told to go
        w.write_step(0, {"grad": {"w": np.ones(2, np.float32)}})
        w.close()

    pid = fork(holder)
    try:
        assert os.read(ready_r, 1) == b"x"
        with pytest.raises(TraceError, match=f"pid {pid} ") as info:
            TraceWriter(path)
        assert str(path) in str(info.value)
    finally:
        os.write(go_w, b"x")
        status = wait(pid)
        for fd in (ready_r, ready_w, go_r, go_w):
            os.close(fd)
    assert status == 0
    with TraceWriter(path) as w:  # released when the holder closed it
        assert w.steps == [0]
        w.write_step(1, {"grad": {"w": np.ones(2, np.float32)}})


def test_stale_lock_of_a_dead_writer_is_recovered(tmp_path):
    path = tmp_path / "t"

    def crash():
        w = TraceWriter(path)
        w.write_step(0, {"grad": {"w": np.ones(2, np.float32)}})
        os.kill(os.getpid(), signal.SIGKILL)

    pid = fork(crash)
    assert wait(pid) == -signal.SIGKILL
    assert (path / ".fpsim_writer.lock").read_text().split()[0] == str(pid)  # left behind: a dead pid
    with TraceWriter(path) as w:
        assert w.steps == [0]
        w.write_step(1, {"grad": {"w": np.ones(2, np.float32)}})
    (path / ".fpsim_writer.lock").write_text("999999999 elsewhere\n")  # a planted stale lock file
    with TraceWriter(path) as w:
        assert w.steps == [0, 1]


def _step_tensors(s):
    rng = np.random.default_rng(s)
    return {
        "grad": {"w": rng.standard_normal(20000).astype(np.float32)},
        "param": {"w": np.full(3, s, np.int64)},
    }


def test_sigkill_during_capture_leaves_exactly_the_completed_steps(tmp_path):
    """A writer appending steps as fast as it can is SIGKILLed 8 times, each at another
    delay after its latest step completed (so at different points of writing a step); each
    time every listed step reads back bit-identical and the next writer goes on."""
    path = tmp_path / "t"

    def capture():
        w = TraceWriter(path)
        s = w.steps[-1] + 1 if w.steps else 0
        while True:
            w.write_step(s, _step_tensors(s), loss=s / 7, update=s + 1)
            s += 1

    done = 0
    for delay in (0.0, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.08):
        pid = fork(capture)
        log, lines = path / "steps.jsonl", done + 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the child has completed one more step
            if log.exists() and log.read_bytes().count(b"\n") >= lines:
                break
            time.sleep(0.001)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        assert wait(pid) == -signal.SIGKILL
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an interrupted step is reported
            t = open_trace(path)
        assert t.steps == list(range(len(t.steps))) and len(t.steps) > done
        for s in t.steps:
            want = _step_tensors(s)
            assert t.read(t.entry(s, "w")).tobytes() == want["grad"]["w"].tobytes()
            assert (
                (t.read(t.entry(s, "w", "param")) == s).all() and t.loss(s) == s / 7 and t.update(s) == s + 1
            )
        done = len(t.steps)
    assert done >= 8


# --- disk full ---------------------------------------------------------------------------------


def test_disk_full_during_capture_names_the_file_and_keeps_completed_steps(small_disk):
    path = small_disk / "t"
    w = TraceWriter(path)
    written = []
    with pytest.raises(OSError) as info:
        for s in range(100):
            w.write_step(s, {"grad": {"w": np.full(40000, s, np.float32)}})  # 160 kB a step
            written.append(s)
    assert info.value.errno == 28 and str(path) in str(info.value), info.value
    w.close()
    assert 0 < len(written) < 100
    assert not [p.name for p in path.iterdir() if p.name.endswith(".tmp")]
    assert (path / "steps.jsonl").read_bytes().endswith(b"\n")
    t = open_trace(path)
    assert t.steps == written
    assert all((t.read(t.entry(s, "w")) == s).all() for s in written)


# --- API misuse gives fpsim's errors, naming the argument --------------------------------------


def _misuse_cases():
    from fpsim import emulate
    from fpsim.formats import FORMATS, BlockFormat, Codebook, Format, IntFormat, ScaleRule

    e4m3, e8m0 = FORMATS["float8_e4m3fn"], FORMATS["float8_e8m0fnu"]
    x = np.ones(3, np.float32)
    sr = {"rounding": "stochastic"}
    return [
        (lambda: emulate.encode(x, e4m3, **sr, random_bits=[0, 1, 2]), TypeError, "random_bits must be"),
        (
            lambda: emulate.encode(x, e4m3, **sr, rng=0, stochastic_bits=1.5),
            TypeError,
            "stochastic_bits must be",
        ),
        (lambda: emulate.encode(x, e4m3, **sr, rng="abc"), TypeError, "rng must be"),
        (lambda: emulate.encode(x, e4m3, **sr, rng=-1), ValueError, "rng: an int seed"),
        (lambda: emulate.encode(x, e4m3, **sr, rng=0, stochastic_bits=33), ValueError, r"\[1, 32\]"),
        (lambda: Format("f", 4.0, 3, 7), TypeError, "exponent_bits must be an int"),
        (lambda: Format("f", 4, 3, 7.5), TypeError, "bias must be an int"),
        (lambda: Format("f", 4, 3, 7, signed="yes"), TypeError, "signed must be True or False"),
        (lambda: Format("f", 4, 3, 7, encoding="fn"), TypeError, "encoding must be an Encoding"),
        (lambda: Format(None, 4, 3, 7), TypeError, "name must be a str"),
        (lambda: IntFormat("i", 8.0), TypeError, "bits must be an int"),
        (lambda: Codebook("c", (0.0, float("nan"))), ValueError, "finite"),
        (lambda: Codebook("c", "ab"), TypeError, "values must be a tuple"),
        (
            lambda: BlockFormat("b", e4m3, 32, ScaleRule.MX_FLOOR, e8m0),
            TypeError,
            "block must be a tuple of ints",
        ),
        (
            lambda: BlockFormat("b", e4m3, (32.5,), ScaleRule.MX_FLOOR, e8m0),
            TypeError,
            "block entries must be an int",
        ),
        (
            lambda: BlockFormat("b", e4m3, (32,), "mx_floor", e8m0),
            TypeError,
            "rule must be one of .*MX_FLOOR",
        ),
        (
            lambda: BlockFormat("b", "float8_e4m3fn", (32,), ScaleRule.MX_FLOOR, e8m0),
            TypeError,
            r"element must be .*FORMATS\['float8_e4m3fn'\]",
        ),
        (
            lambda: BlockFormat("b", e4m3, (32,), ScaleRule.TE, eps=float("inf")),
            ValueError,
            "eps must be finite",
        ),
        (
            lambda: BlockFormat("b", e4m3, (32,), ScaleRule.TE, pad=None),
            TypeError,
            "pad must be True or False",
        ),
        (lambda: open_trace(123), TypeError, "path must be a str or os.PathLike"),
        (lambda: TraceWriter("/nonexistent-fuzz", metadata=[1]), TypeError, "metadata must be a mapping"),
    ]


@pytest.mark.parametrize("case", range(21))
def test_api_misuse_is_refused_naming_the_argument(case):
    cases = _misuse_cases()
    assert len(cases) == 21
    call, error, match = cases[case]
    with pytest.raises(error, match=match):
        call()


def test_writer_and_trace_misuse(tmp_path):
    path = _trace(tmp_path / "t")
    t = open_trace(path)
    with pytest.raises(TypeError, match="entry must be a TensorEntry"):
        t.read("w")
    with pytest.raises(ValueError, match="positive int"):
        list(t.read_chunks(t.entry(0, "w"), 1.5))
    with TraceWriter(path) as w:
        with pytest.raises(ValueError, match="non-negative integer"):
            w.write_step("3", {})
        with pytest.raises(TypeError, match="must map role"):
            w.write_step(3, [("grad", {})])
    assert open_trace(path).steps == [0, 1, 2]


def test_cli_reports_a_hostile_trace_in_one_line_with_exit_2(tmp_path, capsys):
    from fpsim.cli.app import main

    path = _trace(tmp_path / "t")
    (path / "steps.jsonl").write_text("[" * 5000 + "\n")
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path / "steps.jsonl") in err and "nested too deeply" in err
