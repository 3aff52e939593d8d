"""The default endpoint: the daemon's rule and the shim's rule agree in every case, and neither
depends on what happens to be under /run or /tmp on this machine (the system directory and the
system user are parameters here, so every case is built in the test's own directory)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_harness import env, free_port
from trainer_shim.endpoint import (
    SOCKET_NAME,
    daemon_endpoint,
    shim_endpoint,
    shim_would_miss,
)

ME = pwd.getpwuid(os.getuid()).pw_name
OTHER = "nobody" if ME != "nobody" else "root"

# (case, what is on disk, the daemon's extra environment, the endpoint both must use or "MISMATCH")
CASES = [
    ("nothing prepared", "none", {}, "user"),
    ("directory left behind by a hand-run daemon or an old check", "leftover", {}, "user"),
    ("left-behind directory with a stale regular file at the socket path", "leftover+file", {}, "user"),
    ("deployment directory (tmpfiles.d), daemon under systemd not yet bound", "deployed", {"RUNTIME_DIRECTORY": "SYS"},
     "system"),
    ("deployment directory, daemon under systemd serving", "deployed+socket", {"RUNTIME_DIRECTORY": "SYS"},
     "system"),
    ("a socket in use in a directory the system user does not own", "leftover+socket", {"RUNTIME_DIRECTORY": "SYS"},
     "system"),
    ("explicit DFLASH_SIDECAR_ENDPOINT beats a deployment", "deployed+socket",
     {"DFLASH_SIDECAR_ENDPOINT": "tcp://127.0.0.1:5557"}, "tcp://127.0.0.1:5557"),
    ("no XDG_RUNTIME_DIR: /tmp/dflash-sidecar-<uid>", "none", {"XDG_RUNTIME_DIR": ""}, "tmp"),
    ("daemon by hand on a deployed box: the one case that differs, and it is flagged", "deployed", {}, "MISMATCH"),
]


def _prepare(system_dir: Path, state: str) -> str:
    """Builds ``state`` under ``system_dir``; returns the system user name to use."""
    if state == "none":
        return OTHER
    system_dir.mkdir(mode=0o750)
    if "file" in state:
        (system_dir / SOCKET_NAME).write_text("")
    if "socket" in state:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(system_dir / SOCKET_NAME))
        s.close()  # the inode stays: what a killed or restarting daemon leaves
    return ME if state.startswith("deployed") else OTHER


@pytest.mark.parametrize(("case", "state", "daemon_env", "expected"), CASES, ids=[c[0] for c in CASES])
def test_daemon_and_shim_agree_on_the_default_endpoint(tmp_path: Path, case: str, state: str,
                                                      daemon_env: dict[str, str], expected: str) -> None:
    system_dir = tmp_path / "run" / "dflash-sidecar"
    (tmp_path / "run").mkdir()
    user = _prepare(system_dir, state)
    base = {"XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    shim_env = {**base, **{k: v for k, v in daemon_env.items() if k not in ("RUNTIME_DIRECTORY",)}}
    d_env = {**base, **{k: (str(system_dir) if v == "SYS" else v) for k, v in daemon_env.items()}}
    shim_env = {k: v for k, v in shim_env.items() if v}
    d_env = {k: v for k, v in d_env.items() if v}
    daemon = daemon_endpoint(d_env)
    shim = shim_endpoint(shim_env, str(system_dir), user)
    missed = shim_would_miss(daemon, shim_env, str(system_dir), user)
    want = {"user": f"ipc://{tmp_path}/xdg/dflash-sidecar/{SOCKET_NAME}",
            "system": f"ipc://{system_dir}/{SOCKET_NAME}",
            "tmp": f"ipc:///tmp/dflash-sidecar-{os.getuid()}/{SOCKET_NAME}"}.get(expected, expected)
    if expected == "MISMATCH":
        assert daemon == f"ipc://{tmp_path}/xdg/dflash-sidecar/{SOCKET_NAME}", case
        assert shim == missed == f"ipc://{system_dir}/{SOCKET_NAME}", case
    else:
        assert (daemon, shim) == (want, want), case
        assert missed is None, case


def test_a_trainer_unit_with_its_own_runtime_directory_does_not_look_there(tmp_path: Path) -> None:
    # RUNTIME_DIRECTORY in the trainer's environment belongs to the trainer's unit, not the daemon.
    e = {"XDG_RUNTIME_DIR": str(tmp_path), "RUNTIME_DIRECTORY": "/run/trainer"}
    assert shim_endpoint(e, str(tmp_path / "absent"), OTHER) == f"ipc://{tmp_path}/dflash-sidecar/{SOCKET_NAME}"


def _as_nobody(fn: Callable[[], bool]) -> bool:
    """``fn()`` in a forked child that dropped root for the unprivileged user ``nobody`` (root may
    enter any directory, so the rule's permission case needs a user who may not)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery past this point, only os._exit
        code = 2
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)
            os.write(write, b"1" if fn() else b"0")
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as r:
        answer = r.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and answer in (b"0", b"1"), (status, answer)
    return answer == b"1"


NOBODY = pwd.getpwnam("nobody")


def test_a_deployment_directory_this_user_cannot_enter_is_not_chosen(tmp_path: Path) -> None:
    root = os.geteuid() == 0
    # As root the case runs as ``nobody``, who must be able to reach the directory's parent.
    base = Path(tempfile.mkdtemp(prefix="dflash-rule-", dir="/tmp")) if root else tmp_path
    try:
        base.chmod(0o755)
        system_dir = base / "dflash-sidecar"
        system_dir.mkdir(mode=0o600)
        owner = pwd.getpwuid(system_dir.stat().st_uid).pw_name
        e = {"XDG_RUNTIME_DIR": str(base / "xdg")}

        def rule_skips_it() -> bool:
            return shim_endpoint(e, str(system_dir), owner) == daemon_endpoint(e)

        assert _as_nobody(rule_skips_it) if root else rule_skips_it()
    finally:
        if root:
            shutil.rmtree(base)


def _check(tmp: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    e = env(**{"XDG_RUNTIME_DIR": str(tmp / "xdg"), "DFLASH_SIDECAR_ENDPOINT": "", "RUNTIME_DIRECTORY": "", **extra})
    return subprocess.run([sys.executable, "-m", "sidecar", "check", "--no-gpu-metrics",
                           "--prometheus-addr", f"127.0.0.1:{free_port()}", *args],
                          check=False, capture_output=True, text=True, env=e, timeout=60)


def test_check_leaves_no_socket_directory_behind(tmp_path: Path) -> None:
    out = _check(tmp_path, "--endpoint", f"ipc://{tmp_path}/a/b/sidecar.sock")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"would create {tmp_path}/a, {tmp_path}/a/b" in out.stdout
    assert not (tmp_path / "a").exists()
    (tmp_path / "xdg").mkdir()
    out = _check(tmp_path)  # the default endpoint: the per-user directory
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"can bind ipc://{tmp_path}/xdg/dflash-sidecar/{SOCKET_NAME}" in out.stdout
    assert list((tmp_path / "xdg").iterdir()) == []
    existing = tmp_path / "mine"
    existing.mkdir(mode=0o700)
    out = _check(tmp_path, "--endpoint", f"ipc://{existing}/s.sock")
    assert out.returncode == 0 and list(existing.iterdir()) == [], out.stdout + out.stderr


def test_check_reports_a_directory_it_cannot_create(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = _check(tmp_path, "--endpoint", f"ipc://{blocker}/sub/s.sock")
    assert out.returncode == 1
    assert f"FAIL  endpoint   cannot create the socket directory {blocker}/sub" in out.stdout
