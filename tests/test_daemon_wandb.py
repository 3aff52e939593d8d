"""The daemon's W&B export end to end, with the real wandb library in offline mode: a trainer
process with its own offline run publishes through the shim; the daemon (``--wandb-run auto``)
follows the run id the shim announces and logs into its own offline run grouped with it; the rows
are read back from the daemon's ``.wandb`` file after SIGTERM."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from tests import wandb_records
from tests.daemon_harness import DaemonProc, env, wait_for

TRAINER = textwrap.dedent("""
    import json, sys, time, wandb
    from trainer_shim import telemetry
    run = wandb.init(project="dflash", mode="offline", dir=sys.argv[2])
    ch = telemetry.configure(endpoint=sys.argv[1], role="drafter", worker="0", flush_interval_s=0.02)
    warmups = 0
    while ch.records_total == 0:  # until a record reached the running daemon
        ch.gauge("warmup", 1.0); warmups += 1
        telemetry.flush(wait_s=1.0)
    for step in range(1, 41):
        ch.publish(step, {"forward_ms": 10.0, "loss_token_fraction": 0.25})
        ch.count("tokens", 1000)
        time.sleep(0.02)
    telemetry.flush(); time.sleep(0.5)
    print(json.dumps({"run_id": run.id, "warmups": warmups}))
    run.finish()
""")


def test_windows_reach_wandb_on_the_trainer_step_axis(tmp_path: Path) -> None:
    wandb_dir = tmp_path / "daemon-wandb"
    wandb_dir.mkdir()
    secret = "0123456789abcdef0123456789abcdef01234567"
    d = DaemonProc(tmp_path, "--wandb-run", "auto", interval=0.25,
                   extra_env={"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_SILENT": "true",
                              "WANDB_API_KEY": secret})
    try:
        out = subprocess.run([sys.executable, "-c", TRAINER, d.endpoint, str(tmp_path)], capture_output=True,
                             text=True, env=env(WANDB_SILENT="true"), timeout=120, check=True)
        trainer = json.loads(out.stdout.strip().splitlines()[-1])
        trainer_run = trainer["run_id"]
        wait_for(lambda: (d.value("dflash_sidecar_wandb_rows_logged_total") or 0) >= 3, timeout_s=60,
                 what="rows logged to W&B")
        assert d.value("dflash_sidecar_wandb_state", state="offline") == 1.0
    finally:
        d.stop()
    assert secret not in d.log()
    files = [p for p in wandb_dir.rglob("*.wandb")]
    assert len(files) == 1, files
    (run,) = wandb_records.of_type(files[0], "run")
    assert run.run_group == trainer_run and run.job_type == "sidecar" and run.run_id != trainer_run
    host = socket.gethostname()
    rows = [{k.replace(f"sidecar/{host}/", "sidecar/"): v for k, v in row.items()}
            for row in wandb_records.history_rows(files[0])]
    steps = [r["sidecar/trainer_step"] for r in rows if "sidecar/trainer_step" in r]
    assert steps == sorted(steps) and steps[-1] == 40
    forward = [r for r in rows if "sidecar/trainer/drafter/0/forward/p50_ms" in r]
    assert forward and all(r["sidecar/trainer/drafter/0/forward/p50_ms"] == 10.0 for r in forward)
    assert sum(r.get("sidecar/trainer/drafter/0/tokens/rate", 0) > 0 for r in rows) >= 1
    # 40 profiles + 40 counts + the warm-up gauges
    assert max(r.get("sidecar/self/records_accepted", 0) for r in rows) == 80 + trainer["warmups"]
    metrics = wandb_records.of_type(files[0], "metric")
    assert ("", "sidecar/*", "sidecar/trainer_step") in [(m.name, m.glob_name, m.step_metric) for m in metrics]
