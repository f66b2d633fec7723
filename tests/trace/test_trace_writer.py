"""TraceWriter: round trips of every array kind, appending, argument errors, crash safety."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

from fpsim.trace import TraceError, TraceWriter, open_trace
from fpsim.trace import writer as writer_module


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view(f"u{np.asarray(a).dtype.itemsize}")


def test_numpy_and_ml_dtypes_round_trip_bit_exactly(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7)).astype(np.float32) * np.float32(2.0) ** rng.integers(-140, 120, (5, 7))
    with np.errstate(over="ignore"):
        f16 = x.astype(np.float16)  # overflows to inf on purpose
    arrays = {
        "f32": x,
        "f16": f16,
        "f64": x.astype(np.float64),
        "bf16": x.astype(ml_dtypes.bfloat16),
        "e4m3": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn),
        "e5m2": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2),
        "nan_inf": np.array([np.nan, -np.inf, np.inf, -0.0], np.float32),
    }
    with TraceWriter(tmp_path / "t") as w:
        w.write_step(3, {"grad": arrays}, loss=np.float32(0.25), lr=1e-3)
    t = open_trace(tmp_path / "t")
    for name, a in arrays.items():
        e = t.entry(3, name)
        got = t.read(e)
        assert e.dtype == a.dtype.name == got.dtype.name and got.shape == a.shape
        np.testing.assert_array_equal(bits(got), bits(a))
    assert t.loss(3) == 0.25 and t.lr(3) == 1e-3


def test_torch_and_jax_arrays_round_trip_bit_exactly(tmp_path):
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    g = torch.randn(4, 3)
    tensors = {
        "grad": {
            "t32": g,
            "tbf16": g.to(torch.bfloat16),
            "te4m3": g.to(torch.float8_e4m3fn),
            "te5m2": g.to(torch.float8_e5m2),
            "t_noncontig": g.t(),
            "j32": jnp.asarray(g.numpy()),
            "jbf16": jnp.asarray(g.numpy()).astype(jnp.bfloat16),
        }
    }
    w = TraceWriter(tmp_path / "t")
    w.write_step(0, tensors, loss=torch.tensor(1.5, requires_grad=True) * 1, lr=torch.tensor(0.01))
    t = open_trace(tmp_path / "t")
    want = {
        "t32": ("float32", g.numpy()),
        "tbf16": ("bfloat16", g.to(torch.bfloat16).view(torch.int16).numpy()),
        "te4m3": ("float8_e4m3fn", g.to(torch.float8_e4m3fn).view(torch.uint8).numpy()),
        "te5m2": ("float8_e5m2", g.to(torch.float8_e5m2).view(torch.uint8).numpy()),
        "t_noncontig": ("float32", g.t().contiguous().numpy()),
        "j32": ("float32", g.numpy()),
        "jbf16": ("bfloat16", g.to(torch.bfloat16).view(torch.int16).numpy()),
    }
    for name, (dtype, expected) in want.items():
        got = t.read(t.entry(0, name))
        assert got.dtype.name == dtype
        np.testing.assert_array_equal(got.view(expected.dtype), expected)
    assert t.loss(0) == 1.5 and t.lr(0) == pytest.approx(0.01)


def test_nan_loss_and_empty_steps(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.write_step(0, {}, loss=float("nan"), lr=float("inf"))
    text = (tmp_path / "t" / "manifest.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    t = open_trace(tmp_path / "t")
    assert np.isnan(t.loss(0)) and t.lr(0) == np.inf and t.entries() == []


def test_append_after_reopening(tmp_path):
    path = tmp_path / "t"
    with TraceWriter(path, metadata={"a": 1}) as w:
        w.write_step(1, {"grad": {"w": np.ones(3, np.float32)}})
    with TraceWriter(path, metadata={"b": 2}) as w:
        assert w.steps == [1]
        with pytest.raises(ValueError, match="step 1: the trace .* already holds steps 1, and steps must"):
            w.write_step(1, {"grad": {"w": np.ones(3, np.float32)}})
        with pytest.raises(ValueError, match="step 0: the trace .* already holds steps 1, and steps must"):
            w.write_step(0, {})
        w.write_step(2, {"grad": {"w": np.full(3, 2, np.float32)}})
    t = open_trace(path)
    assert t.steps == [1, 2] and t.metadata == {"a": 1, "b": 2}
    assert (t.read(t.entry(2, "w")) == 2).all()


def test_writing_is_deterministic(tmp_path):
    for name in ("a", "b"):
        with TraceWriter(tmp_path / name, metadata={"seed": 0}) as w:
            w.write_step(0, {"grad": {"x": np.arange(6, dtype=np.float32)}}, loss=1.0)
    for f in ("manifest.json", "steps.jsonl", "step_000000.safetensors"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


@pytest.mark.parametrize(
    "step, tensors, error, match",
    [
        (-1, {}, ValueError, "non-negative integer"),
        (1.0, {}, ValueError, "non-negative integer"),
        (0, {"grads": {"w": np.ones(1)}}, ValueError, "role must be 'grad', 'param' or 'state.<name>'"),
        (0, {"state.": {"w": np.ones(1)}}, ValueError, "role must be"),
        (0, {"grad": {"": np.ones(1)}}, ValueError, "non-empty strings"),
        (0, {"grad": np.ones(1)}, TypeError, "must map name -> array"),
        (0, {"grad": {"c": np.ones(2, np.complex64)}}, TypeError, "'grad:c'.*complex64"),
        (0, {"grad": {"o": np.array([None])}}, TypeError, "'grad:o'.*object"),
    ],
)
def test_write_step_argument_errors(tmp_path, step, tensors, error, match):
    w = TraceWriter(tmp_path / "t")
    with pytest.raises(error, match=match):
        w.write_step(step, tensors)
    assert open_trace(tmp_path / "t").steps == []
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [
        ".fpsim_writer.lock",
        "manifest.json",
        "steps.jsonl",
    ]
    w.close()  # releases the lock
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["manifest.json", "steps.jsonl"]


def test_writer_refuses_folders_that_are_not_traces(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(TraceError, match="not a trace folder") as info:
        TraceWriter(tmp_path)
    assert str(tmp_path) in str(info.value)
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "step_000001.safetensors").write_bytes(b"data")
    with pytest.raises(TraceError, match="not a trace folder"):
        TraceWriter(tmp_path / "steps")
    assert (tmp_path / "steps" / "step_000001.safetensors").read_bytes() == b"data"
    with pytest.raises(TraceError, match="is a file"):
        TraceWriter(tmp_path / "notes.txt")
    w = TraceWriter(tmp_path / "new")
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.write_step(0, {})
    with pytest.raises(TypeError, match="JSON-serializable"):
        TraceWriter(tmp_path / "other", metadata={"x": object()})


def test_crash_between_step_file_and_log_keeps_completed_steps(tmp_path, monkeypatch):
    path = tmp_path / "t"
    w = TraceWriter(path)
    w.write_step(0, {"grad": {"w": np.zeros(2, np.float32)}}, loss=2.0)

    def crash_on_log(self, item):
        raise OSError("simulated crash")

    monkeypatch.setattr(writer_module.TraceWriter, "_append_log", crash_on_log)
    with pytest.raises(OSError, match="simulated crash"):
        w.write_step(1, {"grad": {"w": np.ones(2, np.float32)}}, loss=1.0)
    monkeypatch.undo()
    assert w.steps == [0]
    assert (path / "step_000001.safetensors").exists()  # the orphan of the interrupted step
    with pytest.warns(RuntimeWarning, match="step_000001.safetensors"):
        t = open_trace(path)
    assert t.steps == [0] and t.loss(0) == 2.0
    w.close()

    w2 = TraceWriter(path)  # cleans the orphan, then the step can be written again
    assert not (path / "step_000001.safetensors").exists()
    w2.write_step(1, {"grad": {"w": np.ones(2, np.float32)}}, loss=1.0)
    assert open_trace(path).steps == [0, 1]


def test_killed_process_leaves_a_valid_trace(tmp_path):
    """The process dies with half of step 2's log line written: the torn line is an
    incomplete step (reported, ignored), the next writer cuts it off and appends."""
    path = tmp_path / "t"
    script = textwrap.dedent(
        f"""
        import os
        import numpy as np
        from fpsim.trace import TraceWriter
        from fpsim.trace import writer

        w = TraceWriter({str(path)!r})
        w.write_step(0, {{"grad": {{"w": np.zeros(4, np.float32)}}}})
        w.write_step(1, {{"grad": {{"w": np.ones(4, np.float32)}}}})
        real = os.write

        def die_mid_line(fd, data):
            real(fd, data[: len(data) // 2])
            os._exit(17)  # the process dies with half of the line written

        writer.os.write = die_mid_line
        w.write_step(2, {{"grad": {{"w": np.full(4, 2, np.float32)}}}})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr
    assert not (path / "steps.jsonl").read_bytes().endswith(b"\n")
    with pytest.warns(RuntimeWarning) as record:
        t = open_trace(path)
    messages = " | ".join(str(r.message) for r in record)
    assert "incomplete step" in messages and "step_000002" in messages, messages
    assert t.steps == [0, 1]
    assert (t.read(t.entry(1, "w")) == 1).all()
    with TraceWriter(path) as w:  # the lock of the dead process is taken over
        assert w.steps == [0, 1]
        w.write_step(2, {"grad": {"w": np.full(4, 2, np.float32)}})
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json",
        "step_000000.safetensors",
        "step_000001.safetensors",
        "step_000002.safetensors",
        "steps.jsonl",
    ]
    assert open_trace(path).steps == [0, 1, 2]
