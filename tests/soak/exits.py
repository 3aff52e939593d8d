"""Where trainer processes really end: the exit cases, shared by ``tests/test_exit_accounting.py``
(small) and ``bench/soak.py --exits`` (the sizes of the issue that found them).

Each case runs real shim processes against a running ``DaemonProc`` and returns an ``ExitResult``:
the calls the processes made (or, for an unclean death, made up to their last flush) and what the
daemon exports for their role, ``records_accepted_total + Σ records_dropped_total{reason}``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field

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


@dataclass
class ExitResult:
    case: str
    made: int
    counted: int
    dropped: dict[str, int] = field(default_factory=dict)
    unknown_tail: int = 0
    """Calls made after the last flush of a process that died uncleanly (not in ``made``)."""
    wall_s: float = 0.0

    @property
    def unaccounted(self) -> int:
        return self.made - self.counted


def shim(code: str, endpoint: str) -> subprocess.Popen[str]:
    """A shim process running ``PRELUDE`` + ``code`` with the endpoint as its first argument."""
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


def settle(d: DaemonProc, case: str, role: str, made: int, started: float, timeout_s: float = 30.0,
           unknown_tail: int = 0) -> ExitResult:
    """Wait until the daemon counts ``made`` records for ``role`` (or ``timeout_s`` passes), then
    two tally scans more (a late frame or a second booking would show), and read the result."""
    try:
        wait_for(lambda: counted(d, role)[0] >= made, timeout_s=timeout_s, what=f"{made} records counted")
    except AssertionError:
        pass
    time.sleep(2.5)
    total, dropped = counted(d, role)
    return ExitResult(case, made, total, dropped, unknown_tail, time.monotonic() - started)


def _finish(p: subprocess.Popen[str], timeout_s: float, statuses: tuple[int, ...] = (0,)) -> dict[str, int]:
    out, err = p.communicate(timeout=timeout_s)
    assert p.returncode in statuses, (p.returncode, err[-2000:])
    return json.loads(out.splitlines()[-1])


def stall_exit(d: DaemonProc, records: int = 30_000, stall_s: float = 0.0) -> ExitResult:
    """A trainer exits normally while the daemon is stopped (SIGSTOP, as one far behind a backlog
    is): its last frames die in its ZeroMQ queue at the exit linger. ``stall_s``: keep the
    daemon stopped at least this long."""
    started = time.monotonic()
    p = shim(f"""
        ch, calls = connect("stall", "0", 0.02)
        print(json.dumps({{"ready": calls}}), flush=True)
        sys.stdin.readline()
        for i in range({records}):
            ch.gauge("g", float(i)); calls += 1
            if i % 300 == 0:
                time.sleep(0.002)
        print(json.dumps({{"calls": calls}}), flush=True)
    """, d.endpoint)
    assert p.stdout is not None and p.stdin is not None
    json.loads(p.stdout.readline())
    d.proc.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        p.stdin.write("go\n")
        p.stdin.flush()
        calls = _finish(p, 120)["calls"]
        time.sleep(max(0.0, stall_s - (time.monotonic() - stopped)))
    finally:
        d.proc.send_signal(signal.SIGCONT)
    return settle(d, "stall-exit", "stall", calls, started)


def pool_terminate(d: DaemonProc, workers: int = 3, records: int = 5000) -> ExitResult:
    """``Pool.terminate()`` SIGTERMs workers with ``records`` each still queued (flush interval of
    an hour after the warmup)."""
    started = time.monotonic()
    p = shim(f"""
        import multiprocessing as mp
        def work(args):
            i, q = args
            ch, calls = connect("pool", f"w{{i}}", 3600.0)
            for j in range({records}):
                ch.count("tokens", 1); calls += 1
            q.put(calls)
            time.sleep(600)
        if __name__ == "__main__":
            ctx = mp.get_context("fork")
            m = ctx.Manager(); q = m.Queue()
            pool = ctx.Pool({workers})
            pool.map_async(work, [(i, q) for i in range({workers})], chunksize=1)
            calls = sum(q.get(timeout=120) for _ in range({workers}))
            pool.terminate(); pool.join()
            print(json.dumps({{"calls": calls}}), flush=True)
    """, d.endpoint)
    calls = _finish(p, 180)["calls"]
    return settle(d, "terminate", "pool", calls, started)


def unclean(d: DaemonProc, flushes: int = 200, per_flush: int = 500, tail: int = 250) -> ExitResult:
    """One process SIGKILLed and one that calls ``os.abort()``, with frames stuck behind a stopped
    daemon; each publishes ``tail`` records after its last flush (the unknown part)."""
    started = time.monotonic()
    procs = []
    for worker, how in (("kill", "os.kill(os.getpid(), signal.SIGKILL)"), ("abort", "os.abort()")):
        p = shim(f"""
            ch, calls = connect("unclean", "{worker}", 3600.0)
            print(json.dumps({{"ready": calls}}), flush=True)
            sys.stdin.readline()
            for i in range({flushes}):
                for j in range({per_flush}):
                    ch.gauge("g", float(j)); calls += 1
                telemetry.flush(wait_s=5)
            for j in range({tail}):
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
            flushed += _finish(p, 120, (-signal.SIGKILL, -signal.SIGABRT))["flushed"]
    finally:
        d.proc.send_signal(signal.SIGCONT)
    return settle(d, "sigkill+abort", "unclean", flushed, started, unknown_tail=tail * len(procs))


def churn(d: DaemonProc, processes: int = 40, records: int = 100, parallel: int = 4) -> ExitResult:
    """Short-lived processes (forked, ``parallel`` at a time), ``records`` each, closing with no
    linger: most exit before the daemon's subscription reaches them (``no_receiver``)."""
    started = time.monotonic()
    p = shim(f"""
        import multiprocessing as mp
        def child(i):
            ch = telemetry.configure(endpoint=sys.argv[1], role="churn", worker=f"c{{i}}")
            for j in range({records}):
                ch.count("n", 1)
            telemetry._publisher.close(linger_ms=0)  # exit at once: no wait for the subscription
        if __name__ == "__main__":
            ctx = mp.get_context("fork")
            for start in range(0, {processes}, {parallel}):
                ps = [ctx.Process(target=child, args=(i,)) for i in range(start, min(start + {parallel}, {processes}))]
                for c in ps: c.start()
                for c in ps: c.join()
                assert all(c.exitcode == 0 for c in ps)
            print(json.dumps({{"calls": {processes * records}}}), flush=True)
    """, d.endpoint)
    calls = _finish(p, 600)["calls"]
    return settle(d, "churn", "churn", calls, started, timeout_s=60)


CASES = {"stall-exit": stall_exit, "terminate": pool_terminate, "sigkill": unclean, "churn": churn}
