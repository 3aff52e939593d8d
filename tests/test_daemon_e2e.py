"""The daemon end to end: real daemon process, real shim publisher processes, real sockets."""

from __future__ import annotations

import math
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc, env, free_port, publish, require_tool, wait_for
from tests.launcher import http_get


def _role_totals(d: DaemonProc, role: str, worker: str) -> tuple[float, dict[str, float]]:
    s = d.samples()
    accepted = sum(v for lab, v in s["dflash_sidecar_records_accepted_total"]
                   if lab["role"] == role and lab["worker"] == worker)
    dropped = {lab["reason"]: v for lab, v in s["dflash_sidecar_records_dropped_total"]
               if lab["role"] == role and lab["worker"] == worker}
    return accepted, dropped


def test_every_record_is_accounted_for_over_ipc_and_tcp(tmp_path: Path) -> None:
    tcp = f"tcp://127.0.0.1:{free_port()}"
    ipc = f"ipc://{tmp_path}/sidecar.sock"
    d = DaemonProc(tmp_path, "--endpoint", tcp, endpoint=ipc)
    try:
        bad = [["timing", "nan_ms", math.nan], ["count", "neg", -1], ["gauge", "", 1.0],
               ["gauge", "x" * 300, 1.0], ["gauge", "str_value", "high"], ["timing", "inf_ms", math.inf]]
        results = {"ipc": publish(ipc, "drafter", "0", 2000, bad), "tcp": publish(tcp, "target", "1", 1500)}
        for (role, worker), res in zip([("drafter", "0"), ("target", "1")], results.values()):
            def settled(role=role, worker=worker, res=res):
                accepted, dropped = _role_totals(d, role, worker)
                return (accepted + sum(dropped.values()) == res["calls"]) and (accepted, dropped)
            accepted, dropped = wait_for(settled, what=f"{role}/{worker} accounting")
            # sent == received + losses counted, exactly, and here nothing was lost in transit
            assert accepted + sum(dropped.values()) == res["calls"]
            assert res["records_total"] + sum(res["dropped"].values()) == res["calls"]
        accepted, dropped = _role_totals(d, "drafter", "0")
        assert dropped.get("invalid_value") == 4   # NaN, negative count, str gauge, inf
        assert dropped.get("bad_name") == 2        # empty and 300-byte names
        assert d.value("dflash_trainer_tokens_total", role="drafter", worker="0") == 2000 * 10
        assert d.value("dflash_trainer_tokens_total", role="target", worker="1") == 1500 * 10
        assert d.value("dflash_trainer_forward_seconds_count", role="target", worker="1") == 1500
        # dflash_trainer_step is shown for live senders only: tests/test_daemon_live.py
    finally:
        d.stop()


def test_a_second_daemon_refuses_the_endpoint_of_a_running_one(tmp_path: Path) -> None:
    first = DaemonProc(tmp_path)
    try:
        second = DaemonProc(tmp_path, endpoint=first.endpoint, wait=False)
        assert second.proc.wait(20) == 1
        assert "already serves" in second.log() and str(first.proc.pid) in second.log()
        first.wait_ready()  # still serving, still owning its socket
        res = publish(first.endpoint, "drafter", "0", 100)
        wait_for(lambda: sum(_role_totals(first, "drafter", "0")[1].values()) + _role_totals(first, "drafter", "0")[0]
                 == res["calls"], what="first daemon still ingests")
    finally:
        first.stop()


def test_a_stale_socket_from_a_killed_daemon_is_taken_over(tmp_path: Path) -> None:
    first = DaemonProc(tmp_path)
    first.stop(signal.SIGKILL)
    assert Path(first.endpoint[len("ipc://"):]).exists()
    second = DaemonProc(tmp_path, endpoint=first.endpoint)
    try:
        res = publish(second.endpoint, "target", "0", 50)
        wait_for(lambda: _role_totals(second, "target", "0")[0] == res["calls"], what="ingest after takeover")
    finally:
        second.stop()


def test_exposition_passes_promtool(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    d = DaemonProc(tmp_path)
    try:
        publish(d.endpoint, "drafter", "0", 300, [["gauge", "weird name/with.dots", 1.0]])
        wait_for(lambda: d.value("dflash_trainer_tokens_total") == 3000, what="data")
        out = subprocess.run([promtool, "check", "metrics"], input=d.text(), capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout == "" and out.stderr == "", out.stdout + out.stderr
    finally:
        d.stop()


def test_real_prometheus_scrapes_exact_values(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    d = DaemonProc(tmp_path)
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: sidecar\n    static_configs: [{{targets: ['127.0.0.1:{d.port}']}}]\n")
    prom = subprocess.Popen([prometheus, f"--config.file={tmp_path}/prometheus.yml",
                             f"--storage.tsdb.path={tmp_path}/data", f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prom.log", "wb"))
    try:
        res = publish(d.endpoint, "drafter", "3", 1234)
        import json
        import urllib.parse

        def query(expr: str) -> list[dict]:
            url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            try:
                return json.loads(http_get(url))["data"]["result"]
            except OSError:
                return []

        def tokens():
            r = query('dflash_trainer_tokens_total{role="drafter",worker="3"}')
            return r and float(r[0]["value"][1]) == 12340 and r
        result = wait_for(tokens, timeout_s=40, interval_s=0.5, what="Prometheus to scrape the tokens counter")
        assert result[0]["metric"]["job"] == "sidecar"
        accepted = wait_for(lambda: query('dflash_sidecar_records_accepted_total{role="drafter"}'), timeout_s=20)
        assert float(accepted[0]["value"][1]) == res["records_total"]
    finally:
        prom.terminate()
        prom.wait(10)
        d.stop()


def test_sigterm_flushes_the_last_window_and_exits_promptly(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, interval=3600)  # the only window that closes is the final one
    publish(d.endpoint, "drafter", "0", 500)
    time.sleep(0.5)
    d.stop()  # fails if it does not exit by itself within the harness's limit
    assert d.proc.returncode == 0
    log = d.log()
    assert "SIGTERM received" in log and "step 400" in log and "dflash-sidecar stopped" in log
    # promptly: no part of the shutdown waited out its time limit (a wall-clock bound would
    # measure the machine's load, not the daemon)
    assert "did not stop within" not in log and " ERROR " not in log, log


def test_sighup_reloads_the_config_and_rejects_a_bad_one(tmp_path: Path) -> None:
    cfg = tmp_path / "sidecar.toml"
    cfg.write_text("interval = 3600\n")
    d = DaemonProc(tmp_path, "--config", str(cfg), interval=None)
    try:
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reloaded (no reloadable change)" in d.log(), what="reload")
        # prometheus_addr is also given as a flag: the flag keeps precedence over the file
        cfg.write_text("interval = 0.3\nmax_series = 50\nprometheus_addr = '127.0.0.1:1'\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reloaded (interval); needs a restart to apply: max_series" in d.log(),
                 what="reload of a reloadable setting")
        wait_for(lambda: d.log().count("| 0 dropped") >= 2, what="windows at the new interval")
        cfg.write_text("interval = -1\n")
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload rejected" in d.log(), what="rejected reload")
        assert "--interval" in d.log()
        d.wait_ready()
    finally:
        d.stop()


@pytest.mark.parametrize("args, message", [
    (["--interval", "-1"], "invalid --interval: '-1': interval must be between 0.1 and 3600 seconds"),
    (["--prometheus-addr", "nohost"], "expected HOST:PORT"),
    (["--endpoint", "http://x"], "expected ipc:///path/to/socket or tcp://HOST:PORT"),
    (["--prometheus-tls-cert", "/nonexistent"], "must be given together"),
    (["--max-series", "many"], "invalid --max-series"),
])
def test_invalid_options_are_rejected_at_start(tmp_path: Path, args: list[str], message: str) -> None:
    out = subprocess.run([sys.executable, "-m", "sidecar", *args], capture_output=True, text=True, env=env(),
                         timeout=30)
    assert out.returncode == 2
    assert message in out.stderr


def test_a_bad_config_file_is_rejected_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("intervall = 5\n")
    out = subprocess.run([sys.executable, "-m", "sidecar", "--config", str(cfg)], capture_output=True, text=True,
                         env=env(), timeout=30)
    assert out.returncode == 2 and "unknown setting(s) 'intervall' (did you mean 'interval'?)" in out.stderr
    cfg.write_text("interval = [\n")
    out = subprocess.run([sys.executable, "-m", "sidecar", "--config", str(cfg)], capture_output=True, text=True,
                         env=env(), timeout=30)
    assert out.returncode == 2 and "is not valid TOML" in out.stderr


def test_a_busy_prometheus_port_is_a_clear_start_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        d = DaemonProc(tmp_path, port=busy.getsockname()[1], wait=False)
        assert d.proc.wait(20) == 1
    assert "cannot serve Prometheus" in d.log() and "--prometheus-addr" in d.log()


def test_readiness_is_notified_to_systemd(tmp_path: Path) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    notify.bind(path)
    notify.settimeout(20)
    d = DaemonProc(tmp_path, extra_env={"NOTIFY_SOCKET": path})
    try:
        assert notify.recv(4096).startswith(b"READY=1")
    finally:
        d.stop()
        assert notify.recv(4096) == b"STOPPING=1"
        notify.close()
