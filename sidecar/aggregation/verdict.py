"""The bottleneck verdict: which part of the DFlash pipeline limits the run, and why.

The rules (docs/METRICS.md explains them for operators) follow the hidden-state queue between
the two roles, because whichever side of a bounded queue waits is not the limit:

1. Drafters wait on an empty queue (ready deficit >= ``starved_ratio``): the supply side limits.
   Which part of it is read from the target workers' time breakdown: waiting for the host data
   loader -> ``host-bound``; packing/handing off hidden states -> ``queue-starved``; both sides
   waiting on each other (targets blocked on a full queue too) -> ``queue-starved`` (the queue is
   too small); targets busy in their forward pass -> ``target-bound``; no target timings to say
   more -> ``queue-starved``.
2. Otherwise targets wait for room in a full queue (put-wait share >= ``backpressure_ratio``, or,
   without that timing, the queue fill >= ``queue_full_ratio``): the drafters limit ->
   ``drafter-bound`` (``host-bound`` if the drafters themselves wait on the data loader).
3. Otherwise ``balanced``: neither side waits for the other.

Two causes then override, because they explain the limit rather than locate it: ``throttled``
when a GPU of the limiting role (or of an unknown role, or any GPU when balanced) reports a
throttling clock-event reason; else ``straggler`` when a worker of the limiting role (any role
when balanced) scores below ``straggler_score``. Windows shorter than ``MIN_WINDOW_S``, without
data from either role, or with nothing that tells whether a side waits (no ``queue_wait`` or
``queue_put_wait`` timing, no queue gauges) get ``unknown``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.model.insight import Verdict

MIN_WINDOW_S = 0.5
"""Windows shorter than this (the partial last window at shutdown) get ``unknown``."""

DEFAULT_THROTTLE_REASONS: tuple[str, ...] = (
    "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "board_limit",
    "reliability")
"""NVML clock-event reasons (``sidecar.model.gpu.CLOCK_EVENT_REASONS``) that make a ``throttled``
verdict, in bit order; the default of ``insight_throttle_reasons``. ``sw_power_cap`` is left out:
nvml.h says of it "the clocks have been optimized to ensure not to exceed currently set power
limits", the normal state of a saturated GPU, and names it a clock-event reason
(``nvmlClocksEventReasonSwPowerCap``), keeping ``nvmlClocksThrottleReason*`` names for the
hardware slowdowns; ``gpu_idle``, ``sync_boost`` and the clock settings are not limits either."""


@dataclass(frozen=True, slots=True)
class InsightSettings:
    """Role names and verdict thresholds (each a ``insight_*`` setting in ``sidecar.config``)."""

    target_role: str = "target"
    drafter_role: str = "drafter"
    starved_ratio: float = 0.15
    """Ready deficit (drafter share of wall time waiting on an empty queue) from which drafters starve."""
    backpressure_ratio: float = 0.15
    """Target share of wall time blocked on a full queue from which the drafters are the limit."""
    queue_full_ratio: float = 0.9
    """Queue fill from which the drafters are the limit when targets publish no put-wait timing."""
    host_wait_ratio: float = 0.25
    """Share of the limiting role's wall time waiting on the host data loader that makes it host-bound."""
    handoff_ratio: float = 0.25
    """Share of target wall time packing hidden states that makes a starved queue queue-starved."""
    straggler_score: float = 0.7
    """A worker scoring below this (relative to the best of its role) is a straggler."""
    throttle_reasons: frozenset[str] = frozenset(DEFAULT_THROTTLE_REASONS)

    @classmethod
    def from_config(cls, cfg: Any) -> InsightSettings:
        """From a ``sidecar.config.Config``: each field from its ``insight_<field>`` setting."""
        values = {f.name: getattr(cfg, "insight_" + f.name) for f in dataclasses.fields(cls)}
        values["throttle_reasons"] = frozenset(values["throttle_reasons"])
        return cls(**values)


INSIGHT_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(InsightSettings)}
"""Each verdict setting's default, by field name (the ``insight_*`` settings read them)."""


class _WorkerLike(Protocol):
    @property
    def worker(self) -> str: ...
    @property
    def score(self) -> float | None: ...
    @property
    def straggler(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class RoleFacts:
    """What the rules read about one role: its time shares and its workers."""

    role: str
    time_share: Mapping[str, float]
    workers: tuple[_WorkerLike, ...]


def decide(roles: Mapping[str, RoleFacts], duration_s: float, ready_deficit: float | None,
           queue_fill: float | None, throttled: Mapping[str, tuple[str, ...]], gpu_roles: Mapping[str, str],
           s: InsightSettings) -> Verdict:
    """Apply the rules above to one window."""
    target, drafter = roles.get(s.target_role), roles.get(s.drafter_role)
    if duration_s < MIN_WINDOW_S or (target is None and drafter is None):
        return Verdict("unknown", (("window_s", duration_s),),
                       "window too short" if duration_s < MIN_WINDOW_S else "no pipeline data")
    t_share = target.time_share if target else {}
    d_share = drafter.time_share if drafter else {}
    put_wait = t_share.get("queue_put_wait")
    limit: str | None
    if ready_deficit is not None and ready_deficit >= s.starved_ratio:
        limit = s.target_role
        base = _supply_verdict(ready_deficit, t_share, put_wait, queue_fill, s)
    elif (put_wait is not None and put_wait >= s.backpressure_ratio) or (
            put_wait is None and queue_fill is not None and queue_fill >= s.queue_full_ratio):
        limit = s.drafter_role
        data_wait = d_share.get("data_wait", 0.0)
        evidence = _pairs((f"{s.target_role}.queue_put_wait", put_wait), ("queue_fill", queue_fill),
                          ("ready_deficit", ready_deficit))
        if data_wait >= s.host_wait_ratio:
            base = Verdict("host-bound", _pairs((f"{s.drafter_role}.data_wait", data_wait)) + evidence[:2])
        else:
            base = Verdict("drafter-bound", evidence)
    elif ready_deficit is None and put_wait is None and queue_fill is None:
        limit = None
        base = Verdict("unknown", (), "no queue_wait/queue_put_wait timings or queue gauges")
    else:
        limit = None
        base = Verdict("balanced", _pairs(("ready_deficit", ready_deficit),
                                          (f"{s.target_role}.queue_put_wait", put_wait),
                                          ("queue_fill", queue_fill)))
    return _override(base, limit, roles, throttled, gpu_roles, s)


def _supply_verdict(deficit: float, t_share: Mapping[str, float], put_wait: float | None,
                    queue_fill: float | None, s: InsightSettings) -> Verdict:
    """Drafters starve: find the part of the supply side that limits."""
    data_wait = t_share.get("data_wait", 0.0)
    pack = t_share.get("pack", 0.0)
    forward = t_share.get("forward")
    head = (("ready_deficit", deficit),)
    if put_wait is not None and put_wait >= s.backpressure_ratio:
        return Verdict("queue-starved", head + ((f"{s.target_role}.queue_put_wait", put_wait),),
                       "both sides wait: queue too small")
    if data_wait >= s.host_wait_ratio and data_wait >= pack:
        return Verdict("host-bound", head + ((f"{s.target_role}.data_wait", data_wait),))
    if pack >= s.handoff_ratio:
        return Verdict("queue-starved", head + ((f"{s.target_role}.pack", pack),))
    if forward is not None:
        return Verdict("target-bound", head + _pairs((f"{s.target_role}.forward", forward), ("queue_fill", queue_fill)))
    return Verdict("queue-starved", head + _pairs(("queue_fill", queue_fill)), "no target timings")


def _override(base: Verdict, limit: str | None, roles: Mapping[str, RoleFacts],
              throttled: Mapping[str, tuple[str, ...]], gpu_roles: Mapping[str, str], s: InsightSettings) -> Verdict:
    hot = {g: r for g, r in throttled.items() if limit is None or gpu_roles.get(g) in (None, limit)}
    if hot:
        detail = " ".join(f"gpu{g}:{'+'.join(r)}" for g, r in hot.items())
        return Verdict("throttled", (("throttled_gpus", float(len(hot))),) + base.evidence[:2],
                       f"{detail}, otherwise {base.name}")
    if limit is None:
        candidates = list(roles.values())
    else:
        candidates = [roles[limit]] if limit in roles else []
    stragglers = [(f.role, w) for f in candidates for w in f.workers if w.straggler and w.score is not None]
    if stragglers:
        role, worst = min(stragglers, key=lambda rw: rw[1].score or 0.0)
        assert worst.score is not None
        return Verdict("straggler", ((f"{role}.{worst.worker}.score", worst.score),) + base.evidence[:2],
                       f"worker {role}/{worst.worker}, {len(stragglers)} flagged")
    return base


def _pairs(*items: tuple[str, float | None]) -> tuple[tuple[str, float], ...]:
    return tuple((k, v) for k, v in items if v is not None)
