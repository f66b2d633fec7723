"""Asynchronous capture: snapshots, the bounded writer queue, errors, close, and SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

from fpsim.trace import TorchCapture, TraceWriter, open_trace
from fpsim.trace.capture_async import AsyncTraceWriter, snapshot

CHILD = textwrap.dedent(
    """
    import sys, numpy as np
    from fpsim.trace import TraceWriter
    from fpsim.trace.capture_async import AsyncTraceWriter, snapshot

    w = AsyncTraceWriter(TraceWriter(sys.argv[1]), max_pending=2)
    print("ready", flush=True)
    g = np.zeros((512, 512), np.float32)
    for step in range(100000):
        g[...] = step  # the loop changes the array after step(): the snapshot must not see it
        w.submit(snapshot(step, {"grad": {"w": g, "b": g[0]}}, loss=float(step)))
        sys.stdout.write(f"written {w.written[-1] if w.written else -1}\\n")  # one write per line
    """
)


def test_sigkill_leaves_exactly_the_completed_steps(tmp_path):
    rng = random.Random(21)
    deadline = time.monotonic() + 20
    for kill in range(3):
        folder = tmp_path / f"t{kill}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(folder)], stdout=subprocess.PIPE, text=True, env=env
        )
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.02, 0.5))
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        assert child.returncode == -signal.SIGKILL
        # The kill can cut the last line short: only lines that reached their newline count.
        complete = out.split("\n")[:-1]
        reported = [int(line.split()[1]) for line in complete if line.startswith("written")]
        confirmed = max(reported, default=-1)  # steps the child knew were written
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a step file cut off before its manifest
            trace = open_trace(folder)
        assert trace.steps == list(range(len(trace.steps)))  # a prefix, nothing torn
        assert len(trace.steps) - 1 >= confirmed
        for step in trace.steps:
            assert trace.loss(step) == float(step)
            w = trace.read(trace.entry(step, "w"))
            assert w.dtype == np.float32 and w.shape == (512, 512) and np.all(w == step)
            assert np.all(trace.read(trace.entry(step, "b")) == step)
        TraceWriter(folder).close()  # a new writer deletes leftovers and appends after them
        assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []
        if time.monotonic() > deadline:  # time-bounded on a slow machine: fewer kills, never none
            break


def test_writer_errors_surface_once_at_the_next_submit_keeping_their_type(tmp_path):
    w = AsyncTraceWriter(TraceWriter(tmp_path / "t"), max_pending=1)
    w.submit(snapshot(0, {"grad": {"a": np.ones(3, np.float32)}}))
    w.submit(snapshot(1, {"grad": {"a": np.array([1 + 2j])}}))  # complex: the writer refuses it
    w.submit(snapshot(2, {"grad": {"a": np.ones(3, np.float32)}}))  # dropped after the failure
    w._queue.join()
    with pytest.raises(TypeError, match="tensor 'grad:a'") as info:
        w.submit(snapshot(3, {"grad": {"a": np.ones(3, np.float32)}}))
    (note,) = info.value.__notes__
    assert "step 1 was not written" in note and "nor steps 2 given after it" in note and "(0)" in note
    with TraceWriter(tmp_path / "t") as again:  # the failed writer released the lock
        assert again.steps == [0]
    w.close()  # raised once already: nothing more
    with pytest.raises(RuntimeError, match=r"closed \(writing step 1 failed: TypeError"):
        w.submit(snapshot(4, {"grad": {}}))
    assert open_trace(tmp_path / "t").steps == [0]


def test_queue_is_bounded_and_close_waits(tmp_path, monkeypatch):
    gate = threading.Event()
    w = AsyncTraceWriter(TraceWriter(tmp_path / "t"), max_pending=2)
    real = w.writer.write_step

    def slow(*args, **kwargs):
        gate.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(w.writer, "write_step", slow)
    for step in range(3):  # one in the thread, two in the queue
        w.submit(snapshot(step, {"grad": {"a": np.full(4, step, np.float32)}}))
    blocked = threading.Thread(target=w.submit, args=(snapshot(3, {"grad": {"a": np.zeros(1)}}),))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive() and w._queue.qsize() == 2  # the fourth waits: memory stays bounded
    gate.set()
    blocked.join(5)
    w.close()
    assert open_trace(tmp_path / "t").steps == [0, 1, 2, 3] and w.written == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="closed"):
        w.submit(snapshot(4, {"grad": {}}))


def test_torch_snapshot_is_the_value_at_step_time_async_and_sync(tmp_path):
    torch = pytest.importorskip("torch")
    for asynchronous in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 3)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        x = torch.randn(5, 6)
        seen = []
        path = tmp_path / f"a{asynchronous}"
        with TorchCapture(model, path, params=True, optimizer=opt, asynchronous=asynchronous) as cap:
            for step in range(4):
                loss = model(x).square().sum()
                opt.zero_grad(set_to_none=False)  # gradients are zeroed in place: a reference would not do
                loss.backward()
                cap.step(step, loss=loss)
                seen.append((loss.item(), model.weight.grad.clone(), model.weight.detach().clone()))
                opt.step()
        t = open_trace(path)
        assert t.steps == [0, 1, 2, 3]
        for step, (loss, grad, param) in enumerate(seen):
            assert t.loss(step) == np.float32(loss)
            np.testing.assert_array_equal(t.read(t.entry(step, "weight")), grad.numpy())
            np.testing.assert_array_equal(t.read(t.entry(step, "weight", "param")), param.numpy())


def test_capture_step_raises_the_writer_error_once_as_it_is(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()
    cap = TorchCapture(model, tmp_path / "t")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cap.writer, "write_step", full_disk)
    cap.step(0)
    cap._async._queue.join()
    with pytest.raises(OSError, match="No space left on device") as info:
        cap.step(1)
    assert info.value.errno == 28 and "step 0 was not written" in info.value.__notes__[0]
    cap.close()  # raised once: close after the failure does nothing
    assert open_trace(tmp_path / "t").steps == []
