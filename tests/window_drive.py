"""A window driver for the insight's rules: events as a trainer would send them, fed to the real
aggregator (the daemon's mapping and ingest), rolled into windows, each window's verdict computed
on a GPU of a set busy share. The tests of the clocks, the insight and the mapping share it."""

from __future__ import annotations

from sidecar.aggregation.aggregator import Aggregator
from sidecar.aggregation.insight import compute_insight
from sidecar.core.pipeline import ingest_records
from sidecar.model.insight import GpuFacts
from sidecar.model.window import PROFILE, TIMING, SeriesView
from sidecar.processing.mapping import Mapper

WINDOW_S = 10.0
"""The daemon's default window (seconds)."""

Event = tuple[float, int, int | None, dict[str, float]]
"""(monotonic seconds it arrives, sender id, step, profile; no step: each entry a ``timing()`` record, in ms)."""


def drive(events: list[Event], name: str, busy: float = 0.45, mapper: Mapper | None = None,
           window_s: float = WINDOW_S) -> tuple[list[SeriesView], list[str]]:
    """``name``'s view at the end of each window (``window_s``) from the first event's (with data
    or not) and each window's verdict (the GPU ``busy``), on an aggregator whose clock moves to each
    event as it arrives (one ``publish`` each, or a ``timing()`` record per entry where its step is
    None; every sender under one role and worker), names mapped by ``mapper`` (no rules by default)."""
    events = sorted(events, key=lambda e: e[0])
    now = [events[0][0]]
    agg, mapper = Aggregator(clock=lambda: now[0]), mapper or Mapper()
    seen: list[SeriesView] = []
    verdicts: list[str] = []
    i, end = 0, events[0][0] + window_s
    while end <= events[-1][0] + window_s:
        while i < len(events) and events[i][0] < end:
            now[0], sender, step, profile = events[i]
            records = [[PROFILE, step, profile]] if step is not None else [[TIMING, k, v] for k, v in profile.items()]
            ingest_records(agg, "trainer", "0", records, mapper, sender_id=sender)
            i += 1
        now[0] = end
        report = agg.roll(end, end, window_s)
        seen += [v for v in report.series if v.kind == TIMING and (v.raw or v.name) == name]
        verdicts.append(compute_insight(report, gpus=GpuFacts(busy={"0": busy})).verdict.name)
        end += window_s
    return seen, verdicts
