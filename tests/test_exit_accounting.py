"""Every loss counted where a trainer process really ends (issue 22: exits while the daemon is
behind, SIGTERM as ``Pool.terminate()`` sends it, SIGKILL and ``os.abort()``, short-lived processes
that never saw a subscription). Real daemon, real shim processes, real ZeroMQ; the daemon books
what never arrived from the senders' tallies (in ``<socket>.tallies/``). The cases live in
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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.model.liveness import GONE_AFTER_S
from sidecar.sources.tallies import SCAN_S
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
    the final tally and the process still dies of the signal; exact, as ``lost_at_exit``."""
    r = exits.pool_terminate(daemon, workers=3, records=5000)
    assert r.counted == r.made, r
    assert r.dropped.get("lost_at_exit", 0) >= 3 * 5000, r


def test_sigkill_is_bounded_by_one_flush(daemon: DaemonProc) -> None:
    """SIGKILL and ``os.abort()`` with frames stuck behind a stopped daemon: what the last tally
    holds is counted as ``ended_unclean``; only what was made after the last flush is unknown, and
    here that is exactly the tail each published without flushing (not in ``made``)."""
    r = exits.unclean(daemon, flushes=200, per_flush=500, tail=250)
    assert r.counted == r.made, r
    assert r.dropped.get("ended_unclean", 0) > 0, r


def test_short_lived_processes(daemon: DaemonProc) -> None:
    """Processes that publish 100 records and exit before the daemon's subscription reaches them:
    the shim counts them as ``no_receiver`` and its tally tells the daemon. Every tally is
    removed once booked."""
    r = exits.churn(daemon, processes=40, records=100, parallel=4)
    assert r.counted == r.made, r
    assert r.dropped.get("sender_no_receiver", 0) > 0, r
    assert not os.listdir(daemon.endpoint[len("ipc://"):] + ".tallies")


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


CLOSE_AND_EXIT = """
import sys
from trainer_shim.publisher import Publisher
pub = Publisher(sys.argv[1], flush_interval_s=0.01, allocator_interval_s=0)
ch = pub.channel("ended", "0")
for _ in range(200):  # until the daemon's subscription is there, then 2000 records
    ch.count("warm")
    if pub.flush(wait_s=0.2) and ch.records_total:
        break
for _ in range(2000):
    ch.count("n")
pub.close()
print(ch.records_total, flush=True)
"""


def _close_and_exit(endpoint: str) -> int:
    """Run ``CLOSE_AND_EXIT`` against ``endpoint``; the records its channel made."""
    out = subprocess.run([sys.executable, "-c", CLOSE_AND_EXIT, endpoint], env=env(), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[0])


def test_a_sender_that_closed_just_before_the_daemon_stopped_is_booked_by_that_daemon(tmp_path: Path) -> None:
    """The demo's end, and a daemon stopped right after its trainers: a publisher closes, and the
    daemon is stopped within the tallies' exit grace. The daemon reconciles the closed sender's tally
    at its shutdown (everything that arrived is drained by then). It used to leave the file to the
    next daemon, which had seen none of the sender's batches and booked all it made as
    ``lost_at_exit`` (2,000+ records the first daemon had counted)."""
    first = DaemonProc(tmp_path)
    try:
        assert _close_and_exit(first.endpoint) > 2000
    finally:
        first.stop()
    tallies = tmp_path / "sidecar.sock.tallies"
    assert not tallies.exists(), "the stopped daemon left the closed sender's tally (the directory goes when empty)"
    second = DaemonProc(tmp_path)
    try:
        time.sleep(GONE_AFTER_S + SCAN_S + 2.5)  # a tally left behind would be reconciled by now
        assert second.value("dflash_sidecar_records_dropped_total", role="ended") is None
    finally:
        second.stop()


def test_a_tally_written_before_the_daemon_started_is_what_an_earlier_daemon_was_sent(tmp_path: Path) -> None:
    """A sender closed while a daemon ran that was then SIGKILLed (nothing booked): the next daemon
    finds a tally last written before it started. What the sender sent went to the earlier daemon:
    booked as ``before_join``, not as records this daemon lost (``lost_at_exit``)."""
    first = DaemonProc(tmp_path)
    try:
        made = _close_and_exit(first.endpoint)
    finally:
        first.stop(signal.SIGKILL)
    second = DaemonProc(tmp_path)
    try:
        time.sleep(GONE_AFTER_S + SCAN_S + 2.5)
        assert second.value("dflash_sidecar_records_dropped_total", role="ended", reason="lost_at_exit") in (None, 0)
        assert second.value("dflash_sidecar_records_dropped_total", role="ended", reason="before_join") == made
    finally:
        second.stop()
