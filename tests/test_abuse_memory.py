"""Abuse: a client cannot make the daemon allocate without bound. One daemon takes every flood of
``tests/soak/floods.py`` in turn (frames over the limit, 4 MiB frames of nested or empty
containers, huge maps and hellos, and cardinality floods of names, label values, allocator
devices and sender ids); its RSS is read from /proc before, during (every 20 ms) and after.
Figures: ``bench/abuse_memory.py``, recorded in ``bench/RESULTS_SOAK.md``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc
from tests.soak.floods import FLOODS, run_flood
from trainer_shim import wire

MiB = 1024 * 1024
TABLE_FLOOD_PEAK = 64 * MiB
"""Most a flood of small frames (names, labels, devices, senders) may add at its peak."""
DECODE_SLACK = 64 * MiB
"""Beyond the bytes a flood of 4 MiB frames put in the daemon's queue: decoding one frame's worth."""
RETAINED = 32 * MiB
"""Most any one flood may leave behind once it is over."""
TOTAL_RETAINED = 64 * MiB
"""Most all floods together may leave behind (10,000 series from the name flood included)."""


@pytest.mark.timeout(300)
def test_no_flood_makes_the_daemon_allocate_without_bound(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path)
    try:
        results = [run_flood(d, flood) for flood in FLOODS]
        samples = d.samples()
    finally:
        d.stop()
    start = results[0]["rss_before"]
    for flood, r in zip(FLOODS, results):
        assert r["alive"] and r["taken_in"], r
        sent_bytes = r["frames"] * wire.MAX_MESSAGE_BYTES if "MiB" in flood.name else 0
        limit = sent_bytes + DECODE_SLACK if sent_bytes else TABLE_FLOOD_PEAK
        assert r["rss_peak"] - r["rss_before"] <= limit, r
        assert r["rss_after"] - r["rss_before"] <= RETAINED, r
    assert results[-1]["rss_after"] - start <= TOTAL_RETAINED, results
    dropped = {lab["reason"]: v for lab, v in samples["dflash_sidecar_messages_dropped_total"]}
    assert dropped["oversized"] >= 100 and dropped["malformed"] >= 200  # counted, by name
    assert dropped["too_many_labels"] > 0 and dropped["too_many_senders"] > 0
    records = {}
    for lab, v in samples["dflash_sidecar_records_dropped_total"]:
        records[lab["reason"]] = records.get(lab["reason"], 0) + v
    assert records["cardinality"] > 0 and records["malformed_record"] >= 100 * 4096
    assert samples["dflash_sidecar_series"][0][1] == 10_000  # the budget, not 100,000
    assert samples["dflash_sidecar_disconnects_total"][0][1] >= 10  # each frame over 4 MiB closed its link
