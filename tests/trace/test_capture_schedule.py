"""Capture schedules: when=, last=, tensors=, states=."""

from __future__ import annotations

import pytest

from fpsim.trace import TorchCapture, open_trace
from fpsim.trace.schedule import CaptureSchedule


def recorded(schedule, n=30):
    return [s for s in range(n) if schedule.records(s)]


def test_when_forms_and_last():
    assert recorded(CaptureSchedule.resolve(when=10)) == [0, 10, 20]
    assert recorded(CaptureSchedule.resolve(when={3, 7})) == [3, 7]
    assert recorded(CaptureSchedule.resolve(when=range(5, 30, 12))) == [5, 17, 29]
    assert recorded(CaptureSchedule.resolve(when=lambda s: s in (1, 2))) == [1, 2]
    assert recorded(CaptureSchedule.resolve(when=50, last=3, total_steps=30)) == [0, 27, 28, 29]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"when": 0}, "when= as an int"),
        ({"when": {-1}}, "non-negative int steps"),
        ({"when": "often"}, "when= must be"),
        ({"last": 3}, "needs total_steps="),
        ({"last": 0, "total_steps": 9}, "last= must be"),
        ({"states": "sometimes"}, "states= must be"),
        ({"tensors": []}, "tensors= must be"),
    ],
)
def test_bad_options_are_refused(kwargs, error):
    with pytest.raises((ValueError, TypeError), match=error):
        CaptureSchedule.resolve(**kwargs)


def test_callable_must_answer_a_bool():
    with pytest.raises(TypeError, match="expected True or False"):
        CaptureSchedule.resolve(when=lambda s: "yes").records(0)


def test_states_and_tensors_in_a_training_loop(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(8, 3)
    with pytest.raises(ValueError, match=r"patterns \['nope\.\*'\] match none"):
        TorchCapture(model, tmp_path / "bad", tensors=["2.*", "nope.*"])
    for states, want in (("first", [2]), (2, [2, 6]), ("every", [2, 4, 6, 7])):
        path = tmp_path / str(states)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        with TorchCapture(
            model,
            path,
            when=range(2, 8, 2),
            last=1,
            total_steps=8,
            optimizer=opt,
            states=states,
            tensors="2.*",
            params=True,
        ) as cap:
            for step in range(8):
                opt.zero_grad()
                model(x).square().mean().backward()
                cap.step(step)
                opt.step()
        t = open_trace(path)
        assert t.steps == [2, 4, 6, 7]
        assert t.names("grad") == ["2.weight", "2.bias"] and t.names("param") == ["2.weight", "2.bias"]
        assert [s for s in t.steps if t.entries(s, "state.exp_avg")] == want
        assert t.names("state.exp_avg_sq") == ["2.weight", "2.bias"]
        assert all(t.update(s) == s + 1 for s in t.steps)  # counts are recorded at every step
