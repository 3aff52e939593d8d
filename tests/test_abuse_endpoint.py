"""Abuse: the metrics endpoint (loopback, no authentication: any local user is a client) cannot be
stalled or killed. A silent TLS client stops neither scrapes nor SIGTERM; idle connections never
take the descriptors ZeroMQ needs nor a thread each; a burst of scrapes finds room in the listen
backlog."""

from __future__ import annotations

import concurrent.futures
import socket
import ssl
import subprocess
import urllib.request
from pathlib import Path

from tests.daemon_harness import DaemonProc, publish, require_tool, self_signed_cert, wait_for


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def test_a_silent_tls_client_stops_no_scrape_and_no_sigterm(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    d = DaemonProc(tmp_path, "--prometheus-tls-cert", str(cert), "--prometheus-tls-key", str(key), wait=False)
    trusted = ssl.create_default_context(cafile=str(cert))
    url = f"https://127.0.0.1:{d.port}/metrics"

    def fetch() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5, context=trusted) as resp:
                return b"dflash_sidecar_start_time_seconds" in resp.read()
        except OSError:
            return False

    silent = []
    try:
        wait_for(fetch, timeout_s=30, what="metrics over https")
        for _ in range(3):  # connected, never a byte of handshake
            silent.append(socket.create_connection(("127.0.0.1", d.port)))
        answered = sum(fetch() for _ in range(10))
        assert answered == 10, f"{answered} of 10 scrapes answered with silent TLS clients connected"
    finally:
        d.stop(timeout_s=10)  # raises if SIGTERM does not end it
        for s in silent:
            s.close()
    assert d.proc.returncode == 0, d.log()


def test_idle_connections_take_neither_descriptors_nor_threads(tmp_path: Path) -> None:
    """Under ``nofile=512``, 600 idle connections: scrapes still answer, the thread count stays
    small, and a trainer connecting afterwards is counted (libzmq aborts the process when it cannot
    accept a connection for want of a descriptor)."""
    d = DaemonProc(tmp_path, nofile=512)
    idle = []
    try:
        base_threads = _threads(d.proc.pid)
        for _ in range(600):
            try:
                idle.append(socket.create_connection(("127.0.0.1", d.port), timeout=5))
            except OSError:
                pass  # refused or the backlog is full: that is the daemon defending itself
        answered, errors = 0, []
        for _ in range(5):
            try:  # a loaded 2-core box can hold one scrape past 5 s; an idle-connection stall holds it for good
                d.text(timeout_s=20)
                answered += 1
            except OSError as exc:
                errors.append(repr(exc))
        assert answered == 5, (f"{answered} of 5 scrapes answered with {len(idle)} idle connections: {errors}\n"
                               f"{d.log()[-2000:]}")
        assert _threads(d.proc.pid) <= base_threads + 4, "a thread per connection"
        res = publish(d.endpoint, "trainer", "0", 200)
        wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="trainer") == res["records_total"],
                 what="the trainer's records")
        assert d.proc.poll() is None, d.log()
        closed = {lab["reason"]: v for lab, v in d.samples()["dflash_sidecar_http_connections_closed_early_total"]}
        assert sum(closed.values()) > 0, closed  # counted, by reason
    finally:
        for s in idle:
            s.close()
        d.stop()
    assert d.proc.returncode == 0, d.log()


def test_a_burst_of_scrapes_finds_room_in_the_listen_backlog(tmp_path: Path) -> None:
    ss = require_tool("ss")
    d = DaemonProc(tmp_path)
    try:
        out = subprocess.run([ss, "-ltnH", f"sport = :{d.port}"], capture_output=True, text=True, check=True).stdout
        backlog = int(out.split()[2])  # a listening socket's Send-Q is its backlog
        assert backlog == 128, out

        def scrape(_: int) -> bool:
            try:
                return "dflash_sidecar_start_time_seconds" in d.text()
            except OSError:
                return False

        with concurrent.futures.ThreadPoolExecutor(200) as pool:
            answered = sum(pool.map(scrape, range(200)))
        assert answered == 200, f"{answered} of 200 concurrent scrapes answered"
    finally:
        d.stop()
