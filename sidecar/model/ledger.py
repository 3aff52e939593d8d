"""The run ledger (goodput) as every exporter reads it: per run and role, where the wall time and
the GPU energy went, with the efficiency figures derived from them.

Computed by ``sidecar.aggregation.ledger`` (how each cause is told: docs/METRICS.md, "Run
ledger"); carried by the window (``IngestReport.run_ledger``). Seconds and joules are totals since
the run's first sender started, kept across daemon and trainer restarts. This is the *run*
ledger: not the senders' tallies, the shim's per-sender exit accounting (``docs/PROTOCOL.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

CAUSES: tuple[str, ...] = (
    "productive", "data", "host", "communication", "queue", "throttled", "startup", "compile", "warmup",
    "checkpoint", "shutdown", "unattributed", "unobserved", "restart_gap",
)
"""Where a role's wall time goes. ``productive``: its GPUs busy and not throttled; the others are
badput: ``data`` (data-loader wait), ``host`` (host overhead between timed phases), ``communication``
(collectives), ``queue`` (hidden-state queue waits), ``throttled`` (GPUs busy while a throttling
clock-event reason was active), ``startup`` (process start to first step), ``compile`` (first steps
marked as compilation, or a timing named ``compile``), ``warmup`` (idle time nothing else
explains in the first windows with steps, before the step time settles), ``checkpoint`` (a timing
named ``checkpoint``), ``shutdown`` (from the last step to a clean exit), ``unattributed`` (idle
GPU time nothing explains, or a window without readings or phase timings), ``unobserved`` (the
trainer alive while the daemon was not: a daemon restart or upgrade; or a role gone without
anything ever telling a step: its held startup cannot be placed), ``restart_gap`` (the role's
sender gone until its successor started)."""


PEAK_FLOPS: tuple[tuple[str, float, str], ...] = (
    ("H200", 989.4e12, "NVIDIA H200 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity"),
    ("H100 PCIe", 756.0e12, "NVIDIA H100 datasheet: H100 PCIe BF16 Tensor Core 1,513 TFLOPS with sparsity"),
    ("H100", 989.4e12, "NVIDIA H100 datasheet: H100 SXM BF16 Tensor Core 1,979 TFLOPS with sparsity"),
    ("A100", 312.0e12, "NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity)"),
    ("L40S", 362.05e12, "NVIDIA L40S datasheet: BF16 Tensor Core 362.05 TFLOPS (733 with sparsity)"),
    ("L4", 121.0e12, "NVIDIA L4 datasheet: BF16 Tensor Core 242 TFLOPS with sparsity"),
    ("A10", 125.0e12, "NVIDIA A10 datasheet: BF16 Tensor Core 125 TFLOPS (250 with sparsity)"),
)
"""(substring of the NVML device name, dense BF16 tensor peak in FLOP/s, source). The first match
wins, so more specific names come first. Datasheets quote sparse figures; dense is half of them."""


def peak_flops(gpu_name: str) -> float | None:
    """Dense BF16 peak FLOP/s of one GPU named as NVML names it, or None if the table lacks it."""
    for part, peak, _source in PEAK_FLOPS:
        if part.lower() in gpu_name.lower():
            return peak
    return None


def _per(amount: float | None, count: float | None) -> float | None:
    """``amount`` per ``count``; None unless both are known and positive (nothing spent, or
    nothing to spend it on)."""
    return amount / count if amount is not None and count is not None and amount > 0 and count > 0 else None


@dataclass(frozen=True, slots=True)
class RoleLedger:
    """One role of one run. ``seconds``/``joules``: cause -> total (every cause of ``CAUSES``
    present, 0 where none). ``open_gap_s``: seconds since its last sender went silent while none
    followed yet (not part of the wall time until a successor starts). ``flops_per_token``: the
    model FLOPs per token the trainer states (``flops_per_token`` setting), None if not stated."""

    run: str
    role: str
    seconds: Mapping[str, float]
    joules: Mapping[str, float]
    tokens: float
    steps: int
    gpus: int
    gpu_name: str
    first_unix_s: float
    last_unix_s: float
    open_gap_s: float = 0.0
    flops_per_token: float | None = None
    starting_s: float = 0.0
    """Startup seconds not yet in the wall time: held until the first step tells how much of it
    was the first step's compilation."""
    reported_mfu_s: float = 0.0
    """The trainer's own MFU (0-1) times the seconds it stood for, summed."""
    reported_flop: float = 0.0
    """The trainer's own achieved FLOP/s per GPU times the seconds it stood for, summed (FLOPs per GPU)."""
    ends: Mapping[str, int] = field(default_factory=dict)
    """Its senders' ends by how (``model.ends.HOWS``) since the run began."""
    gap_after: Mapping[str, float] = field(default_factory=dict)
    """Of its ``restart_gap`` seconds, those after an end, by that end's how (an ``unclean`` or
    ``oom`` gap is the time a kill cost the run until its successor started)."""
    last_end: Mapping[str, str] = field(default_factory=dict)
    """Its last sender end: ``how``, ``cause`` and ``detail`` (``model.ends``; empty: none told)."""

    @property
    def wall_s(self) -> float:
        """Seconds of wall time accounted (the causes' sum)."""
        return sum(self.seconds.values())

    @property
    def goodput_ratio(self) -> float | None:
        """Productive share of the wall time (0-1), None before any time is accounted."""
        wall = self.wall_s
        return self.seconds.get("productive", 0.0) / wall if wall > 0 else None

    @property
    def energy_j(self) -> float:
        return sum(self.joules.values())

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        """Tokens per second of wall time per GPU of the role (None without tokens or GPUs)."""
        return _per(_per(self.tokens, self.wall_s), self.gpus)

    @property
    def mfu_ratio(self) -> float | None:
        """Model FLOPs utilization over the wall time (0-1): FLOPs per token x tokens/s/GPU over
        the GPU's dense peak (``PEAK_FLOPS``); where those are missing, from the trainer's own
        figures (``mfu_source``); None without either."""
        rate = self.tokens_per_s_per_gpu
        peak = peak_flops(self.gpu_name)
        if rate and peak and self.flops_per_token:
            return self.flops_per_token * rate / peak
        wall = self.wall_s
        if (trainer_mfu := _per(self.reported_mfu_s, wall)) is not None:
            return trainer_mfu
        return _per(_per(self.reported_flop, wall), peak)

    @property
    def mfu_source(self) -> str | None:
        """What ``mfu_ratio`` comes from: ``flops_per_token`` (the sidecar's own), ``trainer_mfu``
        (the trainer's MFU, over the wall time), ``trainer_flops`` (its FLOP/s per GPU over the
        GPU's peak), None when there is none."""
        if self.mfu_ratio is None:
            return None
        if self.tokens_per_s_per_gpu and peak_flops(self.gpu_name) and self.flops_per_token:
            return "flops_per_token"
        return "trainer_mfu" if self.reported_mfu_s > 0 else "trainer_flops"

    @property
    def joules_per_token(self) -> float | None:
        return _per(self.energy_j, self.tokens)

    @property
    def joules_per_step(self) -> float | None:
        return _per(self.energy_j, self.steps)


@dataclass(frozen=True, slots=True)
class VerdictShare:
    """One verdict over a run: the seconds and windows in which the pipeline insight gave it
    while the run had a live sender, and its evidence averaged over those seconds (ratios 0-1,
    in the verdict's own deciding order); ``detail`` the latest one it gave."""

    name: str
    seconds: float
    windows: int
    evidence: tuple[tuple[str, float], ...] = ()
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RunVerdicts:
    """A run's verdicts, kept after it ended (``dflash-sidecar report``, ``explain --run``):
    most seconds first. The insight's verdict is the host's, so runs alive at once share it."""

    run: str
    verdicts: tuple[VerdictShare, ...]

    @property
    def seconds(self) -> float:
        """Seconds of the run with a verdict (the sum over ``verdicts``)."""
        return sum(v.seconds for v in self.verdicts)

    @property
    def windows(self) -> int:
        return sum(v.windows for v in self.verdicts)

    def time_share(self, verdict: VerdictShare) -> float:
        """``verdict``'s share of the seconds with a verdict (0-1)."""
        return verdict.seconds / self.seconds if self.seconds > 0 else 0.0

    def window_share(self, verdict: VerdictShare) -> float:
        """``verdict``'s share of the windows with a verdict (0-1)."""
        return verdict.windows / self.windows if self.windows else 0.0

    @property
    def dominant(self) -> VerdictShare | None:
        """The verdict held for the most seconds, ``unknown`` only when no other was given."""
        told = [v for v in self.verdicts if v.name != "unknown"] or list(self.verdicts)
        return max(told, key=lambda v: v.seconds, default=None)


@dataclass(frozen=True, slots=True)
class RunLedgerView:
    """Every run the ledger holds, and the daemon's time with no live trainer at all."""

    roles: tuple[RoleLedger, ...] = ()
    no_trainer_s: float = 0.0
    """Seconds the daemon ran with no live sender (summed across daemon restarts)."""
    no_trainer_j: float = 0.0
    """GPU energy spent meanwhile, joules (every GPU NVML reports)."""
    runs_dropped: int = 0
    """Runs forgotten to keep the ledger bounded (the oldest first)."""
    state_errors: dict[str, int] = field(default_factory=dict)
    """Reason -> failed loads or saves of the state file."""
    verdicts: tuple[RunVerdicts, ...] = ()
    """Each run's verdicts (a run the insight gave none has no entry)."""

    def verdicts_of(self, run: str) -> RunVerdicts | None:
        return next((v for v in self.verdicts if v.run == run), None)

    def run(self, run: str) -> tuple[RoleLedger, ...]:
        return tuple(r for r in self.roles if r.run == run)

    @property
    def runs(self) -> tuple[str, ...]:
        """Run ids, most recent last."""
        last: dict[str, float] = {}
        for r in self.roles:
            last[r.run] = max(last.get(r.run, 0.0), r.last_unix_s)
        return tuple(sorted(last, key=lambda k: last[k]))
