"""Where a profiler capture's steps went, from its Chrome/Kineto trace (``sidecar.model.trace``).

The trace is what ``torch.profiler``'s ``export_chrome_trace`` writes: a JSON object whose
``traceEvents`` hold complete events (``ph: "X"``, ``ts`` and ``dur`` in microseconds). Read here:
the steps (``ProfilerStep#N``, category ``user_annotation``), the host operators (``cpu_op``),
the DataLoader's annotation (``enumerate(DataLoader)...``), the device activities (``kernel``,
``gpu_memcpy``, ``gpu_memset``, with ``args.correlation``) and the runtime calls that launched
them (``cuda_runtime``/``cuda_driver`` with the same correlation). Everything else is ignored.

Pure functions of the parsed JSON: nothing here reads a clock or a file but ``load_trace``.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.model.trace import Hotspot, StepBreakdown, TraceBreakdown

KERNEL_WAIT_THRESHOLD_S = 30e-6
"""HTA's ``consecutive_kernel_delay``: an idle gap shorter than this after a kernel launched in
good time is launch overhead (kernel wait). 30 us, the value of HTA's microsecond releases (its
later releases keep the number 30 in nanoseconds)."""
TOP = 10
"""How many host operators and kernels the breakdown keeps."""
MAX_TRACE_BYTES = 1 << 30
"""A trace larger than this (uncompressed) is refused: ``ValueError``."""

_DEVICE = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_RUNTIME = frozenset({"cuda_runtime", "cuda_driver", "runtime"})
_STEP_PREFIX = "ProfilerStep#"
_DATA_PREFIX = "enumerate(DataLoader)"

Interval = tuple[float, float]


@dataclass(frozen=True)
class _Device:
    """One device activity, in seconds."""

    start: float
    end: float
    name: str
    kind: str
    launched: float | None
    """When its runtime call began (None: no runtime event with its correlation)."""


def load_trace(path: str) -> dict[str, Any]:
    """The parsed trace at ``path`` (gzip when the name ends in ``.gz``). Raises ``OSError`` if
    it cannot be read, ``ValueError`` if it is not a Chrome trace or over ``MAX_TRACE_BYTES``."""
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read(MAX_TRACE_BYTES + 1)
    if len(raw) > MAX_TRACE_BYTES:
        raise ValueError(f"{path}: trace over {MAX_TRACE_BYTES >> 20} MiB")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    return data


def breakdown(trace: dict[str, Any], threshold_s: float = KERNEL_WAIT_THRESHOLD_S, top: int = TOP) -> TraceBreakdown:
    """The breakdown of every ``ProfilerStep#N`` span of ``trace`` (``load_trace``'s form)."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"
              and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    steps = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith(_STEP_PREFIX)), key=lambda e: e["ts"])
    device = _device_activities(events)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    data = [_span(e) for e in events if str(e.get("name", "")).startswith(_DATA_PREFIX)]
    out: list[StepBreakdown] = []
    previous_end: float | None = None
    for step in steps:
        start, end = _span(step)
        thread_ops = [_span(e) for e in ops if e.get("tid") == step.get("tid") and e.get("pid") == step.get("pid")]
        fields = _device_fields((start, end), device, threshold_s) if device else {}
        out.append(StepBreakdown(
            label=str(step["name"]), wall_s=end - start,
            gap_before_s=None if previous_end is None else start - previous_end,
            host_busy_s=_covered(thread_ops, (start, end)), data_wait_s=_covered(data, (start, end)), **fields))
        previous_end = end
    window = (steps[0]["ts"] / 1e6, max(_span(s)[1] for s in steps)) if steps else None
    return TraceBreakdown(steps=out, has_gpu=bool(device), top_host_ops=_top_ops(ops, window, top),
                          top_kernels=_top_kernels(device, window, top), kernel_wait_threshold_s=threshold_s)


def _span(event: dict[str, Any]) -> Interval:
    start = float(event["ts"]) / 1e6
    return start, start + float(event["dur"]) / 1e6


def _device_activities(events: Sequence[dict[str, Any]]) -> list[_Device]:
    launched: dict[Any, float] = {}
    for e in events:
        if e.get("cat") in _RUNTIME:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launched[corr] = float(e["ts"]) / 1e6
    out = []
    for e in events:
        if e.get("cat") in _DEVICE:
            start, end = _span(e)
            corr = (e.get("args") or {}).get("correlation")
            out.append(_Device(start, end, str(e.get("name", "")), str(e["cat"]), launched.get(corr)))
    out.sort(key=lambda d: d.start)
    return out


def _kind(d: _Device) -> str:
    if d.kind != "kernel":
        return "memcpy"
    return "communication" if "nccl" in d.name.lower() else "compute"


def _device_fields(window: Interval, device: Sequence[_Device], threshold_s: float) -> dict[str, float]:
    """The GPU side of one step: busy, idle by cause, and the union of each kind of activity."""
    busy = _union([(d.start, d.end) for d in device])
    by_kind: dict[str, list[Interval]] = defaultdict(list)
    for d in device:
        by_kind[_kind(d)].append((d.start, d.end))
    idle = {"host": 0.0, "kernel": 0.0, "other": 0.0}
    for gap_start, gap_end in _gaps(busy, window):
        idle[_cause(gap_start, gap_end, device, threshold_s)] += gap_end - gap_start
    return {"gpu_busy_s": _covered(busy, window), "idle_host_wait_s": idle["host"],
            "idle_kernel_wait_s": idle["kernel"], "idle_other_s": idle["other"],
            "communication_s": _covered(by_kind["communication"], window),
            "memcpy_s": _covered(by_kind["memcpy"], window), "compute_s": _covered(by_kind["compute"], window)}


def _cause(gap_start: float, gap_end: float, device: Sequence[_Device], threshold_s: float) -> str:
    """HTA's rule for the gap ``[gap_start, gap_end)``, charged to the activity that ends it: the
    first one starting at or after its end (a gap clipped at the step's end is ended by the next
    step's first activity). No such activity, or one without a runtime event: other."""
    nxt = next((d for d in device if d.start >= gap_end), None)
    if nxt is None or nxt.launched is None:
        return "other"
    if nxt.launched > gap_start:
        return "host"
    return "kernel" if gap_end - gap_start < threshold_s else "other"


def _union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly what ``intervals`` cover."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _covered(intervals: Iterable[Interval], window: Interval) -> float:
    """How much of ``window`` the union of ``intervals`` covers (seconds)."""
    lo, hi = window
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in _union(intervals))


def _gaps(busy: Sequence[Interval], window: Interval) -> list[Interval]:
    """The parts of ``window`` that ``busy`` (sorted, disjoint) leaves uncovered."""
    lo, hi = window
    gaps, cursor = [], lo
    for s, e in busy:
        if e <= cursor:
            continue
        if s >= hi:
            break
        if s > cursor:
            gaps.append((cursor, s))
        cursor = max(cursor, e)
    if cursor < hi:
        gaps.append((cursor, hi))
    return gaps


def _inside(span: Interval, window: Interval | None) -> bool:
    return window is not None and span[0] >= window[0] and span[1] <= window[1]


def _top_ops(ops: Sequence[dict[str, Any]], window: Interval | None, top: int) -> list[Hotspot]:
    """Host operators inside the steps by self time: an op's duration less its direct children's
    on the same thread (a nested ``aten::`` call is charged to itself, not twice)."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in ops:
        if _inside(_span(e), window):
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for thread_ops in by_thread.values():
        stack: list[tuple[float, str]] = []  # (end, name) of the open ancestors
        for e in sorted(thread_ops, key=lambda e: (e["ts"], -e["dur"])):
            start, end = _span(e)
            while stack and stack[-1][0] <= start:
                stack.pop()
            name = str(e.get("name", ""))
            total[name] += end - start
            count[name] += 1
            if stack:
                total[stack[-1][1]] -= end - start
            stack.append((end, name))
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [Hotspot(name, max(0.0, seconds), count[name]) for name, seconds in ranked]


def _top_kernels(device: Sequence[_Device], window: Interval | None, top: int) -> list[Hotspot]:
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for d in device:
        if window is not None and d.end > window[0] and d.start < window[1]:
            total[d.name] += d.end - d.start
            count[d.name] += 1
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [Hotspot(name, seconds, count[name]) for name, seconds in ranked]
