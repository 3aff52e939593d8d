"""Restart semantics, seen by a real Prometheus server scraping every second: counters stay
monotonic within each daemon life, every restart (SIGTERM and SIGKILL) shows as a change of
``dflash_sidecar_start_time_seconds`` and as a counter reset, so ``resets()`` counts the restarts,
``rate()`` never goes negative or spikes, and ``increase()`` over the restarts matches what the
trainer sent. Prometheus needs 5-6 s before its first sample; the test takes about 40 s."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc, free_port, require_tool
from tests.soak.procs import PublisherProc
from tests.soak.prom import Prometheus, scalar, wait_samples

RATE = 2000.0
"""Records/s of the one publisher thread; one call in ten is count("tokens", 10): tokens/s == RATE."""
SAMPLES_PER_LIFE = 6


def _by_life(values: list[tuple[float, float]], starts: list[tuple[float, float]]) -> dict[float, list[float]]:
    """Split a counter's samples by the start time scraped with them (same timestamps)."""
    start_at = dict(starts)
    out: dict[float, list[float]] = {}
    for t, v in values:
        out.setdefault(start_at[t], []).append(v)
    return out


@pytest.mark.timeout(240)
def test_rate_and_resets_stay_right_across_daemon_restarts(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    port = free_port()
    endpoint = f"ipc://{tmp_path}/sidecar.sock"
    prom = Prometheus(prometheus, tmp_path, port)
    pub = PublisherProc(tmp_path, {"endpoint": endpoint, "role": "drafter", "name": "r", "threads": 1, "rate": RATE,
                                   "bad_every": 0})
    daemon = None
    starts = []
    try:
        for index, end in enumerate(("sigterm", "sigkill", "final")):
            life_dir = tmp_path / f"life-{index}"
            life_dir.mkdir()
            daemon = DaemonProc(life_dir, endpoint=endpoint, port=port)
            starts.append(daemon.value("dflash_sidecar_start_time_seconds"))
            wait_samples(prom, "dflash_sidecar_start_time_seconds", starts[-1], SAMPLES_PER_LIFE)
            if end == "final":
                final = pub.stop()
                break
            daemon.stop(signal.SIGTERM if end == "sigterm" else signal.SIGKILL)
            daemon = None
            time.sleep(1.5)
        at = time.time()
        start_samples = prom.samples("dflash_sidecar_start_time_seconds", "3m", at)
        tokens = prom.samples('dflash_trainer_tokens_total{worker="r-0"}', "3m", at)
        accepted = prom.samples('dflash_sidecar_records_accepted_total{worker="r-0"}', "3m", at)
        first = min(t for t, _ in tokens)
        rates = prom.range('rate(dflash_trainer_tokens_total{worker="r-0"}[5s])', first + 5, at)
        figures = {
            "restarts_seen": scalar(prom.query("changes(dflash_sidecar_start_time_seconds[3m])", at)),
            "resets_tokens": scalar(prom.query('resets(dflash_trainer_tokens_total{worker="r-0"}[3m])', at)),
            "resets_accepted": scalar(prom.query(
                'resets(dflash_sidecar_records_accepted_total{worker="r-0"}[3m])', at)),
            "increase_tokens": scalar(prom.query('increase(dflash_trainer_tokens_total{worker="r-0"}[3m])', at)),
            "tokens_sent": final["calls"],  # one call in ten is count("tokens", 10)
            "tokens_seen": sum(v[-1] for v in _by_life(tokens, start_samples).values()) - tokens[0][1],
            "rate_min": min(v for _, v in rates), "rate_max": max(v for _, v in rates),
            "true_rate": final["calls"] / final["active_s"],
            "before_join_increase": scalar(prom.query(
                'increase(dflash_sidecar_records_dropped_total{worker="r-0",reason="before_join"}[3m])', at)),
            "samples": len(tokens),
        }
        (tmp_path / "restart-figures.json").write_text(json.dumps(figures, indent=1))
        print(json.dumps(figures))
    finally:
        pub.kill()
        if daemon is not None:
            daemon.stop()
        prom.stop()
    # each life's start time is what Prometheus saw, and it changed exactly at the two restarts
    assert sorted({v for _, v in start_samples}) == sorted(starts)
    assert figures["restarts_seen"] == 2
    for counter in (tokens, accepted):
        lives = _by_life(counter, start_samples)
        assert len(lives) == 3
        for values in lives.values():
            assert values == sorted(values), "a counter went backwards within one daemon life"
    assert figures["resets_tokens"] == 2 and figures["resets_accepted"] == 2
    assert figures["rate_min"] >= 0
    assert figures["rate_max"] <= 3 * figures["true_rate"], figures
    # increase() across both restarts adds up every life (not just the last), within extrapolation;
    # what it cannot see was sent before Prometheus's first sample or died with the SIGKILL
    assert 0.9 * figures["tokens_seen"] <= figures["increase_tokens"] <= 1.1 * figures["tokens_seen"], figures
    assert figures["tokens_seen"] <= figures["tokens_sent"]
