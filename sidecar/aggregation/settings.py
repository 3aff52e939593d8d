"""The aggregation stage's settings (``sidecar.model.settings``): the window, the cardinality
budget, the GPU groups, the run ledger and the verdict's role names and thresholds
(``InsightSettings``, which ``verdict`` reads)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from sidecar.aggregation.gpu_groups import GpuGroups
from sidecar.model.gpu import CLOCK_EVENT_REASONS
from sidecar.model.settings import RoleSettings, one_of, ratio, setting


def flops(raw: Any) -> float:
    """FLOPs per token, 1 to 1e18. Raises ``ValueError`` otherwise."""
    value = float(raw)
    if not 1.0 <= value <= 1e18:  # NaN fails too
        raise ValueError("flops_per_token must be between 1 and 1e18")
    return value


@dataclass(frozen=True)
class WindowSettings:
    """The aggregation window and the series it may hold."""

    TITLE: ClassVar[str] = "window"
    """The options' group in ``--help`` and the docs."""

    # Bounds: a window under 0.1 s spent a whole core rolling windows (13,500/s at 1e-06); over an
    # hour no window ever closes in practice.
    interval: float = setting(10.0, check=float, bounds=(0.1, 3600.0), unit="seconds", reloadable=True, metavar="S",
                              help="Aggregation window (seconds).", summary="aggregation window, default 10 s")
    # 100,000 timing series hold about 540 MB (10,000: 54 MB), the daemon's whole memory target.
    max_series: int = setting(10_000, check=int, bounds=(1, 100_000), unit="series", metavar="N",
                              help="Cardinality budget: most distinct trainer series held.")


@dataclass(frozen=True)
class GpuGroupSettings:
    """Which GPUs each role runs on."""

    TITLE: ClassVar[str] = "GPU group"
    """The options' group in ``--help`` and the docs."""

    gpu_group: tuple[str, ...] = setting(
        (), kind="list", metavar="NAME=IDS", example="target=0-5",
        default_note="none, roles are discovered from the trainers' processes",
        help="Role to GPUs mapping NAME=IDS (repeatable), e.g. target=0-5, drafter=6,7. Unset: discovered from "
             "the trainers' processes.", summary="role to GPUs, repeatable (default: from the trainers' processes)")

    def check_settings(self) -> Mapping[str, Any]:
        """Raises ``ValueError`` for groups that do not parse or overlap (``GpuGroups.parse``)."""
        try:
            GpuGroups.parse(self.gpu_group)
        except ValueError as exc:
            raise ValueError(f"invalid --gpu-group: {exc}") from None
        return {}


@dataclass(frozen=True)
class LedgerSettings:
    """The run ledger (docs/METRICS.md, "Run ledger")."""

    TITLE: ClassVar[str] = "run ledger"
    """The options' group in ``--help`` and the docs."""

    state_dir: str | None = setting(
        None, metavar="DIR", example="/var/lib/dflash-sidecar",
        default_note="$STATE_DIRECTORY under systemd, else $XDG_STATE_HOME/dflash-sidecar "
                     "(~/.local/state/dflash-sidecar)",
        help="Folder of the run ledger's state file (kept across daemon restarts). Under systemd $STATE_DIRECTORY "
             "wins over this.")
    flops_per_token: float | None = setting(
        None, check=flops, metavar="F", example="4.2e10", default_note="unset, MFU only where a trainer states it",
        help="Model FLOPs per trained token (forward and backward, e.g. 6 x parameters): enables the run ledger's "
             "MFU for trainers whose shim states none (DFLASH_FLOPS_PER_TOKEN or configure(flops_per_token=...) "
             "win over this). Unset: MFU only where a trainer states it.")
    run_gap_s: float = setting(
        300.0, check=float, bounds=(1.0, 7 * 86400.0), unit="seconds", metavar="S",
        help="A host's trainers with neither a W&B run nor a run label start a new run when no sender of the "
             "host's current run sent for longer than this (seconds); within it, a new trainer is a restart of "
             "the same run.")


DEFAULT_THROTTLE_REASONS: tuple[str, ...] = (
    "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "board_limit",
    "reliability")
"""NVML clock-event reasons (``sidecar.model.gpu.CLOCK_EVENT_REASONS``) that make a ``throttled``
verdict, in bit order; the default of ``insight_throttle_reasons``. ``sw_power_cap`` is left out:
nvml.h says of it "the clocks have been optimized to ensure not to exceed currently set power
limits", the normal state of a saturated GPU, and names it a clock-event reason
(``nvmlClocksEventReasonSwPowerCap``), keeping ``nvmlClocksThrottleReason*`` names for the
hardware slowdowns; ``gpu_idle``, ``sync_boost`` and the clock settings are not limits either."""

_RULE = "Verdict"
_SINGLE = "Verdict (single-role loops)"


def threshold(default: float, help: str) -> Any:
    """A verdict threshold: a reloadable ratio setting (0-1) of ``InsightSettings``."""
    return setting(default, reloadable=True, check=ratio, help=help)


@dataclass(frozen=True)
class InsightSettings(RoleSettings):
    """Role names (``RoleSettings``) and verdict thresholds: the ``insight_*`` settings
    (``sidecar.model.settings``), all reloadable (applied on SIGHUP)."""

    KEY_PREFIX: ClassVar[str] = "insight_"
    TITLE: ClassVar[str] = "insight"

    starved_ratio: float = threshold(0.15,
        f"{_RULE}: drafters starve (the supply side limits) when they spend at least this share of wall time "
        "waiting on an empty queue (the ready deficit).")
    backpressure_ratio: float = threshold(0.15,
        f"{_RULE}: drafters limit (drafter-bound) when targets spend at least this share of wall time blocked on "
        "a full queue.")
    queue_full_ratio: float = threshold(0.9,
        f"{_RULE}: drafter-bound when the queue is at least this full and targets publish no queue_put_wait "
        "timing.")
    host_wait_ratio: float = threshold(0.25,
        f"{_RULE}: input-bound when the limiting role waits on the host data loader (data_wait) for at least "
        "this share of wall time.")
    handoff_ratio: float = threshold(0.25,
        f"{_RULE}: queue-starved when drafters starve and targets spend at least this share of wall time packing "
        "hidden states (pack).")
    straggler_score: float = threshold(0.7,
        f"{_RULE}: a worker whose score is below this is a straggler. The score: where every worker of the role times "
        "its step and its collectives, the role's least time a step outside the collectives / its own (the rank "
        "the others wait for); else best median busy time per batch of its role / its own.")
    comm_wait_ratio: float = threshold(0.25,
        f"{_SINGLE}: communication-bound when the role spends at least this share of wall time in collective "
        "waits (comm_wait).")
    host_overhead_ratio: float = threshold(0.3,
        f"{_SINGLE}: host-bound when at least this share of the role's wall time is measured host time between "
        "its timed phases (inside its step).")
    compute_busy_ratio: float = threshold(0.85,
        f"{_SINGLE}: compute-bound when the role's GPUs are at least this busy (GPM SM activity, else NVML "
        "utilization), whatever the host-side shares say.")
    unexplained_idle_ratio: float = threshold(0.3,
        f"{_RULE}: unexplained-idle, never balanced, when a role's GPUs are idle at least this share of the "
        "window beyond what its waits (data, queue, collectives, measured host time) explain.")
    throttle_reasons: tuple[str, ...] = setting(
        DEFAULT_THROTTLE_REASONS, kind="list", reloadable=True,
        check=one_of(*(name for _, name in CLOCK_EVENT_REASONS)),
        metavar="REASON", help=f"{_RULE}: NVML clock-event reasons that count as throttling (repeatable).")
