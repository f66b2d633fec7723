"""fpsim's optimizers inside the real frameworks: a Hugging Face ``Trainer`` and PyTorch
Lightning, their state_dict through each framework's checkpoints. The oracles are torch's own
``AdamW`` in the same framework, on this machine, and the uninterrupted run."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hf import tiny_bert_config, token_data  # noqa: E402

from fpsim.trace import TorchCapture, open_trace  # noqa: E402
from fpsim.train.torch import AdamW  # noqa: E402

LR = 1e-2


def _same_parameters(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_fpsim_adamw_in_the_hf_trainer_and_through_its_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    # 4,096-element word embeddings: the one tensor bnb-8bit stores in 8 bits (min_8bit_size)
    cfg = tiny_bert_config(transformers, 256)
    data = token_data(256, 48)

    def train(name, config=None, resume=None, save=False):
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification(cfg)
        opt = None
        if config is not None:
            opt = AdamW(model.named_parameters(), lr=LR, weight_decay=0.0, config=config, sqrt="torch")
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / name),
            max_steps=12,
            per_device_train_batch_size=4,
            learning_rate=LR,
            optim="adamw_torch",
            save_strategy="steps" if save else "no",
            save_steps=6,
            report_to=[],
            use_cpu=True,
            dataloader_num_workers=0,
            logging_steps=1,
            disable_tqdm=True,
            log_level="error",
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, None))
        trainer.train(resume_from_checkpoint=resume)
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], model

    torch_losses, torch_model = train("torch")
    fp32_losses, fp32_model = train("fp32", "fp32")
    assert len(fp32_losses) == 12 and fp32_losses == torch_losses
    assert _same_parameters(fp32_model, torch_model)
    bnb_losses, bnb_model = train("bnb", "bnb-8bit", save=True)
    assert np.isfinite(bnb_losses).all() and not _same_parameters(bnb_model, torch_model)
    _, resumed = train("bnb", "bnb-8bit", resume=str(tmp_path / "bnb" / "checkpoint-6"))
    assert _same_parameters(resumed, bnb_model)


def test_fpsim_adamw_in_lightning_and_through_its_checkpoint(tmp_path):
    L = pytest.importorskip("lightning")
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((96, 64)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 4, 96))

    class Module(L.LightningModule):
        def __init__(self, make, trace=None):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
            self.make, self.trace, self.losses, self.grads = make, trace, [], {}

        def training_step(self, batch, i):
            loss = torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return self.make(self.named_parameters())

        def on_train_start(self):  # self.optimizers() is Lightning's LightningOptimizer wrapper
            if self.trace is not None:
                self.capture = TorchCapture(self, self.trace, optimizer=self.optimizers(), asynchronous=False)

        def on_before_optimizer_step(self, optimizer):
            if self.trace is not None:
                self.capture.step(self.global_step)
                self.grads[self.global_step] = self.net[0].weight.grad.clone()

        def on_train_end(self):
            if self.trace is not None:
                self.capture.close()

    def fit(make, trace=None, save=None, resume=None):
        module = Module(make, trace)
        checkpoints = [L.pytorch.callbacks.ModelCheckpoint(save, every_n_train_steps=6, save_top_k=-1)]
        trainer = L.Trainer(
            accelerator="cpu",
            max_steps=12,
            logger=False,
            enable_checkpointing=save is not None,
            callbacks=checkpoints if save is not None else [],
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module, torch.utils.data.DataLoader(list(zip(x, y)), batch_size=16), ckpt_path=resume)
        return module

    ref = fit(lambda params: torch.optim.AdamW(params, lr=LR))
    fp32 = fit(lambda params: AdamW(params, lr=LR, config="fp32", sqrt="torch"), trace=tmp_path / "t")
    assert len(fp32.losses) == 12 and fp32.losses == ref.losses and _same_parameters(fp32, ref)
    t = open_trace(tmp_path / "t")
    assert t.steps == list(range(12)) and [t.update(s) for s in t.steps] == list(range(1, 13))
    for s in t.steps:
        np.testing.assert_array_equal(t.read(t.entry(s, "net.0.weight")), fp32.grads[s].numpy())
    int8 = fit(lambda params: AdamW(params, lr=LR, config="int8-states"))
    drift = max((p - q).abs().max().item() for p, q in zip(int8.parameters(), ref.parameters()))
    assert drift > 100 * LR  # int8 states: the run leaves torch's visibly
    bnb = fit(lambda params: AdamW(params, lr=LR, config="bnb-8bit"), save=tmp_path / "ckpt")
    resumed = fit(
        lambda params: AdamW(params, lr=LR, config="bnb-8bit"),
        resume=tmp_path / "ckpt" / "epoch=0-step=6.ckpt",
    )
    assert len(resumed.losses) == 6 and resumed.losses == bnb.losses[6:] and _same_parameters(resumed, bnb)
