"""The two-line integrations with the real frameworks on CPU, end to end against a real receiver:
a Hugging Face ``Trainer`` with a tiny GPT-2 built from a config (no download), a Lightning
``Trainer`` with a tiny module, and the data-loader wrapper in a plain loop. Each script runs in
a fresh interpreter; what the receiver got is checked per record."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.shim_helpers import ROOT, SenderBook, only_book, run_script
from trainer_shim.integrations import names

pytest_plugins = ["tests.shim_fixtures"]

STEPS = 6
PROFILE = 6  # wire.RecordKind.PROFILE


def profiles(book: SenderBook) -> list[tuple[int, dict[str, float]]]:
    return [(r[1], r[2]) for r in book.records if r[0] == PROFILE]


def values(book: SenderBook, name: str) -> list[Any]:
    return [r[2] for r in book.records if r[0] != PROFILE and r[1] == name]


def test_importing_the_package_imports_no_framework() -> None:
    code = ("import sys, trainer_shim.integrations, trainer_shim.integrations.loader; "
            "print(sorted(m for m in ('torch', 'transformers', 'lightning') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


def test_hf_trainer_callback(workdir: Path, ep: str, receivers: Callable[..., Any]) -> None:
    rx = receivers(ep)
    proc = run_script(workdir, f"""
        import torch, wandb
        from transformers import Trainer, TrainingArguments
        from tests.tiny_hf import Tokens, tiny_gpt2
        from trainer_shim.integrations.hf import SidecarCallback

        torch.manual_seed(0)
        model = tiny_gpt2()
        args = TrainingArguments(output_dir="out", max_steps={STEPS}, per_device_train_batch_size=4,
                                 logging_steps=1, report_to=["wandb"], use_cpu=True,
                                 save_strategy="no", dataloader_num_workers=0,
                                 include_num_input_tokens_seen="all", disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(),
                          callbacks=[SidecarCallback()])
        trainer.train()
        print("RUN", wandb.run.id if wandb.run else None, flush=True)
    """, ep, env={"WANDB_MODE": "offline", "WANDB_DIR": str(workdir), "WANDB_SILENT": "true"})
    run_id = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("RUN"))
    book = only_book(rx, lambda b: len(profiles(b)) >= STEPS and len(values(b, "loss")) >= STEPS)
    steps = profiles(book)
    assert [s for s, _ in steps] == list(range(1, STEPS + 1))
    assert all({names.STEP_MS, names.FORWARD_BACKWARD_MS, names.OPTIMIZER_STEP_MS} <= set(p) for _, p in steps)
    assert all(names.DATA_WAIT_MS in p for _, p in steps[1:])
    # the step covers its data wait and every phase; what they leave is host time between hooks
    inside = (names.DATA_WAIT_MS, names.FORWARD_BACKWARD_MS, names.OPTIMIZER_STEP_MS)
    assert all(p[names.STEP_MS] >= sum(p.get(k, 0.0) for k in inside) > 0 for _, p in steps)
    assert all(p[names.FORWARD_BACKWARD_MS] > 0 and p[names.OPTIMIZER_STEP_MS] > 0 for _, p in steps)
    assert values(book, names.BATCHES) == [1] * STEPS
    assert sum(values(book, names.TOKENS)) == STEPS * 4 * 8
    losses, lrs = values(book, names.LOSS), values(book, names.LR)
    assert len(losses) == STEPS and all(isinstance(v, float) and v > 0 for v in losses)
    assert len(lrs) == STEPS and all(isinstance(v, float) for v in lrs)
    assert run_id != "None" and run_id in {h.get("wandb_run_id") for h in book.hellos}


LOG_MS = 150
"""What the user's ``on_log`` hook costs in the data-wait test (ms): its sleep is a lower bound."""


def test_hf_data_wait_leaves_out_the_logging_between_steps(workdir: Path, ep: str,
                                                            receivers: Callable[..., Any]) -> None:
    # Between steps the Trainer logs (here a user's on_log, listed first, sleeps LOG_MS) and then
    # fetches the next batch (no sleep): the data wait is the fetch; the logging lies in the
    # step and in no phase (host time between the hooks).
    rx = receivers(ep)
    run_script(workdir, f"""
        import time, torch
        from transformers import Trainer, TrainerCallback, TrainingArguments
        from tests.tiny_hf import Tokens, tiny_gpt2
        from trainer_shim.integrations.hf import SidecarCallback

        class SlowLogger(TrainerCallback):
            def on_log(self, args, state, control, **kwargs):
                time.sleep({LOG_MS} / 1000)

        torch.manual_seed(0)
        model = tiny_gpt2()
        args = TrainingArguments(output_dir="out", max_steps={STEPS}, per_device_train_batch_size=4,
                                 logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                                 dataloader_num_workers=0, disable_tqdm=True)
        Trainer(model=model, args=args, train_dataset=Tokens(),
                callbacks=[SlowLogger(), SidecarCallback()]).train()
    """, ep)
    steps = profiles(only_book(rx, lambda b: len(profiles(b)) >= STEPS))
    inside = (names.DATA_WAIT_MS, names.FORWARD_BACKWARD_MS, names.OPTIMIZER_STEP_MS)
    for _, p in steps[1:]:  # every step after the first follows a logged one
        assert p[names.DATA_WAIT_MS] < LOG_MS, steps  # the fetch only (it held the sleep before)
        assert p[names.STEP_MS] - sum(p[k] for k in inside) >= LOG_MS, steps  # in the step, in no phase


def test_lightning_callback(workdir: Path, ep: str, receivers: Callable[..., Any]) -> None:
    rx = receivers(ep)
    run_script(workdir, f"""
        import torch
        import lightning as L
        from tests.tiny_lightning import Tiny
        from trainer_shim.integrations.lightning import SidecarCallback

        data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        trainer = L.Trainer(max_steps={STEPS}, accelerator="cpu", logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[SidecarCallback()])
        trainer.fit(Tiny(), loader)
    """, ep)
    book = only_book(rx, lambda b: len(profiles(b)) >= STEPS)
    steps = profiles(book)
    assert [s for s, _ in steps] == list(range(1, STEPS + 1))
    timed = {names.STEP_MS, names.FORWARD_MS, names.BACKWARD_MS, names.OPTIMIZER_STEP_MS}
    assert all(timed <= set(p) for _, p in steps)
    assert all(names.DATA_WAIT_MS in p for _, p in steps[1:])
    inside = (names.DATA_WAIT_MS, names.FORWARD_MS, names.BACKWARD_MS, names.OPTIMIZER_STEP_MS)
    assert all(p[names.STEP_MS] >= sum(p.get(k, 0.0) for k in inside) for _, p in steps)
    assert values(book, names.BATCHES) == [1] * STEPS
    assert values(book, names.LR) == [0.05] * STEPS
    losses = values(book, names.LOSS)
    assert len(losses) == STEPS and all(isinstance(v, float) and v > 0 for v in losses)


FETCH_MS = 40
"""What each batch costs the dataset in the Lightning data-wait test (ms, a lower bound)."""


def test_lightning_data_wait_is_the_fetch_not_the_host_work_between_batches(
        workdir: Path, ep: str, receivers: Callable[..., Any]) -> None:
    # A user's callback after the sidecar's sleeps LOG_MS at each batch end (host work between
    # batches); the dataset takes FETCH_MS per batch: the data wait is the fetch, the host work
    # lies in the step and in no phase.
    rx = receivers(ep)
    run_script(workdir, f"""
        import time, torch
        import lightning as L
        from tests.tiny_lightning import Tiny
        from trainer_shim.integrations.lightning import SidecarCallback

        class Slow(torch.utils.data.Dataset):
            def __len__(self):
                return 64
            def __getitem__(self, i):
                time.sleep({FETCH_MS} / 8 / 1000)
                return torch.randn(8), torch.randn(1)

        class HostWork(L.Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                time.sleep({LOG_MS} / 1000)

        trainer = L.Trainer(max_steps={STEPS}, accelerator="cpu", logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[SidecarCallback(), HostWork()])
        trainer.fit(Tiny(), torch.utils.data.DataLoader(Slow(), batch_size=8))
    """, ep)
    steps = profiles(only_book(rx, lambda b: len(profiles(b)) >= STEPS))
    inside = (names.DATA_WAIT_MS, names.FORWARD_MS, names.BACKWARD_MS, names.OPTIMIZER_STEP_MS)
    for _, p in steps[1:]:
        assert FETCH_MS <= p[names.DATA_WAIT_MS] < LOG_MS, steps  # the fetch, without the host work
        assert p[names.STEP_MS] - sum(p[k] for k in inside) >= LOG_MS, steps  # in the step, in no phase


def test_loader_wrapper_times_the_wait_for_each_batch(workdir: Path, ep: str,
                                                      receivers: Callable[..., Any]) -> None:
    """Each batch's ``data_wait_ms`` covers the time the loader spent producing it (the dataset
    sleeps 20 ms per batch), and nothing of the loop body (which sleeps 50 ms)."""
    rx = receivers(ep)
    run_script(workdir, """
        import time
        from trainer_shim.integrations.loader import timed

        def slow_batches():
            for i in range(5):
                time.sleep(0.02)
                yield list(range(i + 1))

        wrapped = timed(slow_batches(), tokens=len)
        for batch in wrapped:
            time.sleep(0.05)
        assert len(timed([1, 2, 3])) == 3
    """, ep)
    book = only_book(rx, lambda b: len(values(b, names.BATCHES)) >= 5)
    waits = values(book, names.DATA_WAIT_MS)
    assert len(waits) == 5 and all(20 <= w < 50 for w in waits)
    assert values(book, names.TOKENS) == [1, 2, 3, 4, 5]
