"""Synthetic runs for the run timeline and its page: a run of any length, window by window, through
the real ``RunTimelineBook`` (the tests check its merged buckets; bench/bench_html.py measures its
size, load time and the page's paint time), with a ledger view whose verdict seconds are the
windows' own."""

from __future__ import annotations

import math
import random
from typing import Any

from sidecar.aggregation.timeline import RunTimelineBook
from sidecar.model.ledger import CAUSES, RoleLedger, RunLedgerView, RunVerdicts, VerdictShare

RUN = "synthetic-run"
START = 1_790_000_000.0


def verdict_at(i: int, windows: int) -> str:
    """The verdict of window ``i``: balanced, an input-bound stretch from 30 % to 70 % of the run,
    a communication-bound stretch near its end."""
    share = i / max(1, windows)
    if 0.3 <= share < 0.7:
        return "input-bound"
    return "communication-bound" if 0.9 <= share < 0.95 else "balanced"


def point(i: int, windows: int, window_s: float, gpus: int, roles: tuple[str, ...], rng: random.Random,
          ) -> dict[str, Any]:
    """Window ``i`` of a run (as ``sidecar.aggregation.timeline.window_point`` makes them)."""
    t1 = START + (i + 1) * window_s
    verdict = verdict_at(i, windows)
    slow = verdict == "input-bound"
    means: dict[str, float] = {"conf": round(rng.uniform(0.6, 1.0), 3)}
    for role in roles:
        means[f"rate|{role}"] = round(rng.uniform(8, 10) * (0.5 if slow else 1.0), 3)
        means[f"step|{role}|forward"] = round(rng.uniform(0.03, 0.035), 4)
        means[f"step|{role}|backward"] = round(rng.uniform(0.05, 0.055), 4)
        means[f"step|{role}|data_wait"] = round(rng.uniform(0.09, 0.1) if slow else rng.uniform(0.001, 0.003), 4)
        means[f"step|{role}|comm_wait"] = round(rng.uniform(0.005, 0.01), 4)
        means[f"step|{role}|host"] = round(rng.uniform(0.001, 0.002), 4)
    for g in range(gpus):
        busy = (0.45 if slow else 0.92) + 0.05 * math.sin(i / 50 + g)
        means[f"busy|gpu{g}"] = round(busy, 3)
        means[f"power|gpu{g}"] = round(150 + 500 * busy, 1)
    out = {"t0": round(t1 - window_s, 3), "t1": round(t1, 3), "s": window_s, "n": 1, "v": {verdict: window_s},
           "m": means}
    if i % 997 == 500:  # now and then a sender drops records
        out["c"] = {"drops": 3}
    return out


def book(windows: int, window_s: float = 10.0, gpus: int = 8, roles: tuple[str, ...] = ("trainer",),
         seed: int = 0) -> tuple[RunTimelineBook, dict[str, float]]:
    """A run of ``windows`` windows through a ``RunTimelineBook``; with the verdict seconds fed."""
    rng = random.Random(seed)
    b = RunTimelineBook(RUN)
    fed: dict[str, float] = {}
    for i in range(windows):
        p = point(i, windows, window_s, gpus, roles, rng)
        for k, v in p["v"].items():
            fed[k] = fed.get(k, 0.0) + v
        b.add(p)
        if i == windows // 2:
            b.mark(p["t1"], "end", roles[0], "unclean")
            b.mark(p["t1"] + window_s, "start", roles[0])
    return b, fed


def ledger_view(fed: dict[str, float], windows: int, window_s: float,
                roles: tuple[str, ...] = ("trainer",)) -> RunLedgerView:
    """A run ledger view of the synthetic run: its verdict seconds, and a plausible split by cause."""
    wall = windows * window_s
    seconds = dict.fromkeys(CAUSES, 0.0) | {"productive": 0.6 * wall, "data": 0.3 * wall, "communication": 0.07 * wall,
                                            "startup": 0.03 * wall}
    role_views = tuple(RoleLedger(RUN, r, seconds, dict.fromkeys(CAUSES, 0.0), 1e6, windows * 90, 8, "NVIDIA H100",
                                  START, START + wall) for r in roles)
    shares = tuple(VerdictShare(k, v, round(v / window_s), (("trainer.data_wait", 0.5),))
                   for k, v in sorted(fed.items(), key=lambda kv: -kv[1]))
    return RunLedgerView(role_views, verdicts=(RunVerdicts(RUN, shares),))
