"""Every loss counted where a trainer process really ends (issue 22: exits while the daemon is
behind, SIGTERM as ``Pool.terminate()`` sends it, SIGKILL and ``os.abort()``, short-lived processes
that never saw a subscription). Real daemon, real shim processes, real ZeroMQ; the daemon books
what never arrived from the senders' ledgers (``<socket>.ledger/``). The cases live in
``tests/soak/exits.py`` (``bench/soak.py --exits`` runs them at full size).

Each compares the calls the trainer processes made with what the daemon exports for their role:
``records_accepted_total + Σ records_dropped_total{reason}``. One daemon serves all four (each
case has its own role), which keeps the file to about half a minute.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc, env
from tests.soak import exits


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path_factory.mktemp("exits"))
    yield d
    d.stop()


def test_exit_while_the_daemon_is_stalled(daemon: DaemonProc) -> None:
    """A trainer exits normally while the daemon is stopped: its last frames die in its ZeroMQ
    queue at the exit linger. Booked as ``lost_at_exit``, exactly."""
    r = exits.stall_exit(daemon, records=30_000)
    assert r.counted == r.made, r
    assert r.dropped.get("lost_at_exit", 0) > 0, r  # the case really happened


def test_pool_terminate(daemon: DaemonProc) -> None:
    """``Pool.terminate()`` SIGTERMs workers with records queued: the shim's SIGTERM handler writes
    the final ledger and the process still dies of the signal; exact, as ``lost_at_exit``."""
    r = exits.pool_terminate(daemon, workers=3, records=5000)
    assert r.counted == r.made, r
    assert r.dropped.get("lost_at_exit", 0) >= 3 * 5000, r


def test_sigkill_is_bounded_by_one_flush(daemon: DaemonProc) -> None:
    """SIGKILL and ``os.abort()`` with frames stuck behind a stopped daemon: what the last ledger
    holds is booked as ``ended_unclean``; only what was made after the last flush is unknown, and
    here that is exactly the tail each published without flushing (not in ``made``)."""
    r = exits.unclean(daemon, flushes=200, per_flush=500, tail=250)
    assert r.counted == r.made, r
    assert r.dropped.get("ended_unclean", 0) > 0, r


def test_short_lived_processes(daemon: DaemonProc) -> None:
    """Processes that publish 100 records and exit before the daemon's subscription reaches them:
    the shim counts them as ``no_receiver`` and its ledger tells the daemon. Every ledger is
    removed once booked."""
    r = exits.churn(daemon, processes=40, records=100, parallel=4)
    assert r.counted == r.made, r
    assert r.dropped.get("sender_no_receiver", 0) > 0, r
    assert not os.listdir(daemon.endpoint[len("ipc://"):] + ".ledger")


SIGTERM_CHILD = """
import signal, sys, time
from trainer_shim import telemetry
if sys.argv[2] == "own":
    def own(signum, frame):
        print("own handler", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, own)
telemetry.configure(endpoint=sys.argv[1], role="t", worker="0")
telemetry.count("n")
telemetry.flush(wait_s=1)
print("ready", flush=True)
time.sleep(60)
"""


def test_sigterm_keeps_its_effect(tmp_path: Path) -> None:
    """With the shim's handler, SIGTERM still kills with the default disposition (status -15),
    and a handler the trainer installed first still runs (and decides the exit)."""
    for mode, status in (("default", -signal.SIGTERM), ("own", 3)):
        p = subprocess.Popen([sys.executable, "-c", SIGTERM_CHILD, f"ipc://{tmp_path}/none.sock", mode], env=env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=20)
        assert p.returncode == status, (mode, p.returncode, err)
        assert ("own handler" in out) == (mode == "own")


def test_sigterm_handler_can_be_left_out(tmp_path: Path) -> None:
    """``DFLASH_TELEMETRY_SIGTERM=0`` leaves SIGTERM alone; without it the shim's handler is there
    once a channel started the flusher (from the main thread)."""
    code = ("import signal, sys; from trainer_shim import telemetry; "
            "telemetry.configure(endpoint=sys.argv[1], role='t', worker='0'); telemetry.count('n'); "
            "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)")
    for value, default in (("0", "True"), ("1", "False")):
        out = subprocess.run([sys.executable, "-c", code, f"ipc://{tmp_path}/none.sock"], capture_output=True,
                             text=True, timeout=30, env=env(DFLASH_TELEMETRY_SIGTERM=value))
        assert out.stdout.strip() == default, (value, out.stderr)
