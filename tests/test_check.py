"""``dflash-sidecar check``: one line per deployment prerequisite, exit 1 on a failure, no secrets."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.daemon_harness import env, free_port


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
