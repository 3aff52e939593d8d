"""Abuse: what an operator's typo or a local process can do at start-up. Every numeric setting is
bounded (an ``interval`` of 1e-06 spent a core rolling windows, 1e300 closed none); a tcp endpoint
beyond loopback needs an explicit option and is warned about; an explicit endpoint in a missing
directory is refused, not created; the ipc socket is born with its final mode (no moment at 0777
under umask 0); ``HEAD /metrics`` is answered; the value bounds of docs/PROTOCOL.md are the code's."""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from sidecar.aggregation.aggregator import Aggregator
from sidecar.core import config
from sidecar.core.config import ConfigError
from sidecar.core.pipeline import ingest_records
from sidecar.exporters.prometheus.collector import ExportState
from sidecar.exporters.prometheus.server import serve
from sidecar.processing.mapping import Mapper
from sidecar.sources import receiver as receiver_mod
from sidecar.sources.receiver import EndpointError, Receiver
from tests.daemon_harness import env, free_port
from trainer_shim import wire

ROOT = Path(__file__).resolve().parent.parent
BOUNDED = [s for s in config.SETTINGS if s.bounds is not None]


def test_every_numeric_setting_declares_its_bounds() -> None:
    numeric = [s.name for s in config.SETTINGS
               if isinstance(s.default, (int, float)) and not isinstance(s.default, bool)]
    ratios = [s.name for s in config.SETTINGS if s.name.endswith(("_ratio", "_score"))]
    assert set(numeric) == {s.name for s in BOUNDED} | set(ratios), numeric
    for name in ratios:  # ratios are bounded by their own check, 0 to 1
        with pytest.raises(ConfigError, match="between 0 and 1"):
            config.load({name: "1.5"})


@pytest.mark.parametrize("setting", BOUNDED, ids=[s.name for s in BOUNDED])
def test_a_setting_outside_its_bounds_is_refused_with_the_range(setting: config.Setting) -> None:
    assert setting.bounds is not None
    low, high = setting.bounds
    assert setting.value(config.load({setting.name: str(low)})) == low
    assert setting.value(config.load({setting.name: str(high)})) == high
    step = 1 if isinstance(low, int) else (low / 2 if low else 0.5)  # a bound of 0: below it is negative
    for bad in (low - step, high * 10, math.nan):
        if isinstance(low, int) and isinstance(bad, float) and math.isnan(bad):
            continue
        with pytest.raises(ConfigError, match=f"{setting.name} must be between") as err:
            config.load({setting.name: str(bad)})
        assert f"--{setting.name.replace('_', '-')}" in str(err.value)
    assert "Range:" in config.sample_toml().split(f"# {setting.name} = ")[0].rsplit("\n\n", 1)[-1]


@pytest.mark.parametrize("value", ["1e-06", "1e300", "0", "inf"])
def test_the_absurd_intervals_of_the_report_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="interval must be between 0.1 and 3600 seconds"):
        config.load({"interval": value})


def test_a_tcp_endpoint_beyond_loopback_needs_the_option_and_is_warned_about(tmp_path: Path) -> None:
    for endpoint in ("tcp://0.0.0.0:5557", "tcp://192.0.2.1:5557", "tcp://[::]:5557"):
        with pytest.raises(ConfigError, match="not on loopback.*--endpoint-allow-remote"):
            config.load({"endpoint": [endpoint]})
    for endpoint in ("tcp://127.0.0.1:5557", "tcp://127.0.0.2:5557", "tcp://[::1]:5557"):
        assert config.load({"endpoint": [endpoint]}).endpoint == (endpoint,)
    port, http = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sidecar", "run", "--no-gpu-metrics", "--endpoint-allow-remote",
                             "--endpoint", f"tcp://0.0.0.0:{port}", "--prometheus-addr", f"127.0.0.1:{http}"],
                            env=env(), stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "dflash-sidecar started" in line:
                break
        text = "".join(lines)
        assert f"tcp://0.0.0.0:{port} binds beyond loopback" in text and "WARNING" in text, text
    finally:
        proc.terminate()
        proc.wait(10)


def test_an_explicit_endpoint_in_a_missing_directory_is_refused_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "dir"
    with pytest.raises(EndpointError, match=f"the socket directory {missing} does not exist"):
        Receiver([f"ipc://{missing}/s.sock"])
    assert not (tmp_path / "typo").exists()


def test_the_daemons_own_directory_is_still_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    r = Receiver([f"ipc://{tmp_path}/dflash-sidecar/s.sock"])
    try:
        assert os.stat(tmp_path / "dflash-sidecar").st_mode & 0o777 == 0o700
    finally:
        r.close()


def test_the_socket_is_born_with_its_final_mode_under_umask_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The mode the socket file has when bind returns, before anything else touches it: what
    # another user's connect() would have met in that moment.
    born: list[int] = []
    real_bind = receiver_mod.zmq.Socket.bind

    def bind_and_look(self, addr: str):  # noqa: ANN001, ANN202
        result = real_bind(self, addr)
        born.append(os.stat(addr[len("ipc://"):]).st_mode & 0o777)
        return result

    monkeypatch.setattr(receiver_mod.zmq.Socket, "bind", bind_and_look)
    old = os.umask(0)
    try:
        r = Receiver([f"ipc://{tmp_path}/s.sock"])
    finally:
        os.umask(old)
    try:
        assert born == [0o660], [oct(m) for m in born]
        assert os.stat(tmp_path / "s.sock").st_mode & 0o777 == 0o660
        probe = tmp_path / "after"
        probe.touch()  # the process's umask is back to what it was
        assert os.stat(probe).st_mode & 0o777 == 0o666 & ~old
    finally:
        r.close()


def _request(port: int, method: str) -> tuple[str, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"{method} /metrics HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return lines[0], headers, body


def test_head_metrics_is_answered_with_the_headers_of_get() -> None:
    port = free_port()
    server, _ = serve(ExportState(host="h", started_unix_s=0.0), f"127.0.0.1:{port}")
    try:
        status, headers, body = _request(port, "HEAD")
        assert status == "HTTP/1.1 200 OK" and body == b"", (status, body[:200])
        get_status, get_headers, get_body = _request(port, "GET")
        assert get_status == status and headers["Content-Type"] == get_headers["Content-Type"]
        assert int(headers["Content-Length"]) > 0 and abs(int(headers["Content-Length"]) - len(get_body)) < 200
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/metrics", method="POST",
                                                           data=b""), timeout=10) as resp:
            raise AssertionError(f"POST answered {resp.status}")
    except urllib.error.HTTPError as exc:
        assert exc.code == 405 and "HEAD" in exc.headers["Allow"]
    finally:
        server.shutdown()
        server.server_close()


def _protocol_bounds() -> dict[int, tuple[float, float]]:
    """Record kind -> (lowest, highest) value, as docs/PROTOCOL.md's record table states them."""
    out = {}
    for line in (ROOT / "docs" / "PROTOCOL.md").read_text().splitlines():
        m = re.match(r"\| (\d) (TIMING|COUNT|GAUGE|SCALAR) \| str \| (.*) \|$", line)
        if m:
            if (r := re.search(r"0 to ([0-9e+.]+)", m[3])) is not None:
                out[int(m[1])] = (0.0, float(r[1]))
            elif (r := re.search(r"within ±([0-9e+.]+)", m[3])) is not None:
                out[int(m[1])] = (-float(r[1]), float(r[1]))
    return out


def test_the_value_bounds_of_the_protocol_are_the_codes() -> None:
    bounds = _protocol_bounds()
    assert set(bounds) == {1, 2, 3, 5}, bounds  # every numeric kind states its bound
    agg = Aggregator()
    for kind, (low, high) in bounds.items():
        for value in (low, high):  # the stated bounds are accepted, by the daemon and by the shim's check
            accepted, rejected = ingest_records(agg, "r", "0", [[kind, f"k{kind}", value]], Mapper())
            assert accepted == 1, (kind, value, rejected)
            assert wire.record_problem(kind, f"k{kind}", value) is None
        for value in (math.nextafter(high, math.inf), 1e308, math.nextafter(low, -math.inf) if low else -1.0):
            _, rejected = ingest_records(agg, "r", "0", [[kind, f"k{kind}", value]], Mapper())
            reason = "out_of_range" if value != -1.0 else "invalid_value"
            assert rejected == {reason: 1}, (kind, value, rejected)
            assert wire.record_problem(kind, f"k{kind}", value) == reason, (kind, value)
