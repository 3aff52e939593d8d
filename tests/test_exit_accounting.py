"""Every loss counted where a trainer process really ends (issue: exits while the daemon is
behind, SIGTERM as ``Pool.terminate()`` sends it, SIGKILL, short-lived processes that never saw a
subscription). Real daemon, real shim processes, real ZeroMQ; the daemon books what never arrived
from the senders' ledgers (``<socket>.ledger/``).

Each test compares the calls the trainer processes made with what the daemon exports for their
role: ``records_accepted_total + Σ records_dropped_total{reason}``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.daemon_harness import DaemonProc, env, wait_for

PRELUDE = """
import json, os, signal, sys, time
from trainer_shim import telemetry
def connect(role, worker, flush_interval_s):
    ch = telemetry.configure(endpoint=sys.argv[1], role=role, worker=worker, flush_interval_s=flush_interval_s)
    calls = 0
    deadline = time.monotonic() + 20
    while ch.records_total == 0 and time.monotonic() < deadline:  # until a record reached the daemon
        ch.gauge("warmup", 1.0); calls += 1
        telemetry.flush(wait_s=1.0)
    return ch, calls
"""


def shim(code: str, endpoint: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code), endpoint], env=env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def counted(d: DaemonProc, role: str) -> tuple[int, dict[str, int]]:
    """(accepted + every drop reason, drops by reason) the daemon exports for ``role``."""
    samples = d.samples()
    accepted = sum(v for lab, v in samples.get("dflash_sidecar_records_accepted_total", []) if lab.get("role") == role)
    dropped: dict[str, int] = {}
    for lab, v in samples.get("dflash_sidecar_records_dropped_total", []):
        if lab.get("role") == role:
            dropped[lab["reason"]] = dropped.get(lab["reason"], 0) + int(v)
    return int(accepted) + sum(dropped.values()), dropped


def settle(d: DaemonProc, role: str, expected: int, timeout_s: float = 30.0) -> dict[str, int]:
    """Wait until the daemon counts ``expected`` records for ``role`` (or time runs out), then
    check it stays there (nothing counted twice); returns the drops by reason."""
    try:
        wait_for(lambda: counted(d, role)[0] >= expected, timeout_s=timeout_s, what=f"{expected} records counted")
    except AssertionError:
        pass
    time.sleep(2.5)  # two ledger scans more: a late frame or a second booking would show
    total, dropped = counted(d, role)
    assert total == expected, f"counted {total} of {expected} made: {dropped}"
    return dropped


def test_exit_while_the_daemon_is_stalled(tmp_path: Path) -> None:
    """A trainer exits normally while the daemon is stopped (as one far behind a backlog is): its
    last frames die in its ZeroMQ queue at the exit linger. Booked as ``lost_at_exit``."""
    d = DaemonProc(tmp_path)
    try:
        p = shim("""
            ch, calls = connect("stall", "0", 0.02)
            print(json.dumps({"ready": calls}), flush=True)
            sys.stdin.readline()
            for i in range(30_000):
                ch.gauge("g", float(i)); calls += 1
                if i % 300 == 0:
                    time.sleep(0.002)
            print(json.dumps({"calls": calls}), flush=True)
        """, d.endpoint)
        assert p.stdout is not None and p.stdin is not None
        json.loads(p.stdout.readline())
        d.proc.send_signal(signal.SIGSTOP)
        try:
            p.stdin.write("go\n")
            p.stdin.flush()
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
        finally:
            d.proc.send_signal(signal.SIGCONT)
        calls = json.loads(out.splitlines()[-1])["calls"]
        dropped = settle(d, "stall", calls)
        assert dropped.get("lost_at_exit", 0) > 0, dropped  # the case really happened
    finally:
        d.stop()


def test_pool_terminate(tmp_path: Path) -> None:
    """``Pool.terminate()`` SIGTERMs workers with records still queued: the shim's SIGTERM handler
    writes the final ledger and the process still dies of the signal; exact, as ``lost_at_exit``."""
    d = DaemonProc(tmp_path)
    try:
        p = shim("""
            import multiprocessing as mp
            def work(args):
                i, q = args
                ch, calls = connect("pool", f"w{i}", 3600.0)  # no flush after the warmup: all queued
                for j in range(5000):
                    ch.count("tokens", 1); calls += 1
                q.put(calls)
                time.sleep(600)
            if __name__ == "__main__":
                ctx = mp.get_context("fork")
                m = ctx.Manager(); q = m.Queue()
                pool = ctx.Pool(3)
                pool.map_async(work, [(i, q) for i in range(3)], chunksize=1)
                calls = sum(q.get(timeout=60) for _ in range(3))
                pool.terminate(); pool.join()
                print(json.dumps({"calls": calls}), flush=True)
        """, d.endpoint)
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        calls = json.loads(out.splitlines()[-1])["calls"]
        dropped = settle(d, "pool", calls)
        assert dropped.get("lost_at_exit", 0) >= 3 * 5000, dropped
    finally:
        d.stop()


def test_sigkill_is_bounded_by_one_flush(tmp_path: Path) -> None:
    """A SIGKILLed process (and one that calls ``os.abort()``) with frames stuck behind a stopped
    daemon: what its last ledger holds is booked as ``ended_unclean``; only what it made after its
    last flush is unknown, and here that is exactly the tail it published without flushing."""
    d = DaemonProc(tmp_path)
    try:
        procs = []
        for worker, how in (("kill", "os.kill(os.getpid(), signal.SIGKILL)"), ("abort", "os.abort()")):
            p = shim(f"""
                ch, calls = connect("unclean", "{worker}", 3600.0)
                print(json.dumps({{"ready": calls}}), flush=True)
                sys.stdin.readline()
                for i in range(200):
                    for j in range(500):
                        ch.gauge("g", float(j)); calls += 1
                    telemetry.flush(wait_s=5)
                for j in range(250):  # after the last flush: the unknown tail
                    ch.gauge("tail", 1.0)
                print(json.dumps({{"flushed": calls}}), flush=True)
                {how}
            """, d.endpoint)
            assert p.stdout is not None
            json.loads(p.stdout.readline())
            procs.append(p)
        d.proc.send_signal(signal.SIGSTOP)
        try:
            flushed = 0
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
                out, _ = p.communicate(timeout=60)
                assert p.returncode in (-signal.SIGKILL, -signal.SIGABRT), p.returncode
                flushed += json.loads(out.splitlines()[-1])["flushed"]
        finally:
            d.proc.send_signal(signal.SIGCONT)
        dropped = settle(d, "unclean", flushed)
        assert dropped.get("ended_unclean", 0) > 0, dropped
    finally:
        d.stop()


def test_short_lived_processes(tmp_path: Path) -> None:
    """Processes that publish 100 records and exit before the daemon's subscription reaches them:
    the shim counts them as ``no_receiver`` and its ledger tells the daemon."""
    d = DaemonProc(tmp_path)
    try:
        p = shim("""
            import multiprocessing as mp
            def child(i):
                ch = telemetry.configure(endpoint=sys.argv[1], role="churn", worker=f"c{i}")
                for j in range(100):
                    ch.count("n", 1)
                telemetry._publisher.close(linger_ms=0)  # exit at once: no wait for the subscription
            if __name__ == "__main__":
                ctx = mp.get_context("fork")
                for start in range(0, 40, 4):
                    ps = [ctx.Process(target=child, args=(i,)) for i in range(start, start + 4)]
                    for c in ps: c.start()
                    for c in ps: c.join()
                    assert all(c.exitcode == 0 for c in ps)
                print(json.dumps({"calls": 40 * 100}), flush=True)
        """, d.endpoint)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        dropped = settle(d, "churn", 4000)
        assert dropped.get("sender_no_receiver", 0) > 0, dropped
        assert not os.listdir(d.endpoint[len("ipc://"):] + ".ledger")  # every ledger booked and removed
    finally:
        d.stop()


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
