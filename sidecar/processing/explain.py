"""What the mapping stage made of every series, and what each verdict still lacks (the report
of ``dflash-sidecar explain``).

The daemon serves ``explain_data(...)`` as JSON on ``/explain`` of its Prometheus address (read
from the latest window report, never from ingest); the command (``sidecar.cli.explain``) fetches
and prints it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from sidecar.model.mapped import READ
from sidecar.model.meanings import MEANINGS
from sidecar.model.settings import RoleSettings
from sidecar.model.window import GAUGE, KIND_NAMES, TIMING, SeriesView
from sidecar.processing.mapping import Mapper
from sidecar.processing.reader import NOT_A_DURATION, NOT_A_PHASE, read_name, words
from sidecar.processing.rules import NO_MEANING
from sidecar.processing.units import read_unit

TARGET, DRAFTER, LOOP = "<target>", "<drafter>", "*"
"""Role placeholders of the inputs below: the configured target and drafter roles
(``insight_target_role``, ``insight_drafter_role``), and the loop's own role."""

DFLASH_INPUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "target-bound / queue-starved / input-bound (DFlash)": ((DRAFTER, "queue_wait"), (TARGET, "forward"),
                                                           (TARGET, "pack"), (TARGET, "data_wait")),
    "drafter-bound (DFlash)": ((TARGET, "queue_put_wait"), (TARGET, "queue_depth"), (TARGET, "queue_capacity")),
}
LOOP_INPUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "input-bound": ((LOOP, "data_wait"),),
    "communication-bound": ((LOOP, "comm_wait"),),
    "host-bound": ((LOOP, "forward"), (LOOP, "backward"), (LOOP, "step")),
    "step breakdown (every verdict's confidence)": ((LOOP, "optimizer"), (LOOP, "step")),
}
"""Verdict -> the (role, meaning) inputs it reads; ``*`` is the loop's own role (any role but the
DFlash ones, which are the configured target and drafter roles). Only the family of the roles
seen is listed (both before any series). ``host-bound`` needs the loop's compute timed
(``forward`` and ``backward``, or ``forward_backward`` for both) and, from snapshots, ``step``
(every-occurrence timings do without); ``compute-bound`` and ``throttled`` need GPU telemetry,
``straggler`` two workers."""
INPUTS = {**DFLASH_INPUTS, **LOOP_INPUTS}

GPU_SUPPLY = ("GPU telemetry on (not --no-gpu-metrics) on a box with NVML, and the GPUs' role: --gpu-group "
              "<role>=<ids>, or the trainer's hello (its process on the GPU)")

TIMING_MEANINGS = ("data_wait", "forward", "backward", "forward_backward", "optimizer", "comm_wait", "step")


def explain_data(report: Any, mapper: Mapper, roles: RoleSettings, gpu_missing: str | None = None) -> dict[str, Any]:
    """The mapping report of the latest window (``report``: an ``IngestReport`` or None).
    ``gpu_missing``: why the insight has no GPU busy/throttle data (None when it has).
    ``roles``: the role names the insight reads the DFlash pipeline under (the
    ``insight_*_role`` settings), so its missing inputs are looked for and named as configured. Its
    ``config`` is TOML to paste into the config file: one ``[[mapping]]`` block per unmapped
    timing, its phase guessed from the name (commented out where nothing in the name says), and a
    commented one per gauge whose words name a phase (a duration whose name says no unit)."""
    series = []
    present: set[tuple[str, str]] = set()
    snapshot_roles: set[str] = set()
    workers: dict[str, set[str]] = {}
    unmapped: list[Any] = []
    durations: list[tuple[SeriesView, str]] = []
    if report is not None:
        for v in report.window.series:
            kind = KIND_NAMES.get(v.kind, str(v.kind))
            series.append({"kind": kind, "role": v.role, "worker": v.worker, "name": v.raw or v.name,
                           "meaning": v.meaning or "unmapped", "rule": v.rule or "-",
                           "form": "snapshot" if v.snapshot else "every occurrence"})
            if v.snapshot:
                snapshot_roles.add(v.role)
            if v.meaning:
                present.add((v.role, v.meaning))
                if v.meaning == "forward_backward":
                    present |= {(v.role, "forward"), (v.role, "backward")}
                workers.setdefault(v.role, set()).add(v.worker)
            if v.kind == TIMING and (not v.meaning or READ in v.rule) and not v.counted_in \
                    and not (v.outside and not v.meaning):
                unmapped.append(v)  # (a name outside the step, or overruled as none, needs no rule)
            elif v.kind == GAUGE and not v.meaning and (phase := _duration_phase(v)):
                durations.append((v, phase))  # a gauge that would be a phase's timing, had its name a unit
    insight = report.insight if report is not None else None
    missing = missing_inputs(mapper, roles, present, snapshot_roles, workers, gpu_missing)
    return {
        "verdict": insight.verdict.text() if insight is not None else None,
        "series": sorted(series, key=lambda s: (s["role"], s["worker"], s["name"])),
        "missing": missing,
        "unused_rules": [r.source for r in mapper.unused_rules()],
        "config": mapping_config(unmapped, mapper.known_roles, durations),
    }


def _duration_phase(v: SeriesView) -> str:
    """The phase a gauge would time were it a duration in seconds, ``""`` where it looks like
    anything else: its name says a unit (bytes, %), names the step (a step counter: ``global_step``),
    a count, size or index (``NOT_A_DURATION``), a key outside the step (``NOT_A_PHASE``: a loss), or
    its values this window are whole numbers (a counter, a size, a queue's depth)."""
    name = v.raw or v.name
    if read_unit(name).known or set(words(name)) & (NOT_A_DURATION | NOT_A_PHASE):
        return ""
    phase = read_name(name, record=True).meaning
    mean = float(v.window["mean"]) if v.window else 0.0
    return phase if phase not in ("", "step") and not mean.is_integer() else ""


def missing_inputs(mapper: Mapper, roles: RoleSettings, present: set[tuple[str, str]], snapshot_roles: set[str],
                   workers: Mapping[str, set[str]], gpu_missing: str | None) -> dict[str, list[dict[str, str]]]:
    """Verdict -> the inputs it lacks, each with how to supply it, given the (role, meaning) pairs
    ``present`` in the window, the roles sending ``snapshot_roles`` and each role's ``workers``."""
    dflash = {roles.target_role, roles.drafter_role} | set(mapper.known_roles)
    own = sorted(r for r in workers if r not in dflash)
    named = {TARGET: roles.target_role, DRAFTER: roles.drafter_role,
             LOOP: max(own, key=lambda r: (len(workers[r]), r)) if own else LOOP}
    families: dict[str, tuple[tuple[str, str], ...]] = {}
    if own or not workers:
        families.update(LOOP_INPUTS)
    if set(workers) & dflash or not workers:
        families.update(DFLASH_INPUTS)
    missing: dict[str, list[dict[str, str]]] = {}
    for verdict, needs in families.items():
        lack = []
        for role, meaning in needs:
            want = named[role]
            if meaning == "step" and want not in snapshot_roles and verdict == "host-bound":
                continue  # every-occurrence timings tell host overhead without a step timing
            if (want, meaning) not in present:
                lack.append({"input": f"{want if want != LOOP else '<your role>'} {meaning}",
                             "supply": supply_line(want, meaning, want in mapper.known_roles,
                                                   want in snapshot_roles)})
        if lack:
            missing[verdict] = lack
    if gpu_missing is not None:
        missing["compute-bound"] = [{"input": f"GPU busy share ({gpu_missing})", "supply": GPU_SUPPLY}]
        missing["throttled"] = [{"input": f"GPU clock-event reasons ({gpu_missing})", "supply": GPU_SUPPLY}]
    if not any(len(w) >= 2 for w in workers.values()):
        missing["straggler"] = [{"input": "two workers (ranks) of one role", "supply":
                                 "a channel per worker (telemetry.channel(worker=...), or RANK in each process), "
                                 "or the worker in the key: drafter.0.forward_ms, drafter.1.forward_ms"}]
    return missing


def mapping_config(unmapped: Iterable[Any], known_roles: Iterable[str],
                   durations: Iterable[tuple[SeriesView, str]] = ()) -> str:
    """TOML ``[[mapping]]`` blocks for the timings seen that no rule or preset maps: those whose
    phase was read from the name (pasted, the read is pinned; ``phase = "none"`` overrules it) and
    the unmapped ones (commented out, a phase to choose); then, commented out, one for each gauge
    of ``durations`` (gauge, the phase its words name): a duration whose name says no unit (a
    Lightning profiler's ``[_TrainingEpochLoop].train_dataloader_next``) is a timing once a rule
    gives its phase and unit. Each matches the name as the trainer sends it (the dict key for
    ``publish()``, the name for ``timing()``); a name whose role came from its key
    (``target.t_update_ms``) keeps that role."""
    blocks: list[str] = []
    seen: set[str] = set()
    roles = set(known_roles)
    for v in sorted(unmapped, key=lambda v: (v.role, v.raw or v.name)):
        name = v.raw or v.name
        sent = f"{v.role}.{name}" if v.rule == "key grammar" and v.role in roles else name
        if sent in seen:
            continue
        seen.add(sent)
        lines = ["[[mapping]]", f"match = {json.dumps(sent)}"]
        if sent != name:
            lines.append(f"role = {json.dumps(v.role)}")
        form = "snapshot key" if v.snapshot else "timing()"
        if v.meaning:
            lines.append(f'phase = "{v.meaning}"  # {form} of role {v.role}: {READ}, check it '
                         f'(phase = "{NO_MEANING}" overrules)')
            blocks.append("\n".join(lines))
        else:
            lines.append(f'phase = "<one of: {", ".join(TIMING_MEANINGS)}>"  # {form} of role {v.role}')
            blocks.append(_commented(lines))
    for v, phase in sorted(durations, key=lambda d: (d[0].role, d[0].raw or d[0].name)):
        name = v.raw or v.name
        if name not in seen:
            seen.add(name)
            lines = ["[[mapping]]", f"match = {json.dumps(name)}",
                     f'phase = "{phase}"  # a gauge of role {v.role} whose words name {phase}: if it is a duration,',
                     'unit = "s"  # the unit its values are in (its name says none)']
            blocks.append(_commented(lines))
    if not blocks:
        return ""
    head = ("# dflash-sidecar explain: rules for the timings sent under names no preset knows (their phase read\n"
            "# from the name, or to choose). Paste into the config file (--config FILE), check each phase, then\n"
            "# send the daemon SIGHUP (or restart it).")
    return head + "\n\n" + "\n\n".join(blocks) + "\n"


def _commented(lines: Iterable[str]) -> str:
    """A TOML block commented out, line by line (a rule for the user to check and paste)."""
    return "\n".join("# " + line for line in lines)


def supply_line(role: str, meaning: str, role_in_key: bool, snapshot: bool = False) -> str:
    """How a trainer supplies one input, in the form it publishes: the preset name (a key of the
    dict it publishes, or a ``timing()`` name; with the role in the key when the key grammar
    takes it there), or a ``[[mapping]]`` block for a name of its own."""
    cls = MEANINGS[meaning][0]
    call = {"wait": "timing", "busy": "timing", "cycle": "timing", "overlap": "timing", "counter": "count",
            "gauge": "gauge", "category": "category", "throughput": "gauge", "efficiency": "gauge"}[cls]
    suffix = "_ms" if call == "timing" else ""
    prefix = f"{role}." if role_in_key else ""
    role_part = f' role = "{role}",' if prefix else ""
    field = "phase" if call == "timing" else "meaning"
    name = f"{prefix}{meaning}{suffix}"
    how = (f'"{name}": <ms> in the dict you publish(step, {{...}})' if snapshot and call == "timing"
           else f'{call}("{name}", ...)')
    return (f'{how}; or, for a name of your own, a [[mapping]] block in the config with '
            f'match = "<your name>",{role_part} {field} = "{meaning}"')
