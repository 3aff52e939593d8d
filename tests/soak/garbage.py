"""A garbage flood on the daemon's own socket: ``python -m tests.soak.garbage '<json spec>'``.

One XPUB socket, connected like a shim, sends ``rate`` frames a second drawn from ``frames()``:
random bytes, truncated and reshaped msgpack, unknown protocol versions, deep nesting, forged
batches full of invalid records from a small pool of sender ids, replayed counters, counts of
2**62, values of 1e308, made-up worker names, and now and then a frame over the daemon's size
limit (ZeroMQ then closes this connection; it reconnects). Forged batches carry ``garbage*``
labels, never a real publisher's labels, so the real senders' accounting must stay exact. On
``stop`` (stdin) it prints what it sent, by kind.
"""

from __future__ import annotations

import json
import math
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import msgspec
import zmq

from trainer_shim import wire

_enc = msgspec.msgpack.Encoder()

OVERSIZED_EVERY_S = 3.0


HOSTILE_RECORDS = [
    [1, "t_ms", math.nan], [1, "neg_ms", -5.0], [2, "c", math.inf], [3, "", 1.0], [3, "x" * 300, 1.0],
    [3, "ctrl\x00name", 1.0], [4, "cat", "k" * 100], [4, "cat", 1.5], [9, "kind", 1], [1, 5, 1.0], [6, -1, {}],
    [6, 3, "nope"], [7, 0, [1, 2]], [7, 2**62, [1, 2, 3]], "junk", [1, "t_ms"], [],
    [6, 1, {"ok_ms": 1.0, "": 2.0, "bad": "x"}], [3, "g", True], [2, "c", None], [3, "fine", 1.0],
]
"""Invalid records (and a few valid ones) for forged batches."""


def frames(rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """(kind, frame) forever."""
    senders = [rng.getrandbits(63) for _ in range(8)]
    seqs = {s: 0 for s in senders}
    totals = {s: 0 for s in senders}
    valid = wire.encode_batch(_enc, 1, 0, "r", "w", 3, 2, {}, [[1, "a_ms", 1.0], [2, "b", 2]])
    while True:
        pick = rng.random()
        if pick < 0.25:
            yield "random_bytes", rng.randbytes(rng.randint(0, 300))
        elif pick < 0.35:
            yield "truncated", valid[: rng.randint(0, len(valid) - 1)]
        elif pick < 0.45:
            yield "wrong_shape", _enc.encode(rng.choice([[9, 2, 1], [1, 2, "x"], {"a": 1}, "s", [1], [1, 1, 2, 3],
                                                         [1, 2, -1, 0, "r", "w", None, 0, {}, []]]))
        elif pick < 0.5:
            yield "unknown_version", _enc.encode([rng.choice([0, 2, 99, -1, 2**40]), 2, 1, 0])
        elif pick < 0.53:
            depth = rng.randint(100, 5000)
            yield "deep", b"\x91" * depth + b"\x00"
        elif pick < 0.56:
            yield "hello_junk", _enc.encode([1, 1, rng.choice(senders), 0, {"pid": "x", "role": 5, "junk": [1] * 50}])
        elif pick < 0.58:  # counts no process can make (refused: impossible_count)
            yield "impossible_count", _enc.encode([1, 2, rng.getrandbits(63), 0, "garbage", "forged", None, 2**62,
                                                   {"buffer_full": 2**62}, [[2, "c", 1]]])
        elif pick < 0.60:  # finite values no trainer produces (refused: out_of_range)
            yield "absurd_values", _enc.encode([1, 2, rng.getrandbits(63), 0, "garbage", "absurd", None, 3, {},
                                                [[1, "t_ms", 1e308], [2, "c", 1e308], [3, "g", -1e308]]])
        elif pick < 0.62:  # made-up worker names: the label table, which evicts idle pairs
            yield "label_flood", _enc.encode([1, 2, rng.getrandbits(63), 0, "garbage-flood", str(rng.getrandbits(40)),
                                              None, 1, {}, [[2, "c", 1]]])
        else:
            s = rng.choice(senders)
            records = [rng.choice(HOSTILE_RECORDS) for _ in range(rng.randint(0, 40))]
            if rng.random() < 0.1:
                totals[s] = max(0, totals[s] - 100)  # a replayed counter: refused as bad_sequence
            totals[s] += len(records) + rng.choice([0, 0, 0, 5])  # now and then a gap: lost_in_transit
            yield "forged_batch", _enc.encode([1, 2, s, seqs[s], "garbage", str(s % 4), None, totals[s],
                                               {"buffer_full": seqs[s]}, records])
            seqs[s] += 1


def main() -> int:
    spec = json.loads(sys.argv[1])
    rng = random.Random(spec.get("seed", 1))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.SNDHWM, 1000)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.connect(spec["endpoint"])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    sent: Counter[str] = Counter()
    refused = 0
    period = 1.0 / spec["rate"]
    burst = max(1, int(spec["rate"] * 0.01))
    next_oversized = time.monotonic() + OVERSIZED_EVERY_S
    gen = frames(rng)
    next_t = time.monotonic()
    while not stop.is_set():
        try:
            while sock.recv(zmq.NOBLOCK):  # subscriptions: nothing to do, just drain them
                pass
        except zmq.Again:
            pass
        for _ in range(burst):
            kind, frame = next(gen)
            if time.monotonic() >= next_oversized:
                kind, frame = "oversized", b"\x00" * (wire.MAX_MESSAGE_BYTES + 1)
                next_oversized = time.monotonic() + OVERSIZED_EVERY_S
            try:
                sock.send(frame, zmq.NOBLOCK)
                sent[kind] += 1
            except zmq.Again:
                refused += 1
        next_t += period * burst
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -1.0:
            next_t = time.monotonic()
    print(json.dumps({"event": "stopped", "sent": dict(sent), "refused_by_zmq": refused}), flush=True)
    sock.close(0)
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
