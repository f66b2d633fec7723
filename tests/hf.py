"""A tiny Hugging Face model and its data, built from a config (no download), for the tests that
run a real ``transformers.Trainer``."""

from __future__ import annotations

import torch


def tiny_bert_config(transformers, vocab_size: int):
    """A one-layer BERT classifier's config: hidden size 16, two heads, two labels."""
    return transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )


def token_data(vocab_size: int, n: int) -> list[dict]:
    """``n`` examples of 8 random tokens (seed 0), labels alternating 0 and 1."""
    g = torch.Generator().manual_seed(0)
    return [
        {"input_ids": torch.randint(0, vocab_size, (8,), generator=g), "labels": torch.tensor(i % 2)}
        for i in range(n)
    ]
