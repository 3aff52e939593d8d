"""``dflash-sidecar top`` as an operator meets it: in tmux at 160x50 before and after the daemon
starts, ``q`` to quit, ``--config``; and the frame itself rendered in-process at 160x50."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console

from sidecar.cli.top import Samples, no_gpu_reason, render
from sidecar.cli.top_screen import Screen, _actions, top_url
from tests.daemon_harness import ROOT, DaemonProc, free_port, publish, require_tool, wait_for


def _busy_samples(workers: int) -> Samples:
    accepted = [({"role": "drafter", "worker": f"w{i:02d}"}, 1000.0 + i) for i in range(workers)]
    dropped = [({"role": "drafter", "worker": f"w{i:02d}", "reason": reason}, float(n))
               for i in range(workers) for reason, n in (("lost_in_transit", 3), ("invalid_value", i + 1))]
    return {"dflash_sidecar_records_accepted_total": accepted, "dflash_sidecar_records_dropped_total": dropped}


def _print(screen: Screen) -> list[str]:
    console = Console(width=160, height=50, file=io.StringIO(), record=True, color_system=None)
    console.print(screen)
    return console.export_text().splitlines()


def test_at_160x50_a_long_accounting_table_scrolls_to_its_last_row() -> None:
    screen = Screen(render(_busy_samples(60)), "status")
    lines = _print(screen)
    assert len(lines) == 50, len(lines)  # 49 lines of the frame and the status line: nothing runs off
    assert "lines 1-49 of" in lines[-1] and "q quit" in lines[-1] and "scroll" in lines[-1], lines[-1]
    assert "drafter/w59" not in "\n".join(lines)
    screen.key("end")
    lines = _print(screen)
    body = "\n".join(lines[:-1])
    assert "drafter/w59" in body and "invalid_value 60" in body and "lost_in_transit 3" in body, body
    assert lines[-1].endswith("q quit · ↑↓ PgUp PgDn scroll") and f"of {screen.lines}" in lines[-1]
    screen.key("up")
    screen.key("home")
    assert "lines 1-49" in _print(screen)[-1]


def test_a_short_frame_fits_and_says_so() -> None:
    lines = _print(Screen(render(_busy_samples(3)), "status"))
    assert "drafter/w02" in "\n".join(lines) and "scroll" not in lines[-1] and len(lines) < 50


@pytest.mark.parametrize(("samples", "reason"), [
    ({}, "GPU metrics are turned off on the daemon (--no-gpu-metrics)"),
    ({"dflash_nvml_up": [({}, 0.0)], "dflash_nvml_stalled": [({}, 0.0)]}, "NVML is unavailable on the daemon's host"),
    ({"dflash_nvml_up": [({}, 0.0)], "dflash_nvml_stalled": [({}, 1.0)]}, "an NVML call is hanging"),
    ({"dflash_nvml_up": [({}, 1.0)], "dflash_nvml_stalled": [({}, 0.0)]}, "reports no GPU"),
])
def test_an_empty_gpu_table_says_why(samples: Samples, reason: str) -> None:
    assert reason in no_gpu_reason(samples)
    console = Console(width=160, file=io.StringIO(), record=True)
    console.print(render(samples))
    assert reason in console.export_text().replace("\n", " ")


def test_the_url_comes_from_url_addr_or_config(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('prometheus_addr = "0.0.0.0:9555"\n')
    assert top_url(None, None, str(cfg)) == "http://127.0.0.1:9555/metrics"
    assert top_url(None, "[::1]:9556", str(cfg)) == "http://[::1]:9556/metrics"
    assert top_url("http://h:1/metrics", "127.0.0.1:2", str(cfg)) == "http://h:1/metrics"
    assert top_url(None, None, None) == "http://127.0.0.1:9478/metrics"
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    cfg.write_text(f'prometheus_addr = "127.0.0.1:9557"\nprometheus_tls_cert = "{cert}"\n'
                   f'prometheus_tls_key = "{cert}"\n')
    assert top_url(None, None, str(cfg)) == "https://127.0.0.1:9557/metrics"


class Tmux:
    """A private tmux server (its own socket) with one 160x50 session running ``command``."""

    def __init__(self, tmp: Path, command: list[str]) -> None:
        self.tmux = require_tool("tmux")
        self.socket = str(tmp / "tmux.sock")
        env_prefix = ["env", "-u", "COLUMNS", "-u", "LINES", f"PYTHONPATH={ROOT}", "TERM=xterm-256color"]
        # The exit status through a file: tmux 3.3 does not always report a dead pane's status.
        self.status_file = tmp / "exit_status"
        self.run("new-session", "-d", "-s", "top", "-x", "160", "-y", "50",
                 " ".join(env_prefix + command) + f"; echo $? > {self.status_file}")
        self.run("set-option", "-t", "top", "remain-on-exit", "on")

    def run(self, *args: str) -> str:
        return subprocess.run([self.tmux, "-S", self.socket, *args], check=True, capture_output=True,
                              text=True, timeout=30).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top")

    def dead(self) -> tuple[str, str]:
        out = self.run("display-message", "-p", "-t", "top", "#{pane_dead} #{pane_dead_status}").split()
        return out[0], (out[1] if len(out) > 1 else "")

    def exit_status(self) -> str | None:
        """The command's exit status once it has ended, else None."""
        text = self.status_file.read_text() if self.status_file.exists() else ""
        return text.strip() or None

    def close(self) -> None:
        subprocess.run([self.tmux, "-S", self.socket, "kill-server"], check=False, capture_output=True, timeout=30)


def test_top_in_tmux_waits_for_the_daemon_shows_it_and_quits_on_q(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "sidecar.toml"
    cfg.write_text(f'prometheus_addr = "127.0.0.1:{port}"\n')
    tmux = Tmux(tmp_path, [sys.executable, "-m", "sidecar", "top", "--config", str(cfg), "--refresh", "0.5"])
    daemon = None
    try:
        wait_for(lambda: f"waiting for the daemon at http://127.0.0.1:{port}/metrics" in tmux.screen(),
                 what="top waiting for a daemon that is not up yet")
        assert tmux.dead()[0] == "0"  # still running: it waits instead of exiting
        daemon = DaemonProc(tmp_path, port=port, interval=0.5)
        res = publish(daemon.endpoint, "drafter", "7", 200)
        wait_for(lambda: f"{res['records_total']:,}" in tmux.screen() and "drafter/7" in tmux.screen(),
                 what="the accounting row of the published records: " + tmux.screen())
        shown = tmux.screen()
        assert "GPU metrics are turned off on the daemon" in shown, shown
        assert shown.rstrip().splitlines()[-1].lstrip().startswith(f"http://127.0.0.1:{port}/metrics"), shown
        assert len(shown.splitlines()) <= 50
        tmux.run("send-keys", "-t", "top", "q")
        assert wait_for(tmux.exit_status, timeout_s=60, what="top exiting on q") == "0"
    finally:
        tmux.close()
        if daemon is not None:
            daemon.stop()


def test_top_once_without_a_daemon_fails_with_the_url(tmp_path: Path) -> None:
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "sidecar", "top", "--once", "--prometheus-addr", f"127.0.0.1:{port}"],
                         check=False, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 1 and f"cannot read http://127.0.0.1:{port}/metrics" in out.stdout


def test_keys_arriving_together_or_beside_other_bytes_are_all_seen() -> None:
    # A terminal can deliver several keys, or a key beside bytes of its own reports, in one read.
    assert _actions(b"q") == ["quit"]
    assert _actions(b"jjq") == ["down", "down", "quit"]
    assert _actions(b"\x1b[Aq") == ["up", "quit"]
    assert _actions(b"\x1b[?1;2cq") == ["quit"]
    assert _actions(b"\x1b[5~\x1b[6~") == ["page_up", "page_down"]
    assert _actions(b"xyz") == []


def test_top_without_a_terminal_says_it_waits_then_prints_frames(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sidecar", "top", "--prometheus-addr", f"127.0.0.1:{port}",
                             "--refresh", "0.5"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                                       "COLUMNS": "200"})
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    daemon = None
    try:
        wait_for(lambda: any(f"waiting for the daemon at http://127.0.0.1:{port}/metrics" in line for line in out),
                 what="top saying it waits, without a terminal")
        assert proc.poll() is None  # it waits instead of exiting
        daemon = DaemonProc(tmp_path, port=port, interval=0.5)
        publish(daemon.endpoint, "drafter", "7", 50)
        wait_for(lambda: any("drafter/7" in line for line in out), what="a frame once the daemon answers")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        if daemon is not None:
            daemon.stop()
    assert sum("waiting for the daemon" in line for line in out) == 1, out  # said once, not every retry
