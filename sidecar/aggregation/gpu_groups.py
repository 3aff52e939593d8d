"""GPU groups: which GPUs serve which role, per-group aggregates, and the GPU facts the other
stages read (``GpuAggregates``: the exporters' ``GpuView``, the insight's ``GpuFacts``).

Groups come from ``--gpu-group NAME=IDS`` (``target=0-5``, ``drafter=6,7``, ``a=0-3,8``), or,
when none is given, are discovered from the trainer processes found on each GPU (matched by
pid to the shims' hellos): a GPU belongs to the role of the trainer process using the most
memory on it. Aggregates are computed over the group's GPUs that are up and report the value.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from sidecar.model.gpu import NVML_DISABLED, GpuReading, GpuSnapshot, GpuView, GroupAggregate, NvmlStatus
from sidecar.model.insight import GpuFacts

log = logging.getLogger("sidecar")

MAX_GPU_INDEX = 1023
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, slots=True)
class GpuGroupSpec:
    """One configured group: a name and NVML GPU indices (sorted, unique)."""

    name: str
    gpus: tuple[int, ...]


def parse_gpu_ids(text: str) -> tuple[int, ...]:
    """Parse ``"0-5"``, ``"6,7"`` or ``"0-3,6"`` into sorted unique indices.

    Raises ``ValueError`` for empty parts, non-integers, negative or too large indices,
    reversed ranges and repeated indices.
    """
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty GPU id in {text!r}")
        low_text, dash, high_text = part.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if dash else low
        except ValueError:
            raise ValueError(f"GPU ids must be integers or ranges like 0-5, got {part!r}") from None
        if low < 0 or high > MAX_GPU_INDEX:
            raise ValueError(f"GPU ids must be between 0 and {MAX_GPU_INDEX}, got {part!r}")
        if high < low:
            raise ValueError(f"GPU range {part!r} runs backwards")
        ids.extend(range(low, high + 1))
    repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
    if repeated:
        raise ValueError(f"GPU id(s) {repeated} listed twice in {text!r}")
    return tuple(sorted(ids))


def parse_group_spec(text: str) -> GpuGroupSpec:
    """Parse one ``NAME=IDS`` spec. Raises ``ValueError`` with the reason and the bad input."""
    name, equals, ids = text.partition("=")
    name = name.strip()
    if not equals:
        raise ValueError(f"GPU group must look like NAME=IDS (e.g. target=0-5), got {text!r}")
    if not _NAME.match(name):
        raise ValueError(f"GPU group name must be 1-64 of letters, digits, _ . - starting with a letter or _, "
                         f"got {name!r}")
    if not ids.strip():
        raise ValueError(f"GPU group {name!r} lists no GPUs")
    return GpuGroupSpec(name, parse_gpu_ids(ids))


@dataclass(frozen=True, slots=True)
class GpuGroups:
    """The configured groups; empty means "discover from the trainer processes"."""

    specs: tuple[GpuGroupSpec, ...] = ()

    @classmethod
    def parse(cls, texts: Iterable[str]) -> GpuGroups:
        """Parse ``--gpu-group`` values. Raises ``ValueError`` for a bad spec, a repeated group
        name, or a GPU in two groups."""
        specs: list[GpuGroupSpec] = []
        owner: dict[int, str] = {}
        for text in texts:
            spec = parse_group_spec(text)
            if any(s.name == spec.name for s in specs):
                raise ValueError(f"GPU group {spec.name!r} is given twice")
            for gpu in spec.gpus:
                if gpu in owner:
                    raise ValueError(f"GPU {gpu} is in both group {owner[gpu]!r} and group {spec.name!r}")
                owner[gpu] = spec.name
            specs.append(spec)
        return cls(tuple(specs))

    @property
    def discovered(self) -> bool:
        """True when groups are discovered from trainer processes (no explicit spec)."""
        return not self.specs

    def resolve(self, snapshot: GpuSnapshot | None) -> dict[str, tuple[int, ...]]:
        """Group name -> GPU indices for this snapshot (explicit specs, else discovery)."""
        if self.specs:
            return {spec.name: spec.gpus for spec in self.specs}
        return discover_groups(snapshot)

    def unknown_gpus(self, snapshot: GpuSnapshot) -> tuple[int, ...]:
        """Configured GPU indices this host does not have (worth one warning)."""
        present = {g.index for g in snapshot.gpus}
        return tuple(sorted({i for s in self.specs for i in s.gpus} - present))


def discover_groups(snapshot: GpuSnapshot | None) -> dict[str, tuple[int, ...]]:
    """Role -> GPUs, from the trainer processes on each GPU (the role using most memory wins)."""
    groups: dict[str, list[int]] = {}
    for reading in snapshot.gpus if snapshot is not None else ():
        memory_by_role: dict[str, int] = {}
        for process in reading.processes:
            memory_by_role[process.role] = memory_by_role.get(process.role, 0) + (process.memory_bytes or 0)
        if memory_by_role:
            role = min(memory_by_role, key=lambda r: (-memory_by_role[r], r))
            groups.setdefault(role, []).append(reading.index)
    return {role: tuple(sorted(gpus)) for role, gpus in sorted(groups.items())}


def aggregate_groups(snapshot: GpuSnapshot | None, groups: GpuGroups) -> tuple[GroupAggregate, ...]:
    """One ``GroupAggregate`` per group, in name order."""
    if snapshot is None:
        return ()
    by_index = {g.index: g for g in snapshot.gpus}
    result = []
    for name, indices in sorted(groups.resolve(snapshot).items()):
        up = [by_index[i] for i in indices if i in by_index and by_index[i].up]
        utilization = _present(up, "utilization_ratio")
        power = _present(up, "power_watts")
        temperature = _present(up, "temperature_celsius")
        free = _present(up, "memory_free_bytes")
        result.append(GroupAggregate(
            name=name,
            gpus=indices,
            gpus_up=len(up),
            utilization_mean_ratio=sum(utilization) / len(utilization) if utilization else None,
            power_total_watts=sum(power) if power else None,
            temperature_max_celsius=max(temperature) if temperature else None,
            memory_free_min_bytes=int(min(free)) if free else None,
        ))
    return tuple(result)


def _present(readings: list[GpuReading], attribute: str) -> list[float]:
    values = (getattr(r, attribute) for r in readings)
    return [v for v in values if v is not None]


def gpu_view(snapshot: GpuSnapshot | None, status: NvmlStatus, groups: GpuGroups) -> GpuView:
    """What the exporters read of the GPUs: the snapshot, the status and the group aggregates."""
    return GpuView(snapshot, status, aggregate_groups(snapshot, groups))


class GpuAggregates:
    """The GPU side as the other stages read it, from the NVML source's latest snapshot and status
    (passed as callables, so this stage never imports the source; ``None``: GPU metrics are off).
    Nothing here calls NVML: a read costs what the aggregation of one snapshot costs."""

    def __init__(self, groups: GpuGroups, latest: Callable[[], GpuSnapshot | None] | None = None,
                 status: Callable[[], NvmlStatus] | None = None,
                 recent: Callable[[float], tuple[GpuSnapshot, ...]] | None = None) -> None:
        """``recent(seconds)``: the snapshots of that many last seconds (the source's), for a
        window's busy share; without it, the latest poll stands for the window."""
        self.groups = groups
        self._recent = recent
        self._latest = latest or (lambda: None)
        self._status = status or (lambda: NVML_DISABLED)
        self._warned_unknown = False

    def view(self, window_s: float | None = None) -> GpuView:
        """The GPUs now (for a scrape); with ``window_s``, a window's view: with the insight's
        ``facts`` over the window's last ``window_s`` seconds."""
        view = gpu_view(self._latest(), self._status(), self.groups)
        return view if window_s is None else replace(view, facts=self.facts(window_s))

    def facts(self, window_s: float | None = None) -> GpuFacts | None:
        """Active clock-event (throttle) reasons (latest poll), the group and the busy share of each
        GPU (GPM SM activity where the GPU has it, else NVML utilization; with SM activity, NVML
        utilization beside it), for the insight: the
        mean over the polls of the last ``window_s`` seconds when given (and the source keeps
        them), else the latest poll's; None before the first snapshot or without NVML. Warns once
        about configured GPUs this host lacks."""
        snapshot = self._latest()
        if snapshot is None:
            return None
        if not self._warned_unknown and self.groups.specs and self.groups.unknown_gpus(snapshot):
            self._warned_unknown = True
            log.warning("sidecar: --gpu-group names GPUs this host does not have: %s",
                        ", ".join(map(str, self.groups.unknown_gpus(snapshot))))
        events = {str(r.index): frozenset(name for name, on in (r.clock_events() or ()) if on)
                  for r in snapshot.gpus if r.up}
        roles = {str(gpu): group for group, gpus in self.groups.resolve(snapshot).items() for gpu in gpus}
        polls = (self._recent(window_s) if self._recent is not None and window_s else ()) or (snapshot,)
        samples: dict[str, list[float]] = {}
        beside: dict[str, list[float]] = {}
        for snap in polls:
            for r in snap.gpus:
                value = r.sm_activity_ratio if r.sm_activity_ratio is not None else r.utilization_ratio
                if r.up and value is not None:
                    samples.setdefault(str(r.index), []).append(value)
                if r.up and r.sm_activity_ratio is not None and r.utilization_ratio is not None:
                    beside.setdefault(str(r.index), []).append(r.utilization_ratio)
        up = {str(r.index) for r in snapshot.gpus if r.up}
        busy = {gpu: sum(v) / len(v) for gpu, v in samples.items() if gpu in up}
        utilization = {gpu: sum(v) / len(v) for gpu, v in beside.items() if gpu in up}
        return GpuFacts(events, roles, busy, utilization)
