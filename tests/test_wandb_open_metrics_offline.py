"""The open-metrics path end to end with real wandb offline: a trainer run started with
``open_metrics_settings()`` scrapes a running ``dflash-sidecar demo`` (simulated workers publishing
through the real shim, NVML on the fake driver with two GPU groups) through wandb-core's own
scraper; the run's ``.wandb`` file is read back. No W&B server, no credentials, no shared mode.

The trainer child scrapes ``/metrics`` itself all along (same clock as its run's stats records),
so each stats value is compared with ``/metrics`` as it was within one window of the record's
timestamp."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.model.insight import VERDICT_CODES
from tests import wandb_records
from tests.daemon_harness import env, free_port, spawn_sidecar
from tests.fake_nvml.control import FakeNvml
from tests.fake_nvml.helpers import library_or_skip

INTERVAL_S = 1.0
"""The daemon's window, and the run's stats sampling interval."""

TRAINER = textwrap.dedent("""
    import json, sys, time, urllib.request
    import wandb
    from prometheus_client.parser import text_string_to_metric_families
    from trainer_shim.integrations.wandb_metrics import describe_run, open_metrics_settings
    addr, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    run = wandb.init(project="open-metrics", settings=wandb.Settings(
        **open_metrics_settings(addr), x_stats_sampling_interval=float(sys.argv[4])))
    describer = describe_run(run, addr)
    scrapes = []
    deadline = time.time() + seconds
    while time.time() < deadline:
        t = time.time()
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        samples = [[s.name, s.labels, s.value] for f in text_string_to_metric_families(text) for s in f.samples]
        scrapes.append([(t + time.time()) / 2, samples])
        time.sleep(0.2)
    describer.join(10)
    run.finish()
    json.dump({"run_id": run.id, "scrapes": scrapes}, open(out, "w"))
""")

EXPECTED: dict[str, tuple[str, dict[str, str]]] = {
    "dflash_verdict_confidence_ratio": ("dflash_pipeline_verdict_confidence_ratio", {}),
    "dflash_bottleneck_balanced": ("dflash_pipeline_bottleneck", {"verdict": "balanced"}),
    "dflash_bottleneck_input_bound": ("dflash_pipeline_bottleneck", {"verdict": "input-bound"}),
    "dflash_pipeline_queue_fill_ratio": ("dflash_pipeline_queue_fill_ratio", {}),
    "dflash_role_drafter_batches_per_second": ("dflash_pipeline_batches_per_second", {"role": "drafter"}),
    "dflash_role_target_tokens_per_second": ("dflash_pipeline_tokens_per_second", {"role": "target"}),
    "dflash_role_drafter_time_share_forward_ratio": ("dflash_pipeline_time_share_ratio",
                                                     {"role": "drafter", "phase": "forward"}),
    "dflash_group_drafter_gpu_idle_ratio": ("dflash_pipeline_gpu_idle_ratio", {"group": "drafter"}),
    "dflash_group_target_gpu_idle_unexplained_ratio": ("dflash_pipeline_gpu_idle_reason_ratio",
                                                       {"group": "target", "reason": "unexplained"}),
    "dflash_group_target_gpu_utilization_ratio": ("dflash_group_gpu_utilization_ratio", {"group": "target"}),
    "dflash_group_drafter_power_watts": ("dflash_group_power_watts", {"group": "drafter"}),
    "dflash_group_drafter_memory_free_min_bytes": ("dflash_group_memory_free_min_bytes", {"group": "drafter"}),
    "dflash_sidecar_senders": ("dflash_sidecar_senders", {}),
    "dflash_sidecar_records_accepted_total": ("dflash_sidecar_records_accepted_total", {}),
}
"""W&B family (after ``openmetrics.sidecar.``, before ``.0``) -> the ``/metrics`` sample and the
labels it must carry (summed over the rest), written out here rather than taken from the page's
own declaration."""


def _on_metrics(samples: list[Any], name: str, labels: dict[str, str]) -> float | None:
    found = [v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())]
    return sum(found) if found else None


def _verdict_code(samples: list[Any]) -> float | None:
    current = [lab["verdict"] for n, lab, v in samples if n == "dflash_pipeline_bottleneck" and v == 1.0]
    return float(VERDICT_CODES[current[0]]) if current else None


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A running ``dflash-sidecar demo`` on the fake NVML driver: (its Prometheus address, a folder)."""
    library = library_or_skip("full")
    tmp = tmp_path_factory.mktemp("open-metrics")
    control = FakeNvml(tmp / "nvml-control.txt", library, {"devices": 2})
    control.gpu("*", utilization_gpu=70, clock_reasons=0)
    addr = f"127.0.0.1:{free_port()}"
    daemon_env = env(LD_LIBRARY_PATH=str(library.parent), FAKE_NVML_CONTROL=str(control.path))
    proc = spawn_sidecar(["demo", "--duration", "120", "--interval", str(INTERVAL_S),
                          "--nvml-interval", "0.5", "--gpu-group", "target=0", "--gpu-group", "drafter=1",
                          "--endpoint", f"ipc://{tmp}/demo.sock", "--prometheus-addr", addr],
                         tmp / "demo.log", daemon_env)
    try:
        _wait_for_window(addr, proc, tmp / "demo.log")
        yield addr, tmp
    finally:
        proc.terminate()
        proc.wait(15)


def _trainer_env(wandb_dir: Path) -> dict[str, str]:
    wandb_dir.mkdir()
    trainer_env = {k: v for k, v in env().items() if not k.startswith("WANDB_")}
    trainer_env.update(WANDB_MODE="offline", WANDB_DIR=str(wandb_dir), WANDB_SILENT="true")
    return trainer_env


def _read_run(wandb_dir: Path, run_id: str) -> dict[str, Any]:
    """The run's stats records ((unix s, {key: value})) and its config, from its ``.wandb`` file."""
    run_file = wandb_records.find_run_file(wandb_dir, run_id)
    stats = []
    for record in wandb_records.of_type(run_file, "stats"):
        values = {item.key: json.loads(item.value_json) for item in record.item}
        stats.append((record.timestamp.seconds + record.timestamp.nanos / 1e9, values))
    config = {item.key: json.loads(item.value_json) for c in wandb_records.of_type(run_file, "config")
              for item in c.update}
    return {"stats": stats, "config": config}


@pytest.fixture(scope="module")
def scraped_run(demo: tuple[str, Path]) -> dict[str, Any]:
    addr, tmp = demo
    wandb_dir, out = tmp / "trainer", tmp / "trainer.json"
    subprocess.run([sys.executable, "-c", TRAINER, addr, str(out), "7", str(INTERVAL_S)], env=_trainer_env(wandb_dir),
                   cwd=wandb_dir, check=True, timeout=120, capture_output=True)
    result = json.loads(out.read_text())
    return {**_read_run(wandb_dir, result["run_id"]), "scrapes": result["scrapes"]}


def _wait_for_window(addr: str, demo: subprocess.Popen[bytes], log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert demo.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"http://{addr}/metrics/wandb", timeout=2) as resp:
                text = resp.read().decode()
            if "dflash_group_drafter_gpu_idle_ratio" in text and "dflash_role_drafter_batches_per_second" in text:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError("the demo's page never had a window with GPU groups:\n" + log.read_text())


def _sidecar_keys(values: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in values.items() if k.startswith("openmetrics.sidecar.")}


def test_run_holds_the_sidecar_figures_under_readable_names(scraped_run: dict[str, Any]) -> None:
    records = [(t, _sidecar_keys(v)) for t, v in scraped_run["stats"]]
    records = [(t, v) for t, v in records if v]
    assert len(records) >= 3, scraped_run["stats"]
    keys = set().union(*(v for _, v in records))
    assert all(k.endswith(".0") for k in keys), sorted(k for k in keys if not k.endswith(".0"))
    names = {k.removeprefix("openmetrics.sidecar.").removesuffix(".0") for k in keys}
    assert {"dflash_verdict_code", *EXPECTED} <= names, sorted({"dflash_verdict_code", *EXPECTED} - names)
    assert len(names) < 120  # bounded: one family per figure, not per label set of /metrics
    assert scraped_run["config"]["dflash_verdict_code"] == {str(c): v for v, c in VERDICT_CODES.items()}


def test_run_values_match_metrics_within_one_window(scraped_run: dict[str, Any]) -> None:
    scrapes = scraped_run["scrapes"]
    judged = 0
    for t, values in scraped_run["stats"]:
        # Judged only where /metrics was read within half a window on each side of the record:
        # one of those reads saw the window W&B sampled (a loaded box may leave gaps).
        if not (_sidecar_keys(values) and any(t - 0.45 <= ts <= t for ts, _ in scrapes)
                and any(t <= ts <= t + 0.45 for ts, _ in scrapes)):
            continue
        near = [samples for ts, samples in scrapes if abs(ts - t) <= INTERVAL_S]
        compared = 0
        for name, (source, labels) in [("dflash_verdict_code", ("", {})), *EXPECTED.items()]:
            got = values.get(f"openmetrics.sidecar.{name}.0")
            if got is None:
                continue
            seen = [_verdict_code(s) if name == "dflash_verdict_code" else _on_metrics(s, source, labels)
                    for s in near]
            assert any(v is not None and math.isclose(v, got, rel_tol=1e-9) for v in seen), (name, got, seen)
            compared += 1
        assert compared >= len(EXPECTED) - 2, (t, sorted(values))  # nearly every figure in every record
        judged += 1
    assert judged >= 2, (judged, len(scraped_run["stats"]))


HF_TRAINER = textwrap.dedent("""
    import sys, time
    import wandb
    from transformers import Trainer, TrainingArguments
    from tests.tiny_hf import Tokens, tiny_gpt2
    from trainer_shim.integrations.hf import SidecarCallback

    callback = SidecarCallback(wandb_open_metrics=sys.argv[1])  # before the Trainer's wandb sets up

    model = tiny_gpt2()
    args = TrainingArguments(output_dir="out", max_steps=4, per_device_train_batch_size=4, report_to=["wandb"],
                             use_cpu=True, save_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback]).train()
    time.sleep(3 * float(sys.argv[2]))  # a few samples of the run's system metrics
    print("RUN", wandb.run.id, flush=True)
    wandb.finish()
""")


def test_hf_callback_option_brings_the_page_into_the_run_the_trainer_starts(demo: tuple[str, Path]) -> None:
    addr, tmp = demo
    wandb_dir = tmp / "hf"
    trainer_env = _trainer_env(wandb_dir)
    trainer_env["WANDB_X_STATS_SAMPLING_INTERVAL"] = str(INTERVAL_S)
    proc = subprocess.run([sys.executable, "-c", HF_TRAINER, addr, str(INTERVAL_S)], env=trainer_env, cwd=wandb_dir,
                          timeout=180, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("RUN"))
    run = _read_run(wandb_dir, run_id)
    keys = set().union(*(v for _, v in run["stats"]))
    assert {"openmetrics.sidecar.dflash_verdict_code.0", "openmetrics.sidecar.dflash_role_drafter_batches_per_second.0",
            "openmetrics.sidecar.dflash_group_target_power_watts.0"} <= keys, sorted(keys)
    assert run["config"]["dflash_verdict_code"]["8"] == "input-bound"

