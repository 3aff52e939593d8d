"""Training loops a capture is asked of (tests/test_trace_capture.py), run as child processes:
``python -m tests.capture_loops KIND PROGRESS_FILE``. The endpoint and role come from the
environment (``DFLASH_SIDECAR_ENDPOINT``, ``DFLASH_ROLE``), as for any trainer. Each loop rewrites
``PROGRESS_FILE`` with its step count (and, compiled, dynamo's graph breaks and recompiles) after
every step, and runs until killed (at most ``LIMIT_S``).

Kinds: ``plain`` (forward, backward, optimizer, a DataLoader with 2 workers, ``publish`` per step),
``compiled`` (the same with the forward and ``publish`` in a ``torch.compile``d function),
``hf`` (a Hugging Face Trainer with the shim's callback), ``lightning`` (a Lightning Trainer with
the shim's callback), ``notorch`` (publishes, never imports torch), ``silent`` (imports torch,
never publishes: no step boundary), ``slowdown`` (its step time grows sixfold after 8 s),
``loader`` (a ``timed`` DataLoader, no ``publish``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

LIMIT_S = 240.0


class Progress:
    def __init__(self, path: str) -> None:
        self.path, self.steps, self.extra = path, 0, {}
        self.start = time.monotonic()

    def step(self) -> None:
        self.steps += 1
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"steps": self.steps, **self.extra}, f)
        os.replace(tmp, self.path)
        if time.monotonic() - self.start > LIMIT_S:
            sys.exit(0)


def _data() -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(256, 32, generator=g), torch.randn(256, 1, generator=g))
    return DataLoader(ds, batch_size=16, num_workers=2, persistent_workers=True)


def plain(progress: Progress, compiled: bool = False) -> None:
    import torch

    from trainer_shim import telemetry

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0

    def forward(x: Any, y: Any, i: int) -> Any:
        loss = torch.nn.functional.mse_loss(model(x), y)
        telemetry.publish(i, {"forward_ms": 1.0})  # the step boundary, inside compiled code
        return loss

    fwd = forward
    if compiled:
        import torch._dynamo
        from torch._dynamo.utils import counters

        fwd = torch.compile(forward, backend="eager", dynamic=False)
    while True:
        for x, y in _data():
            loss = fwd(x, y, step)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if not compiled:
                telemetry.publish(step, {"step_ms": 1.0})
            step += 1
            if compiled:
                progress.extra = {"graph_breaks": sum(counters["graph_break"].values()),
                                  "recompiles": sum(counters["recompiles"].values())}
            progress.step()


def loader(progress: Progress) -> None:
    """Forward, backward, SGD over ``timed(DataLoader)``; never calls ``publish``."""
    import torch

    from trainer_shim.integrations.loader import timed

    model = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    while True:
        for x, y in timed(_data()):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            progress.step()


def notorch(progress: Progress) -> None:
    from trainer_shim import telemetry

    step = 0
    while True:
        telemetry.publish(step, {"step_ms": 5.0})
        step += 1
        time.sleep(0.005)
        progress.step()


def slowdown(progress: Progress) -> None:
    """A step of 5 ms for 8 s, then of 40 ms: the step time moves (counts its batches)."""
    import torch

    from trainer_shim import telemetry

    x, start, step = torch.randn(16, 16), time.monotonic(), 0
    while True:
        (x @ x).sum()
        time.sleep(0.005 if time.monotonic() - start < 8 else 0.04)
        telemetry.count("batches")
        telemetry.publish(step, {"step_ms": 5.0})
        step += 1
        progress.step()


def silent(progress: Progress) -> None:
    """Imports torch, counts, never publishes: no step boundary."""
    import torch  # noqa: F401

    from trainer_shim import telemetry

    while True:
        telemetry.count("batches")
        time.sleep(0.005)
        progress.step()


def hf(progress: Progress) -> None:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from trainer_shim.integrations.hf import SidecarCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def forward(self, x: Any, labels: Any = None) -> Any:
            out = self.lin(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    class Count(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            progress.step()

    data = [{"x": torch.randn(8), "labels": torch.randn(1)} for _ in range(64)]
    args = TrainingArguments(output_dir=os.path.dirname(progress.path) + "/hf", max_steps=100_000,
                             per_device_train_batch_size=4, report_to=[], save_strategy="no",
                             logging_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[Count(), SidecarCallback()]).train()


def lightning(progress: Progress) -> None:
    import lightning as L
    import torch

    from trainer_shim.integrations.lightning import SidecarCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_batch_end(self, *args: Any) -> None:
            progress.step()

    ds = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer = L.Trainer(max_steps=100_000, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[SidecarCallback()])
    trainer.fit(Tiny(), torch.utils.data.DataLoader(ds, batch_size=4))


if __name__ == "__main__":
    kind, path = sys.argv[1], sys.argv[2]
    p = Progress(path)
    {"plain": plain, "compiled": lambda p: plain(p, compiled=True), "notorch": notorch, "silent": silent,
     "slowdown": slowdown, "loader": loader, "hf": hf, "lightning": lightning}[kind](p)
