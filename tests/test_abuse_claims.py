"""Abuse: claims no honest sender can make (needs the trainer's group). A hand-built frame under an
honest trainer's labels with counts of 2**62 is refused as ``impossible_count``; a frame under
the honest sender's own id from another process is refused as ``wrong_peer`` (the kernel says
which process is at the other end of an ipc connection), so the honest sender's batches all
count."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec

from tests.daemon_harness import DaemonProc, env, publish, raw_publisher, wait_for

enc = msgspec.msgpack.Encoder()

FORGER = textwrap.dedent("""
    import sys, msgspec, zmq
    endpoint, frame = sys.argv[1], bytes.fromhex(sys.argv[2])
    ctx = zmq.Context(); pub = ctx.socket(zmq.XPUB); pub.setsockopt(zmq.LINGER, 5000)
    pub.connect(endpoint)
    pub.poll(20_000); pub.recv()
    pub.send(frame); pub.close(); ctx.term()
""")


def _forge(endpoint: str, frame: bytes) -> None:
    subprocess.run([sys.executable, "-c", FORGER, endpoint, frame.hex()], env=env(), check=True, timeout=60)


def _frames(d: DaemonProc) -> float:
    return d.value("dflash_sidecar_frames_received_total") or 0.0


def _dropped(d: DaemonProc) -> dict[str, float]:
    return {lab["reason"]: v for lab, v in d.samples().get("dflash_sidecar_messages_dropped_total", [])}


def test_counts_of_two_to_the_62_under_an_honest_trainers_labels_are_refused(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path)
    try:
        res = publish(d.endpoint, "drafter", "0", 200)
        wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="drafter") == res["records_total"],
                 what="the honest trainer's records")
        honest = d.value("dflash_sidecar_records_dropped_total", role="drafter") or 0
        frames = _frames(d)
        _forge(d.endpoint, enc.encode([1, 2, 12345, 0, "drafter", "0", None, 2**62, {"buffer_full": 2**62},
                                       [[2, "tokens", 1]]]))
        wait_for(lambda: _frames(d) > frames, what="the forged frame taken in")
        assert (d.value("dflash_sidecar_records_dropped_total", role="drafter") or 0) == honest
        assert d.value("dflash_sidecar_records_accepted_total", role="drafter") == res["records_total"]
        assert _dropped(d).get("impossible_count") == 1
    finally:
        d.stop()


def test_another_process_cannot_speak_for_a_senders_id(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path)
    sender, total = 777, 0
    try:
        with raw_publisher(d.endpoint) as pub:
            pub.send(enc.encode([1, 1, sender, 0, {"pid": os.getpid(), "role": "target",
                                                   "worker": "0", "started_unix_s": time.time()}]))
            for seq in range(1, 11):
                total += 3
                pub.send(enc.encode([1, 2, sender, seq, "target", "0", None, total, {}, [[2, "tokens", 1]] * 3]))
            wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="target") == total,
                     what="the honest batches")
            # the same sender id from another process: a records_total ahead of the honest one
            frames = _frames(d)
            forged = [1, 2, sender, 11, "target", "0", None, total + 1000, {}, [[2, "tokens", 1]]]
            _forge(d.endpoint, enc.encode(forged))
            wait_for(lambda: _frames(d) > frames, what="the forged frame taken in")
            for seq in range(12, 22):
                total += 3
                pub.send(enc.encode([1, 2, sender, seq, "target", "0", None, total, {}, [[2, "tokens", 1]] * 3]))
            wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="target") == total,
                     what="the honest batches after the forgery")
            assert "bad_sequence" not in _dropped(d)
            assert _dropped(d).get("wrong_peer") == 1
            assert d.value("dflash_sidecar_records_dropped_total", role="target") in (None, 0.0)
    finally:
        d.stop()
