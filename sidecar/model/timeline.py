"""A run's timeline as readers see it: the run ledger's windows over time, bounded.

Computed by ``sidecar.aggregation.timeline`` (how it is bounded: its docstring and docs/METRICS.md,
"Run timeline"); read by ``dflash-sidecar report --html`` and the W&B exporter's HTML panel
(``sidecar.exporters.html``). A *point* is one window of the run, or several merged into one
bucket; it is a plain mapping, never changed once made (merging makes a new one):

- ``t0``, ``t1``: the first window's begin and the last window's end (Unix seconds);
- ``s``: the seconds of the run the point covers (the run's part of its windows);
- ``n``: the windows merged into it;
- ``v``: verdict -> seconds the run held it in those windows (the run ledger's verdict seconds,
  ``sidecar.aggregation.run_verdicts``: they sum to the ledger's over the kept points);
- ``m``: series -> its mean over the seconds that had it (``SERIES`` names them);
- ``w``: series -> the seconds that had it, only where fewer than ``s``;
- ``c``: count -> its total (``drops``: records dropped or lost, the run's senders').
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TIMELINE_VERSION = 1
"""The version of a run timeline's state file (``sidecar.core.timeline_state``)."""

SERIES: tuple[tuple[str, str], ...] = (
    ("conf", "the verdict's confidence (0-1)"),
    ("queue", "hidden-state queue fill (0-1), where there is a queue"),
    ("rate|<role>", "the role's steps (batches) per second, its workers together"),
    ("step|<role>|<phase>", "seconds per step of the role's workers in a phase "
                            "(``sidecar.aggregation.timeline.STEP_PHASES``)"),
    ("busy|<gpu>", "a GPU's busy share (0-1: GPM SM activity, else NVML utilization); a group's mean on big boxes"),
    ("power|<gpu>", "a GPU's power draw (watts); a group's total on big boxes"),
)
"""The series a point's ``m`` holds: key pattern, meaning and unit (docs/METRICS.md lists them)."""

EVENT_KINDS: tuple[str, ...] = ("start", "end", "daemon")
"""``start``: a sender process of the run started (its role); ``end``: one ended (its role, and
how, ``model.ends.HOWS``); ``daemon``: the daemon restarted while the run was kept (the time it
was down is not in the timeline)."""


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """A marker on the run's time axis (``EVENT_KINDS``); ``unix_s`` when it happened."""

    unix_s: float
    kind: str
    role: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RunTimeline:
    """One run's timeline: ``points`` oldest first (module docstring), ``events`` oldest first.
    ``window_s``: the daemon's window (seconds); ``bucket_s``: the width of the merged buckets
    before the recent windows (0 while none is merged); ``windows``: windows folded in, all told;
    ``events_dropped``: the oldest markers forgotten to keep the bound."""

    run: str
    points: tuple[Mapping[str, Any], ...]
    events: tuple[TimelineEvent, ...] = ()
    window_s: float = 0.0
    bucket_s: float = 0.0
    windows: int = 0
    events_dropped: int = 0

    def verdict_seconds(self) -> dict[str, float]:
        """Verdict -> seconds over every kept point (equal to the run ledger's)."""
        out: dict[str, float] = {}
        for p in self.points:
            for name, seconds in p.get("v", {}).items():
                out[name] = out.get(name, 0.0) + float(seconds)
        return out

    def keys(self) -> list[str]:
        """Every series key some point holds, in first-seen order."""
        seen: dict[str, None] = {}
        for p in self.points:
            seen.update(dict.fromkeys(p.get("m", {})))
        return list(seen)
