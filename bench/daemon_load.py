"""The load for bench/bench_daemon.py: a realistic record mix, and the publisher processes.

Run by the benchmark as separate processes (``python bench/daemon_load.py ROLE [options]``):

- ``publish``: pre-encoded batches through an XPUB socket as fast as possible (the flood);
- ``shim``: the real ``trainer_shim``, 8 channels, at a paced rate;
- ``series``: 50 workers x 200 names, to make a daemon hold 10,000 series.

Each prints one JSON line when ready, waits for stdin where the benchmark drives it, and prints
its counts as JSON at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import select
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from trainer_shim import wire

# -- the workload: a realistic record mix ----------------------------------------------------------

TIMINGS = ["step_ms", "forward_ms", "backward_ms", "optimizer_ms", "data_wait_ms", "queue_wait_ms"]
COUNTERS = ["tokens", "batches", "samples", "loss_tokens"]
GAUGES = ["queue_fill", "lr", "batch_tokens", "prefetch_fill", "ready_deficit"]
CATEGORIES = ["bucket", "seq_len_bin"]
PROFILE = {"step_ms": 41.0, "forward_ms": 12.0, "backward_ms": 24.0, "data_ms": 0.4,
           "loss": 2.1, "grad_norm": 0.9, "tokens_per_s": 14000.0, "lr": 1e-4}
"""20 distinct names in all (profile keys overlap the timings/gauges above)."""
INVALID_EVERY = 1000
"""One record in this many is a NaN gauge: the daemon must reject it as ``invalid_value``."""


def make_records(rng: random.Random, n: int, offset: int = 0) -> list[list[Any]]:
    """``n`` records: 40 % timings, 20 % counters, 20 % gauges, 15 % categories, 5 % profile dicts.
    Record number ``offset + i`` is invalid when divisible by ``INVALID_EVERY``."""
    out: list[list[Any]] = []
    for i in range(n):
        if (offset + i) % INVALID_EVERY == INVALID_EVERY - 1:
            out.append([3, "queue_fill", float("nan")])
            continue
        r = rng.random()
        if r < 0.40:
            out.append([1, rng.choice(TIMINGS), rng.lognormvariate(2.0, 0.8)])
        elif r < 0.60:
            out.append([2, rng.choice(COUNTERS), rng.randint(1, 4096)])
        elif r < 0.80:
            out.append([3, rng.choice(GAUGES), rng.random()])
        elif r < 0.95:
            out.append([4, rng.choice(CATEGORIES), rng.randint(0, 15)])
        else:
            out.append([6, rng.randint(0, 1 << 20), {k: v * rng.uniform(0.8, 1.2) for k, v in PROFILE.items()}])
    return out


@dataclass
class Sender:
    """One simulated sender: its identity and wire counters."""

    sender: int
    role: str
    worker: str
    seq: int = 0
    records_total: int = 0

    def frame(self, enc: msgspec.msgpack.Encoder, payload: Any, n: int) -> bytes:
        """Encode one BATCH of ``n`` records (``payload``: a list or a pre-encoded ``msgspec.Raw``)."""
        self.records_total += n
        frame = wire.encode_batch(enc, self.sender, self.seq, self.role, self.worker, None,
                                  self.records_total, {}, payload)
        self.seq += 1
        return frame


def make_senders(rng: random.Random, n: int, tag: str) -> list[Sender]:
    return [Sender(rng.getrandbits(62), "target" if i % 4 else "drafter", f"{tag}{i}") for i in range(n)]


def publisher_main(args: argparse.Namespace) -> int:
    """Connect an XPUB socket, wait for the daemon's subscription and for ``go`` on stdin, then
    send ``records`` records in pre-encoded batches as fast as possible; then keep sending empty
    heartbeat batches (carrying the final ``records_total``) until stdin closes. With ``--nodrop``
    the socket refuses (EAGAIN) at its high-water mark and the publisher retries, so nothing is
    lost; without, ZeroMQ drops at the mark, as it does for the shim."""
    rng = random.Random(args.seed)
    senders = make_senders(rng, args.senders, f"p{args.seed}-")
    enc = msgspec.msgpack.Encoder()
    payloads = [msgspec.Raw(enc.encode(make_records(rng, args.batch, i * args.batch))) for i in range(16)]
    ctx = zmq.Context(io_threads=1)
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.SNDHWM, args.hwm)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.XPUB_NODROP, int(args.nodrop))
    sock.connect(args.endpoint)
    if not sock.poll(20_000):
        print(json.dumps({"error": "no subscriber"}), flush=True)
        return 1
    sock.recv()
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    waits = 0
    t0 = time.time()
    for i in range(max(1, args.records // args.batch)):
        frame = senders[i % len(senders)].frame(enc, payloads[i % len(payloads)], args.batch)
        while True:
            try:
                sock.send(frame, zmq.NOBLOCK)
                break
            except zmq.Again:  # only with --nodrop: wait for room, never lose the frame
                waits += 1
                time.sleep(0.0005)
    t1 = time.time()
    print(json.dumps({"t0": t0, "t1": t1, "hwm_waits": waits,
                      "sent": sum(s.records_total for s in senders)}), flush=True)
    while not select.select([sys.stdin], [], [], 0.2)[0]:
        for s in senders:
            try:
                sock.send(s.frame(enc, [], 0), zmq.NOBLOCK)
            except zmq.Again:
                pass
    sock.close(0)
    ctx.term()
    return 0


def shim_main(args: argparse.Namespace) -> int:
    """The real trainer_shim: 8 channels (6 target, 2 drafter workers) publishing ``rate``
    records/s in 10 ms ticks for ``seconds``; prints the shim's stats at the end."""
    from trainer_shim import telemetry

    telemetry.configure(endpoint=args.endpoint, role="target", worker="0", allocator_interval_s=0)
    channels = [telemetry.channel("target" if w < 6 else "drafter", str(w)) for w in range(8)]
    rng = random.Random(7)
    per_tick = args.rate / 100
    print(json.dumps({"ready": True}), flush=True)
    start = time.monotonic()
    due = 0.0
    tick = 0
    step = 0
    while True:
        now = time.monotonic() - start
        if now >= args.seconds:
            break
        due += per_tick
        while due >= 1:
            due -= 1
            ch = channels[rng.randrange(8)]
            r = rng.random()
            if r < 0.40:
                ch.timing(rng.choice(TIMINGS), rng.lognormvariate(2.0, 0.8))
            elif r < 0.60:
                ch.count(rng.choice(COUNTERS), rng.randint(1, 4096))
            elif r < 0.80:
                ch.gauge(rng.choice(GAUGES), rng.random())
            elif r < 0.95:
                ch.category(rng.choice(CATEGORIES), rng.randint(0, 15))
            else:
                step += 1
                ch.publish(step, {k: v * rng.uniform(0.8, 1.2) for k, v in PROFILE.items()})
        tick += 1
        time.sleep(max(0.0, tick * 0.01 - (time.monotonic() - start)))
    telemetry.close()  # flushes what is queued: the counts below are final
    stats = telemetry.stats()
    print(json.dumps({"records_total": sum(s["records_total"] for s in stats.values()),
                      "dropped": {r: sum(s["dropped"].get(r, 0) for s in stats.values())
                                  for r in {r for s in stats.values() for r in s["dropped"]}}}), flush=True)
    return 0


SERIES_KINDS = [1] * 50 + [2] * 50 + [3] * 80 + [4] * 20
"""200 names per worker: 50 timings, 50 counters, 80 gauges, 20 categories (4 keys each)."""


def series_workload(workers: int, names: int) -> tuple[list[Sender], Callable[[], list[list[Any]]]]:
    """``workers`` senders and a function giving one batch of ``names`` names (two records each)."""
    rng = random.Random(3)
    senders = [Sender(rng.getrandbits(62), "target" if w < 38 else "drafter", f"w{w:02d}") for w in range(workers)]
    kinds = [(k, f"metric_{i:03d}" + ("_ms" if k == 1 else "")) for i, k in enumerate(SERIES_KINDS[:names])]

    def batch() -> list[list[Any]]:
        return [[k, n, (rng.randint(0, 3) if k == 4 else rng.uniform(0.1, 100.0))] for k, n in kinds for _ in range(2)]

    return senders, batch


def series_main(args: argparse.Namespace) -> int:
    """50 senders x 200 names, one batch per sender every ``period`` seconds until stdin closes."""
    senders, batch = series_workload(args.workers, args.names)
    enc = msgspec.msgpack.Encoder()
    ctx = zmq.Context(io_threads=1)
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(args.endpoint)
    if not sock.poll(20_000):
        return 1
    sock.recv()
    print(json.dumps({"ready": True}), flush=True)
    rounds = 0
    while True:
        for s in senders:
            records = batch()
            sock.send(s.frame(enc, records, len(records)))
        rounds += 1
        if select.select([sys.stdin], [], [], args.period)[0]:
            break
    sock.close(0)
    ctx.term()
    return 0


MAINS = {"publish": publisher_main, "shim": shim_main, "series": series_main}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="load processes for bench_daemon.py")
    parser.add_argument("role", choices=sorted(MAINS))
    for flag, kind in (("--endpoint", str), ("--seed", int), ("--senders", int), ("--batch", int),
                       ("--records", int), ("--hwm", int), ("--rate", int), ("--seconds", float),
                       ("--workers", int), ("--names", int), ("--period", float)):
        parser.add_argument(flag, type=kind)
    parser.add_argument("--nodrop", action="store_true")
    args = parser.parse_args(argv)
    return MAINS[args.role](args)


if __name__ == "__main__":
    raise SystemExit(main())
