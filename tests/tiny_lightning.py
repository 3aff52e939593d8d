"""The smallest Lightning module the callback tests' trainer scripts fit (they import it with the
repository root on ``PYTHONPATH``): one linear layer, MSE loss, SGD at lr 0.05."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch


class Tiny(L.LightningModule):  # type: ignore[misc]
    """Regresses 8 features onto 1 with a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)
