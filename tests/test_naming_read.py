"""Names never seen before, end to end: three trainers that name their timings themselves, each
only calling its logger (no shim call in its code: the tap is switched on by the environment,
``DFLASH_SIDECAR_TAP``), a real daemon on the fake NVML driver, and the verdict of every window.

- TensorBoard ``add_scalar("timing/data_s")`` and ``("timing/iter_s")``, 60 % of each step
  waiting on data, the GPU 35 % busy: input-bound.
- ``wandb.log({"perf/data_time_ms": ..., "perf/step_time_ms": ...})`` (offline), the same loop:
  input-bound.
- DeepSpeed's TensorBoard monitor as its engine writes it (``Train/Samples/elapsed_time_ms_*``
  at the sample count, batch 32): backward = backward_inner + backward_allreduce, the all-reduce
  55 % of each step, ``..._step`` the optimizer step, the GPU 46 % busy: communication-bound, and
  the run ledger counts steps, not samples.

Each verdict says which evidence was read from a name. And no false health: a loop that logs only
its loss and learning rate (no timing at all), its GPU 45 % busy, is ``unexplained-idle``, never
``balanced``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc, env
from tests.fake_nvml.helpers import library_or_skip
from tests.verdict_matrix import _lines, _set_gpu, _write

LOOP_HEAD = """
    import json, os, sys, time
    from pathlib import Path
    control = Path(sys.argv[1])
"""

TENSORBOARD = LOOP_HEAD + """
    from torch.utils.tensorboard import SummaryWriter
    w = SummaryWriter(sys.argv[2])
    step = 0
    while not control.exists():
        t0 = time.perf_counter()
        time.sleep(0.048)                       # waiting on the data loader
        data_s = time.perf_counter() - t0
        time.sleep(0.032)                       # the step's compute
        w.add_scalar("timing/data_s", data_s, step)
        w.add_scalar("timing/iter_s", time.perf_counter() - t0, step)
        w.add_scalar("train/loss", 2.0, step)
        step += 1
    w.close()
"""

WANDB = LOOP_HEAD + """
    import wandb
    run = wandb.init(project="names", mode="offline", dir=sys.argv[2])
    step = 0
    while not control.exists():
        t0 = time.perf_counter()
        time.sleep(0.048)
        data_ms = (time.perf_counter() - t0) * 1000
        time.sleep(0.032)
        run.log({"perf/data_time_ms": data_ms, "perf/step_time_ms": (time.perf_counter() - t0) * 1000,
                 "train/loss": 2.0}, step=step)
        step += 1
    run.finish()
"""

DEEPSPEED = LOOP_HEAD + """
    from torch.utils.tensorboard import SummaryWriter
    w = SummaryWriter(sys.argv[2])
    samples, batch = 0, 32
    P = "Train/Samples/"
    while not control.exists():
        time.sleep(0.060)                       # forward 10, backward 12 + all-reduce 33, optimizer 5 (ms)
        samples += batch
        events = [(P + "train_loss", 2.0), (P + "lr", 1e-4), (P + "loss_scale", 1.0),
                  (P + "elapsed_time_ms_forward", 10.0), (P + "elapsed_time_ms_backward", 45.0),
                  (P + "elapsed_time_ms_backward_inner", 12.0), (P + "elapsed_time_ms_backward_allreduce", 33.0),
                  (P + "elapsed_time_ms_step", 5.0)]
        for name, value in events:              # DeepSpeed's TensorBoardMonitor.write_events
            w.add_scalar(name, value, samples)
        w.flush()
    w.close()
"""

UNTIMED = LOOP_HEAD + """
    import wandb
    run = wandb.init(project="names", mode="offline", dir=sys.argv[2])
    step = 0
    while not control.exists():
        time.sleep(0.08)
        run.log({"train/loss": 2.0, "train/learning_rate": 1e-4, "train/global_step": step}, step=step)
        step += 1
    run.finish()
"""

FIXMATCH = LOOP_HEAD + """
    from torch.utils.tensorboard import SummaryWriter
    w = SummaryWriter(sys.argv[2])              # FixMatch-pytorch's TBLog: its tags, as it spells them
    step = 0
    while not control.exists():
        t0 = time.perf_counter()
        time.sleep(0.048)                       # zip() of the labelled and unlabelled loaders
        prefecth = time.perf_counter() - t0
        t1 = time.perf_counter()
        time.sleep(0.032)                       # copies, forward, losses, backward, optimizer, EMA
        tb = {"train/sup_loss": 1.0, "train/unsup_loss": 0.5, "train/total_loss": 1.5, "train/mask_ratio": 0.9,
              "lr": 0.03, "train/prefecth_time": prefecth, "train/run_time": time.perf_counter() - t1}
        for key, value in tb.items():
            w.add_scalar(key, value, step)
        step += 1
    w.close()
"""

SYNC = LOOP_HEAD + """
    import wandb
    run = wandb.init(project="names", mode="offline", dir=sys.argv[2])
    step = 0
    while not control.exists():
        t0 = time.perf_counter()
        time.sleep(0.008)                       # the next batch
        data_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        time.sleep(0.016)                       # forward and backward
        fwd_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        time.sleep(0.048)                       # the weights pushed to the other ranks
        run.log({"step_time": time.perf_counter() - t0, "data_time": data_s, "fwd_time": fwd_s,
                 "timing/sync_time": time.perf_counter() - t2, "train/loss": 2.0}, step=step)
        step += 1
    run.finish()
"""

TRAINERS = {
    "tensorboard": (TENSORBOARD, "tensorboard", 35, "input-bound", "timing/data_s"),
    "wandb": (WANDB, "wandb", 35, "input-bound", "perf/data_time_ms"),
    "deepspeed": (DEEPSPEED, "tensorboard", 46, "communication-bound", "elapsed_time_ms_backward_allreduce"),
    "untimed": (UNTIMED, "wandb", 45, "unexplained-idle", ""),
}
"""Trainer -> (its loop, the tap, the fake GPU's busy percent, the verdict, the name it is read from)."""
ALONE = {"fixmatch": (FIXMATCH, "tensorboard", 40, "input-bound", "train/prefecth_time"),
         "sync": (SYNC, "wandb", 40, "unexplained-idle", "")}
"""Trainers run one at a time (the same fields): FixMatch-pytorch's own tags, its data wait misspelt."""


def run_trainer(name: str, workdir: Path, windows: int = 10, interval_s: float = 0.5) -> dict[str, object]:
    """One daemon on one fake GPU and one trainer: the verdicts of ``windows`` full windows once it
    steps (the first two not scored), the log lines, and the ledger's steps and the last step sent."""
    from tests.fake_nvml.build import build_fake_nvml
    from tests.fake_nvml.control import FakeNvml

    code, tap, busy, _, _ = (TRAINERS | ALONE)[name]
    row = workdir / name
    row.mkdir(parents=True)
    library = build_fake_nvml("full")
    nvml = FakeNvml(row / "nvml-control.txt", library, {"devices": 1})
    _set_gpu(nvml, busy)
    stop = row / "stop"
    d = DaemonProc(row, "--nvml-interval", "0.25", interval=interval_s, gpu=True,
                   extra_env={"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(nvml.path)})
    trainer_env = env(DFLASH_SIDECAR_TAP=tap, DFLASH_SIDECAR_ENDPOINT=d.endpoint, WANDB_SILENT="true",
                      WANDB_MODE="offline")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(stop), str(row / "logs")],
                            env=trainer_env, cwd=row, stdout=subprocess.DEVNULL,
                            stderr=open(row / "trainer.log", "wb"))
    try:
        deadline = time.monotonic() + 90
        while (d.value("dflash_trainer_step") or 0) < 4:
            assert time.monotonic() < deadline and proc.poll() is None, (row / "trainer.log").read_text()
            time.sleep(0.2)
        start = len(_lines(d))
        time.sleep(windows * interval_s)
        lines = [(v, e) for dur, v, e in _lines(d)[start:][2:] if dur >= 0.5 * interval_s]
        samples = d.samples()  # one scrape: the ledger's steps and the step sent at the same moment
        steps = [v for lab, v in samples.get("dflash_ledger_steps_total", []) if lab.get("role") == "trainer"]
        sent = [v for _, v in samples.get("dflash_trainer_step", [])]
        return {"lines": lines, "steps": steps[0] if steps else None, "sent": max(sent) if sent else None}
    finally:
        _write(stop, {"stop": True})
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        d.stop()


def ledger_after(row: Path) -> list[dict[str, object]]:
    """The run ledger's runs as ``report --json`` reads them from the stopped daemon's state folder."""
    out = subprocess.run([sys.executable, "-m", "sidecar", "report", "--json", "--state-dir", str(row / "state")],
                         capture_output=True, text=True, env=env(), timeout=60)
    assert out.returncode == 0, out.stderr
    runs: list[dict[str, object]] = json.loads(out.stdout)["runs"]
    return runs


@pytest.mark.timeout(240)
def test_three_trainers_with_names_of_their_own_get_the_right_verdict(tmp_path: Path) -> None:
    library_or_skip("full")
    with ThreadPoolExecutor(max_workers=len(TRAINERS)) as pool:
        rows = dict(zip(TRAINERS, pool.map(lambda t: run_trainer(t, tmp_path), TRAINERS), strict=True))
    for trainer, row in rows.items():
        _, _, _, expected, read_from = TRAINERS[trainer]
        lines = row["lines"]
        assert isinstance(lines, list) and len(lines) >= 5, (trainer, rows)
        verdicts = [v for v, _ in lines]
        assert verdicts.count(expected) / len(verdicts) >= 0.8, (trainer, lines)
        if read_from:
            said = [e for v, e in lines if v == expected]
            assert all("read from the name" in e and read_from in e for e in said), (trainer, lines)
        else:  # no timing at all, the GPU 45 % busy: no false health
            assert "balanced" not in verdicts and all("55% idle" in e for v, e in lines if v == expected), lines
    for trainer in TRAINERS:  # after the run: each role's causes sum to its wall time, the verdict kept
        runs = ledger_after(tmp_path / trainer)
        assert runs, trainer
        for r in runs:
            seconds = r["seconds"]
            assert isinstance(seconds, dict) and r["wall_s"] == pytest.approx(sum(seconds.values())), (trainer, r)
    # DeepSpeed's axis counts samples (32 a step): the ledger counts steps, the sent step stays the axis
    ds = rows["deepspeed"]
    sent, steps = ds["sent"], ds["steps"]
    assert isinstance(sent, float) and isinstance(steps, float) and sent % 32 == 0, ds
    assert steps > 0 and abs(steps - sent / 32) <= 1, ds


@pytest.mark.timeout(120)
def test_a_misspelt_data_wait_of_a_trainers_own_reads_input_bound(tmp_path: Path) -> None:
    """FixMatch-pytorch's TensorBoard tags as it writes them (``train/prefecth_time``: the loaders'
    wait, 60 % of each step; ``train/run_time``: the rest, a name of no phase), seconds, no config,
    the GPU 40 % busy: input-bound, read from the misspelt name (uncertain, and said so); after the
    run, each role's causes sum to its wall time. Read as written, the wait names nothing and the
    idle is unexplained."""
    library_or_skip("full")
    lines = run_trainer("fixmatch", tmp_path)["lines"]
    assert isinstance(lines, list) and len(lines) >= 5, lines
    verdicts = [v for v, _ in lines]
    assert verdicts.count("input-bound") / len(verdicts) >= 0.8 and "balanced" not in verdicts, lines
    said = [e for v, e in lines if v == "input-bound"]
    assert all("read from the name" in e and "prefecth" in e for e in said), lines
    runs = ledger_after(tmp_path / "fixmatch")
    assert runs, lines
    for r in runs:
        seconds = r["seconds"]
        assert isinstance(seconds, dict) and r["wall_s"] == pytest.approx(sum(seconds.values())), r


@pytest.mark.timeout(120)
def test_an_unread_sync_of_a_trainers_own_is_named_never_host_time(tmp_path: Path) -> None:
    """A W&B-tapped loop's own names (``step_time``, ``data_time``, ``fwd_time`` and
    ``timing/sync_time``, a weight push of two thirds of the step, a name the reader leaves unread:
    a bare sync is a device's synchronize as often), the GPU 40 % busy: the sync is a timing of no
    phase, its time unattributed and said so, the verdict unexplained idle, never host-bound. Before,
    the sync stayed a gauge and the gap it left was taken for host time: host-bound."""
    library_or_skip("full")
    lines = run_trainer("sync", tmp_path)["lines"]
    assert isinstance(lines, list) and len(lines) >= 5, lines
    verdicts = [v for v, _ in lines]
    assert verdicts.count("unexplained-idle") / len(verdicts) >= 0.8 and "host-bound" not in verdicts, lines
    assert all("unattributed" in e for v, e in lines if v == "unexplained-idle"), lines

