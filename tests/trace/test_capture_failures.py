"""A write that fails (a full disk) keeps its exception's class and errno, names the lost steps,
closes the capture and releases the folder's lock: a notebook cell run again records again.

The disk fills for real at the lowest level the writer reaches: ``os.fsync`` of one step's
temporary file fails with ``ENOSPC`` (as a file system with delayed allocation reports a full
disk), or ``os.write`` of the step log writes half the line and then fails; "freeing space"
undoes it. Synchronous capture, the background writer, TraceWriter and capture_jax.
"""

from __future__ import annotations

import errno
import os
import sys
import threading

import numpy as np
import pytest

from fpsim.trace import TorchCapture, TraceError, TraceWriter, capture_jax, open_trace
from fpsim.trace.errors import steps_text

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/fd names files")
torch = pytest.importorskip("torch")

ENOSPC = os.strerror(errno.ENOSPC)


def _fd_name(fd: int) -> str:
    return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))


class Disk:
    """Fills the disk for one step's file (``full_for(step)``) until ``free()``."""

    def __init__(self, monkeypatch):
        self.step: int | None = None
        real = os.fsync

        def fsync(fd):
            if self.step is not None and _fd_name(fd).startswith(f".step_{self.step:06d}.safetensors."):
                raise OSError(errno.ENOSPC, ENOSPC)
            return real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def full_for(self, step: int) -> None:
        self.step = step

    def free(self) -> None:
        self.step = None


@pytest.fixture
def disk(monkeypatch):
    return Disk(monkeypatch)


def _grad(step: int, i: int, shape) -> torch.Tensor:
    """The gradient a step gives parameter i: exact values the test recomputes."""
    return torch.from_numpy(np.random.default_rng([step, i]).standard_normal(tuple(shape)).astype(np.float32))


def _cell(cap, model, opt, steps, given):
    """A notebook cell: a training loop over ``steps`` that records with ``cap``, then closes it."""
    for step in steps:
        for i, p in enumerate(model.parameters()):
            p.grad = _grad(step, i, p.shape)
        given.append(step)
        cap.step(step, loss=float(step))
        opt.step()
    cap.close()


def _check_trace(path, model, steps, updates=True):
    t = open_trace(path)
    assert t.steps == steps
    for s in steps:
        assert t.loss(s) == float(s) and t.update(s) == (s + 1 if updates else None)  # an update a step
        for i, (name, p) in enumerate(model.named_parameters()):
            assert t.read(t.entry(s, name)).tobytes() == _grad(s, i, p.shape).numpy().tobytes()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_disk_full_keeps_the_oserror_and_a_cell_run_again_records_again(tmp_path, disk, asynchronous):
    path = tmp_path / "t"
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    disk.full_for(2)
    cap = TorchCapture(model, path, optimizer=opt, asynchronous=asynchronous, max_pending=2)
    given: list[int] = []
    with pytest.raises(OSError) as info:
        _cell(cap, model, opt, range(10), given)
    e, stopped = info.value, given[-1]  # the cap.step that raised
    assert type(e) is OSError and e.errno == errno.ENOSPC and e.strerror.startswith(ENOSPC)
    assert e.filename == str(path / "step_000002.safetensors")
    notes = "\n".join(e.__notes__)
    assert f"step 2 was not written to the trace {path}" in notes and "(0..1)" in notes
    if asynchronous:
        # raised by a later cap.step: the queue holds at most max_pending steps, so by step 6 the
        # thread has failed; the steps given in between were dropped, and the note names them
        assert 3 <= stopped <= 6
        if stopped > 3:
            assert f"steps {steps_text(range(3, stopped))}, given after step 2, were not written" in notes
    else:
        assert stopped == 2
    assert open_trace(path).steps == [0, 1]
    assert not [p.name for p in path.iterdir() if p.name.endswith(".tmp")]
    cap.close()  # after the error was raised: does nothing
    cap.flush()
    with pytest.raises(RuntimeError, match=r"closed \(writing step 2 failed: OSError: .*No space left"):
        cap.step(stopped)

    disk.free()  # space freed; the cell runs again, `cap` still alive (as in the notebook's history)
    cap2 = TorchCapture(model, path, optimizer=opt, asynchronous=asynchronous, max_pending=2)
    _cell(cap2, model, opt, range(stopped, 10), [])
    _check_trace(path, model, [0, 1, *range(stopped, 10)])
    assert cap is not None


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_disk_that_really_fills_then_the_cell_run_again_after_freeing_space(small_disk, asynchronous):
    """A 1 MiB tmpfs fills for real: the loop gets ENOSPC, the trace keeps the completed steps;
    a file deleted (space freed), the same cell runs again and records after them."""
    path, filler = small_disk / "t", small_disk / "filler"
    filler.write_bytes(b"\0" * 400_000)
    model = torch.nn.Linear(200, 200)  # 160 kB of gradients a step: the fourth does not fit
    opt = torch.optim.SGD(model.parameters(), lr=0.01)  # (not given to the capture: no state)
    cap = TorchCapture(model, path, asynchronous=asynchronous)
    given: list[int] = []
    with pytest.raises(OSError) as info:
        _cell(cap, model, opt, range(20), given)
    done = open_trace(path).steps
    assert done == [0, 1, 2]
    assert info.value.errno == errno.ENOSPC and info.value.filename.startswith(str(path))
    assert "step 3 was not written" in info.value.__notes__[0]
    filler.unlink()
    stopped = given[-1]
    _cell(TorchCapture(model, path, asynchronous=asynchronous), model, opt, [stopped], [])
    _check_trace(path, model, [*done, stopped], updates=False)


def test_background_error_is_raised_once_by_flush_or_by_leaving_the_with_block(tmp_path, disk):
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    disk.full_for(1)
    cap = TorchCapture(model, tmp_path / "a", optimizer=opt)
    _cell_steps = [0, 1]
    for step in _cell_steps:
        for i, p in enumerate(model.parameters()):
            p.grad = _grad(step, i, p.shape)
        cap.step(step)
    with pytest.raises(OSError, match="No space left") as info:
        cap.flush()
    assert info.value.errno == errno.ENOSPC
    cap.flush()
    cap.close()  # raised once: nothing more
    assert open_trace(tmp_path / "a").steps == [0]

    with pytest.raises(OSError, match="No space left") as info:
        with TorchCapture(model, tmp_path / "b", optimizer=opt) as cap:
            for step in _cell_steps:
                cap.step(step)  # both queued before the thread fails: raised when the block closes it
    assert info.value.errno == errno.ENOSPC and "step 1 was not written" in "".join(info.value.__notes__)
    disk.free()
    with TraceWriter(tmp_path / "b") as w:  # the lock was released
        assert w.steps == [0]


def test_step_log_append_failure_cuts_the_half_line_and_releases_the_lock(tmp_path, monkeypatch):
    path = tmp_path / "t"
    w = TraceWriter(path)
    w.write_step(0, {"grad": {"w": np.zeros(3, np.float32)}})
    real = os.write

    def full(fd, data):
        if _fd_name(fd) == "steps.jsonl":
            real(fd, data[: len(data) // 2])  # a short write, then the disk is full
            raise OSError(errno.ENOSPC, ENOSPC)
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError) as info:
        w.write_step(1, {"grad": {"w": np.ones(3, np.float32)}})
    monkeypatch.undo()
    e = info.value
    assert e.errno == errno.ENOSPC and e.filename == str(path / "steps.jsonl")
    assert "appending step 1 to the step log" in e.strerror and "step 1 was not written" in e.__notes__[0]
    assert w.closed and w.steps == [0]
    assert (path / "steps.jsonl").read_bytes().endswith(b"\n")
    with pytest.raises(ValueError, match=r"closed \(writing step 1 failed: OSError"):
        w.write_step(1, {})
    with pytest.warns(RuntimeWarning, match="step_000001.safetensors"):  # its file, unlisted
        assert open_trace(path).steps == [0]
    with TraceWriter(path) as w2:  # while `w` is alive: its lock is gone
        w2.write_step(1, {"grad": {"w": np.full(3, 7, np.float32)}})
    t = open_trace(path)
    assert t.steps == [0, 1] and (t.read(t.entry(1, "w")) == 7).all()


def test_capture_jax_disk_full_closes_the_writer_and_the_folder_records_again(tmp_path, disk):
    jnp = pytest.importorskip("jax").numpy
    path = tmp_path / "j"
    w = capture_jax(path, 0, {"k": jnp.zeros(3)})
    disk.full_for(1)
    with pytest.raises(OSError) as info:
        capture_jax(w, 1, {"k": jnp.ones(3)})
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path / "step_000001.safetensors")
    assert "step 1 was not written" in info.value.__notes__[0] and w.closed
    with pytest.raises(OSError, match="No space left"):  # on a writer capture_jax opens itself
        capture_jax(tmp_path / "k", 1, {"k": jnp.ones(3)})
    disk.free()
    w2 = capture_jax(path, 1, {"k": jnp.full(3, 5.0)})  # while `w` is alive: its lock is gone
    w2.close()
    t = open_trace(path)
    assert t.steps == [0, 1] and (t.read(t.entry(1, "k")) == 5).all()
    with TraceWriter(tmp_path / "k") as wk:  # that one was closed too
        assert wk.steps == []


def test_background_writer_keeps_at_most_max_pending_plus_one_returned_steps_unwritten(tmp_path):
    """The bound the README states: while the writer is stuck, exactly ``max_pending + 1``
    cap.step calls return (the step being written and the queued ones); the next one blocks."""
    model = torch.nn.Linear(2, 2)
    gate = threading.Event()
    returned: list[int] = []
    for max_pending in (1, 3):
        gate.clear()
        returned.clear()
        cap = TorchCapture(model, tmp_path / f"t{max_pending}", max_pending=max_pending)
        real = cap.writer.write_step

        def stuck(*args, real=real, **kwargs):
            gate.wait()
            return real(*args, **kwargs)

        cap.writer.write_step = stuck

        def loop(cap=cap, max_pending=max_pending):
            for step in range(max_pending + 3):
                for p in model.parameters():
                    p.grad = torch.full_like(p, step)
                cap.step(step)
                returned.append(step)

        t = threading.Thread(target=loop)
        t.start()
        t.join(0.5)
        assert t.is_alive() and returned == list(range(max_pending + 1))
        gate.set()
        t.join(10)
        cap.close()
        assert open_trace(tmp_path / f"t{max_pending}").steps == list(range(max_pending + 3))


def test_other_writer_errors_keep_their_type_and_name_the_step(tmp_path):
    """A tensor the writer cannot store (complex) fails in the writer: its TypeError is raised
    as it is, with the note; the capture closes and the folder can be written again."""
    model = torch.nn.Linear(2, 2, dtype=torch.complex64)
    for asynchronous in (True, False):
        path = tmp_path / f"a{asynchronous}"
        model.weight.grad = torch.zeros(2, 2, dtype=torch.complex64)
        cap = TorchCapture(model, path, asynchronous=asynchronous)
        with pytest.raises(TypeError, match="tensor 'grad:weight'") as info:
            cap.step(0)
            cap.flush()  # (the background writer's error)
        assert info.value.__notes__ == [
            f"fpsim: step 0 was not written to the trace {path}. The trace keeps its completed steps "
            "(none); its writer is closed and the folder's writer lock released: fix the cause (e.g. "
            "free disk space) and open a new writer on the folder (TorchCapture, TraceWriter, "
            "capture_jax) to record again"
        ]
        with pytest.raises(RuntimeError, match=r"closed \(writing step 0 failed: TypeError"):
            cap.step(1)
        cap.close()
        with TraceWriter(path) as w:
            assert w.steps == []


def test_a_capture_that_cannot_open_leaves_no_hook_behind(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    hooks = dict(opt._optimizer_step_post_hooks)
    with TraceWriter(tmp_path / "t"), pytest.raises(TraceError, match=f"pid {os.getpid()} "):
        TorchCapture(model, tmp_path / "t", optimizer=opt)  # the folder is being written
    with pytest.raises(ValueError, match="max_pending"):
        TorchCapture(model, tmp_path / "t", optimizer=opt, max_pending=0)
    assert dict(opt._optimizer_step_post_hooks) == hooks
    with TorchCapture(model, tmp_path / "t", optimizer=opt):  # (nor the lock)
        assert len(opt._optimizer_step_post_hooks) == len(hooks) + 1


def test_fresh_optimizer_is_refused_in_step_itself(tmp_path):
    """A run restarted with a fresh optimizer (update count back to 1): cap.step raises at once,
    saying what to do; nothing is written, and the capture is closed (a new one can open)."""
    path = tmp_path / "t"
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    _cell(TorchCapture(model, path, optimizer=opt), model, opt, range(5), [])
    before = (path / "steps.jsonl").read_bytes()
    fresh = torch.optim.Adam(model.parameters(), lr=0.01)
    cap = TorchCapture(model, path, optimizer=fresh)
    model.weight.grad = torch.ones(2, 3)
    with pytest.raises(
        ValueError, match=r"step 5: update counts must not decrease: .* update 5 at step 4"
    ) as info:
        cap.step(5)
    assert "fresh optimizer" in str(info.value) and "resume_from=" in str(info.value)
    assert (path / "steps.jsonl").read_bytes() == before

    older = torch.optim.Adam(model.parameters(), lr=0.01)  # keeps its count: 2 updates done
    for _ in range(2):
        model.weight.grad = torch.ones(2, 3)
        older.step()
    with TorchCapture(model, path, optimizer=older) as cap:
        with pytest.raises(ValueError, match=r"step 5: update counts must not decrease: .* got 3\. A run"):
            cap.step(5)
    with TorchCapture(model, path, optimizer=older, when={7}) as cap:
        assert cap.step(5) is False  # not recorded: its count does not matter
