"""Hostile clients that try to make the daemon allocate without bound, and the RSS they cost it.

Each flood connects its own XPUB socket (``XPUB_NODROP``: every frame is handed to the daemon's
queue, none is dropped on the client side), sends its frames, waits until the daemon has taken
them all in (or closed the connection, for frames over the size limit), and reports the daemon's
RSS before, at its peak (sampled every 20 ms) and after. ``tests/test_abuse_memory.py`` asserts
the bounds; ``bench/abuse_memory.py`` prints the table recorded in ``bench/RESULTS_SOAK.md``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import msgspec
import zmq

from tests.daemon_harness import DaemonProc, env
from tests.soak.procs import Sampler, rss_bytes
from trainer_shim import wire

_enc = msgspec.msgpack.Encoder()
NEAR_LIMIT = wire.MAX_MESSAGE_BYTES - 64
LIMIT = f"{wire.MAX_MESSAGE_BYTES // (1024 * 1024)} MiB"
BLOAT = (NEAR_LIMIT - 64) // 4096 - 3
"""Empty arrays per bloated record: 4096 of them fill a frame near the limit."""


def _oversized(n: int) -> Iterator[bytes]:
    for _ in range(n):
        yield b"\x00" * (wire.MAX_MESSAGE_BYTES + 1)


def _empty_arrays(n: int) -> Iterator[bytes]:
    frame = (b"\x9a\x01\x02\x07\x00\xa1r\xa1w\xc0\xce\xff\xff\xff\xff\x80\xdd" + NEAR_LIMIT.to_bytes(4, "big")
             + b"\x90" * NEAR_LIMIT)
    for _ in range(n):
        yield frame


def _bloated_records(n: int) -> Iterator[bytes]:
    # 4096 records (the most a batch may hold), each an array of empty arrays: the batch is
    # refused record by record (each malformed_record), the slowest path through decode.
    record = b"\xdc" + BLOAT.to_bytes(2, "big") + b"\x90" * BLOAT
    for i in range(n):
        yield (b"\x9a\x01\x02\xcd\x01\x00" + bytes([0xCD]) + i.to_bytes(2, "big") + b"\xa5flood\xa13\xc0"
               + b"\xce" + (4096 * (i + 1)).to_bytes(4, "big") + b"\x80\xdc\x10\x00" + record * 4096)


def _profiles(n: int) -> Iterator[bytes]:
    # PROFILE records of 1000 distinct keys each, as many as fit a frame: with a small
    # --max-series every key is beyond the budget (the costly path before keys were resolved
    # once per batch).
    keys = {f"k{j}": 1.5 for j in range(1000)}
    per = (NEAR_LIMIT - 256) // len(_enc.encode([6, 0, keys]))
    for i in range(n):
        yield _enc.encode([1, 2, 31, i, "flood", "profile", i, per * (i + 1), {},
                           [[6, i, keys] for _ in range(per)]])


def _distinct_profiles(n: int, sender: int = 32) -> Iterator[bytes]:
    # PROFILE records of 1000 keys each, as many as fit a frame (about 60,000 keys), from 4 blocks
    # of distinct keys in turn: each key is a name to map, the costliest frame per byte (370 ms of
    # daemon CPU each before names beyond an owner's budget were refused unmapped and frames had
    # fair turns). The blocks are encoded once (``msgspec.Raw``): the flooder itself costs little.
    one = len(_enc.encode([6, 0, {f"k{j:09d}": 1.5 for j in range(1000)}]))
    per = (NEAR_LIMIT - 256) // one
    blocks = [msgspec.Raw(_enc.encode([[6, b, {f"k{(b * per + r) * 1000 + j:09d}": 1.5 for j in range(1000)}]
                                       for r in range(per)])) for b in range(4)]
    for i in range(n):
        yield _enc.encode([1, 2, sender, i, "flood", "keys", i, per * (i + 1), {}, blocks[i % 4]])


def _deep(n: int) -> Iterator[bytes]:
    frame = b"\x91" * NEAR_LIMIT + b"\x00"
    for _ in range(n):
        yield frame


def _huge_map(n: int) -> Iterator[bytes]:
    frame = b"\xdf" + (NEAR_LIMIT // 2).to_bytes(4, "big") + b"\x00\xc0" * (NEAR_LIMIT // 2)
    for _ in range(n):
        yield frame


def _hellos(n: int) -> Iterator[bytes]:
    for i in range(n):
        hello = {"pid": i, "role": "r", "worker": "w", "junk": "x" * (NEAR_LIMIT - 100)}
        yield _enc.encode([1, 1, 10_000 + i, 0, hello])


def _names(n: int) -> Iterator[bytes]:
    per = 1000
    for i in range(0, n, per):
        yield _enc.encode([1, 2, 21, i // per, "flood", "0", None, i + per, {},
                           [[3, f"name_{j}", 1.0] for j in range(i, i + per)]])


def _timing_names(n: int) -> Iterator[bytes]:
    per = 1000
    for i in range(0, n, per):
        yield _enc.encode([1, 2, 24, i // per, "flood", "t", None, i + per, {},
                           [[1, f"name_{j}_ms", 1.0] for j in range(i, i + per)]])


def _labels(n: int) -> Iterator[bytes]:
    for i in range(n):
        yield _enc.encode([1, 2, 22, i, f"role{i}", f"worker{i}", i, i + 1, {}, [[2, "c", 1]]])


def _devices(n: int) -> Iterator[bytes]:
    per = 1000
    for i in range(0, n, per):
        records = [[7, d, [1, 2, 3]] for d in range(i, i + per)]
        yield _enc.encode([1, 2, 23, i // per, "flood", "1", None, i + per, {}, records])


def _senders(n: int) -> Iterator[bytes]:
    for i in range(n):
        yield _enc.encode([1, 2, 100_000 + i, 0, "flood", "2", None, 1, {}, [[2, "c", 1]]])


@dataclass(frozen=True)
class Flood:
    name: str
    frames: Callable[[int], Iterator[bytes]]
    n: int
    closes_connection: bool = False
    refused: tuple[str, str, str, int] | None = None
    """(role, worker, reason, records per frame sent at least): the records the daemon refuses of
    this flood, counted under its labels. ``run_flood`` reads them once they are all counted: a
    later flood of label values may evict the label pair (silent for ``EVICT_IDLE_S``) with its
    counts, so the end of ``run_all`` cannot."""


FLOODS = (
    Flood(f"frames over {LIMIT}", _oversized, 10, closes_connection=True),
    Flood(f"{LIMIT} batches of empty arrays", _empty_arrays, 100),
    Flood(f"{LIMIT} batches of 4096 bloated records", _bloated_records, 100,
          refused=("flood", "3", "malformed_record", 4096)),
    Flood(f"{LIMIT} of nesting (deep)", _deep, 100),
    Flood(f"{LIMIT} single maps (huge)", _huge_map, 100),
    Flood(f"{LIMIT} hellos, distinct senders", _hellos, 100),
    Flood("distinct timing names", _timing_names, 100_000, refused=("flood", "t", "cardinality", 0)),
    Flood("distinct metric names", _names, 100_000),
    Flood("distinct (role, worker) values", _labels, 20_000),
    Flood("distinct allocator devices", _devices, 20_000),
    Flood("distinct sender ids", _senders, 20_000),
)


def _counter(d: DaemonProc, name: str) -> float:
    return d.value(name) or 0.0


def _refused(d: DaemonProc, role: str, worker: str, reason: str) -> float:
    """Records of (role, worker) the daemon counted dropped for ``reason`` (0 where it has none)."""
    return sum(v for lab, v in d.samples().get("dflash_sidecar_records_dropped_total", [])
               if (lab.get("role"), lab.get("worker"), lab.get("reason")) == (role, worker, reason))


def run_flood(d: DaemonProc, flood: Flood, timeout_s: float = 120.0) -> dict[str, object]:
    """Send ``flood`` to ``d``; returns RSS before/peak/after (bytes), seconds, frames sent, and the
    records of it the daemon counted refused (``Flood.refused``; None where it declares none)."""
    pid = d.proc.pid
    refused_before = _refused(d, *flood.refused[:3]) if flood.refused else 0.0
    frames_before = _counter(d, "dflash_sidecar_frames_received_total")
    disconnects_before = _counter(d, "dflash_sidecar_disconnects_total")
    before = rss_bytes(pid)
    sampler = Sampler(pid, period_s=0.02)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.XPUB_NODROP, 1)
    pub.setsockopt(zmq.SNDTIMEO, 30_000)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(d.endpoint)
    start = time.monotonic()
    sent = 0
    try:
        deadline = start + 20
        while not pub.poll(100) and time.monotonic() < deadline:
            pass
        pub.recv()
        for frame in flood.frames(flood.n):
            if flood.closes_connection:  # the daemon drops the link for each: wait for it to be back
                while pub.poll(0):
                    pub.recv()
            pub.send(frame, copy=False)
            sent += 1
            if flood.closes_connection:
                _wait(lambda: _counter(d, "dflash_sidecar_disconnects_total") >= disconnects_before + sent, 20)
        if flood.closes_connection:
            done = True
        else:
            done = _wait(lambda: _counter(d, "dflash_sidecar_frames_received_total") >= frames_before + sent,
                         timeout_s)
        took = time.monotonic() - start
    finally:
        pub.close(0)
        ctx.term()
    refused = None
    if flood.refused:  # decoded, and counted, behind receiving: wait for all of them (or the timeout)
        role, worker, reason, per_frame = flood.refused
        least = refused_before + max(1, per_frame * sent)
        _wait(lambda: _refused(d, role, worker, reason) >= least, timeout_s)
        refused = _refused(d, role, worker, reason) - refused_before
    time.sleep(0.5)
    samples = [rss for _, rss, _ in sampler.stop()]
    return {"flood": flood.name, "frames": sent, "taken_in": done, "seconds": round(took, 2), "refused": refused,
            "rss_before": before, "rss_peak": max(samples + [before]), "rss_after": rss_bytes(pid),
            "alive": d.proc.poll() is None}


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def is_big(flood: Flood) -> bool:
    """A flood of frames near the size limit (as opposed to many small frames)."""
    return "MiB" in flood.name


def run_all(d: DaemonProc) -> list[dict[str, object]]:
    """Every flood once, then the 4 MiB floods a second time (marked ``round`` 2): memory a
    too-fast client made the daemon queue may stay in the allocator's heap, but must be reused,
    not added to, when the same abuse comes again."""
    first = [{**run_flood(d, flood), "round": 1} for flood in FLOODS]
    # sent again by the same sender ids from sequence 0, a flood's frames are no new records to
    # count (unless the sender was evicted meanwhile): its refusals are read in the first round only
    again = [replace(flood, refused=None) for flood in FLOODS if is_big(flood) and not flood.closes_connection]
    return first + [{**run_flood(d, flood), "round": 2} for flood in again]


FLOODER = textwrap.dedent("""
    import sys, zmq
    from tests.soak.floods import _bloated_records, _distinct_profiles, _profiles
    endpoint, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.XPUB_NODROP, 1)  # every frame reaches the daemon's queue: nothing dropped here
    pub.setsockopt(zmq.SNDTIMEO, 60_000)
    pub.setsockopt(zmq.LINGER, 60_000)
    pub.connect(endpoint)
    pub.poll(20_000); pub.recv()  # the daemon's subscription
    frames = {"bloated": _bloated_records, "keys": _distinct_profiles, "profiles": _profiles}[kind](n)
    for frame in frames:
        pub.send(frame, copy=False)
    pub.close(); ctx.term()
    print(n)
""")


def flood_process(endpoint: str, kind: str, n: int) -> subprocess.Popen[str]:
    """A process that pushes ``n`` frames of ``kind`` ('bloated', 'keys' or 'profiles') to ``endpoint``
    through an XPUB_NODROP socket and prints ``n`` once all are handed to ZeroMQ."""
    return subprocess.Popen([sys.executable, "-c", FLOODER, endpoint, kind, str(n)], env=env(),
                            stdout=subprocess.PIPE, text=True)


def frames_received(d: DaemonProc) -> float:
    """The frames the daemon has taken from its socket so far."""
    return d.value("dflash_sidecar_frames_received_total") or 0.0
