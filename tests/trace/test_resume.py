"""Resumed runs: a trace that holds the steps a restarted run records is refused naming them;
``resume_from=S`` drops the steps >= S atomically (SIGKILL at every point of the drop leaves the
old trace or the new one) and records from S; a run SIGKILLed and resumed from its checkpoint
reads back bit for bit; after ``cap.flush()`` a SIGKILL loses none of the flushed steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from children import fork, wait

from fpsim.trace import TraceCallback, TraceWriter, capture_jax, open_trace

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals and fork")


def _values(run: int, step: int) -> np.ndarray:
    return np.random.default_rng([run, step]).standard_normal(300).astype(np.float32)


def _record(path, steps, run=1, **kw):
    with TraceWriter(path, **kw) as w:
        for s in steps:
            w.write_step(s, {"grad": {"w": _values(run, s)}}, loss=run * 100 + s, update=s + 1)


def _check(path, runs: dict[int, int]):
    """The trace holds exactly ``runs``' steps (step -> run), each bit for bit."""
    t = open_trace(path)
    assert t.steps == sorted(runs)
    for s, run in runs.items():
        assert t.read(t.entry(s, "w")).tobytes() == _values(run, s).tobytes()
        assert t.loss(s) == run * 100 + s and t.update(s) == s + 1
    return t


def test_steps_the_trace_holds_are_refused_naming_them(tmp_path):
    torch = pytest.importorskip("torch")
    from fpsim.trace import TorchCapture

    path = tmp_path / "t"
    _record(path, range(10))

    def files():  # the log and the step files (the capture adds its metadata to the manifest)
        return {p.name: p.read_bytes() for p in path.iterdir() if p.name != "manifest.json"}

    before = files()
    model = torch.nn.Linear(2, 2)
    model.weight.grad = torch.ones(2, 2)
    cap = TorchCapture(model, path, when={6, 9})
    with pytest.raises(
        ValueError, match=r"step 5: the trace .* already holds steps 5\.\.9, .*resume_from=5"
    ) as e:
        cap.step(5)  # (refused even where not recorded: the run overlaps the trace)
    assert "this TorchCapture of" in e.value.__notes__[0]
    with pytest.raises(RuntimeError, match="closed"):
        cap.step(10)
    with TraceWriter(path) as w, pytest.raises(ValueError, match=r"already holds steps 3\.\.9"):
        w.write_step(3, {})  # (`cap`, still alive, released the folder)
    assert files() == before
    with TorchCapture(model, path, resume_from=5) as again:
        assert again.step(5)
    assert open_trace(path).steps == [0, 1, 2, 3, 4, 5]


def test_resume_from_drops_the_later_steps_and_records_from_there(tmp_path):
    path = tmp_path / "t"
    _record(path, range(10))
    with TraceWriter(path, resume_from=5) as w:
        assert w.steps == [0, 1, 2, 3, 4] and w.last_update == (4, 5)
        with pytest.raises(ValueError, match="step 4 comes before resume_from=5"):
            w.write_step(4, {})
        for s in (5, 6):
            w.write_step(s, {"grad": {"w": _values(2, s)}}, loss=200 + s, update=s + 1)
    assert sorted(p.name for p in path.glob("step_*")) == [f"step_{s:06d}.safetensors" for s in range(7)]
    _check(path, {**dict.fromkeys(range(5), 1), 5: 2, 6: 2})
    log = (path / "steps.jsonl").read_bytes()
    with TraceWriter(path, resume_from=20):  # nothing from 20 on: the log is not touched
        pass
    assert (path / "steps.jsonl").read_bytes() == log
    with TraceWriter(path, resume_from=0) as w:
        assert w.steps == [] and w.last_update is None
    assert open_trace(path).steps == [] and not list(path.glob("step_*"))
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(ValueError, match="resume_from must be a non-negative int"):
            TraceWriter(tmp_path / "new", resume_from=bad)
    assert not (tmp_path / "new").exists()


def test_resume_from_converts_a_version_1_trace(tmp_path):
    path = tmp_path / "t"
    _record(path, range(4))
    items = [json.loads(line) for line in (path / "steps.jsonl").read_text().splitlines()]
    (path / "manifest.json").write_text(json.dumps({"fpsim_trace": 1, "metadata": {}, "steps": items}))
    (path / "steps.jsonl").unlink()
    with TraceWriter(path, resume_from=2):
        pass
    assert json.loads((path / "manifest.json").read_text())["fpsim_trace"] == 2
    _check(path, dict.fromkeys(range(2), 1))


def test_capture_jax_and_the_trainer_callback_resume(tmp_path):
    jnp = pytest.importorskip("jax").numpy
    path = tmp_path / "j"
    _record(path, range(6))
    w = capture_jax(path, 3, {"w": jnp.asarray(_values(2, 3))}, loss=203.0, update=4, resume_from=3)
    with pytest.raises(ValueError, match="resume_from= applies when capture_jax opens"):
        capture_jax(w, 4, {"w": jnp.zeros(1)}, resume_from=4)
    w.close()
    _check(path, {0: 1, 1: 1, 2: 1, 3: 2})

    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    args, control = SimpleNamespace(), SimpleNamespace()
    kw = {"model": model, "optimizer": opt}

    def train(cb, first, last):
        state = SimpleNamespace(global_step=first, max_steps=last)
        cb.on_train_begin(args, state, control, **kw)
        for step in range(first, last):
            model.weight.grad = torch.full((2, 3), float(step + 100 * (first > 0)))
            cb.on_pre_optimizer_step(args, state, control, **kw)
            state.global_step += 1
        cb.on_train_end(args, state, control, **kw)

    train(TraceCallback(tmp_path / "hf"), 0, 6)  # preempted after step 5; checkpoint at step 3
    with pytest.raises(ValueError, match=r"already holds steps 3\.\.5.*TraceCallback\(resume=True\)"):
        train(TraceCallback(tmp_path / "hf"), 3, 8)
    with pytest.raises(ValueError, match="resume=True"):
        TraceCallback(tmp_path / "hf", resume_from=3)
    train(TraceCallback(tmp_path / "hf", resume=True), 3, 8)
    t = open_trace(tmp_path / "hf")
    assert t.steps == list(range(8))
    assert [float(t.read(t.entry(s, "weight"))[0, 0]) for s in t.steps] == [0, 1, 2, 103, 104, 105, 106, 107]


# --- SIGKILL while the later steps are dropped ------------------------------------------------


def _killed_at(point: str):
    """A child body that resumes from step 5 and SIGKILLs itself at ``point`` of the drop."""

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def body(path):
        real_replace, real_unlink, removed = os.replace, os.unlink, []

        def replace(src, dst):
            if os.path.basename(dst) == "steps.jsonl" and point == "before the rename":
                die()  # the new log is written and fsynced under its temporary name
            real_replace(src, dst)
            if os.path.basename(dst) == "steps.jsonl" and point == "after the rename":
                die()  # the log lists steps 0..4; the files of 5..9 are still there

        def unlink(p, *a, **k):
            if os.path.basename(p).startswith("step_"):
                removed.append(p)
                if point == "between two removals" and len(removed) == 3:
                    die()
            real_unlink(p, *a, **k)

        os.replace, os.unlink = replace, unlink
        TraceWriter(path, resume_from=5)

    return body


@pytest.mark.parametrize("point", ["before the rename", "after the rename", "between two removals"])
def test_sigkill_during_the_drop_leaves_the_old_or_the_new_trace(tmp_path, point):
    path = tmp_path / "t"
    _record(path, range(10))
    assert wait(fork(lambda: _killed_at(point)(path))) == -signal.SIGKILL
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if point == "before the rename":
            _check(path, dict.fromkeys(range(10), 1))  # the old trace, whole
            assert [p.name for p in path.iterdir() if p.name.endswith(".tmp")]  # the unused new log
        else:
            _check(path, dict.fromkeys(range(5), 1))  # the new one: no listed step lacks its file
            assert any("not listed in the trace are ignored" in str(w.message) for w in caught)
    _record(path, range(5, 8), run=2, resume_from=5)  # the next resume cleans up and records
    _check(path, {**dict.fromkeys(range(5), 1), **dict.fromkeys(range(5, 8), 2)})
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json",
        *(f"step_{s:06d}.safetensors" for s in range(8)),
        "steps.jsonl",
    ]


# --- a run SIGKILLed, then resumed from its checkpoint ---------------------------------------

RUN = textwrap.dedent(
    """
    import sys, time, numpy as np, torch
    from fpsim.trace import TorchCapture

    folder, run, ckpt, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    S = 4

    def grads(step):
        for i, p in enumerate(model.parameters()):
            rng = np.random.default_rng([run, step, i])
            p.grad = torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32))

    if run == 1:  # records 0..7, saves its checkpoint at step S, is killed while at step 7
        cap = TorchCapture(model, folder, params=True, optimizer=opt)
        for step in range(8):
            if step == S:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt)
            grads(step)
            cap.step(step, loss=100.0 * run + step)
            opt.step()
        print("at 7", flush=True)
        time.sleep(600)
    else:  # restarts from the checkpoint
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        grads(S)
        try:
            TorchCapture(model, folder, params=True, optimizer=opt).step(S)
        except ValueError as e:
            print("refused:", e, flush=True)
        with TorchCapture(model, folder, params=True, optimizer=opt, resume_from=S) as cap:
            for step in range(S, 10):
                grads(step)
                cap.step(step, loss=100.0 * run + step)
                opt.step()
    """
)


def _start(*args):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _log_lines(path):
    log = path / "steps.jsonl"
    return log.read_bytes().count(b"\n") if log.exists() else 0


def test_run_killed_then_resumed_from_its_checkpoint_reads_back_bit_for_bit(tmp_path):
    torch = pytest.importorskip("torch")
    path, ckpt = tmp_path / "t", tmp_path / "ckpt.pt"
    first = _start(RUN, str(path), "1", str(ckpt), "")
    try:
        assert first.stdout.readline().strip() == "at 7", first.stderr.read()
        deadline = time.monotonic() + 30
        while _log_lines(path) < 6 and time.monotonic() < deadline:  # steps 0..5 on disk
            time.sleep(0.002)
    finally:
        first.kill()  # SIGKILL
        first.communicate()
    assert first.returncode == -signal.SIGKILL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step cut off by the kill
        assert open_trace(path).steps[:6] == list(range(6))
    second = _start(RUN, str(path), "2", str(ckpt), "")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert "refused: step 4: the trace" in out and "already holds steps 4.." in out and "resume_from=4" in out

    t = open_trace(path)
    assert t.steps == list(range(10))
    model = torch.nn.Linear(6, 4)
    names = [n for n, _ in model.named_parameters()]
    for s in t.steps:
        run = 1 if s < 4 else 2
        assert t.loss(s) == 100.0 * run + s and t.update(s) == s + 1  # Adam's count goes on
        for i, (name, p) in enumerate(model.named_parameters()):
            want = np.random.default_rng([run, s, i]).standard_normal(tuple(p.shape)).astype(np.float32)
            assert t.read(t.entry(s, name)).tobytes() == want.tobytes()
    saved = torch.load(ckpt, weights_only=True)["model"]
    for name in names:  # the resumed step's parameters are the checkpoint's
        assert t.read(t.entry(4, name, "param")).tobytes() == saved[name].numpy().tobytes()


# --- flush(): what a SIGKILL can lose ----------------------------------------------------------

FLUSH = textwrap.dedent(
    """
    import sys, time, numpy as np, torch
    from fpsim.trace import TorchCapture

    folder, flush, max_pending = sys.argv[1], sys.argv[2] == "flush", int(sys.argv[3])
    model = torch.nn.Linear(64, 64)
    cap = TorchCapture(model, folder, max_pending=max_pending)
    real = cap.writer.write_step

    def slow(*args, **kwargs):  # a slow disk: 30 ms a step
        time.sleep(0.03)
        return real(*args, **kwargs)

    cap.writer.write_step = slow

    def step(s):
        g = np.random.default_rng(s).standard_normal((64, 64)).astype(np.float32)
        model.weight.grad = torch.from_numpy(g)
        cap.step(s)

    for s in range(10):
        step(s)
    print("written before", len(cap._async.written), flush=True)
    if flush:
        cap.flush()
    print("returned 9", flush=True)
    for s in range(10, 10**6):  # the loop goes on until it is killed
        step(s)
    """
)


@pytest.mark.parametrize("flush", [True, False], ids=["flush", "no-flush"])
def test_after_flush_a_sigkill_loses_none_of_the_flushed_steps(tmp_path, flush):
    path, max_pending = tmp_path / "t", 4
    child = _start(FLUSH, str(path), "flush" if flush else "", str(max_pending))
    try:
        before = int(child.stdout.readline().split()[-1])
        assert child.stdout.readline().strip() == "returned 9", child.stderr.read()
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    assert before < 10  # the writer lagged behind when flush() was called
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t = open_trace(path)
    assert t.steps == list(range(len(t.steps)))
    missing = [s for s in range(10) if s not in t.steps]  # of the steps whose cap.step returned
    assert missing == [] if flush else len(missing) <= max_pending + 1
    for s in t.steps:
        want = np.random.default_rng(s).standard_normal((64, 64)).astype(np.float32)
        assert t.read(t.entry(s, "weight")).tobytes() == want.tobytes()
