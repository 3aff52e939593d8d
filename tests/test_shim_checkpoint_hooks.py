"""Checkpoint time from the frameworks' save hooks, on the real Hugging Face and Lightning
trainers (CPU): each save the trainer makes arrives as one ``checkpoint_ms`` timing that covers
the save (made slow on purpose, 0.3 s, and timed by the script itself) and nothing outside the
hooks around it (clocks the script reads just outside the shim's own: before its hook that starts
the timing, after the one that ends it). Bounds by construction, so a loaded box cannot break
them. The run ledger tells these timings as ``checkpoint`` (tests/test_run_ledger.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.shim_helpers import SenderBook, books_of, run_script, wait_until
from trainer_shim.integrations import names

pytest_plugins = ["tests.shim_fixtures"]

def timings(rx: Any, name: str, n: int) -> list[float]:
    def ready() -> SenderBook | None:
        books = list(books_of(rx.messages()).values())
        return books[0] if len(books) == 1 and len(_named(books[0], name)) >= n else None

    book = wait_until(ready, timeout_s=60)
    rx.stop()
    return _named(book, name)


def _named(book: SenderBook, name: str) -> list[float]:
    return [r[2] for r in book.records if r[1] == name]


def saves(stdout: str, tag: str = "SAVES") -> list[float]:
    """The milliseconds the script printed on its ``tag`` line."""
    return [float(x) for x in json.loads(next(line[len(tag) + 1:] for line in stdout.splitlines()
                                              if line.startswith(tag + " ")))]


def test_hf_on_save_times_each_checkpoint(workdir: Path, ep: str, receivers: Callable[..., Any]) -> None:
    rx = receivers(ep)
    proc = run_script(workdir, """
        import json, time, torch
        from transformers import Trainer, TrainerCallback, TrainingArguments
        from tests.tiny_hf import Tokens, tiny_gpt2
        from trainer_shim.integrations.hf import SidecarCallback

        class Clock(TrainerCallback):  # the time of each hook, and (last hook, on_save) per save
            def __init__(self):
                self.last, self.saves = 0.0, []
            def _mark(self, *args, **kwargs):
                self.last = time.perf_counter()
            on_step_end = on_log = on_evaluate = on_epoch_end = _mark
            def on_save(self, *args, **kwargs):
                self.saves.append((self.last, time.perf_counter()))

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
        before, after = Clock(), Clock()  # called just before and just after the shim's own hooks
        SlowSave(model=model, args=args, train_dataset=Tokens(), callbacks=[before, SidecarCallback(), after]).train()
        print("SAVES " + json.dumps(SAVES), flush=True)
        print("BOUNDS " + json.dumps([(end - start) * 1000 for (start, _), (_, end) in zip(before.saves, after.saves)]),
              flush=True)
    """, ep)
    measured, bounds = saves(proc.stdout), saves(proc.stdout, "BOUNDS")
    assert len(measured) == 2 and all((workdir / "out" / f"checkpoint-{n}").is_dir() for n in (2, 4))
    got = timings(rx, names.CHECKPOINT_MS, 2)
    assert len(got) == 2 and len(bounds) == 2
    for ms, save_ms, bound in zip(got, measured, bounds):
        assert save_ms <= ms <= bound, (got, measured, bounds)


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

        class Timed(ModelCheckpoint):  # a clock around the whole save call, outside the shim's
            def _save_checkpoint(self, trainer, filepath):
                t0 = time.perf_counter()
                super()._save_checkpoint(trainer, filepath)
                BOUNDS.append((time.perf_counter() - t0) * 1000)

        SAVES, BOUNDS = [], []
        data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
                            enable_model_summary=False,
                            callbacks=[SidecarCallback(), SlowWrite(),
                                       Timed(dirpath="ckpt", every_n_train_steps=2, save_top_k=-1)])
        trainer.fit(Tiny(), loader)
        print("SAVES " + json.dumps(SAVES), flush=True)
        print("BOUNDS " + json.dumps(BOUNDS), flush=True)
        print("RESTORED", "save_checkpoint" not in trainer.__dict__, flush=True)
    """, ep)
    measured, bounds = saves(proc.stdout), saves(proc.stdout, "BOUNDS")
    assert len(measured) == 2 and len(list((workdir / "ckpt").glob("*.ckpt"))) == 2
    assert "RESTORED True" in proc.stdout  # the trainer's own method again after fit
    got = timings(rx, names.CHECKPOINT_MS, 2)
    assert len(got) == 2 and len(bounds) == 2
    for ms, save_ms, bound in zip(got, measured, bounds):
        assert save_ms <= ms <= bound, (got, measured, bounds)
