"""Immutable data model of the NVML source: per-GPU readings, snapshots and source status.

Every value is in base units (ratios 0-1, bytes, watts, joules, celsius, hertz, bytes per
second). ``None`` always means "not available" (unsupported by this GPU or driver, or the read
failed this poll), never zero. Objects are frozen and built once per poll, so the poller thread
can hand them to readers (exporters, the daemon) without locks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sidecar.model.insight import GpuFacts

# Bits of nvmlClocksEventReason* (nvml.h) with the names the exporters use. The values are
# part of NVML's ABI; deprecated "throttle" names map to the same bits.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)

# nvmlPerfPolicyType_t values of the violation counters (fields NVML_FI_DEV_PERF_POLICY_*, or
# nvmlDeviceGetViolationStatus), with the exported reason
# names (NVML's violation counters: time the clocks were held below the application clocks).
VIOLATION_POLICIES: tuple[tuple[int, str], ...] = (
    (0, "power"),
    (1, "thermal"),
    (2, "sync_boost"),
    (3, "board_limit"),
    (4, "low_utilization"),
    (5, "reliability"),
)


class NvmlState(enum.Enum):
    """Where the NVML source stands."""

    DISABLED = "disabled"
    """Never started (``--no-gpu-metrics``)."""
    STARTING = "starting"
    """Started; NVML not initialized yet."""
    AVAILABLE = "available"
    """Polling normally."""
    UNAVAILABLE = "unavailable"
    """No NVML (library missing, driver not loaded, ...); ``NvmlStatus.reason`` says why."""
    STALLED = "stalled"
    """An NVML call has been running far longer than a poll should; readers get the last data."""
    STOPPED = "stopped"
    """Shut down."""


class ProfilingState(enum.Enum):
    """State of the GPM profiling metrics on one GPU."""

    UNSUPPORTED = "unsupported"
    """No GPM on this GPU or driver (before Hopper, or an old driver)."""
    ACTIVE = "active"
    """Sampling; metrics appear once two samples exist."""
    BUSY = "busy"
    """Another profiler holds the counters; backing off and retrying later."""
    ERROR = "error"
    """GPM failed otherwise; retrying later."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A trainer process found on a GPU (matched by pid to a shim's hello)."""

    pid: int
    role: str
    worker: str
    memory_bytes: int | None
    """GPU memory used by the process, bytes; None when the driver does not report it."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU's readings from one poll. A GPU that is ``up=False`` carries no values."""

    index: int
    """NVML device index (the order of ``nvidia-smi``, not ``CUDA_VISIBLE_DEVICES``)."""
    uuid: str
    name: str
    up: bool = True
    """False once the GPU is lost (``NVML_ERROR_GPU_IS_LOST``); it stays down until restart."""
    pci_bus_id: str = ""
    """PCI bus id as NVML gives it (``00000000:1B:00.0``); "" when unknown."""
    utilization_ratio: float | None = None
    """Fraction of the sample period during which a kernel ran (NVML "GPU utilization")."""
    memory_utilization_ratio: float | None = None
    """Fraction of the sample period during which device memory was read or written."""
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    """Memory the driver reserves (``nvmlMemory_v2_t.reserved``); None with the v1 call."""
    power_watts: float | None = None
    power_limit_watts: float | None = None
    """Enforced power limit."""
    energy_joules: float | None = None
    """Energy used since the driver was loaded (a counter)."""
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    clock_event_mask: int | None = None
    """Bit mask of active clock-event (throttle) reasons; see ``clock_events()``."""
    pcie_rx_bytes_per_second: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    ecc_corrected_total: int | None = None
    """Single-bit (corrected) ECC errors since the driver was loaded."""
    ecc_uncorrected_total: int | None = None
    """Double-bit (uncorrected) ECC errors since the driver was loaded."""
    xid_errors_total: int | None = None
    """XID events seen since the source started; None when XID events are not available."""
    last_xid: int | None = None
    """Code of the most recent XID event, None before the first one."""
    xid_counts: tuple[tuple[int, int], ...] = ()
    """XID events seen since the source started, per XID code, sorted by code."""
    violation_seconds_total: tuple[tuple[str, float], ...] = ()
    """Per ``VIOLATION_POLICIES`` reason the GPU supports: seconds its clocks were held below
    the application clocks since the driver was loaded (NVML's violation counter)."""
    violation_ratio: tuple[tuple[str, float], ...] = ()
    """Per reason: the share (0-1) of the last poll interval the reason held the clocks down;
    absent for a reason on the first poll or after its counter went back."""
    processes: tuple[GpuProcess, ...] = ()
    foreign_processes: int | None = None
    """Compute processes on the GPU that are not known trainer processes; None when the
    processes were not listed (no trainer known, or the driver cannot list them)."""
    foreign_memory_bytes: int | None = None
    """GPU memory of those foreign processes, bytes (the ones the driver reports)."""
    profiling: ProfilingState = ProfilingState.UNSUPPORTED
    graphics_activity_ratio: float | None = None
    """GPM: fraction of time any graphics or compute engine was active."""
    sm_activity_ratio: float | None = None
    """GPM: fraction of SMs busy, averaged over the interval."""
    sm_occupancy_ratio: float | None = None
    """GPM: resident warps / theoretical maximum."""
    tensor_activity_ratio: float | None = None
    """GPM: fraction of time the tensor pipes were active (any precision)."""
    dram_bandwidth_ratio: float | None = None
    """GPM: DRAM bandwidth used / theoretical maximum."""
    nvlink_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_per_second: float | None = None

    def clock_events(self) -> tuple[tuple[str, bool], ...] | None:
        """Every known clock-event reason with whether it is active, or None if not available."""
        mask = self.clock_event_mask
        if mask is None:
            return None
        return tuple((name, bool(mask & bit)) for bit, name in CLOCK_EVENT_REASONS)


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """All GPUs from one poll."""

    taken_monotonic_s: float
    """``time.monotonic()`` when the poll started: the age of the oldest value in it."""
    poll_duration_s: float
    nvml_calls: int
    """NVML calls the poll made (a cost measure)."""
    gpus: tuple[GpuReading, ...]
    driver_version: str = ""

    def gpu(self, index: int) -> GpuReading | None:
        """The reading of GPU ``index``, or None if the snapshot has none."""
        for reading in self.gpus:
            if reading.index == index:
                return reading
        return None


@dataclass(frozen=True, slots=True)
class NvmlCallCost:
    """What one NVML call kind has cost since the source started."""

    call: str
    """The C function, with its argument where one function serves several values
    (``nvmlDeviceGetClockInfo(SM)``)."""
    calls: int
    wall_s: float
    """Seconds of wall time inside the calls."""
    cpu_s: float
    """Seconds of the polling thread's CPU time (user + system) inside the calls."""


@dataclass(frozen=True, slots=True)
class NvmlStatus:
    """Health of the NVML source, safe to read at any time (``NvmlSource.status()``)."""

    state: NvmlState
    reason: str = ""
    """Why the source is unavailable or stalled (human-readable)."""
    since_monotonic_s: float | None = None
    """When the current stall began (``STALLED``) or NVML was found unavailable."""
    stalled_call: str | None = None
    """The NVML function that is hanging, while ``STALLED``."""
    last_poll_duration_s: float | None = None
    last_poll_calls: int | None = None
    polls_total: int = 0
    errors: tuple[tuple[str, int], ...] = ()
    """Cumulative NVML errors by reason (e.g. ``gpu_is_lost``, ``unknown``, ``stalled_call``), sorted."""
    gpus_lost: tuple[int, ...] = ()
    hung_gpus: tuple[int, ...] = ()
    """GPUs whose NVML call has been running longer than one poll interval: exporters report
    them down (``up`` 0, no values) until the call returns."""
    profiler_busy_gpus: tuple[int, ...] = ()
    """GPUs whose GPM counters are held by another profiler right now."""
    call_costs: tuple[NvmlCallCost, ...] = ()
    """Every NVML call kind made so far, with its cumulative count, wall and CPU time."""
    cpu_seconds_total: float | None = None
    """CPU time of the polling thread since it started (seconds; NVML calls and the Python around them)."""
    cpu_budget_ratio: float | None = None
    """The share of one core the poller may use (``nvml_cpu_budget``); None in ``every-poll`` mode."""
    intervals: tuple[tuple[str, float], ...] = ()
    """Per group of values (``utilization``, ``energy_counter``, ``gpm``, ...): seconds between
    two reads now, the slow groups' stretched to keep the CPU budget."""

    @property
    def available(self) -> bool:
        """True while polling normally (not stalled, not unavailable)."""
        return self.state is NvmlState.AVAILABLE

    def error_count(self, reason: str) -> int:
        """Errors counted for ``reason`` (0 if none)."""
        return dict(self.errors).get(reason, 0)


@dataclass(frozen=True, slots=True)
class GroupAggregate:
    """Aggregates of one group over its GPUs that are up; a value is None when no GPU has it."""

    name: str
    gpus: tuple[int, ...]
    gpus_up: int
    utilization_mean_ratio: float | None
    power_total_watts: float | None
    temperature_max_celsius: float | None
    memory_free_min_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuView:
    """The GPUs as exporters see them: the source's latest snapshot (None before the first poll
    or without NVML), its status, and the GPU groups' aggregates over that snapshot."""

    snapshot: GpuSnapshot | None
    status: NvmlStatus
    groups: tuple[GroupAggregate, ...] = ()
    facts: GpuFacts | None = None
    """What the insight reads of the GPUs over a window (a window's view only: the GPU stage's;
    None in a view taken between windows, and before the first snapshot)."""


NVML_DISABLED = NvmlStatus(NvmlState.DISABLED, "--no-gpu-metrics")
"""The status of a daemon run with ``--no-gpu-metrics``."""


@dataclass(frozen=True, slots=True)
class GpuMetric:
    """One per-GPU value: where it is in ``GpuReading`` and how it is exported."""

    attribute: str
    name: str
    """Prometheus family name (a counter's ``_total`` is added by the exposition)."""
    help: str
    wandb_key: str
    """Key under ``gpu/<index>/`` in W&B rows."""
    counter: bool = False


GPU_METRICS: tuple[GpuMetric, ...] = (
    GpuMetric("utilization_ratio", "dflash_gpu_utilization_ratio",
              "Fraction of the last sample period in which a kernel was running (NVML GPU utilization).",
              "utilization"),
    GpuMetric("memory_utilization_ratio", "dflash_gpu_memory_utilization_ratio",
              "Fraction of the last sample period in which device memory was read or written.", "memory_utilization"),
    GpuMetric("memory_used_bytes", "dflash_gpu_memory_used_bytes", "Device memory allocated, in bytes.",
              "memory_used_bytes"),
    GpuMetric("memory_free_bytes", "dflash_gpu_memory_free_bytes", "Device memory free, in bytes.",
              "memory_free_bytes"),
    GpuMetric("memory_total_bytes", "dflash_gpu_memory_total_bytes", "Device memory in total, in bytes.",
              "memory_total_bytes"),
    GpuMetric("power_watts", "dflash_gpu_power_watts", "Power draw, in watts.", "power_watts"),
    GpuMetric("power_limit_watts", "dflash_gpu_power_limit_watts", "Enforced power limit, in watts.",
              "power_limit_watts"),
    GpuMetric("energy_joules", "dflash_gpu_energy_joules", "Energy used since the driver was loaded, in joules.",
              "energy_joules", counter=True),
    GpuMetric("temperature_celsius", "dflash_gpu_temperature_celsius", "GPU die temperature, in degrees Celsius.",
              "temperature_celsius"),
    GpuMetric("memory_temperature_celsius", "dflash_gpu_memory_temperature_celsius",
              "Device memory (HBM) temperature, in degrees Celsius.", "memory_temperature_celsius"),
    GpuMetric("sm_clock_hertz", "dflash_gpu_sm_clock_hertz", "Current SM clock, in hertz.", "sm_clock_hertz"),
    GpuMetric("memory_clock_hertz", "dflash_gpu_memory_clock_hertz", "Current memory clock, in hertz.",
              "memory_clock_hertz"),
    GpuMetric("pcie_rx_bytes_per_second", "dflash_gpu_pcie_rx_bytes_per_second",
              "PCIe bytes received by the GPU per second over the last poll interval.", "pcie_rx_bytes_per_second"),
    GpuMetric("pcie_tx_bytes_per_second", "dflash_gpu_pcie_tx_bytes_per_second",
              "PCIe bytes sent by the GPU per second over the last poll interval.", "pcie_tx_bytes_per_second"),
    GpuMetric("sm_activity_ratio", "dflash_gpu_sm_activity_ratio",
              "GPM: fraction of SMs busy over the last interval (Hopper and newer).", "sm_activity"),
    GpuMetric("sm_occupancy_ratio", "dflash_gpu_sm_occupancy_ratio",
              "GPM: resident warps over the theoretical maximum (Hopper and newer).", "sm_occupancy"),
    GpuMetric("tensor_activity_ratio", "dflash_gpu_tensor_activity_ratio",
              "GPM: fraction of time any tensor pipe was active (Hopper and newer).", "tensor_activity"),
    GpuMetric("dram_bandwidth_ratio", "dflash_gpu_dram_bandwidth_ratio",
              "GPM: DRAM bandwidth used over the theoretical maximum (Hopper and newer).", "dram_bandwidth"),
    GpuMetric("nvlink_rx_bytes_per_second", "dflash_gpu_nvlink_rx_bytes_per_second",
              "GPM: NVLink bytes received per second, all links (Hopper and newer).", "nvlink_rx_bytes_per_second"),
    GpuMetric("nvlink_tx_bytes_per_second", "dflash_gpu_nvlink_tx_bytes_per_second",
              "GPM: NVLink bytes sent per second, all links (Hopper and newer).", "nvlink_tx_bytes_per_second"),
)

XID_METRICS: tuple[GpuMetric, ...] = (
    GpuMetric("xid_errors_total", "dflash_gpu_xid_errors", "XID error events seen since the sidecar started.",
              "xid_errors", counter=True),
    GpuMetric("last_xid", "dflash_gpu_last_xid", "Code of the most recent XID error event.", "last_xid"),
)
