"""The trainer's own throughput and efficiency figures (tokens/s, samples/s, steps/s, FLOP/s, MFU):
exported per role, shown by ``top`` and W&B, and feeding the run ledger where the sidecar cannot
compute its own (no ``tokens`` counter, no FLOPs per token)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from sidecar.aggregation.insight import compute_insight
from sidecar.aggregation.ledger.facts import RoleFact, SenderFact, WindowFacts
from sidecar.aggregation.ledger.fold import RunLedger
from sidecar.cli.top import render
from sidecar.exporters.wandb.insight_row import insight_row
from sidecar.model.ledger import CAUSES
from sidecar.model.window import GAUGE, SeriesView, WindowReport
from tests.daemon_harness import DaemonProc, env, require_tool, wait_for

TORCHTITAN = r"""
import sys, time
from trainer_shim import telemetry
ch = telemetry.configure(sys.argv[1], "trainer", "0", flush_interval_s=0.05)
began = time.time()
step = 0
while time.time() - began < 4.0:
    time.sleep(0.05)
    step += 1
    if step % 5 == 0:  # torchtitan's MetricsProcessor.log, every log_freq steps (its own key names)
        ch.publish(step, {"throughput(tps)": 5000.0, "tflops": 120.0, "mfu(%)": 40.0,
                          "time_metrics/end_to_end(s)": 0.05, "time_metrics/data_loading(s)": 0.035})
telemetry.flush(1.0)
"""


def test_a_torchtitan_dict_gives_throughput_families_top_and_a_ledger_mfu(tmp_path: Path) -> None:
    state = tmp_path / "state"
    d = DaemonProc(tmp_path, "--state-dir", str(state), interval=1.0)
    try:
        proc = subprocess.Popen([sys.executable, "-c", TORCHTITAN, d.endpoint], env=env())
        wait_for(lambda: d.value("dflash_pipeline_reported_mfu_ratio", role="trainer"), timeout_s=20,
                 what="the trainer's own MFU on /metrics")
        samples = d.samples()
        page = tmp_path / "page.txt"
        page.write_text(d.text())
        assert proc.wait(timeout=60) == 0
        wait_for(lambda: (d.value("dflash_ledger_open_gap_seconds", role="trainer") or 0) > 0, timeout_s=20,
                 what="the trainer to be gone")
    finally:
        d.stop()

    def one(name: str) -> float:
        [(_, value)] = samples["dflash_pipeline_reported_" + name]
        return value

    assert one("tokens_per_second") == 5000.0 and one("flops_per_second") == pytest.approx(120e12)
    assert one("mfu_ratio") == pytest.approx(0.4)
    lint = subprocess.run([require_tool("promtool"), "check", "metrics"], stdin=page.open(), capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint
    console = Console(width=200, record=True)
    console.print(render(samples))
    shown = console.export_text()
    assert "tok/s 5,000" in shown and "TFLOP/s 120.0" in shown and "MFU 40.0%" in shown, shown
    out = subprocess.run([sys.executable, "-m", "sidecar", "report", "--json", "--state-dir", str(state)],
                         capture_output=True, text=True, env=env(), timeout=60)
    [r] = json.loads(out.stdout)["runs"]
    s = r["seconds"]
    stepping = r["wall_s"] - s["startup"] - s["compile"] - s["unobserved"]
    # no tokens counter, no FLOPs per token: the trainer's own tokens/s and MFU over its stepping time
    assert r["tokens"] == pytest.approx(5000.0 * stepping, rel=0.01), (r, stepping)
    assert r["mfu_source"] == "trainer_mfu" and r["mfu_ratio"] == pytest.approx(0.4 * stepping / r["wall_s"])
    table = subprocess.run([sys.executable, "-m", "sidecar", "report", "--state-dir", str(state)],
                           capture_output=True, text=True, env=env(), timeout=60)
    assert "(the trainer's own)" in table.stdout, table.stdout


def _gauge(meaning: str, worker: str, value: float) -> SeriesView:
    return SeriesView(GAUGE, meaning, "trainer", worker, {"last": value, "mean": value, "count": 1.0},
                      {"last": value}, meaning)


def test_rates_add_over_workers_and_efficiency_is_their_mean_in_the_insight_and_wandb() -> None:
    series = (_gauge("tokens_per_s", "0", 4000.0), _gauge("tokens_per_s", "1", 6000.0), _gauge("mfu", "0", 0.3),
              _gauge("mfu", "1", 0.5), _gauge("steps_per_s", "0", 2.0), _gauge("steps_per_s", "1", 2.0))
    insight = compute_insight(WindowReport(10.0, 1.0, series))
    assert insight.roles["trainer"].reported == {"tokens_per_s": 10000.0, "steps_per_s": 2.0, "mfu": 0.4}
    row = insight_row(insight)
    assert row["pipeline/reported/tokens_per_s/trainer"] == 10000.0 and row["pipeline/reported/mfu/trainer"] == 0.4
    assert "pipeline/reported/samples_per_s/trainer" not in row  # not reported: absent, never 0


def test_the_ledger_takes_the_trainers_figures_only_where_it_has_none_of_its_own() -> None:
    shares = dict.fromkeys(CAUSES, 0.0) | {"productive": 1.0}
    own = {"tokens_per_s": 1000.0, "flops_per_s": 400e12, "mfu": 0.25}

    def run(tokens: float, flops_per_token: float | None) -> RunLedger:
        led = RunLedger(flops_per_token=flops_per_token)
        for end in (101, 102, 103, 104):
            sender = SenderFact("1@100", "run-1", "trainer", 100.0, end - 1.0, float(end), end)
            led.add(WindowFacts(end, 1.0, (sender,), {"trainer": RoleFact(shares, tokens=tokens, gpus=1,
                                                                          gpu_name="NVIDIA H200", reported=own)}))
        return led

    [r] = run(0.0, None).view().roles  # no tokens counter, no FLOPs per token
    assert r.wall_s == pytest.approx(4.0) and r.tokens == pytest.approx(4000.0)
    assert r.mfu_source == "trainer_mfu" and r.mfu_ratio == pytest.approx(0.25)
    [r] = run(700.0, 1e9).view().roles  # its own counter and FLOPs per token win
    assert r.tokens == pytest.approx(2800.0) and r.mfu_source == "flops_per_token"
    assert r.mfu_ratio == pytest.approx(1e9 * 700.0 / 989.4e12)
