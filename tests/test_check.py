"""``dflash-sidecar check``: one line per deployment prerequisite, exit 1 on a failure, no secrets."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.daemon_harness import DaemonProc, env, free_port, wait_for


def _check(tmp: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    e = env(HOME=str(tmp), **extra)
    e.pop("WANDB_API_KEY", None)
    e.pop("WANDB_MODE", None)
    e.update(extra)
    return subprocess.run([sys.executable, "-m", "sidecar", "check", "--endpoint", f"ipc://{tmp}/s.sock",
                           "--prometheus-addr", f"127.0.0.1:{free_port()}", *args],
                          capture_output=True, text=True, env=e, timeout=60)


def test_check_passes_on_a_cpu_box_and_reports_nvml(tmp_path: Path) -> None:
    out = _check(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[1] for line in lines] == ["endpoint", "prometheus", "nvml", "wandb"]
    assert "W&B export disabled" in out.stdout


def test_check_fails_on_a_busy_port_and_missing_credentials_without_leaking_the_key(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = _check(tmp_path, "--wandb-run", "abc123", "--prometheus-addr", f"127.0.0.1:{port}")
    assert out.returncode == 1
    assert "FAIL  prometheus" in out.stdout and "FAIL  wandb" in out.stdout and "WANDB_API_KEY" in out.stdout
    key = "f" * 40
    out = _check(tmp_path, "--wandb-run", "abc123", WANDB_API_KEY=key)
    assert out.returncode == 0 and "credentials from WANDB_API_KEY" in out.stdout
    assert key not in out.stdout + out.stderr


def test_the_daemon_without_credentials_warns_at_start_with_checks_advice_and_keeps_serving(tmp_path: Path) -> None:
    from sidecar.exporters.wandb.join import NO_CREDENTIALS

    no_key = {"HOME": str(tmp_path), "NETRC": str(tmp_path / "no-netrc"), "WANDB_API_KEY": "", "WANDB_MODE": ""}
    checked = _check(tmp_path, "--wandb-run", "abc123")  # _check runs without a key, HOME the test's folder
    assert f"FAIL  wandb      {NO_CREDENTIALS}" in checked.stdout, checked.stdout
    d = DaemonProc(tmp_path, "--wandb-run", "abc123", extra_env=no_key)
    try:
        wait_for(lambda: "WARNING" in d.log() and NO_CREDENTIALS in d.log(), what="the warning at start")
        warning = next(line for line in d.log().splitlines() if NO_CREDENTIALS in line)
        assert " WARNING " in warning and "everything else runs" in warning and "retries joining run abc123" in warning
        assert d.value("dflash_sidecar_wandb_queue_depth") is not None  # /metrics answers meanwhile
    finally:
        d.stop()
