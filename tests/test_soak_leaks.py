"""No file descriptor or thread leak in the daemon across 100 client connect/disconnect cycles
(real shim publishers, over ipc and tcp, closed cleanly), plus clients SIGKILLed mid-stream.
Read from /proc/<pid>/fd and /proc/<pid>/task of the daemon."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc, free_port, wait_for
from tests.soak.procs import PublisherProc, open_fds, rss_bytes, thread_names
from trainer_shim.publisher import Publisher

CYCLES = 100
KILLED = 10


def _cycle(endpoint: str, worker: str) -> int:
    """One client life: connect, say hello, send a batch, close. Returns the records it sent: one,
    or more where a flush outlasted its wait on a loaded machine and the loop queued another."""
    pub = Publisher(endpoint, flush_interval_s=0.005, allocator_interval_s=0)
    ch = pub.channel("leak", worker)
    deadline = time.monotonic() + 20
    # The shim connects on its first record and counts records as no_receiver until the daemon's
    # subscription arrives: send until one has reached the running daemon.
    while ch.records_total < 1 and time.monotonic() < deadline:
        ch.count("c", 1)
        pub.flush(wait_s=0.5)
    assert ch.records_total >= 1, f"client {worker} never saw the daemon subscribe"
    pub.close()
    return ch.records_total


def _settled_fds(pid: int, still_s: float = 1.0, timeout_s: float = 20.0) -> list[str]:
    """The process's descriptors once they have not changed for ``still_s``."""
    deadline = time.monotonic() + timeout_s
    last, since = open_fds(pid), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = open_fds(pid)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still_s:
            return now
    raise AssertionError(f"descriptors never held still for {still_s} s: {_kinds(last)}")


def _kinds(fds: list[str]) -> Counter[str]:
    return Counter(f.split(":")[0] if ":" in f else "file" for f in fds)


@pytest.mark.timeout(240)
def test_no_fd_or_thread_leak_across_client_cycles(tmp_path: Path) -> None:
    tcp = f"tcp://127.0.0.1:{free_port()}"
    d = DaemonProc(tmp_path, "--endpoint", tcp)
    try:
        pid = d.proc.pid
        sent = _cycle(d.endpoint, "warmup")  # first use of each path
        sent += _cycle(tcp, "warmup-tcp")
        wait_for(lambda: d.value("dflash_sidecar_disconnects_total") == 2, what="warm-up disconnects")
        # The scrape just made leaves the daemon's side of its HTTP connection open for a moment:
        # the baseline is the descriptor set once it holds still (no scrape in between).
        fds0 = _settled_fds(pid)
        threads0, rss0 = thread_names(pid), rss_bytes(pid)
        for i in range(CYCLES):
            sent += _cycle(d.endpoint if i % 2 else tcp, str(i))
        for i in range(KILLED):  # abrupt: the process dies with its socket open, mid-stream
            p = PublisherProc(tmp_path, {"endpoint": d.endpoint if i % 2 else tcp, "role": "killed", "name": str(i),
                                         "threads": 2, "rate": 2000})
            try:  # connected and streaming: its records arrive
                wait_for(lambda i=i: d.value("dflash_sidecar_records_accepted_total", role="killed", worker=f"{i}-0"),
                         timeout_s=30, what=f"publisher {i} streaming")
            finally:
                p.kill()
        expected = 2 + CYCLES + KILLED
        wait_for(lambda: (d.value("dflash_sidecar_disconnects_total") or 0) >= expected, timeout_s=30,
                 what=f"{expected} disconnects")
        wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="leak") == sent,
                 what=f"every cycle's records ({sent})")
        settled = wait_for(lambda: (open_fds(pid) == fds0 and thread_names(pid) == threads0) or None,
                           timeout_s=20, what="fds and threads back to the baseline")
        assert settled
        fds1, threads1, rss1 = open_fds(pid), thread_names(pid), rss_bytes(pid)
    except AssertionError as exc:
        if "fds0" not in locals():
            raise
        fds1, threads1 = open_fds(pid), thread_names(pid)
        raise AssertionError(f"{exc}: fds {_kinds(fds0)} -> {_kinds(fds1)}; threads {threads0} -> {threads1}") from None
    finally:
        d.stop()
    assert len(fds1) == len(fds0) and threads1 == threads0
    assert rss1 - rss0 < 8 * 1024 * 1024  # 112 senders' state, no per-connection residue
    print(f"fds {len(fds0)} -> {len(fds1)}, threads {len(threads0)} -> {len(threads1)}, "
          f"RSS {rss0 / 1e6:.1f} -> {rss1 / 1e6:.1f} MB over {expected} connections")
