"""CLI and start-up errors say what is wrong and what to type instead (real parser, real sockets)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli import main as cli
from sidecar.core.config import ConfigError, read_file
from sidecar.sources.receiver import EndpointError, Receiver
from tests.daemon_harness import env, free_port


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(list(argv))
    assert exc.value.code == 2, argv
    return capsys.readouterr().err


def test_an_unknown_command_is_reported_as_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(capsys, "chek")
    assert "unknown command 'chek'; did you mean 'check'?" in err, err
    assert "unrecognized arguments" not in err
    err = _error(capsys, "frobnicate")
    commands = "run, check, demo, top, explain, report, cluster, trace, sample-config"
    assert f"unknown command 'frobnicate'; commands: {commands}" in err, err


@pytest.mark.parametrize(("argv", "message"), [
    (["--endpont", "ipc:///x"], "dflash-sidecar run: error: unknown option --endpont; did you mean --endpoint?"),
    (["check", "--prometheus-adr=127.0.0.1:1"],
     "check: error: unknown option --prometheus-adr; did you mean --prometheus-addr?"),
    (["demo", "--botleneck", "queue"], "demo: error: unknown option --botleneck; did you mean --bottleneck?"),
    (["top", "--zzz"], "top: error: unknown option --zzz; see dflash-sidecar top --help"),
    (["run", "stray"], "run: error: unexpected argument 'stray'"),
])
def test_unknown_flags_suggest_the_close_match(capsys: pytest.CaptureFixture[str], argv: list[str],
                                              message: str) -> None:
    err = _error(capsys, *argv)
    assert message in err, err


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_demo_duration_must_be_positive(capsys: pytest.CaptureFixture[str], value: str) -> None:
    err = _error(capsys, "demo", "--duration", value)
    assert "argument --duration:" in err and ("must be > 0 seconds" in err or "expected seconds" in err), err


def test_unknown_config_keys_suggest_the_close_match(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('endpont = "ipc:///x"\nintervall = 3\nzzz = 1\n')
    with pytest.raises(ConfigError) as exc:
        read_file(str(path))
    msg = str(exc.value)
    assert "'endpont' (did you mean 'endpoint'?)" in msg and "'intervall' (did you mean 'interval'?)" in msg, msg
    assert "'zzz';" in msg


def test_port_examples_fit_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(capsys, "--endpoint", "tcp://127.0.0.1")
    assert "invalid --endpoint: 'tcp://127.0.0.1': expected HOST:PORT" in err, err
    assert "e.g. tcp://127.0.0.1:5557" in err, err
    assert "9478" not in err
    err = _error(capsys, "--prometheus-addr", "127.0.0.1")
    assert "e.g. 127.0.0.1:9478" in err and "tcp://" not in err, err


def test_a_tcp_endpoint_on_an_address_this_machine_lacks_gets_that_hint() -> None:
    with pytest.raises(EndpointError) as exc:
        Receiver(["tcp://192.0.2.1:5557"])  # TEST-NET-1 (RFC 5737): assigned to no machine
    msg = str(exc.value)
    assert "192.0.2.1 is not an address of this machine" in msg and "tcp://127.0.0.1:PORT" in msg, msg
    assert "another daemon" not in msg


def test_a_busy_tcp_port_names_the_cause_with_an_endpoint_example() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(EndpointError) as exc:
            Receiver([f"tcp://127.0.0.1:{port}"])
    assert "another program (or another dflash-sidecar) listens there" in str(exc.value)
    assert "e.g. tcp://127.0.0.1:5557" in str(exc.value)


def test_an_unusable_ipc_directory_names_the_socket_not_its_lock_file() -> None:
    with pytest.raises(EndpointError) as exc:
        Receiver(["ipc:///proc/x.sock"])
    msg = str(exc.value)
    assert msg.startswith("cannot create the socket ipc:///proc/x.sock:"), msg
    assert "in /proc" in msg


def test_the_demo_ends_on_its_duration_without_claiming_a_sigterm(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "sidecar", "demo", "--duration", "1", "--no-gpu-metrics",
                          "--interval", "0.5", "--endpoint", f"ipc://{tmp_path}/demo.sock",
                          "--prometheus-addr", f"127.0.0.1:{free_port()}"],
                         check=False, capture_output=True, text=True, env=env(XDG_STATE_HOME=str(tmp_path)),
                         timeout=120)  # its ledger and page in the test's folder, never the user's
    assert out.returncode == 0, out.stderr
    assert "demo ran its --duration of 1 s, flushing and exiting" in out.stderr, out.stderr
    assert "SIGTERM" not in out.stderr


def test_a_prometheus_address_this_machine_lacks_gets_that_hint(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "sidecar", "run", "--no-gpu-metrics", "--prometheus-addr",
                          "192.0.2.1:9478", "--endpoint", f"ipc://{tmp_path}/s.sock"],
                         check=False, capture_output=True, text=True, env=env(), timeout=60)
    assert out.returncode == 1
    assert "cannot serve Prometheus on 192.0.2.1:9478" in out.stderr, out.stderr
    assert "not an address of this machine; use e.g. --prometheus-addr 127.0.0.1:9478" in out.stderr
