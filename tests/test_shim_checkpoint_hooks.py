"""Checkpoint time from the frameworks' save hooks, on the real Hugging Face and Lightning
trainers (CPU): each save the trainer makes arrives as one ``checkpoint_ms`` timing that covers
the save (made slow on purpose, 0.3 s, and timed by the script itself) and little else. The run
ledger tells these timings as ``checkpoint`` (tests/test_run_ledger.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.shim_helpers import SenderLedger, ledgers, run_script, wait_until
from trainer_shim.integrations import names

pytest_plugins = ["tests.shim_fixtures"]

SLACK_MS = 250.0
"""What a timing may hold beyond the save itself: the hooks between (logging) on a loaded box."""


def timings(rx: Any, name: str, n: int) -> list[float]:
    def ready() -> SenderLedger | None:
        books = list(ledgers(rx.messages()).values())
        return books[0] if len(books) == 1 and len(_named(books[0], name)) >= n else None

    book = wait_until(ready, timeout_s=60)
    rx.stop()
    return _named(book, name)


def _named(book: SenderLedger, name: str) -> list[float]:
    return [r[2] for r in book.records if r[1] == name]


def saves(stdout: str) -> list[float]:
    return [float(x) for x in json.loads(next(line[6:] for line in stdout.splitlines() if line.startswith("SAVES ")))]


def test_hf_on_save_times_each_checkpoint(workdir: Path, ep: str, receivers: Callable[..., Any]) -> None:
    rx = receivers(ep)
    proc = run_script(workdir, """
        import json, time, torch
        from transformers import Trainer, TrainingArguments
        from tests.tiny_hf import Tokens, tiny_gpt2
        from trainer_shim.integrations.hf import SidecarCallback

        class SlowSave(Trainer):  # a slow disk, and the save's own clock
            def _save_checkpoint(self, *args, **kwargs):
                t0 = time.perf_counter()
                time.sleep(0.3)
                super()._save_checkpoint(*args, **kwargs)
                SAVES.append((time.perf_counter() - t0) * 1000)

        SAVES = []
        torch.manual_seed(0)
        model = tiny_gpt2()
        args = TrainingArguments(output_dir="out", max_steps=4, per_device_train_batch_size=4, logging_steps=1,
                                 report_to=[], use_cpu=True, save_strategy="steps", save_steps=2,
                                 dataloader_num_workers=0, disable_tqdm=True)
        SlowSave(model=model, args=args, train_dataset=Tokens(), callbacks=[SidecarCallback()]).train()
        print("SAVES " + json.dumps(SAVES), flush=True)
    """, ep)
    measured = saves(proc.stdout)
    assert len(measured) == 2 and all((workdir / "out" / f"checkpoint-{n}").is_dir() for n in (2, 4))
    got = timings(rx, names.CHECKPOINT_MS, 2)
    assert len(got) == 2
    for ms, save_ms in zip(got, measured):
        assert save_ms <= ms <= save_ms + SLACK_MS, (got, measured)


def test_lightning_times_each_save_checkpoint(workdir: Path, ep: str, receivers: Callable[..., Any]) -> None:
    rx = receivers(ep)
    proc = run_script(workdir, """
        import json, time, torch
        import lightning as L
        from lightning.pytorch.callbacks import ModelCheckpoint
        from tests.tiny_lightning import Tiny
        from trainer_shim.integrations.lightning import SidecarCallback

        class SlowWrite(L.Callback):  # a slow disk under the strategy's write, and the write's own clock
            def setup(self, trainer, pl_module, stage):
                write = trainer.strategy.save_checkpoint
                def slow(*args, **kwargs):
                    t0 = time.perf_counter()
                    time.sleep(0.3)
                    write(*args, **kwargs)
                    SAVES.append((time.perf_counter() - t0) * 1000)
                trainer.strategy.save_checkpoint = slow

        SAVES = []
        data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
                            enable_model_summary=False,
                            callbacks=[SidecarCallback(), SlowWrite(),
                                       ModelCheckpoint(dirpath="ckpt", every_n_train_steps=2, save_top_k=-1)])
        trainer.fit(Tiny(), loader)
        print("SAVES " + json.dumps(SAVES), flush=True)
        print("RESTORED", "save_checkpoint" not in trainer.__dict__, flush=True)
    """, ep)
    measured = saves(proc.stdout)
    assert len(measured) == 2 and len(list((workdir / "ckpt").glob("*.ckpt"))) == 2
    assert "RESTORED True" in proc.stdout  # the trainer's own method again after fit
    got = timings(rx, names.CHECKPOINT_MS, 2)
    assert len(got) == 2
    for ms, save_ms in zip(got, measured):
        assert save_ms <= ms <= save_ms + SLACK_MS, (got, measured)
