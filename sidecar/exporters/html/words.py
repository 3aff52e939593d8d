"""What the run's picture says in words: the next thing to check per verdict, the colours, and a
short text summary of every chart (for people who cannot see it, and for a quick read).

Pure functions of ``model`` types; ``sidecar.exporters.html.render`` puts them on the page.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.model.ledger import CAUSES, RoleLedger, RunVerdicts
from sidecar.model.timeline import RunTimeline, TimelineEvent

NEXT_CHECK: dict[str, str] = {
    "input-bound": "the data loader: more workers (num_workers), pinned memory, prefetching, or faster storage; "
                   "its wait shows as data in the step time below",
    "host-bound": "host work between the timed phases: logging, Python overhead, synchronisations (.item(), "
                  "printing tensors); time it with timing() so it gets a name",
    "communication-bound": "the collectives: the interconnect, overlap of all-reduce with backward, bucket sizes, "
                           "and whether one rank arrives late",
    "target-bound": "the target model's forward pass: more target workers or GPUs, a larger batch per forward",
    "drafter-bound": "the drafter's step: more drafter workers, or fewer targets feeding it",
    "queue-starved": "the hidden-state hand-off: packing and transfer time, and the queue's capacity",
    "throttled": "the GPUs' clocks: temperature, power limits and cooling (the detail names the GPU and reason)",
    "straggler": "the slow worker the detail names: its GPU, its node, its data shard",
    "compute-bound": "the model itself: the GPUs are busy; look at kernel efficiency, precision and batch size",
    "balanced": "nothing waits beyond its threshold; throughput now grows with more hardware or a faster model",
    "unknown": "what the trainer publishes: dflash-sidecar explain says which timings or GPU readings are missing",
}
"""Verdict -> the next thing to check, in words (docs/METRICS.md describes each verdict)."""

COLOURS: dict[str, str] = {
    "input-bound": "#e69f00", "host-bound": "#cc79a7", "communication-bound": "#56b4e9", "target-bound": "#d55e00",
    "drafter-bound": "#0072b2", "queue-starved": "#f0e442", "throttled": "#a50026", "straggler": "#8c510a",
    "compute-bound": "#009e73", "balanced": "#7fbf7b", "unknown": "#bbbbbb", "idle": "#eeeeee",
}
"""Verdict -> its colour on the band (Okabe-Ito where it has one: told apart with colour blindness)."""

CAUSE_COLOURS: dict[str, str] = {
    "productive": "#009e73", "data": "#e69f00", "host": "#cc79a7", "communication": "#56b4e9", "queue": "#f0e442",
    "throttled": "#a50026", "startup": "#999999", "compile": "#6a3d9a", "warmup": "#b2abd2", "checkpoint": "#0072b2",
    "shutdown": "#777777", "unattributed": "#d9d9d9", "unobserved": "#4d4d4d", "restart_gap": "#d55e00",
}
"""Run ledger cause -> its colour."""

PHASE_COLOURS: dict[str, str] = {
    "forward": "#009e73", "backward": "#5ab4ac", "forward_backward": "#35978f", "optimizer": "#01665e",
    "pack": "#8c510a", "data_wait": "#e69f00", "queue_wait": "#f0e442", "queue_put_wait": "#d8c100",
    "comm_wait": "#56b4e9", "host": "#cc79a7", "unattributed": "#bdbdbd",
}
"""Step time phase (``sidecar.aggregation.timeline.STEP_PHASES``) -> its colour, in the order the
chart stacks them: work in greens first, waits in the colours of the ledger causes they count as."""


def clock(unix_s: float) -> str:
    """``12:04:05 UTC`` (with the date when it is not today's in UTC)."""
    same_day = time.strftime("%Y-%m-%d", time.gmtime(unix_s)) == time.strftime("%Y-%m-%d", time.gmtime())
    return time.strftime("%H:%M:%S UTC" if same_day else "%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_s))


def seconds(s: float) -> str:
    """``42.0 s``, ``12.5 min``, ``3.2 h`` or ``2.1 days``."""
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if s >= 2 * size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.1f} s"


def headline(kept: RunVerdicts | None) -> tuple[str, str, str]:
    """(the dominant verdict, its evidence in words, the next thing to check)."""
    top = kept.dominant if kept is not None else None
    if kept is None or top is None:
        return ("no verdict kept", "the run had no window with a live trainer and an insight",
                NEXT_CHECK["unknown"])
    share = kept.time_share(top)
    evidence = ", ".join(f"{k} {x:.2f}" for k, x in top.evidence) + (f"; {top.detail}" if top.detail else "")
    return (f"{top.name} for {share:.0%} of the run ({seconds(top.seconds)} of {seconds(kept.seconds)} with a "
            f"verdict, {top.windows} of {kept.windows} windows)", evidence or "no evidence kept",
            NEXT_CHECK.get(top.name, NEXT_CHECK["unknown"]))


def band_summary(timeline: RunTimeline) -> str:
    """The verdicts' seconds and shares over the timeline, when the first turned to the dominant
    one, and how often the verdict changed."""
    told = timeline.verdict_seconds()
    total = sum(told.values())
    if total <= 0:
        return "No verdict in the kept windows."
    parts = [f"{name} {seconds(s)} ({s / total:.0%})" for name, s in sorted(told.items(), key=lambda kv: -kv[1])]
    top = max(told, key=lambda k: told[k])
    first = next((p["t0"] for p in timeline.points if top in p.get("v", {})), None)
    changes, last = 0, None
    for p in timeline.points:
        v = p.get("v", {})
        name = max(v, key=lambda k: v[k]) if v else None
        if name is not None and last is not None and name != last:
            changes += 1
        last = name or last
    when = f"; first {top} at {clock(first)}" if first is not None else ""
    return f"Verdict over {seconds(total)}: {', '.join(parts)}{when}; the verdict changed {changes} times."


def _stats(values: Sequence[float]) -> tuple[float, float, float]:
    return sum(values) / len(values), min(values), max(values)


def series_values(timeline: RunTimeline, key: str) -> list[float]:
    """The kept means of one series, oldest first (points without it left out)."""
    return [float(p["m"][key]) for p in timeline.points if key in p.get("m", {})]


def gpu_summary(timeline: RunTimeline, gpus: Sequence[str]) -> str:
    """Each GPU series' mean, lowest and highest busy share and power."""
    if not gpus:
        return ("No GPU readings in this run: the daemon ran without GPU metrics, or NVML found no GPU. "
                "The verdict then comes from the trainer's own timings.")
    parts = []
    for gpu in gpus:
        busy, power = series_values(timeline, f"busy|{gpu}"), series_values(timeline, f"power|{gpu}")
        text = gpu
        if busy:
            mean, low, high = _stats(busy)
            text += f" busy {mean:.0%} on average ({low:.0%} to {high:.0%})"
        if power:
            mean, low, high = _stats(power)
            text += f", power {mean:.0f} W ({low:.0f} to {high:.0f} W)"
        parts.append(text)
    return "; ".join(parts) + "."


def step_summary(timeline: RunTimeline, role: str, phases: Sequence[str]) -> str:
    """The role's mean step time and its split by phase."""
    means = {c: series_values(timeline, f"step|{role}|{c}") for c in phases}
    avg = {c: sum(v) / len(v) for c, v in means.items() if v}
    total = sum(avg.values())
    if total <= 0:
        return f"{role}: no phase timings, so its step time cannot be split."
    parts = ", ".join(f"{c} {s * 1000:.1f} ms ({s / total:.0%})" for c, s in sorted(avg.items(), key=lambda kv: -kv[1]))
    return f"{role}: {total * 1000:.1f} ms per step on average: {parts}."


def rate_summary(timeline: RunTimeline, roles: Sequence[str]) -> str:
    """Each role's step rate, and the queue fill where there is a queue."""
    parts = []
    for role in roles:
        rates = series_values(timeline, f"rate|{role}")
        if rates:
            mean, low, high = _stats(rates)
            parts.append(f"{role} {mean:.1f} steps/s on average ({low:.1f} to {high:.1f})")
    queue = series_values(timeline, "queue")
    if queue:
        parts.append(f"queue fill {_stats(queue)[0]:.0%} on average")
    return ("; ".join(parts) + ".") if parts else "No step rate in the kept windows."


def ledger_summary(roles: Sequence[RoleLedger]) -> str:
    """Each role's wall time and its causes' shares (those above 0.5 %)."""
    parts = []
    for r in roles:
        wall = r.wall_s
        if wall <= 0:
            parts.append(f"{r.role}: no time accounted yet")
            continue
        shares = ", ".join(f"{c} {r.seconds[c] / wall:.0%}" for c in sorted(CAUSES, key=lambda c: -r.seconds[c])
                           if r.seconds[c] / wall >= 0.005)
        parts.append(f"{r.role}: wall {seconds(wall)}: {shares}")
    return "; ".join(parts) + "." if parts else "No role in the ledger."


def events_summary(events: Sequence[TimelineEvent], dropped: int) -> str:
    """How many sender starts, ends by how, and daemon restarts the markers show."""
    counts: dict[str, int] = {}
    for e in events:
        label = f"{e.kind} ({e.detail})" if e.kind == "end" else e.kind
        counts[label] = counts.get(label, 0) + 1
    if not counts:
        return "No sender start, end or daemon restart was marked."
    names = {"start": "sender start{s}", "daemon": "daemon restart{s}"}
    text = ", ".join(f"{n} " + names.get(k, "sender end{s}" + k[3:]).format(s="" if n == 1 else "s")
                     for k, n in counts.items())
    return text + (f" ({dropped} older markers forgotten)" if dropped else "") + "."


def drops_summary(timeline: RunTimeline) -> str:
    """How many records the run's senders dropped or lost, in how many points, and when first."""
    dropped = [(p["t1"], p["c"]["drops"]) for p in timeline.points if p.get("c", {}).get("drops")]
    if not dropped:
        return "No record was dropped or lost."
    return (f"{sum(n for _, n in dropped):,} records dropped or lost, in {len(dropped)} of {len(timeline.points)} "
            f"points, the first by {clock(dropped[0][0])} (dflash-sidecar explain and the "
            "dflash_sidecar_records_dropped_total series say why).")


def event_rows(events: Sequence[TimelineEvent]) -> list[dict[str, Any]]:
    """The markers as the page draws them: time, a one-letter tag, colour and a title."""
    rows = []
    for e in events:
        tag, colour = {"start": ("S", "#1a9850"), "daemon": ("D", "#6a3d9a")}.get(e.kind, ("E", "#555555"))
        if e.kind == "end" and e.detail in ("unclean", "oom", "crashed"):
            colour = "#d73027"
        title = f"{e.role} {e.kind}" + (f" ({e.detail})" if e.detail else "") + f" at {clock(e.unix_s)}"
        rows.append({"t": e.unix_s, "tag": tag, "colour": colour, "title": title.strip()})
    return rows


def lacking(timeline: RunTimeline | None, problem: str | None, gpus: Mapping[str, Any]) -> list[str]:
    """What this picture lacks, in words."""
    out = []
    if timeline is None:
        why = {"absent": "its state was written before timelines were kept, or the run is older than the "
                         "timelines kept", "newer_version": "its timeline file is of a newer version",
               "corrupt": "its timeline file is unusable", "unreadable": "its timeline file cannot be read"}
        out.append(f"No timeline for this run ({why.get(problem or 'absent', problem or '')}): the charts over "
                   "time are missing; the run ledger's totals and verdicts below are complete.")
    elif not gpus:
        out.append("No GPU data: the GPU chart is missing.")
    if timeline is not None and timeline.bucket_s:
        out.append(f"Older windows are merged into buckets of {seconds(timeline.bucket_s)} (the most recent are "
                   "kept as they were; verdict seconds are kept exactly).")
    return out
