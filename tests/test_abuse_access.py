"""Abuse: who may talk to the daemon. Another local user cannot connect to the default ipc
endpoint, and cannot set a trap for it (a socket directory or lock file prepared in advance).

The other user is ``nobody``: the test forks and the child drops to that uid with ``os.setuid``
(no exec: the venv's interpreter may live where ``nobody`` cannot read). Needs root."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from tests.daemon_harness import DaemonProc, publish, wait_for
from trainer_shim.endpoint import daemon_endpoint

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def as_nobody(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``fn`` in a forked child that has become ``nobody``; returns its JSON-able result."""
    nobody = pwd.getpwnam("nobody")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            out = {"uid": os.getuid(), **fn()}
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            out = {"error": repr(exc)}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """A runtime directory every user may traverse, like /run/user/<uid> or /tmp: only the
    daemon's own permissions can then keep ``nobody`` out."""
    path = Path(tempfile.mkdtemp(prefix="dflash-abuse-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _daemon_env(runtime: Path) -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": str(runtime), "DFLASH_SIDECAR_ENDPOINT": "", "RUNTIME_DIRECTORY": ""}


def test_another_user_cannot_connect_to_the_default_endpoint(tmp_path: Path, runtime_dir: Path) -> None:
    env = _daemon_env(runtime_dir)
    endpoint = daemon_endpoint({**os.environ, **env})
    sock_path = endpoint[len("ipc://"):]
    d = DaemonProc(tmp_path, endpoint=False, extra_env=env)  # no --endpoint: the default one
    try:
        assert Path(sock_path).exists(), d.log()

        def attempt() -> dict[str, Any]:
            os.listdir(runtime_dir)  # raises if nobody could not even reach the runtime directory
            out: dict[str, Any] = {"can_list_runtime_dir": True}
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock_path)
                out["connect"] = "connected"
            except OSError as exc:
                out["connect"] = errno.errorcode.get(exc.errno, str(exc.errno))
            finally:
                s.close()
            ctx = zmq.Context()
            pub = ctx.socket(zmq.XPUB)
            monitor = pub.get_monitor_socket()
            pub.connect(endpoint)
            events: set[int] = set()
            subscribed = False
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and not subscribed:
                subscribed = bool(pub.poll(100))
                while monitor.poll(0):
                    events.add(recv_monitor_message(monitor)["event"])
            pub.send(b"\x9a\x01\x02")  # would be counted as malformed if it got through
            out["zmq_connected"] = zmq.EVENT_CONNECTED in events
            out["zmq_subscription_seen"] = subscribed
            pub.disable_monitor()
            monitor.close(0)
            pub.close(0)
            ctx.term()
            return out

        result = as_nobody(attempt)
        assert result.get("uid") == pwd.getpwnam("nobody").pw_uid, result
        assert result["can_list_runtime_dir"], result     # the way to the socket is open...
        assert result["connect"] == "EACCES", result      # ...the daemon's private directory is not
        assert not result["zmq_connected"] and not result["zmq_subscription_seen"], result
        # root, the trainer's user here, is accepted on the same endpoint
        res = publish(endpoint, "drafter", "0", 200)
        wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="drafter", worker="0")
                 == res["records_total"], what="root's records")
        assert d.value("dflash_sidecar_messages_dropped_total") is None  # nothing from nobody arrived
        mode = os.stat(Path(sock_path).parent).st_mode & 0o777
        assert mode == 0o700, oct(mode)
    finally:
        d.stop()


def test_a_socket_directory_prepared_by_another_user_is_refused(tmp_path: Path, runtime_dir: Path) -> None:
    # /tmp/dflash-sidecar-<uid> (or $XDG_RUNTIME_DIR/dflash-sidecar) created first by someone else:
    # they could swap the socket for their own and read every trainer's telemetry.
    trap = runtime_dir / "dflash-sidecar"
    trap.mkdir(mode=0o777)
    trap.chmod(0o777)
    nobody = pwd.getpwnam("nobody")
    os.chown(trap, nobody.pw_uid, nobody.pw_gid)
    assert _refused(DaemonProc(tmp_path, endpoint=False, extra_env=_daemon_env(runtime_dir), wait=False),
                    f"refusing the socket directory {trap}: it is owned by uid {nobody.pw_uid}")
    assert not (trap / "sidecar.sock").exists()
    os.chown(trap, 0, 0)  # ours now, but still writable by anyone
    assert _refused(DaemonProc(tmp_path, endpoint=False, extra_env=_daemon_env(runtime_dir), wait=False),
                    "writable by other users (mode 0777) without the sticky bit")


def _refused(d: DaemonProc, message: str) -> bool:
    """The daemon exited 1 saying ``message``; a daemon that started anyway is killed."""
    try:
        code = d.proc.wait(20)
    except subprocess.TimeoutExpired:
        d.stop(signal.SIGKILL)
        raise AssertionError(f"the daemon started instead of refusing:\n{d.log()}") from None
    d.stop()
    assert code == 1 and message in d.log(), d.log()
    return True


def _hold_lock_as_nobody(path: Path) -> tuple[int, int]:
    """A child process, become ``nobody``, that creates ``path`` and holds an exclusive flock on
    it until the returned pipe's write end is closed. Returns (pid, write fd)."""
    nobody = pwd.getpwnam("nobody")
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(ready_r)
            os.close(hold_w)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(ready_w, b"1")
            os.read(hold_r, 1)  # until the parent closes its end
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(hold_r)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    return pid, hold_w


@pytest.mark.parametrize("trap", ["symlink", "held lock"])
def test_what_another_user_left_in_a_shared_directory_neither_stops_nor_fools_the_daemon(
        tmp_path: Path, runtime_dir: Path, trap: str) -> None:
    # A shared sticky directory (like /tmp) is allowed for an explicit endpoint, but whatever
    # another user left there is not trusted: their symlink must not make root truncate a file,
    # and a lock file they created (and hold) first must not keep the daemon from starting.
    shared = runtime_dir / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    lock = shared / "sidecar.sock.lock"
    holder = None
    if trap == "symlink":
        lock.symlink_to(victim)
        nobody = pwd.getpwnam("nobody")
        os.lchown(lock, nobody.pw_uid, nobody.pw_gid)
    else:
        holder = _hold_lock_as_nobody(lock)
    private = runtime_dir / "private"
    private.mkdir(mode=0o700)
    d = DaemonProc(tmp_path, endpoint=f"ipc://{shared}/sidecar.sock", extra_env={"XDG_RUNTIME_DIR": str(private)})
    try:
        res = publish(d.endpoint, "drafter", "0", 100)
        wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="drafter") == res["records_total"],
                 what="records on the shared-directory endpoint")
        # its lock lives in its own private directory, where nobody else can create it first
        locks = list((private / "dflash-sidecar").glob("*.lock"))
        assert len(locks) == 1 and fcntl_locked(locks[0]), locks
        # a second daemon of this user on the same path still finds it taken
        second = DaemonProc(tmp_path, endpoint=d.endpoint, extra_env={"XDG_RUNTIME_DIR": str(private)}, wait=False)
        assert _refused(second, "already serves")
    finally:
        d.stop()
        if holder is not None:
            os.close(holder[1])
            os.waitpid(holder[0], 0)
        assert victim.read_text() == "precious\n"
    assert not list((private / "dflash-sidecar").glob("*.lock"))  # removed at exit


def fcntl_locked(path: Path) -> bool:
    """Whether some process holds an exclusive flock on ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False
