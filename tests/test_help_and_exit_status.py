"""``--help`` reads right and shows defaults; the exit statuses are the README's table, each
produced by a real command (status 3, the shim-only install, by ``tests/test_shim_install.py``)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from sidecar.cli import exit_status
from sidecar.cli.options_doc import ROOT, exit_status_table
from sidecar.core import config as config_mod
from tests.daemon_harness import env, free_port


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sidecar", *args], capture_output=True, text=True, env=env(),
                          timeout=60)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_run_help_shows_each_settings_default_and_the_no_flag_reads_as_what_it_does() -> None:
    out = _run("run", "--help")
    assert out.returncode == exit_status.OK
    text = _flat(out.stdout)
    assert "--interval S Aggregation window (seconds). Range: 0.1 to 3600 seconds. Default: 10." in text, text
    assert "--no-gpu-metrics Do not poll the GPUs through NVML (a box without GPUs). Default: on; this flag " \
           "turns it off." in text
    assert "Poll the GPUs through NVML" not in text  # the setting's own words are the config file's
    for s in config_mod.SETTINGS:
        if s.flag and s.kind != "tables":
            assert "default" in s.flag_help.lower() or "unset:" in s.flag_help.lower(), s.name


def test_the_other_commands_help_shows_their_defaults() -> None:
    demo = _flat(_run("demo", "--help").stdout)
    assert "(default: none)" in demo and "simulated target workers (1-64) (default: 3)" in demo, demo
    assert "else to the default state folder's demo/" in demo
    top = _flat(_run("top", "--help").stdout)
    assert "seconds between refreshes (> 0) (default: 2.0)" in top, top


def test_the_readme_documents_the_declared_exit_statuses() -> None:
    assert exit_status_table() in (ROOT / "README.md").read_text()
    assert [s for s, _, _ in exit_status.STATUSES] == [0, 1, 2, 3]


def test_each_exit_status_from_a_real_command(tmp_path: Path) -> None:
    assert _run("sample-config").returncode == exit_status.OK
    for wrong in (["frobnicate"], ["run", "--interval", "0"], ["run", "--config", str(tmp_path / "absent.toml")],
                  ["report", "--jsn"]):
        out = _run(*wrong)
        assert out.returncode == exit_status.USAGE and "error: " in out.stderr, (wrong, out.stderr)
    assert _run("report", "--state-dir", str(tmp_path / "empty")).returncode == exit_status.FAILURE
    assert _run("top", "--once", "--prometheus-addr", f"127.0.0.1:{free_port()}").returncode == exit_status.FAILURE
    explain = _run("explain", "--prometheus-addr", f"127.0.0.1:{free_port()}")
    assert explain.returncode == exit_status.FAILURE and "explain --run ID" in explain.stdout  # the ended run's way
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        out = _run("run", "--no-gpu-metrics", "--endpoint", f"ipc://{tmp_path}/s.sock", "--state-dir",
                   str(tmp_path / "state"), "--prometheus-addr", f"127.0.0.1:{busy.getsockname()[1]}")
    assert out.returncode == exit_status.FAILURE and "Traceback" not in out.stderr, out.stderr


def test_output_cut_short_by_its_reader_ends_quietly_as_a_shell_tool_does() -> None:
    """``dflash-sidecar report | head``: the reader is gone before the command writes (the pipe's
    read end closed before it starts), so its first write fails with EPIPE; it exits with
    128 + SIGPIPE and no traceback, as ``cat`` would."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run([sys.executable, "-m", "sidecar", "sample-config"], stdout=write, stderr=subprocess.PIPE,
                             text=True, env=env(), timeout=60)
    finally:
        os.close(write)
    assert out.returncode == 128 + signal.SIGPIPE, out.stderr
    assert out.stderr == "", out.stderr
