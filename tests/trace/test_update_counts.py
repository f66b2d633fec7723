"""The optimizer's update count (and the skipped flag) in the trace: written, read back,
validated, and recorded by TorchCapture from the optimizer itself."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fpsim.trace import TraceError, TraceWriter, open_trace

G = {"grad": {"w": np.ones(3, np.float32)}}


def test_update_and_skipped_round_trip(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.write_step(0, G, update=1)
        w.write_step(1, G, update=2, skipped=True)
        w.write_step(2, G, update=2)
        w.write_step(3, G)
    tr = open_trace(tmp_path / "t")
    assert [tr.update(s) for s in tr.steps] == [1, 2, 2, None]
    assert [tr.skipped(s) for s in tr.steps] == [False, True, False, False]
    items = [json.loads(line) for line in (tmp_path / "t" / "steps.jsonl").read_text().splitlines()]
    assert "skipped" not in items[0] and items[1]["skipped"] is True and "update" not in items[3]
    # a folder of the step files alone (no manifest) keeps them: they are in __metadata__ too
    (tmp_path / "t" / "manifest.json").unlink()
    files = open_trace(tmp_path / "t")
    assert [files.update(s) for s in files.steps] == [1, 2, 2, None]
    assert [files.skipped(s) for s in files.steps] == [False, True, False, False]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_writer_refuses_bad_update(tmp_path, bad):
    with TraceWriter(tmp_path / "t") as w, pytest.raises(ValueError, match="update must be an integer >= 1"):
        w.write_step(0, G, update=bad)


def test_writer_refuses_decreasing_update_and_bad_skipped(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.write_step(0, G, update=5)
        with pytest.raises(
            ValueError, match="step 1: .* must not decrease: .* recorded update 5 at step 0, got 4"
        ):
            w.write_step(1, G, update=4)
        with pytest.raises(ValueError, match="skipped must be True or False"):
            w.write_step(1, G, update=6, skipped=1)


@pytest.mark.parametrize(
    ("field", "value", "message"), [("update", 0, "'update' must be"), ("skipped", 1, "'skipped'")]
)
def test_reader_refuses_bad_fields(tmp_path, field, value, message):
    with TraceWriter(tmp_path / "t") as w:
        w.write_step(0, G, update=1)
    path = tmp_path / "t" / "steps.jsonl"
    item = json.loads(path.read_text())
    item[field] = value
    path.write_text(json.dumps(item) + "\n")
    with pytest.raises(TraceError, match=message):
        open_trace(tmp_path / "t")


torch = pytest.importorskip("torch")


def _loop(tmp_path, opt_cls, steps, *, scaler_kw=None, overflow=()):
    """A 0-based enumerate loop as the README writes it; returns the trace and the optimizer's
    own update counts before each step (Adam: state['step'])."""
    from fpsim.trace import TorchCapture

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = opt_cls(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **scaler_kw) if scaler_kw is not None else None
    with TorchCapture(model, tmp_path / "t", params=True, optimizer=opt, scaler=scaler) as cap:
        for step in range(steps):
            opt.zero_grad()
            loss = model(torch.ones(1, 3)).sum() * (1e38 if step in overflow else 1.0)
            if scaler is None:
                loss.backward()
                cap.step(step, loss=loss)
                opt.step()
            else:
                scaler.scale(loss).backward()
                cap.step(step, loss=loss)
                scaler.step(opt)
                scaler.update()
    return open_trace(tmp_path / "t")


@pytest.mark.parametrize("opt_cls", [lambda p, lr: torch.optim.AdamW(p, lr=lr), torch.optim.SGD])
def test_torch_capture_records_update_counts_of_a_zero_based_loop(tmp_path, opt_cls):
    tr = _loop(tmp_path, opt_cls, 4)
    assert tr.steps == [0, 1, 2, 3]
    assert [tr.update(s) for s in tr.steps] == [1, 2, 3, 4]
    assert not any(tr.skipped(s) for s in tr.steps)


@pytest.mark.parametrize("adam", [True, False])
def test_torch_capture_after_optimizer_step_records_the_update_just_done(tmp_path, adam):
    from fpsim.trace import TorchCapture

    model = torch.nn.Linear(3, 2)
    opt = (torch.optim.Adam if adam else torch.optim.SGD)(model.parameters(), lr=0.1)
    with TorchCapture(model, tmp_path / "t", optimizer=opt) as cap:
        for step in range(3):
            opt.zero_grad()
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
            cap.step(step)
    tr = open_trace(tmp_path / "t")
    assert [tr.update(s) for s in tr.steps] == [1, 2, 3]


def test_torch_capture_with_grad_scaler_records_unscaled_grads_and_skips(tmp_path):
    """Steps 1 and 2 overflow (scaled loss 1e38 * 2**10): torch skips optimizer.step(), the
    count stays; the recorded gradients are the unscaled ones."""
    tr = _loop(tmp_path, torch.optim.AdamW, 5, scaler_kw={"init_scale": 2.0**10}, overflow={1, 2})
    assert [tr.update(s) for s in tr.steps] == [1, 2, 2, 2, 3]
    assert [tr.skipped(s) for s in tr.steps] == [False, True, True, False, False]
    g = tr.read(tr.entry(0, "bias", "grad"))
    np.testing.assert_array_equal(g, np.ones(2, np.float32))  # d(sum)/d(bias), unscaled


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_resumed_with_updates_done_continues_the_counts(tmp_path, momentum):
    """SGD keeps no update count: a run resumed from a checkpoint at step 3 (plain SGD: no state;
    with momentum: its restored buffers) counts on from ``updates_done=3`` instead of being refused
    (plain) or recording no counts (momentum); a count that would decrease is still refused."""
    from fpsim.trace import TorchCapture

    model = torch.nn.Linear(3, 2)

    def run(opt, steps, **kw):
        with TorchCapture(model, tmp_path / "t", optimizer=opt, **kw) as cap:
            for step in steps:
                opt.zero_grad()
                model(torch.ones(1, 3)).sum().backward()
                cap.step(step)
                opt.step()

    first = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    run(first, range(5))
    resumed = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    resumed.load_state_dict(first.state_dict())  # (the checkpoint of step 3, as far as the state goes)
    run(resumed, range(3, 6), resume_from=3, updates_done=3)
    tr = open_trace(tmp_path / "t")
    assert [tr.update(s) for s in tr.steps] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(ValueError, match=r"update 6 at step 5, .* this capture counts the updates it saw: 2"):
        run(torch.optim.SGD(model.parameters(), lr=0.1), [6], updates_done=1)


def test_updates_done_is_refused_where_it_does_not_apply(tmp_path):
    from fpsim.trace import TorchCapture

    model = torch.nn.Linear(3, 2)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="updates_done must be an int >= 0"):
            TorchCapture(
                model, tmp_path / "a", optimizer=torch.optim.SGD(model.parameters(), lr=0.1), updates_done=bad
            )
    with pytest.raises(ValueError, match="updates_done= needs optimizer="):
        TorchCapture(model, tmp_path / "b", updates_done=3)
    adam = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    adam.step()
    with pytest.raises(ValueError, match=r"Adam keeps its own update count \(1 in its state\)"):
        TorchCapture(model, tmp_path / "c", optimizer=adam, updates_done=3)
    fresh = torch.optim.Adam(model.parameters(), lr=0.1)  # (no state yet: refused at its first count)
    with TorchCapture(model, tmp_path / "d", optimizer=fresh, updates_done=3) as cap:
        fresh.step()
        with pytest.raises(ValueError, match=r"updates_done=3: Adam keeps its own update count"):
            cap.step(0)
