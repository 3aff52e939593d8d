"""Abuse: what the daemon exposes. The Prometheus endpoint listens on loopback unless told
otherwise and serves TLS when configured; a W&B API key never shows in the daemon's logs (its
own and wandb's), in ``dflash-sidecar check`` or in the metrics."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc, env, free_port, publish, self_signed_cert, wait_for

DEFAULT_PORT = 9478


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets ``pid`` listens on, from its /proc/<pid>/net tables
    (its own network namespace) and its file descriptors."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            raw = bytes.fromhex(addr_hex)
            if width == 8:
                addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:
                addr = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            out.add((addr, int(port_hex, 16)))
    return out


def _wait_listening(pid: int, port: int) -> set[tuple[str, int]]:
    return wait_for(lambda: {a for a in listening(pid) if a[1] == port}, timeout_s=20, what=f"a listener on {port}")


def _in_fresh_netns() -> list[str] | None:
    """A command prefix running in a new network namespace with loopback up (so that the default
    port is free whatever else runs on this box), or None where that is not allowed."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if not unshare or not ip or os.geteuid() != 0:
        return None
    probe = subprocess.run([unshare, "-n", ip, "link", "set", "lo", "up"], capture_output=True)
    if probe.returncode != 0:
        return None
    return [unshare, "-n", "sh", "-c", f'{ip} link set lo up && exec "$0" "$@"']


def test_prometheus_listens_on_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "sidecar", "run", "--no-gpu-metrics", "--endpoint", f"ipc://{tmp_path}/s.sock"]
    prefix = _in_fresh_netns()
    if prefix is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", DEFAULT_PORT)) == 0:
                pytest.skip("cannot isolate the network namespace and port 9478 is in use")
        prefix = []
    # no --prometheus-addr at all: the built-in default
    proc = subprocess.Popen(prefix + base, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_listening(proc.pid, DEFAULT_PORT) == {("127.0.0.1", DEFAULT_PORT)}
    finally:
        proc.terminate()
        proc.wait(10)
    # a port without a host is still loopback; an explicit wildcard is what opens it up
    port = free_port()
    d = DaemonProc(tmp_path, "--prometheus-addr", f":{port}", port=port)
    try:
        assert _wait_listening(d.proc.pid, port) == {("127.0.0.1", port)}
    finally:
        d.stop()
    port = free_port()
    d = DaemonProc(tmp_path, "--prometheus-addr", f"0.0.0.0:{port}", port=port)
    try:
        assert _wait_listening(d.proc.pid, port) == {("0.0.0.0", port)}
    finally:
        d.stop()
    check = subprocess.run([sys.executable, "-m", "sidecar", "check", "--no-gpu-metrics", "--prometheus-addr",
                            f"0.0.0.0:{free_port()}", "--endpoint", f"ipc://{tmp_path}/c.sock"],
                           capture_output=True, text=True, env=env(), timeout=60)
    assert "not loopback: reachable from the network" in check.stdout, check.stdout


def test_prometheus_serves_tls_when_configured(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    port = free_port()
    d = DaemonProc(tmp_path, "--prometheus-tls-cert", str(cert), "--prometheus-tls-key", str(key), port=port,
                   wait=False)
    try:
        url = f"https://127.0.0.1:{port}/metrics"
        trusted = ssl.create_default_context(cafile=str(cert))

        def fetch() -> str | None:
            try:
                with urllib.request.urlopen(url, timeout=5, context=trusted) as resp:
                    return resp.read().decode()
            except (OSError, ssl.SSLError):
                if d.proc.poll() is not None:
                    raise AssertionError(d.log()) from None
                return None

        text = wait_for(fetch, timeout_s=30, what="metrics over https")
        assert "dflash_sidecar_start_time_seconds" in text
        wait_for(lambda: "(TLS)" in d.log(), timeout_s=30, what="the start-up line naming TLS")  # logged after bind
        with pytest.raises(urllib.error.URLError) as err:  # a client without that CA refuses the server
            urllib.request.urlopen(url, timeout=5, context=ssl.create_default_context())
        assert "CERTIFICATE_VERIFY_FAILED" in str(err.value)
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):  # and plain http gets nothing
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        d.stop()


SECRET = "5ec7e7-do-not-leak-0123456789abcdef0123456789"


def test_the_wandb_api_key_never_shows(tmp_path: Path) -> None:
    wandb_dir = tmp_path / "wandb"
    wandb_dir.mkdir()
    secret_env = {"WANDB_API_KEY": SECRET, "WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir),
                  "WANDB_SILENT": "true"}
    d = DaemonProc(tmp_path, "--wandb-run", "secret-test-run", "--log-level", "debug", extra_env=secret_env)
    try:
        res = publish(d.endpoint, "drafter", "0", 300)
        wait_for(lambda: d.value("dflash_sidecar_records_accepted_total") == res["records_total"], what="ingest")
        wait_for(lambda: (d.value("dflash_sidecar_wandb_rows_logged_total") or 0) >= 1, timeout_s=60,
                 what="a row logged to W&B")
        metrics = d.text()
        with open(f"/proc/{d.proc.pid}/environ", "rb") as f:
            assert SECRET.encode() in f.read()  # it was there to leak
    finally:
        d.stop()
    assert SECRET not in metrics
    assert SECRET not in d.log()
    leaked = [str(p) for p in wandb_dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaked == [], f"the key was written to {leaked}"
    for mode in ("online", "offline"):
        out = subprocess.run([sys.executable, "-m", "sidecar", "check", "--no-gpu-metrics", "--wandb-run", "abc",
                              "--prometheus-addr", f"127.0.0.1:{free_port()}", "--endpoint",
                              f"ipc://{tmp_path}/check.sock", "--log-level", "debug"],
                             capture_output=True, text=True, env=env(**{**secret_env, "WANDB_MODE": mode}), timeout=60)
        assert SECRET not in out.stdout + out.stderr
        assert "wandb" in out.stdout
