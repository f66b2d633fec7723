"""fpsim in a child made with ``os.fork()`` (multiprocessing's fork start method, torch DataLoader
workers) after the parent has used it: each thread pool fpsim keeps (the compiled loops' pool that
the compiled encode, the analysis, the replay and the training optimizers run on) works again in
the child; a trace writer or capture of the parent refuses, naming both processes, to write the
parent's trace from the child (two processes never write one trace), and a new capture in the
child works.

Each test runs fpsim in the parent, forks, runs it again in the child, and fails where the child
fails or does not exit within :data:`TIMEOUT` (it is killed then): a hang is a failure, not a stuck
suite. The child compares its results with the parent's, bit for bit, and does fpsim's work only.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from children import fork, wait

import fpsim
from fpsim.emulate import element
from fpsim.trace import TraceError, TraceWriter, open_trace

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="os.fork (Linux)")

TIMEOUT = 60.0
"""Seconds a child may take (its work takes well under one; a hang is killed after this)."""

BIG = element.PIECE + 1000
"""Elements of a tensor large enough that the compiled encode runs it on the thread pool."""


def _in_child(body: Callable[[], None], where: Path) -> None:
    """Run ``body()`` in a child forked now; fail with the child's traceback where it raises, or
    kill it and fail where it has not exited within :data:`TIMEOUT` seconds."""
    report = where / f"child-{time.monotonic_ns()}.txt"
    try:
        code = wait(fork(body, report), TIMEOUT)
    except TimeoutError:
        pytest.fail(f"the forked child hung: not done after {TIMEOUT:.0f} s (killed)")
    assert code == 0, report.read_text() if report.exists() else f"the child exited with status {code}"


def test_compiled_encode(tmp_path):
    x = np.random.default_rng(1).standard_normal(2 * element.PIECE + 5).astype(np.float32)
    codes = fpsim.encode(x, "float8_e4m3fn", backend="compiled")  # the pool starts its threads

    def child():
        again = fpsim.encode(x, "float8_e4m3fn", backend="compiled")
        assert again.dtype == codes.dtype and np.array_equal(again, codes)

    _in_child(child, tmp_path)


def test_analysis(tmp_path):
    from fpsim.analysis import analyze

    def run():
        return analyze(None, ["float16", "mxfp8_e4m3"], steps=[10, 20], progress=False, backend="compiled")

    summary = run().summary()

    def child():
        assert run().summary() == summary

    _in_child(child, tmp_path)


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory) -> Path:
    """Two steps of one tensor of :data:`BIG` elements, with its parameter and lr."""
    path = tmp_path_factory.mktemp("fork") / "trace"
    rng = np.random.default_rng(2)
    p = rng.standard_normal(BIG).astype(np.float32)
    with TraceWriter(path) as w:
        for step in (1, 2):
            g = (rng.standard_normal(BIG) * 1e-3).astype(np.float32)
            w.write_step(step, {"grad": {"w": g}, "param": {"w": p}}, lr=1e-3, update=step)
    return path


def test_replay(tmp_path, big_trace):
    """A configuration whose steps encode the whole tensor at once (Kahan's bfloat16
    compensation) on the compiled loops' pool, besides the replay's own pool of each call."""
    from fpsim.replay import replay

    def run():
        return replay(big_trace, ["bf16-master-kahan"], progress=False, backend="compiled").summary()

    summary = run()

    def child():
        assert run() == summary

    _in_child(child, tmp_path)


@pytest.fixture
def torch_one_thread():
    """torch on one thread in the parent, as in a DataLoader worker: torch's own intra-op threads
    (OpenMP) do not survive a fork, and a child would hang in torch, not in fpsim."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(n)


def test_training(tmp_path, torch_one_thread):
    torch = torch_one_thread
    from fpsim.train.torch import AdamW

    rng = np.random.default_rng(3)
    start = rng.standard_normal(BIG).astype(np.float32)
    grads = [(rng.standard_normal(BIG) * 1e-3).astype(np.float32) for _ in range(3)]

    def train() -> np.ndarray:
        p = torch.nn.Parameter(torch.from_numpy(start.copy()))
        opt = AdamW([p], lr=1e-3, config="bf16-master-kahan", backend="compiled")
        for g in grads:
            p.grad = torch.from_numpy(g)
            opt.step()
        return p.detach().numpy().copy()

    trained = train()

    def child():
        assert train().view(np.uint32).tobytes() == trained.view(np.uint32).tobytes()

    _in_child(child, tmp_path)


@pytest.mark.parametrize("asynchronous", [True, False], ids=["asynchronous", "synchronous"])
def test_capture(tmp_path, asynchronous, torch_one_thread):
    """The parent's capture cannot be written from the child (two processes must never write one
    trace): step, flush and close raise there, naming both processes, and a release in the child
    leaves the parent's lock alone. A new capture in
    the child, on another folder, records; the parent goes on recording into its own trace."""
    from fpsim.trace import TorchCapture

    torch = torch_one_thread

    model = torch.nn.Linear(4, 3)
    for q in model.parameters():
        q.grad = torch.ones_like(q)
    grads = {n: q.grad.numpy().copy() for n, q in model.named_parameters()}
    ours, theirs = tmp_path / "parent", tmp_path / "child"
    held = {"cap": TorchCapture(model, ours, asynchronous=asynchronous)}  # the one reference to it
    held["cap"].step(0, loss=1.0)
    held["cap"].flush()
    parent = os.getpid()

    def child():
        cap = held.pop("cap")
        for use, args in ((cap.step, (1, 2.0)), (cap.flush, ()), (cap.close, ())):
            with pytest.raises(RuntimeError, match=f"opened by process {parent}.* {os.getpid()}"):
                use(*args)
        cap.writer._lock.release()  # nothing: the child closed its copy at the fork
        with TorchCapture(model, theirs, asynchronous=asynchronous) as mine:
            mine.step(0, loss=3.0)
            mine.step(1, loss=4.0)
        tr = open_trace(theirs)
        assert tr.steps == [0, 1] and [tr.loss(s) for s in tr.steps] == [3.0, 4.0]
        assert all(np.array_equal(tr.read(tr.entry(1, n)), g) for n, g in grads.items())

    _in_child(child, tmp_path)
    with pytest.raises(TraceError, match=f"pid {parent} "):  # the parent still holds its trace
        TraceWriter(ours)
    held["cap"].step(1, loss=2.0)
    held.pop("cap").close()
    tr = open_trace(ours)
    assert tr.steps == [0, 1] and [tr.loss(s) for s in tr.steps] == [1.0, 2.0]
    assert not (ours / ".fpsim_writer.lock").exists()


def test_a_crashed_writers_child_does_not_keep_its_lock(tmp_path):
    """A writer's process that dies without releasing its lock (``os._exit``, as a SIGKILL) while a
    child it forked lives on: the next writer takes the trace over (the child closed its copy of
    the lock file at the fork; ``flock`` would otherwise stay held by the child's copy)."""
    folder, pids = tmp_path / "trace", tmp_path / "grandchild"

    def writer_that_crashes():
        held = TraceWriter(folder)
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the grandchild: outlives its parent, then leaves)
            time.sleep(TIMEOUT)
            os._exit(0)
        pids.write_text(str(pid))
        assert held.path == folder
        os._exit(0)  # no finalizer runs: the lock is never released (kept referenced until here)

    assert wait(fork(writer_that_crashes), TIMEOUT) == 0
    grandchild = int(pids.read_text())
    try:
        os.kill(grandchild, 0)  # alive, holding whatever it inherited
        assert (folder / ".fpsim_writer.lock").exists()  # the crashed writer's (stale) lock file
        TraceWriter(folder).close()
    finally:
        os.kill(grandchild, 9)


def test_trace_writers(tmp_path):
    """A parent's TraceWriter and AsyncTraceWriter refuse every write (and close) in the child,
    naming both processes, instead of writing the parent's trace or waiting for the parent's
    writer thread; the parent's go on."""
    from fpsim.trace.capture_async import AsyncTraceWriter, snapshot

    grad = {"grad": {"w": np.arange(6, dtype=np.float32)}}
    plain = TraceWriter(tmp_path / "plain")
    plain.write_step(0, grad)
    threaded = AsyncTraceWriter(TraceWriter(tmp_path / "threaded"))
    threaded.submit(snapshot(0, grad))
    threaded.flush()
    parent = os.getpid()

    def child():
        uses = [
            lambda: plain.write_step(1, grad),
            plain.close,
            lambda: threaded.submit(snapshot(1, grad)),
            threaded.flush,
            lambda: threaded.written,
            threaded.close,
        ]
        for use in uses:
            with pytest.raises(RuntimeError, match=f"opened by process {parent} .*process {os.getpid()},"):
                use()

    _in_child(child, tmp_path)
    plain.write_step(1, grad)
    threaded.submit(snapshot(1, grad))
    assert threaded.written in ([0], [0, 1])
    plain.close()
    threaded.close()
    for name in ("plain", "threaded"):
        tr = open_trace(tmp_path / name)
        assert tr.steps == [0, 1] and np.array_equal(tr.read(tr.entry(1, "w")), grad["grad"]["w"])


def test_the_child_runs_on_a_pool_of_its_own(tmp_path):
    """The compiled loops' pool made in the parent is not the child's: the child makes its own
    (once), whose threads exist."""
    fpsim.encode(np.zeros(BIG, np.float32), "float16", backend="compiled")
    theirs = element.pool()

    def child():
        mine = element.pool()
        assert mine is not theirs and element.pool() is mine
        assert mine.submit(os.getpid).result(timeout=TIMEOUT) == os.getpid()

    _in_child(child, tmp_path)
    assert element.pool() is theirs
