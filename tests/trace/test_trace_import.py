"""open_trace on folders and single files of .pt, .npz and .safetensors, and its errors."""

from __future__ import annotations

import mmap

import ml_dtypes
import numpy as np
import pytest

from fpsim.trace import Trace, TraceError, open_trace
from fpsim.trace.safetensors_io import write_safetensors


class NotATensor:  # a pickled custom object that weights_only loading must refuse
    pass


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def grads(torch, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "fc.weight": torch.randn(4, 3, generator=g),
        "fc.bias": torch.randn(4, generator=g).to(torch.bfloat16),
        "emb": torch.randn(5, 2, generator=g).to(torch.float8_e4m3fn),
        "count": torch.arange(3),
    }


def assert_bits_equal(torch, array: np.ndarray, tensor) -> None:
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    np.testing.assert_array_equal(
        array.view(f"i{array.dtype.itemsize}"), tensor.view(view).numpy().view(f"i{array.dtype.itemsize}")
    )


def test_folder_of_pt_files(tmp_path, torch):
    saved = {}
    for step in (120, 20, 70):
        d = grads(torch, step)
        saved[step] = d
        torch.save(
            {**d, "param:fc.weight": d["fc.weight"] * 2, "loss": 1.0 / step, "lr": torch.tensor(0.5)},
            tmp_path / f"grads_step{step}.pt",
        )
    t = open_trace(tmp_path)
    assert isinstance(t, Trace) and t.steps == [20, 70, 120]
    assert t.roles == ("grad", "param")
    assert t.loss(70) == pytest.approx(1 / 70) and t.lr(20) == 0.5
    e = t.entry(70, "fc.bias")
    assert e.dtype == "bfloat16" and e.shape == (4,) and e.file == tmp_path / "grads_step70.pt"
    got = t.read(e)
    assert got.dtype == ml_dtypes.bfloat16 and not got.flags.writeable
    assert_bits_equal(torch, got, saved[70]["fc.bias"])
    f8 = t.read(t.entry(120, "emb"))
    assert f8.dtype == ml_dtypes.float8_e4m3fn
    assert_bits_equal(torch, f8, saved[120]["emb"])
    count = t.entry(20, "count")
    assert count.dtype == "int64" and not count.is_float
    np.testing.assert_array_equal(
        t.read(t.entry(20, "fc.weight", "param")), saved[20]["fc.weight"].numpy() * 2
    )
    chunks = list(t.read_chunks(t.entry(20, "fc.weight"), 5))
    np.testing.assert_array_equal(np.concatenate(chunks), saved[20]["fc.weight"].numpy().ravel())


def test_nested_pt_dicts_are_flattened(tmp_path, torch):
    w = torch.ones(2, 2)
    torch.save(
        {
            "grads": {"fc": {"weight": w}, "b": w[0]},
            "params": {"fc.weight": 3 * w},
            "state": {"exp_avg": {"fc.weight": 4 * w}},
            "state.exp_avg_sq": {"fc.weight": 5 * w},
            "block": {"ln": {"weight": 6 * w}},
            "step": 9,
        },
        tmp_path / "checkpoint.pt",
    )
    t = open_trace(tmp_path / "checkpoint.pt")
    assert t.steps == [9]  # no integer in the name: the 'step' entry numbers it
    assert {(e.role, e.name) for e in t.entries()} == {
        ("grad", "fc.weight"),
        ("grad", "b"),
        ("param", "fc.weight"),
        ("state.exp_avg", "fc.weight"),
        ("state.exp_avg_sq", "fc.weight"),
        ("grad", "block.ln.weight"),
    }
    assert (t.read(t.entry(9, "fc.weight", "state.exp_avg_sq")) == 5).all()
    assert (t.read(t.entry(9, "block.ln.weight")) == 6).all()


@pytest.mark.parametrize(
    "content, problem",
    [
        ({"w": [1.0, 2.0]}, "w holds a list, not a tensor"),
        ({"w": "text"}, "w holds a str"),
        ([1, 2], "expected a dict of name -> tensor, got list"),
        ({"step": 3}, "disagrees with step 7 in the name"),
    ],
)
def test_pt_contents_that_are_not_tensors_are_errors(tmp_path, torch, content, problem):
    f = tmp_path / "g7.pt"
    torch.save(content, f)
    with pytest.raises(TraceError, match=problem) as info:
        open_trace(f)
    assert str(f) in str(info.value)


def test_pt_files_load_only_with_weights_only(tmp_path, torch):
    f = tmp_path / "g1.pt"
    torch.save({"w": torch.ones(1), "x": NotATensor()}, f)
    with pytest.raises(TraceError, match=r"weights_only=True") as info:
        open_trace(f)
    assert str(f) in str(info.value)
    f.write_bytes(b"garbage, not a torch file")
    with pytest.raises(TraceError, match="cannot load") as info:
        open_trace(f)
    assert str(f) in str(info.value)


def test_npz_folder_stored_and_compressed(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    np.savez(tmp_path / "s_1.npz", w=a, **{"param:w": a + 1, "state.exp_avg:w": a + 2}, loss=np.float32(0.5))
    np.savez_compressed(tmp_path / "s_2.npz", w=np.asfortranarray(a * 3), lr=np.array([0.1]))
    t = open_trace(tmp_path)
    assert t.steps == [1, 2] and t.roles == ("grad", "param", "state.exp_avg")
    assert t.loss(1) == 0.5 and t.lr(1) is None and t.lr(2) == pytest.approx(0.1) and t.loss(2) is None
    stored = t.read(t.entry(1, "w"))
    assert not isinstance(stored.base, mmap.mmap) and not stored.flags.writeable  # read, never mapped
    np.testing.assert_array_equal(stored, a)
    np.testing.assert_array_equal(t.read(t.entry(1, "w", "state.exp_avg")), a + 2)
    compressed = t.read(t.entry(2, "w"))
    assert not compressed.flags.writeable
    np.testing.assert_array_equal(compressed, a * 3)
    np.testing.assert_array_equal(np.concatenate(list(t.read_chunks(t.entry(2, "w"), 5))), (a * 3).ravel())


def test_npz_loses_ml_dtypes_so_they_are_rejected(tmp_path):
    f = tmp_path / "g.npz"
    np.savez(f, w=np.ones(3, ml_dtypes.bfloat16))
    with pytest.raises(TraceError, match="bfloat16/float8.*safetensors or .pt") as info:
        open_trace(f)
    assert str(f) in str(info.value)
    f.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(TraceError, match="corrupt or truncated .npz") as info:
        open_trace(f)
    assert str(f) in str(info.value)


def test_safetensors_files_single_and_folder(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    write_safetensors(tmp_path / "grads.safetensors", {"layer.weight": a, "param:layer.weight": a * 2})
    t = open_trace(tmp_path / "grads.safetensors")
    assert t.steps == [0]  # no integer in the name
    assert [(e.role, e.name, e.key) for e in t.entries()] == [
        ("grad", "layer.weight", "grad:layer.weight"),
        ("param", "layer.weight", "param:layer.weight"),
    ]
    np.testing.assert_array_equal(t.read(t.entry(0, "layer.weight", "param")), a * 2)
    (tmp_path / "grads.safetensors").rename(tmp_path / "g-000004.safetensors")
    write_safetensors(tmp_path / "g-000008.safetensors", {"layer.weight": a}, {"loss": "0.5"})
    t = open_trace(tmp_path)
    assert t.steps == [4, 8] and t.loss(8) == 0.5 and t.loss(4) is None
    assert not isinstance(t.read(t.entry(8, "layer.weight")).base, mmap.mmap)


def test_safetensors_library_file_with_bf16_opens(tmp_path, torch):
    st = pytest.importorskip("safetensors.torch")
    w = torch.randn(3, 3).to(torch.bfloat16)
    st.save_file({"w": w, "param:w": w.float()}, tmp_path / "step_5.safetensors")
    t = open_trace(tmp_path / "step_5.safetensors")
    assert t.steps == [5]
    assert_bits_equal(torch, t.read(t.entry(5, "w")), w)


def make_pt(torch, path):
    torch.save({"w": torch.ones(1)}, path)


@pytest.mark.parametrize(
    "setup, target, problem",
    [
        (lambda p, t: None, "missing", "no such file or folder"),
        (lambda p, t: None, ".", "empty folder"),
        (lambda p, t: (p / "g.txt").write_text("x"), "g.txt", "unknown trace file type '.txt'"),
        (lambda p, t: (make_pt(t, p / "a1.pt"), (p / "README").write_text("x")), ".", "README"),
        (
            lambda p, t: (make_pt(t, p / "a1.pt"), np.savez(p / "a2.npz", w=np.ones(1))),
            ".",
            "mixes file kinds",
        ),
        (lambda p, t: (make_pt(t, p / "a1.pt"), make_pt(t, p / "final.pt")), ".", "final.pt: no step number"),
        (
            lambda p, t: (make_pt(t, p / "a_3.pt"), make_pt(t, p / "b_3.pt")),
            ".",
            "step 3 is also the step of a_3.pt",
        ),
    ],
)
def test_open_trace_errors(tmp_path, torch, setup, target, problem):
    setup(tmp_path, torch)
    path = tmp_path / target
    with pytest.raises(TraceError, match=problem) as info:
        open_trace(path)
    assert str(tmp_path) in str(info.value)


def test_hidden_files_are_ignored(tmp_path, torch):
    make_pt(torch, tmp_path / "g_1.pt")
    (tmp_path / ".DS_Store").write_bytes(b"\0")
    assert open_trace(tmp_path).steps == [1]
