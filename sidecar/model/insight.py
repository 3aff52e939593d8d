"""The pipeline insight of one window, as every exporter reads it: throughput per role and worker,
queue health, batch composition and the bottleneck verdict with its evidence.

Computed by ``sidecar.aggregation.insight`` (rules in ``sidecar.aggregation.verdict``); carried
by the window (``IngestReport.insight``). Ratios are 0-1, rates per second; a value the trainer
does not publish is ``None`` (absent from every export), never a fake zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.model.cluster import NodeFigures

VERDICT_CODES: dict[str, int] = {
    "unknown": 0, "balanced": 1, "target-bound": 2, "drafter-bound": 3, "queue-starved": 4,
    "host-bound": 5, "throttled": 6, "straggler": 7, "input-bound": 8, "communication-bound": 9,
    "compute-bound": 10, "idle": 11, "unexplained-idle": 12,
}
"""Each verdict and its numeric code (the W&B ``pipeline/verdict_code``). ``host-bound`` (5) means
host overhead between timed phases everywhere; until 0.3 the DFlash rules also said ``host-bound``
for targets waiting on the data loader, which is now ``input-bound`` (8) there too
(``RENAMED_FROM_HOST_BOUND``). ``idle``: no live trainer sent anything in the window.
``unexplained-idle``: the GPUs of a role are idle a material share of the window and no timing
explains it (never ``balanced`` then: no false health)."""
VERDICTS = tuple(VERDICT_CODES)

RENAMED_FROM_HOST_BOUND = "formerly host-bound"
"""The alias of the renamed DFlash label, kept one release: a DFlash ``input-bound`` verdict's
detail says it, so a search for the old word in logs and W&B still finds it (docs/METRICS.md)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verdict with its evidence: (name, value) pairs, ratios 0-1, in deciding order;
    ``detail`` names what the numbers cannot (the straggling worker, the throttled GPUs)."""

    name: str
    evidence: tuple[tuple[str, float], ...] = ()
    detail: str = ""
    confidence: float = 1.0
    """0-1: 0.5 at the deciding threshold, 1 a threshold's worth past it (``sidecar.aggregation.verdict``)."""

    @property
    def code(self) -> int:
        return VERDICT_CODES[self.name]

    def text(self) -> str:
        """``target-bound (ready_deficit=0.62 target.forward=0.91)``."""
        parts = [f"{k}={v:.2f}" for k, v in self.evidence]
        if self.detail:
            parts.append(self.detail)
        return f"{self.name} ({' '.join(parts)})" if parts else self.name


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What the insight needs from the GPUs (from the NVML source): the clock-event (throttle)
    reasons active on each GPU, and which role (GPU group) each GPU serves. GPU ids are strings
    (NVML indices as text); a GPU missing from ``roles`` has an unknown role."""

    clock_events: Mapping[str, frozenset[str]] = field(default_factory=dict)
    roles: Mapping[str, str] = field(default_factory=dict)
    busy: Mapping[str, float] = field(default_factory=dict)
    """GPU -> share of time busy (0-1): GPM SM activity where the GPU has it, else NVML utilization."""
    utilization: Mapping[str, float] = field(default_factory=dict)
    """GPU -> NVML utilization (0-1) for the GPUs whose ``busy`` is GPM SM activity, read beside it:
    collectives' kernels spin on a few SMs, so NVML counts a GPU waiting in an all-reduce as busy
    while its SM activity stays low. Absent where ``busy`` is NVML utilization itself."""


@dataclass(frozen=True, slots=True)
class WorkerInsight:
    """One worker in one window. Rates per second; ``busy_ms`` is the median busy time per batch
    (sum of the p50s of its work phases, ms); ``score`` is its performance relative to the best
    worker of its role (0-1, 1 = best); ``straggler`` when the score is below the threshold."""

    role: str
    worker: str
    batches_per_s: float
    tokens_per_s: float
    busy_ms: float | None
    score: float | None
    straggler: bool


@dataclass(frozen=True, slots=True)
class RoleInsight:
    """One role in one window. ``time_share``: phase -> share of the role's wall time (mean over
    its workers weighted by the part of the window each was alive, 0-1): the mapped phases,
    ``unattributed`` (timings that map to no meaning) and ``other`` (the gap no timing covers,
    when it can be told); empty when the role publishes no phase timing.
    ``rate_cv``: coefficient of variation of its workers' batch rates (None below 2 workers)."""

    role: str
    workers: int
    batches_per_s: float
    tokens_per_s: float
    rate_cv: float | None
    time_share: dict[str, float]
    unmapped: dict[str, float] = field(default_factory=dict)
    """Unmapped timing name -> its share of the role's wall time (the parts of ``time_share``'s
    ``unattributed``), largest first."""
    host_measured: bool = False
    """True when ``other`` is measured host time: every worker counted times its own work
    (forward, backward or forward_backward), so the gap is not untimed model work."""
    reported: dict[str, float] = field(default_factory=dict)
    """The trainer's own throughput and efficiency figures (``model.meanings.REPORTED``: meaning -> value in
    its base unit), only those some worker of the role reports."""


@dataclass(frozen=True, slots=True)
class PipelineInsight:
    """The derived pipeline metrics of one window and the verdict. Ratios are 0-1 (the batch
    ratio excepted), ``None`` when the trainer does not publish what they need."""

    end_unix_s: float
    duration_s: float
    roles: dict[str, RoleInsight]
    workers: tuple[WorkerInsight, ...]
    queue_fill: float | None
    ready_deficit: float | None
    target_drafter_batch_ratio: float | None
    prefetch_fill: float | None
    batch_tokens_mean: float | None
    loss_token_ratio: float | None
    bucket_entropy_bits: float | None
    throttled_gpus: dict[str, tuple[str, ...]]
    verdict: Verdict
    gpu_idle: dict[str, dict[str, float]] = field(default_factory=dict)
    """GPU group (role) -> ``idle`` (its GPUs' idle share, 0-1) and its split by reason (data,
    queue, collectives, host, unexplained); the split sums to ``idle``."""
    raw_verdict: Verdict | None = None
    """The window's own verdict when hysteresis held the previous one (else None)."""
    node: NodeFigures | None = None
    """The node's figures for the cluster rules (``sidecar.model.cluster``), None without a role
    that publishes phase timings and batches."""

    def role(self, name: str) -> RoleInsight | None:
        return self.roles.get(name)


@dataclass(frozen=True, slots=True)
class InsightValue:
    """One optional window-level value of ``PipelineInsight`` and how each exporter names it."""

    attribute: str
    """Field of ``PipelineInsight`` (``None`` when the trainer does not publish what it needs)."""
    name: str
    """Prometheus family, after ``dflash_pipeline_``."""
    help: str
    wandb_key: str
    """W&B key, after ``pipeline/``."""


INSIGHT_VALUES: tuple[InsightValue, ...] = (
    InsightValue("queue_fill", "queue_fill_ratio",
                 "Hidden-state queue fill: mean depth over capacity in the last window (0-1).", "queue_fill"),
    InsightValue("ready_deficit", "ready_deficit_ratio",
                 "Share of drafter wall time spent waiting on an empty hidden-state queue (0-1).", "ready_deficit"),
    InsightValue("target_drafter_batch_ratio", "target_drafter_batch_ratio",
                 "Target batches per drafter batch in the last window.", "target_drafter_batch_ratio"),
    InsightValue("prefetch_fill", "prefetch_fill_ratio",
                 "Drafter prefetch buffer fill: mean depth over capacity (0-1).", "prefetch_fill"),
    InsightValue("batch_tokens_mean", "batch_tokens_mean",
                 "Mean total tokens per drafter batch in the last window (tokens).", "batch_tokens_mean"),
    InsightValue("loss_token_ratio", "loss_token_ratio", "Share of tokens that carry loss in the last window (0-1).",
                 "loss_token_ratio"),
    InsightValue("bucket_entropy_bits", "bucket_entropy",
                 "Shannon entropy of the hidden-state bucket mix in the last window, in bits.", "bucket_entropy_bits"),
)
"""The seven optional values, in export order (docs/METRICS.md lists them)."""
