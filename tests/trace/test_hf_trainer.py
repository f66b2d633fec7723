"""TraceCallback in a real ``transformers.Trainer`` (accelerate's optimizer wrapper, gradient
accumulation, clipping), its checkpoint opened as it is and replayed from, bit for bit.

One Trainer run (a BERT of 3,874 parameters built from a config, nothing downloaded, 12 steps
of 2 accumulated micro-batches, ``max_grad_norm=0.05``) serves the module: a plain
``TrainerCallback`` copies the gradients at ``on_pre_optimizer_step`` (the oracle: what the
optimizer is about to use), one TraceCallback records steps 0, 3, 6, 9 and another 6..9 with
parameters, and the Trainer saves ``checkpoint-6``.
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf import tiny_bert_config, token_data  # noqa: E402

from fpsim.cli.app import main  # noqa: E402
from fpsim.trace import TraceCallback, TraceError, open_checkpoint, open_trace  # noqa: E402

CLIP = 0.05


class _Copy(transformers.TrainerCallback):
    """Copies every gradient where the Trainer is about to call ``optimizer.step()``."""

    def __init__(self):
        self.grads = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads[state.global_step] = {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("hf")
    cfg = tiny_bert_config(transformers, 64)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg)
    data = token_data(64, 96)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=12,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_grad_norm=CLIP,
        learning_rate=1e-3,
        optim="adamw_torch",  # the replay follows torch.optim.AdamW, not the fused CPU kernel
        save_steps=6,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        logging_steps=1,
        disable_tqdm=True,
        log_level="error",
    )
    copy = _Copy()
    callbacks = [
        copy,
        TraceCallback(out / "trace", when=3, states="first", params=True),
        TraceCallback(out / "seq", when=range(6, 10), states="first", params=True),
    ]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    norms = {h["step"] - 1: h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h}
    return out, copy.grads, norms


def test_trace_callback_records_what_the_trainers_optimizer_uses(run):
    out, grads, norms = run
    t = open_trace(out / "trace")  # the Trainer hands callbacks accelerate's AcceleratedOptimizer
    assert t.steps == [0, 3, 6, 9] and t.metadata["optimizer"] == "AdamW"
    assert [t.update(s) for s in t.steps] == [1, 4, 7, 10]
    for s in t.steps:
        assert t.names("grad") == list(grads[s])
        for name, want in grads[s].items():
            np.testing.assert_array_equal(t.read(t.entry(s, name)), want.numpy(), strict=True)
        # clipped: the Trainer's norm (before clipping) is above max_grad_norm, the recorded one at it
        recorded = np.sqrt(sum(np.sum(t.read(e).astype(np.float64) ** 2) for e in t.entries(s, "grad")))
        assert norms[s] > 2 * CLIP and abs(recorded - CLIP) < 1e-5 * CLIP
    assert [s for s in t.steps if t.entries(s, "state.exp_avg")] == [3]


def test_the_trainers_checkpoint_opens_as_it_is_and_replays_to_the_next_parameters(run, tmp_path, capsys):
    out, _, _ = run
    ckpt, seq = open_trace(out / "checkpoint-6"), open_trace(out / "seq")
    assert ckpt.steps == [6] and ckpt.update(6) == 7 and seq.update(6) == 7
    assert set(ckpt.roles) == {"param", "state.exp_avg", "state.exp_avg_sq"}
    # names rebuilt from config.json: every parameter and state equals the capture's at step 6
    assert sorted(e.key for e in ckpt.entries(6)) == sorted(e.key for e in seq.entries(6) if e.role != "grad")
    for e in ckpt.entries(6):
        np.testing.assert_array_equal(ckpt.read(e), seq.read(seq.entry(6, e.name, e.role)), strict=True)
    # from the checkpoint's state through the recorded (accumulated, clipped) gradients of
    # updates 7, 8 and 9: the parameters recorded at step 9, bit for bit
    argv = ["replay", str(out / "seq"), "--start", str(out / "checkpoint-6"), "--steps", "6:8"]
    argv += ["--sqrt", "torch", "--weight-decay", "0", "--config", "fp32", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "r"), "--save-state", str(tmp_path / "s")]) == 0
    from safetensors.numpy import load_file

    for config in ("reference", "fp32"):
        final = load_file(tmp_path / "s" / f"{config}.safetensors")
        for name in seq.names("param"):
            np.testing.assert_array_equal(final[f"param:{name}"], seq.read(seq.entry(9, name, "param")))
    capsys.readouterr()
    assert main([*argv[:5], "7:8", *argv[6:], "--out", str(tmp_path / "r")]) == 2
    assert "values before update 7, but the first replayed step 7 is update 8" in capsys.readouterr().err


def test_without_transformers_or_config_the_checkpoint_asks_for_param_names(run, tmp_path, monkeypatch):
    out, _, _ = run
    folder = shutil.copytree(out / "checkpoint-6", tmp_path / "checkpoint-6")
    names = open_trace(out / "seq").names("param")  # named_parameters() order
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModel"]}))
    with pytest.raises(TraceError, match=r"config.json: 'architectures' \['NoSuchModel'\] names no"):
        open_trace(folder)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(TraceError, match="stores no param_names .* pass param_names="):
        open_trace(folder)
    decay = [n for n in names if "bias" not in n and "layernorm" not in n.lower()]  # the Trainer's rule
    order = [[n for n in names if n in decay], [n for n in names if n not in decay]]
    assert open_checkpoint(folder, param_names=order).steps == [6]
    with pytest.raises(TraceError, match=r"gives \[11, 13\] names per group for groups of \[11, 14\]"):
        open_checkpoint(folder, param_names=[order[0], order[1][1:]])
