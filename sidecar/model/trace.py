"""A profiler capture's breakdown, as the CLI prints it and the exporters read it (docs/METRICS.md,
"Captures"). Computed from a Chrome/Kineto trace by ``sidecar.aggregation.trace_breakdown``; kept
as JSON beside the trace file in the state folder's ``traces/`` (``to_json``/``from_json``).

Every duration is in seconds. The GPU's idle time of a step splits as HTA (Holistic Trace
Analysis) splits a stream's: each idle gap is charged to the kernel that ends it. ``host wait``:
that kernel was launched (its runtime call began) after the gap began, so the GPU waited for the
host; ``kernel wait``: it was launched earlier and the gap is shorter than the threshold (the
launch overhead between back-to-back kernels); ``other``: the rest (a wait on another stream's
event, a synchronization, a gap no kernel ends).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = 1
"""The stored form's version (``to_json``); a file of another version is not read."""


@dataclass(frozen=True)
class StepBreakdown:
    """One ``ProfilerStep#N`` span of the trace."""

    label: str
    """The span's name (``ProfilerStep#N``)."""
    wall_s: float
    """The span's duration on the host."""
    gap_before_s: float | None
    """From the previous span's end to this one's start (None for the first)."""
    host_busy_s: float
    """Time inside host operators (the union of the outermost ``cpu_op`` spans of the step's thread)."""
    data_wait_s: float
    """Time inside the DataLoader's ``__next__`` (its ``enumerate(DataLoader)...`` annotation)."""
    gpu_busy_s: float = 0.0
    """The union of every device activity (kernels, copies, sets) inside the span."""
    idle_host_wait_s: float = 0.0
    idle_kernel_wait_s: float = 0.0
    idle_other_s: float = 0.0
    """With ``gpu_busy_s`` these four sum to ``wall_s`` when the trace has device activity."""
    communication_s: float = 0.0
    """The union of the communication kernels (``nccl`` in the name) inside the span."""
    memcpy_s: float = 0.0
    """The union of the memory copies and sets inside the span."""
    compute_s: float = 0.0
    """The union of the other kernels inside the span."""


@dataclass(frozen=True)
class Hotspot:
    """One host operator or device kernel, by total time over the captured steps."""

    name: str
    total_s: float
    """Host operators: self time (the op's time less its child ops'); kernels: duration."""
    count: int


@dataclass(frozen=True)
class TraceBreakdown:
    """Where the captured steps' time went."""

    steps: list[StepBreakdown]
    has_gpu: bool
    """Whether the trace holds device activity (False on a machine without a GPU: host side only)."""
    top_host_ops: list[Hotspot] = field(default_factory=list)
    top_kernels: list[Hotspot] = field(default_factory=list)
    kernel_wait_threshold_s: float = 0.0
    """The gap under which an idle gap after an early launch is a kernel wait."""

    def total(self, attribute: str) -> float:
        """The sum of one ``StepBreakdown`` field over the steps (seconds)."""
        return sum(float(getattr(s, attribute)) for s in self.steps)

    def share(self, attribute: str) -> float | None:
        """One field's sum as a share (0-1) of the steps' wall time; None without steps."""
        wall = self.total("wall_s")
        return self.total(attribute) / wall if wall > 0 else None

    def to_json(self) -> dict[str, Any]:
        """The stored form (plain JSON types)."""
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TraceBreakdown:
        """Read ``to_json``'s form. Raises ``ValueError`` for another schema or a malformed one."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError("not a trace breakdown of schema %d" % SCHEMA)
        try:
            return cls(steps=[StepBreakdown(**s) for s in data["steps"]], has_gpu=bool(data["has_gpu"]),
                       top_host_ops=[Hotspot(**h) for h in data.get("top_host_ops", [])],
                       top_kernels=[Hotspot(**h) for h in data.get("top_kernels", [])],
                       kernel_wait_threshold_s=float(data.get("kernel_wait_threshold_s", 0.0)))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed trace breakdown: {exc}") from None


@dataclass(frozen=True)
class CaptureView:
    """The newest kept capture, as the exporters read it between windows."""

    role: str
    worker: str
    run: str | None
    ended_unix_s: float
    breakdown: TraceBreakdown
