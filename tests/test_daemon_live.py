"""What the daemon shows after a trainer restart: the live runs' steps and senders, not a killed
run's (docs/METRICS.md, "Live senders"). Real daemon, real shim processes, a real SIGKILL."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.daemon_harness import DaemonProc, env, wait_for

RUN = textwrap.dedent("""
    import json, sys, time
    from trainer_shim import telemetry
    spec = json.loads(sys.argv[1])
    ch = telemetry.configure(endpoint=spec["endpoint"], role="drafter", worker="0", flush_interval_s=0.02)
    while ch.records_total == 0:  # until a record reached the daemon
        ch.gauge("warmup", 1.0)
        telemetry.flush(wait_s=1.0)
    for step in range(0, spec["last"] + 1, 2):
        ch.publish(step, {"forward_ms": 1.0})
    telemetry.flush(wait_s=1.0)
    print("published", flush=True)
    time.sleep(600)  # alive: heartbeats keep it live until the test kills it
""")


def _run(endpoint: str, last: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", RUN, json.dumps({"endpoint": endpoint, "last": last})],
                            stdout=subprocess.PIPE, text=True, env=env())


def test_a_restarted_run_shows_its_own_step_and_the_killed_sender_is_not_counted(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, interval=0.5)
    runs: list[subprocess.Popen[str]] = []
    try:
        runs.append(_run(d.endpoint, 574))
        wait_for(lambda: d.value("dflash_trainer_step", role="drafter", worker="0") == 574, timeout_s=30,
                 what="the first run's step")
        assert d.value("dflash_sidecar_senders") == 1
        runs[0].kill()  # SIGKILL: no goodbye, the daemon only stops hearing from it
        runs[0].wait()
        runs.append(_run(d.endpoint, 300))
        wait_for(lambda: (d.value("dflash_trainer_step", role="drafter", worker="0"),
                          d.value("dflash_sidecar_senders")) == (300, 1),
                 timeout_s=40, what="the restarted run's step and one live sender")
        wait_for(lambda: "1 senders" in d.log().splitlines()[-1] and "step 300" in d.log().splitlines()[-1],
                 timeout_s=10, what="the console line")
    finally:
        for p in runs:
            p.kill()
            p.wait()
        d.stop()


def test_the_scrape_state_reads_the_wandb_exporter_it_was_handed() -> None:
    """The W&B exporter is wired by its own parameter (None: W&B is off), never found by a name."""
    from sidecar.core.pipeline import Pipeline
    from sidecar.core.scrape_state import ScrapeState
    from sidecar.exporters.wandb.exporter import WandbConfig, WandbExporter

    wandb = WandbExporter(WandbConfig(run="r", offline=True), host="h")
    scraped = ScrapeState()
    assert scraped.wandb_stats() is None and scraped.ingest_health() is None  # nothing attached yet
    scraped.attach(ingest=Pipeline(), wandb=wandb, admin=None)  # type: ignore[arg-type]
    assert scraped.wandb_stats() == wandb.stats()
    assert scraped.ingest_health() is not None
    off = ScrapeState()
    off.attach(ingest=Pipeline(), wandb=None, admin=None)  # type: ignore[arg-type]
    assert off.wandb_stats() is None
