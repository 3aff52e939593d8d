"""A kept capture as text: ``trace`` prints it, ``explain`` shows the last one beside the verdict,
``report`` lists them per run."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from sidecar.core.captures import FOLDER, Capture, captures, latest
from sidecar.core.ledger_state import state_dir
from sidecar.model.trace import Hotspot, TraceBreakdown


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "-"


def breakdown_lines(b: TraceBreakdown, top: int = 5) -> list[str]:
    """Per step, then the totals' shares and the top host ops and kernels."""
    lines = []
    wall = b.total("wall_s")
    for s in b.steps:
        gap = f" gap {_ms(s.gap_before_s)}" if s.gap_before_s is not None else ""
        line = (f"  {s.label}: wall {_ms(s.wall_s)}{gap}, host ops {_ms(s.host_busy_s)}, "
                f"data wait {_ms(s.data_wait_s)}")
        if b.has_gpu:
            line += (f", GPU busy {_ms(s.gpu_busy_s)} (compute {_ms(s.compute_s)}, comm {_ms(s.communication_s)}, "
                     f"copies {_ms(s.memcpy_s)}), idle: host wait {_ms(s.idle_host_wait_s)}, kernel wait "
                     f"{_ms(s.idle_kernel_wait_s)}, other {_ms(s.idle_other_s)}")
        lines.append(line)
    if b.has_gpu:
        lines.append(f"  GPU: busy {_pct(b.total('gpu_busy_s'), wall)}, idle waiting for the host "
                     f"{_pct(b.total('idle_host_wait_s'), wall)}, between kernels "
                     f"{_pct(b.total('idle_kernel_wait_s'), wall)}, other {_pct(b.total('idle_other_s'), wall)}; "
                     f"communication {_pct(b.total('communication_s'), wall)}, "
                     f"copies {_pct(b.total('memcpy_s'), wall)}")
    else:
        lines.append("  no GPU activity in the trace (a machine without a GPU, or a trainer that never initialised "
                     f"CUDA): host side only; host ops {_pct(b.total('host_busy_s'), wall)} of the wall, data wait "
                     f"{_pct(b.total('data_wait_s'), wall)}")
    lines += _hotspots("top host ops (self time)", b.top_host_ops[:top])
    if b.has_gpu:
        lines += _hotspots("top kernels", b.top_kernels[:top])
    return lines


def _hotspots(title: str, spots: Sequence[Hotspot]) -> list[str]:
    if not spots:
        return []
    return [f"  {title}: " + "; ".join(f"{s.name} {_ms(s.total_s)} x{s.count}" for s in spots)]


def capture_lines(c: Capture) -> list[str]:
    """A kept capture: who, when, the trace file, then its breakdown."""
    m = c.meta
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(m["ended_unix_s"])) if m.get("ended_unix_s") else "?"
    steps = m.get("steps") or []
    head = (f"capture of {m.get('role')}/{m.get('worker')} (pid {m.get('pid')}, run {m.get('run') or '-'}) at {when}: "
            f"{len(c.breakdown.steps)} profiler steps (trainer steps {', '.join(map(str, steps)) or '-'})")
    why = [f"  why: {m['why']}"] if str(m.get("why") or "").startswith("automatic") else []
    if isinstance(m.get("start_s"), (int, float)) and isinstance(m.get("stop_s"), (int, float)):
        why.append(f"  the profiler's start {_ms(m['start_s'])} and stop {_ms(m['stop_s'])} on the trainer's thread")
    return [head, *why, f"  trace: {c.trace if c.trace is not None else '(removed)'}", *breakdown_lines(c.breakdown)]


def last_capture_lines(state_dir: Path) -> list[str]:
    """``explain``'s part: the newest kept capture's breakdown, beside the verdict above it."""
    c = latest(state_dir)
    if c is None:
        return ["", f"last capture: none kept in {state_dir / FOLDER} (dflash-sidecar trace takes one)"]
    return ["", "last capture (dflash-sidecar trace):", *capture_lines(c)]


def _of_run(c: Capture, run: str | None) -> bool:
    have = str(c.meta.get("run") or "")
    return run is None or have == run or (bool(have) and run.endswith(":" + have))


def capture_list_lines(state_dir: Path, run: str | None = None) -> list[str]:
    """``report``'s part: the kept captures per run, one line each."""
    kept = [c for c in captures(state_dir) if _of_run(c, run)]
    if not kept:
        return []
    lines = ["", "captures (dflash-sidecar trace):"]
    for name in dict.fromkeys(str(c.meta.get("run") or "-") for c in kept):
        lines.append(f"  run {name}:")
        for c in (c for c in kept if str(c.meta.get("run") or "-") == name):
            b, m = c.breakdown, c.meta
            wall = b.total("wall_s")
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m["ended_unix_s"])) if m.get("ended_unix_s") else "?"
            side = (f"GPU busy {_pct(b.total('gpu_busy_s'), wall)}, host wait {_pct(b.total('idle_host_wait_s'), wall)}"
                    if b.has_gpu else f"no GPU, host ops {_pct(b.total('host_busy_s'), wall)}")
            lines.append(f"    {when} {m.get('role')}/{m.get('worker')} {len(b.steps)} steps, "
                         f"{_ms(wall / max(1, len(b.steps)))} a step, {side}: {c.trace or '(trace removed)'}")
    return lines


def print_captures(configured_state_dir: str | None, run: str | None, last: bool) -> None:
    """After ``explain`` (``last``: the newest capture's breakdown beside the verdict), or after
    ``report`` and ``explain --run`` (the run's captures, or every run's)."""
    folder = state_dir(configured_state_dir)
    lines = last_capture_lines(folder) if last else capture_list_lines(folder, run)
    if lines:
        print("\n".join(lines))
