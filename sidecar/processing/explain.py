"""``dflash-sidecar explain``: what the mapping stage made of every series, and what each verdict
still lacks.

The daemon serves ``explain_data(...)`` as JSON on ``/explain`` of its Prometheus address (read
from the latest window report, never from ingest); ``run_explain`` fetches and prints it.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from sidecar.model.meanings import CATEGORY, COUNT, GAUGE, MEANINGS, SCALAR, TIMING
from sidecar.processing.mapping import Mapper

KIND_NAMES = {TIMING: "timing", COUNT: "counter", GAUGE: "gauge", CATEGORY: "category", SCALAR: "scalar"}

INPUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "target-bound / queue-starved / host-bound (DFlash)": (("drafter", "queue_wait"), ("target", "forward"),
                                                          ("target", "pack"), ("target", "data_wait")),
    "drafter-bound (DFlash)": (("target", "queue_put_wait"), ("target", "queue_depth"), ("target", "queue_capacity")),
    "input-bound": (("*", "data_wait"),),
    "communication-bound": (("*", "comm_wait"),),
    "host-bound (single role)": (("*", "step"),),
    "compute-bound": (("*", "forward"), ("*", "backward")),
}
"""Verdict -> the (role, meaning) inputs it reads; ``*`` is the loop's own role (any role but the
DFlash ones). Besides these: ``host-bound`` from snapshots needs ``step`` (every-occurrence timings
do without), ``compute-bound`` and ``throttled`` need GPU telemetry, ``straggler`` two workers."""

GPU_SUPPLY = ("GPU telemetry on (not --no-gpu-metrics) on a box with NVML, and the GPUs' role: --gpu-group "
              "<role>=<ids>, or the trainer's hello (its process on the GPU)")


def explain_data(report: Any, mapper: Mapper, gpu_missing: str | None = None) -> dict[str, Any]:
    """The mapping report of the latest window (``report``: an ``IngestReport`` or None).
    ``gpu_missing``: why the insight has no GPU busy/throttle data (None when it has)."""
    series = []
    present: set[tuple[str, str]] = set()
    snapshot_roles: set[str] = set()
    workers: dict[str, set[str]] = {}
    if report is not None:
        for v in report.window.series:
            kind = KIND_NAMES.get(v.kind, str(v.kind))
            series.append({"kind": kind, "role": v.role, "worker": v.worker, "name": v.raw or v.name,
                           "meaning": v.meaning or "unmapped", "rule": v.rule or "-",
                           "form": "snapshot" if v.snapshot else "every occurrence"})
            if v.meaning:
                present.add((v.role, v.meaning))
                workers.setdefault(v.role, set()).add(v.worker)
                if v.snapshot:
                    snapshot_roles.add(v.role)
    insight = report.insight if report is not None else None
    own = sorted(r for r in workers if r not in ("target", "drafter"))
    main = max(own, key=lambda r: (len(workers[r]), r)) if own else "*"
    missing: dict[str, list[dict[str, str]]] = {}
    for verdict, needs in INPUTS.items():
        lack = []
        for role, meaning in needs:
            want = main if role == "*" else role
            if meaning == "step" and want not in snapshot_roles:
                continue  # every-occurrence timings tell host overhead without a step timing
            if (want, meaning) not in present:
                lack.append({"input": f"{want if want != '*' else '<your role>'} {meaning}",
                             "supply": supply_line(want, meaning, want in mapper.known_roles)})
        if gpu_missing is not None and verdict == "compute-bound":
            lack.append({"input": f"GPU busy share ({gpu_missing})", "supply": GPU_SUPPLY})
        if lack:
            missing[verdict] = lack
    if gpu_missing is not None:
        missing["throttled"] = [{"input": f"GPU clock-event reasons ({gpu_missing})", "supply": GPU_SUPPLY}]
    if not any(len(w) >= 2 for w in workers.values()):
        missing["straggler"] = [{"input": "two workers (ranks) of one role", "supply":
                                 "a channel per worker (telemetry.channel(worker=...), or RANK in each process), "
                                 "or the worker in the key: drafter.0.forward_ms, drafter.1.forward_ms"}]
    return {
        "verdict": insight.verdict.text() if insight is not None else None,
        "series": sorted(series, key=lambda s: (s["role"], s["worker"], s["name"])),
        "missing": missing,
        "unused_rules": [r.source for r in mapper.unused_rules()],
    }


def supply_line(role: str, meaning: str, role_in_key: bool) -> str:
    """How a trainer supplies one input: the preset name (with the role in the key when the key
    grammar takes it there), or the mapping line for a name of its own."""
    cls = MEANINGS[meaning][0]
    call = {"wait": "timing", "busy": "timing", "cycle": "timing", "counter": "count", "gauge": "gauge",
            "category": "category"}[cls]
    suffix = "_ms" if call == "timing" else ""
    prefix = f"{role}." if role_in_key else ""
    role_part = f'role = "{role}", ' if prefix else ""
    field = "phase" if call == "timing" else "meaning"
    return (f'{call}("{prefix}{meaning}{suffix}", ...), or for a name of your own, in the config: '
            f'mapping = [{{ match = "<your name>", {role_part}{field} = "{meaning}" }}]')


def format_text(data: dict[str, Any]) -> str:
    lines = [f"verdict: {data.get('verdict') or 'no window yet'}", "", "series seen:"]
    rows = data.get("series", [])
    if not rows:
        lines.append("  (none yet)")
    for s in rows:
        lines.append(f"  {s['role']}/{s['worker']} {s['kind']} {s['name']!r} -> {s['meaning']} "
                     f"[{s['rule']}; {s['form']}]")
    lines += ["", "missing inputs, per verdict:"]
    if not data.get("missing"):
        lines.append("  none")
    for verdict, lack in data.get("missing", {}).items():
        lines.append(f"  {verdict}:")
        for item in lack:
            lines.append(f"    {item['input']}: {item['supply']}")
    unused = data.get("unused_rules") or []
    if unused:
        lines += ["", "mapping rules that matched no series yet:"] + [f"  {u}" for u in unused]
    return "\n".join(lines)


def run_explain(url: str, as_json: bool = False) -> int:
    """Print the explain report of the daemon at ``url`` (``http://HOST:PORT/explain``)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            data = json.loads(resp.read().decode())
    except (OSError, ValueError) as exc:
        print(f"dflash-sidecar explain: cannot read {url}: {exc}; is the daemon running (see --prometheus-addr)?")
        return 1
    print(json.dumps(data, indent=2) if as_json else format_text(data))
    return 0
