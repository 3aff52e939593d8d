"""Abuse: a client cannot make the daemon allocate without bound. One daemon takes every flood of
``tests/soak/floods.py`` in turn (frames over the limit, 4 MiB frames of nested or empty
containers, huge maps and hellos, and cardinality floods of names, label values, allocator
devices and sender ids), then the 4 MiB floods once more; its RSS is read from /proc before,
during (every 20 ms) and after each.
Figures: ``bench/abuse_memory.py``, recorded in ``bench/RESULTS_SOAK.md``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc
from tests.launcher import Samples
from tests.soak.floods import FLOODS, is_big, run_all
from trainer_shim import wire

MiB = 1024 * 1024
TABLE_FLOOD_PEAK = 64 * MiB
"""Most a flood of small frames (names, labels, devices, senders) may add at its peak."""
TABLE_FLOOD_RETAINED = 64 * MiB
"""Most a flood of small frames may leave behind: 10,000 timing series from the timing-name flood
(their sketches, the window report over them and the rendered page; measured 54 MiB before the
page was served in pieces, about 36 MiB since: bench/RESULTS_SOAK.md; 32 MiB for 10,000 gauges)."""
DECODE_SLACK = 64 * MiB
"""Beyond the bytes a flood of 4 MiB frames put in the daemon's queue: decoding one frame's worth."""
RATCHET_SLACK = 64 * MiB
"""After the second round of 4 MiB floods, RSS may exceed the first round's highest peak by at
most this: the allocator may keep part of a flood's heap, but a repeated flood reuses it."""


def counted(d: DaemonProc, timeout_s: float = 60.0) -> Samples:
    """The daemon's samples once the whole messages the floods sent are all counted dropped (or
    after ``timeout_s``, for the assertions to say what was missing). A flood is taken in when
    its frames were received; they are decoded, and counted, behind that: on a loaded box the
    last 4 MiB frames can still be waiting to be decoded when the flood ends."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = d.samples()
        dropped = {lab["reason"]: v for lab, v in samples.get("dflash_sidecar_messages_dropped_total", [])}
        if dropped.get("oversized", 0) >= 200 and dropped.get("malformed", 0) >= 400:
            return samples
        if time.monotonic() > deadline:
            return samples
        time.sleep(0.5)


@pytest.mark.timeout(420)
def test_no_flood_makes_the_daemon_allocate_without_bound(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path)
    try:
        results = run_all(d)
        samples = counted(d)
    finally:
        d.stop()
    floods = {flood.name: flood for flood in FLOODS}
    for r in results:
        assert r["alive"] and r["taken_in"], r
        if is_big(floods[r["flood"]]):
            # what a client sends faster than the daemon drains waits in ZeroMQ's queue; beyond
            # that, decoding adds no more than one frame's worth
            assert r["rss_peak"] - r["rss_before"] <= r["frames"] * wire.MAX_MESSAGE_BYTES + DECODE_SLACK, r
        else:  # tables are capped: a flood of small frames costs little and leaves little
            assert r["rss_peak"] - r["rss_before"] <= TABLE_FLOOD_PEAK, r
            assert r["rss_after"] - r["rss_before"] <= TABLE_FLOOD_RETAINED, r
    first = [r for r in results if r["round"] == 1]
    second = [r for r in results if r["round"] == 2]
    # a leak would add each round's 400 MB again; glibc's retained heap stays under the high-water mark
    assert second[-1]["rss_after"] <= max(r["rss_peak"] for r in first) + RATCHET_SLACK, results
    dropped = {lab["reason"]: v for lab, v in samples["dflash_sidecar_messages_dropped_total"]}
    assert dropped["oversized"] >= 200 and dropped["malformed"] >= 400  # counted, by name (both rounds)
    assert dropped["too_many_labels"] > 0 and dropped["too_many_senders"] > 0
    for r in first:  # the records refused, by name, counted as each flood ended (a later flood of
        refused = floods[r["flood"]].refused  # label values may evict its labels' counts, by design)
        if refused is not None:
            assert r["refused"] >= max(1, refused[3] * r["frames"]), r
    assert samples["dflash_sidecar_series"][0][1] == 10_000  # the budget, not 100,000
    assert samples["dflash_sidecar_disconnects_total"][0][1] >= 10  # each frame over 4 MiB closed its link
