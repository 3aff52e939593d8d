"""The smallest Hugging Face training set-up the callback tests' trainer scripts run (they import
it with the repository root on ``PYTHONPATH``): a one-layer GPT-2 over a 64-token vocabulary and
a dataset of 64 samples of 8 token ids."""

from __future__ import annotations

from typing import Any

import torch


class Tokens(torch.utils.data.Dataset):  # type: ignore[misc,type-arg]
    """64 samples, each 8 consecutive token ids that are their own labels."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.arange(i, i + 8) % 64
        return {"input_ids": ids, "labels": ids}


def tiny_gpt2() -> Any:
    """A freshly initialised one-layer GPT-2 LM head model (16 positions, 16 wide, 2 heads)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
