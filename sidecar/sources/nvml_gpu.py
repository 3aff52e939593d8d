"""Reads one GPU per poll through ``NvmlDriver`` and builds its ``GpuReading``.

Every poll: utilization, memory, power, temperature, two clocks and clock-event reasons (calls of
microseconds), the running processes while trainer pids are known. When the poller's cadence
says so (``nvml_cadence``): one ``nvmlDeviceGetFieldValues`` batch with the slow field groups due
(energy counter, memory temperature, PCIe byte counters, ECC totals, power limit, the six
throttle-policy violation counters), and GPM on Hopper+. Slow values are held between their
reads; the energy between two counter readings is integrated from power (``nvml_energy``). A
violation counter the batch does not give falls back to ``nvmlDeviceGetViolationStatus`` for that
policy. A value the GPU or driver does not support is asked once and then left out (``None``)
until restart; a versioned function missing from an old driver falls back to the older version
(logged once by the driver).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.model.gpu import VIOLATION_POLICIES, GpuProcess, GpuReading, ProfilingState
from sidecar.sources.nvml_cadence import UNITS
from sidecar.sources.nvml_driver import (
    SUCCESS,
    GpuLostError,
    NvmlCallError,
    NvmlDriver,
    Outcome,
    constant,
)
from sidecar.sources.nvml_energy import EnergyEstimate
from sidecar.sources.nvml_gpm import GpmSampler

MHZ = 1e6
MAX_XID_CODES = 64
"""Distinct XID codes counted per GPU; later new codes are counted under ``OTHER_XID``."""
OTHER_XID = -1

FIELD_ENERGY = constant("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 83)  # mJ
FIELD_MEMORY_TEMP = constant("NVML_FI_DEV_MEMORY_TEMP", 82)  # C
FIELD_POWER_LIMIT = constant("NVML_FI_DEV_POWER_CURRENT_LIMIT", 190)  # mW
FIELD_PCIE_TX = constant("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197)  # bytes, may wrap
FIELD_PCIE_RX = constant("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198)
FIELD_ECC_CORRECTED = constant("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", 3)
FIELD_ECC_UNCORRECTED = constant("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", 4)
# Violation counters (ns the clocks were held below the application clocks), one per
# nvmlPerfPolicyType_t in VIOLATION_POLICIES' order: NVML_FI_DEV_PERF_POLICY_POWER .. _RELIABILITY,
# each field named by its reason in capitals.
FIELD_VIOLATIONS: dict[int, str] = {
    constant(f"NVML_FI_DEV_PERF_POLICY_{reason.upper()}", 74 + policy): reason for policy, reason in VIOLATION_POLICIES}
FIELDS: tuple[int, ...] = (FIELD_ENERGY, FIELD_MEMORY_TEMP, FIELD_POWER_LIMIT, FIELD_PCIE_TX,
                           FIELD_PCIE_RX, FIELD_ECC_CORRECTED, FIELD_ECC_UNCORRECTED, *FIELD_VIOLATIONS)
"""The field batch. Power is not in it: ``nvmlDeviceGetPowerUsage`` costs microseconds where a
batch may cost milliseconds, and power is read every poll."""
FIELD_GROUPS: dict[int, str] = {
    FIELD_ENERGY: "energy_counter", FIELD_MEMORY_TEMP: "memory_temperature", FIELD_POWER_LIMIT: "power_limit",
    FIELD_PCIE_TX: "pcie_counters", FIELD_PCIE_RX: "pcie_counters", FIELD_ECC_CORRECTED: "ecc_counters",
    FIELD_ECC_UNCORRECTED: "ecc_counters", **dict.fromkeys(FIELD_VIOLATIONS, "throttle_counters")}
"""The slow group (``nvml_cadence.SLOW_PERIODS_S``) each field is read with."""

# Fields an older driver may lack, with the single-value function that gives the same number.
# PCIe has no such fallback: nvmlDeviceGetPcieThroughput samples for 20 ms per call, which
# would cost 320 ms per poll on 8 GPUs; GPM's PCIe metrics fill in on Hopper+.
LEGACY_FUNCTIONS: dict[int, str] = {
    FIELD_ENERGY: "nvmlDeviceGetTotalEnergyConsumption",
    FIELD_POWER_LIMIT: "nvmlDeviceGetEnforcedPowerLimit",
}

TEMPERATURE_GPU = constant("NVML_TEMPERATURE_GPU", 0)
CLOCK_SM = constant("NVML_CLOCK_SM", 1)
CLOCK_MEM = constant("NVML_CLOCK_MEM", 2)
MEMORY_V2 = constant("nvmlMemory_v2", 0x02000028)


@dataclass(frozen=True, slots=True)
class Call:
    """One way to read a value: ``pynvml.<function>(handle, *args)``, named ``label`` in logs."""

    function: str
    args: tuple[Any, ...] = ()
    label: str | None = None


UTILIZATION = (Call("nvmlDeviceGetUtilizationRates"),)
POWER = (Call("nvmlDeviceGetPowerUsage"),)
MEMORY = (Call("nvmlDeviceGetMemoryInfo", (MEMORY_V2,), "nvmlDeviceGetMemoryInfo_v2"),
          Call("nvmlDeviceGetMemoryInfo"))
TEMPERATURE = (Call("nvmlDeviceGetTemperatureV", (TEMPERATURE_GPU,)),
               Call("nvmlDeviceGetTemperature", (TEMPERATURE_GPU,)))
SM_CLOCK = (Call("nvmlDeviceGetClockInfo", (CLOCK_SM,), "nvmlDeviceGetClockInfo(SM)"),)
MEM_CLOCK = (Call("nvmlDeviceGetClockInfo", (CLOCK_MEM,), "nvmlDeviceGetClockInfo(MEM)"),)
CLOCK_EVENTS = (Call("nvmlDeviceGetCurrentClocksEventReasons"), Call("nvmlDeviceGetCurrentClocksThrottleReasons"))
PROCESSES = (Call("nvmlDeviceGetComputeRunningProcesses_v3"), Call("nvmlDeviceGetComputeRunningProcesses_v2"))
VIOLATION_STATUS = {
    reason: (Call("nvmlDeviceGetViolationStatus", (policy,), f"nvmlDeviceGetViolationStatus({reason})"),)
    for policy, reason in VIOLATION_POLICIES}


class GpuReader:
    """Everything the poller remembers about one GPU; used by the poller thread only."""

    def __init__(self, driver: NvmlDriver, index: int, handle: Any, uuid: str, name: str,
                 log: logging.Logger, gpm: GpmSampler | None, pci_bus_id: str = "") -> None:
        self.index = index
        self.handle = handle
        self.uuid = uuid
        self.name = name
        self.pci_bus_id = pci_bus_id
        self.lost = handle is None
        self.xid_errors_total: int | None = None
        self.last_xid: int | None = None
        self._xid_counts: dict[int, int] = {}
        self._violations: dict[str, tuple[int, float]] = {}
        """Per reason: the last (violation time ns, its timestamp µs)."""
        self._violation_fallback: list[str] = []
        """Reasons the field batch does not give: read with nvmlDeviceGetViolationStatus."""
        self._driver = driver
        self._log = log
        self._gpm = gpm
        self._choice: dict[str, int] = {}
        self._fields: list[int] = list(FIELDS)
        self._legacy: list[int] = []
        self._counters: dict[int, tuple[int, float]] = {}
        self._held: dict[int, tuple[float, float]] = {}
        """The slow fields' last values: field id -> (value in NVML units, timestamp s)."""
        self._pcie: dict[int, float] = {}
        """PCIe rates (bytes/s) by counter field, from the last two readings."""
        self._violation_values: tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]] = ((), ())
        self._energy = EnergyEstimate()
        self.slow_cpu_s: dict[str, float] = {}
        """CPU seconds of this poll's slow reads by unit (``fields``, ``gpm``); empty when none ran."""

    @property
    def gpm_primed(self) -> bool:
        """False while GPM has a first sample but no metrics yet (``GpmSampler.primed``)."""
        return self._gpm is None or self._gpm.primed

    @property
    def profiling(self) -> ProfilingState:
        """Current GPM state of this GPU."""
        return self._gpm.state if self._gpm is not None and not self.lost else ProfilingState.UNSUPPORTED

    def record_xid(self, xid: int) -> None:
        """Count one XID event (from ``XidWatcher``)."""
        self.xid_errors_total = (self.xid_errors_total or 0) + 1
        self.last_xid = xid
        if xid in self._xid_counts or len(self._xid_counts) < MAX_XID_CODES:
            self._xid_counts[xid] = self._xid_counts.get(xid, 0) + 1
        else:  # a driver inventing codes must not grow the series without bound
            self._xid_counts[OTHER_XID] = self._xid_counts.get(OTHER_XID, 0) + 1

    def xid_counts(self) -> tuple[tuple[int, int], ...]:
        """XID events per code, sorted by code."""
        return tuple(sorted(self._xid_counts.items()))

    def read(self, trainer: Mapping[int, tuple[str, str]], now: float, slow: Collection[str]) -> GpuReading:
        """This poll's reading, with the slow groups ``slow`` read afresh (the others as last read);
        a lost GPU is marked down (and never asked again)."""
        self.slow_cpu_s = {}
        if not self.lost:
            try:
                return self._read(trainer, now, slow)
            except GpuLostError as exc:
                self.lost = True
                self._driver.count_error("gpu_is_lost")
                self._log.error("GPU %d (%s) is lost: %s returned NVML_ERROR_GPU_IS_LOST; it is reported down "
                                "until the daemon restarts", self.index, self.uuid, exc.function)
                if self._gpm is not None:
                    self._gpm.close()
        return GpuReading(self.index, self.uuid, self.name, up=False, pci_bus_id=self.pci_bus_id,
                          xid_errors_total=self.xid_errors_total, last_xid=self.last_xid,
                          xid_counts=self.xid_counts())

    def close(self) -> None:
        """Release NVML resources held for this GPU."""
        if self._gpm is not None:
            self._gpm.close()

    # ------------------------------------------------------------------ internals

    def _read(self, trainer: Mapping[int, tuple[str, str]], now: float, slow: Collection[str]) -> GpuReading:
        utilization = self._first("utilization", UTILIZATION)
        memory = self._first("memory", MEMORY)
        power = self._first("power", POWER)
        temperature = self._first("temperature", TEMPERATURE)
        sm_clock = self._first("sm_clock", SM_CLOCK)
        mem_clock = self._first("mem_clock", MEM_CLOCK)
        clock_events = self._first("clock_events", CLOCK_EVENTS)
        self._energy.power(None if power is None else power * 1e-3, now)
        self._read_slow(now, slow)
        held = self._held
        processes, foreign, foreign_memory = self._processes(trainer) if trainer else ((), None, None)
        gpm: dict[str, float | None] = {}
        profiling = ProfilingState.UNSUPPORTED
        if self._gpm is not None:
            gpm, profiling = self._gpm.values, self._gpm.state
        pcie_rx, pcie_tx = self._pcie.get(FIELD_PCIE_RX), self._pcie.get(FIELD_PCIE_TX)
        return GpuReading(
            self.index, self.uuid, self.name, pci_bus_id=self.pci_bus_id,
            utilization_ratio=None if utilization is None else utilization.gpu / 100.0,
            memory_utilization_ratio=None if utilization is None else utilization.memory / 100.0,
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_free_bytes=None if memory is None else int(memory.free),
            memory_total_bytes=None if memory is None else int(memory.total),
            memory_reserved_bytes=_reserved(memory),
            power_watts=None if power is None else power * 1e-3,
            power_limit_watts=_scaled(held.get(FIELD_POWER_LIMIT), 1e-3),
            energy_joules=self._energy.value(),
            temperature_celsius=None if temperature is None else float(temperature),
            memory_temperature_celsius=_scaled(held.get(FIELD_MEMORY_TEMP), 1.0),
            sm_clock_hertz=None if sm_clock is None else sm_clock * MHZ,
            memory_clock_hertz=None if mem_clock is None else mem_clock * MHZ,
            clock_event_mask=None if clock_events is None else int(clock_events),
            pcie_rx_bytes_per_second=pcie_rx if pcie_rx is not None else gpm.get("pcie_rx_bytes_per_second"),
            pcie_tx_bytes_per_second=pcie_tx if pcie_tx is not None else gpm.get("pcie_tx_bytes_per_second"),
            ecc_corrected_total=_integer(held.get(FIELD_ECC_CORRECTED)),
            ecc_uncorrected_total=_integer(held.get(FIELD_ECC_UNCORRECTED)),
            xid_errors_total=self.xid_errors_total,
            last_xid=self.last_xid,
            xid_counts=self.xid_counts(),
            violation_seconds_total=self._violation_values[0],
            violation_ratio=self._violation_values[1],
            processes=processes,
            foreign_processes=foreign,
            foreign_memory_bytes=foreign_memory,
            profiling=profiling,
            graphics_activity_ratio=gpm.get("graphics_activity_ratio"),
            sm_activity_ratio=gpm.get("sm_activity_ratio"),
            sm_occupancy_ratio=gpm.get("sm_occupancy_ratio"),
            tensor_activity_ratio=gpm.get("tensor_activity_ratio"),
            dram_bandwidth_ratio=gpm.get("dram_bandwidth_ratio"),
            nvlink_rx_bytes_per_second=gpm.get("nvlink_rx_bytes_per_second"),
            nvlink_tx_bytes_per_second=gpm.get("nvlink_tx_bytes_per_second"),
        )

    def _read_slow(self, now: float, slow: Collection[str]) -> None:
        """Read the slow groups due (one field batch, GPM), timing each unit's CPU in ``slow_cpu_s``."""
        groups = {name for name in slow if UNITS.get(name) == "fields"}
        if groups:
            cpu0 = time.thread_time()
            fields = self._read_fields(now, groups)
            self._held.update(fields)
            if "energy_counter" in groups:
                self._read_energy(fields, now)
            if "pcie_counters" in groups:
                self._pcie = {f: rate for f in (FIELD_PCIE_RX, FIELD_PCIE_TX)
                              if (rate := self._rate(f, fields)) is not None}
            if "throttle_counters" in groups:
                self._violation_values = self._read_violations(fields)
            self.slow_cpu_s["fields"] = time.thread_time() - cpu0
        if "gpm" in slow and self._gpm is not None:
            cpu0 = time.thread_time()
            self._gpm.poll(now)
            self.slow_cpu_s["gpm"] = time.thread_time() - cpu0

    def _read_energy(self, fields: Mapping[int, tuple[float, float]], now: float) -> None:
        counter = fields.get(FIELD_ENERGY)
        if counter is not None:
            self._energy.counter(counter[0] * 1e-3, now)
        elif FIELD_ENERGY not in self._fields and (FIELD_ENERGY not in self._legacy
                                                   or self._choice.get(f"legacy-{FIELD_ENERGY}", 0) > 0):
            self._energy.forget()  # neither the field nor the function: no energy from now on

    def _first(self, key: str, calls: Sequence[Call]) -> Any:
        """The value from the first of ``calls`` this GPU and driver support, or None.

        Remembers which one worked; gives up on ``key`` for good when none is supported.
        A transient error returns None without moving on to the next alternative.
        """
        start = self._choice.get(key, 0)
        for position in range(start, len(calls)):
            call = calls[position]
            outcome, value = self._driver.try_call(call.function, self.handle, *call.args,
                                                   gpu=self.index, label=call.label)
            if outcome is Outcome.OK:
                self._choice[key] = position
                return value
            if outcome is Outcome.ERROR:
                return None
        if start < len(calls):
            self._log.debug("GPU %d: %s not available; not asked again", self.index, key)
        self._choice[key] = len(calls)
        return None

    def _read_fields(self, now: float, groups: Collection[str]) -> dict[int, tuple[float, float]]:
        """Batched field values of the field ``groups``: ``{field id: (value in NVML units,
        timestamp in seconds)}``; a field asked and not read is dropped from the held values."""
        values: dict[int, tuple[float, float]] = {}
        requested = [f for f in self._fields if FIELD_GROUPS[f] in groups]
        for field_id in FIELD_GROUPS:
            if FIELD_GROUPS[field_id] in groups:
                self._held.pop(field_id, None)
        if requested:
            outcome, results = self._driver.field_values(self.handle, requested, self.index)
            if outcome in (Outcome.MISSING, Outcome.UNSUPPORTED):
                self._drop_fields(requested)
            if outcome is not Outcome.OK:
                results = []
                requested = []
            for field_id, (code, value, timestamp_us) in zip(requested, results, strict=True):
                if code == SUCCESS and value is not None:
                    values[field_id] = (value, timestamp_us / 1e6 if timestamp_us > 0 else now)
                    continue
                error = NvmlCallError(f"nvmlDeviceGetFieldValues[{field_id}]", code)
                if self._driver.classify(error, self.index) in (Outcome.MISSING, Outcome.UNSUPPORTED):
                    self._drop_fields([field_id])
        for field_id in self._legacy:
            if FIELD_GROUPS[field_id] not in groups:
                continue
            value = self._first(f"legacy-{field_id}", (Call(LEGACY_FUNCTIONS[field_id]),))
            if value is not None:
                values[field_id] = (value, now)
        return values

    def _drop_fields(self, field_ids: list[int]) -> None:
        for field_id in field_ids:
            self._fields.remove(field_id)
            if field_id in LEGACY_FUNCTIONS:
                self._legacy.append(field_id)
            if field_id in FIELD_VIOLATIONS:
                self._violation_fallback.append(FIELD_VIOLATIONS[field_id])

    def _rate(self, field_id: int, fields: Mapping[int, tuple[float, float]]) -> float | None:
        """Per-second rate of a cumulative counter field since the previous poll."""
        if field_id not in fields:
            self._counters.pop(field_id, None)
            return None
        value, at = int(fields[field_id][0]), fields[field_id][1]
        previous = self._counters.get(field_id)
        self._counters[field_id] = (value, at)
        if previous is None or at <= previous[1] or value < previous[0]:
            return None  # first sample, clock went back, or the counter wrapped/reset
        return (value - previous[0]) / (at - previous[1])

    def _read_violations(self, fields: Mapping[int, tuple[float, float]]
                         ) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]:
        """Violation counters: (seconds since driver load, share of the last interval) per reason."""
        totals: list[tuple[str, float]] = []
        ratios: list[tuple[str, float]] = []
        for field_id, reason in FIELD_VIOLATIONS.items():
            if field_id in fields:
                violation_ns, reference_us = int(fields[field_id][0]), fields[field_id][1] * 1e6
            elif reason in self._violation_fallback and (
                    status := self._first(f"violation-{reason}", VIOLATION_STATUS[reason])) is not None:
                violation_ns, reference_us = int(status.violationTime), float(status.referenceTime)
            else:
                self._violations.pop(reason, None)
                continue
            totals.append((reason, violation_ns / 1e9))
            previous = self._violations.get(reason)
            self._violations[reason] = (violation_ns, reference_us)
            if previous is not None and reference_us > previous[1] and violation_ns >= previous[0]:
                share = (violation_ns - previous[0]) / 1e3 / (reference_us - previous[1])
                ratios.append((reason, min(1.0, share)))  # the two clocks are read apart: a hair over 1 is 1
        return tuple(totals), tuple(ratios)

    def _processes(self, trainer: Mapping[int, tuple[str, str]]
                   ) -> tuple[tuple[GpuProcess, ...], int | None, int | None]:
        """Trainer processes on this GPU, and the count and memory (bytes) of the others;
        the last two are None when the driver cannot list processes."""
        running = self._first("processes", PROCESSES)
        if running is None:
            return (), None, None
        found = []
        foreign = foreign_memory = 0
        for process in running:
            used = None if process.usedGpuMemory is None else int(process.usedGpuMemory)
            identity = trainer.get(int(process.pid))
            if identity is not None:
                found.append(GpuProcess(int(process.pid), identity[0], identity[1], used))
            else:
                foreign += 1
                foreign_memory += used or 0
        return tuple(sorted(found, key=lambda p: p.pid)), foreign, foreign_memory


def _reserved(memory: Any) -> int | None:
    """``reserved`` of an ``nvmlMemory_v2_t``; None for the v1 structure, which has none."""
    if memory is None:
        return None
    try:
        return int(memory.reserved)
    except AttributeError:
        return None


def _scaled(entry: tuple[float, float] | None, scale: float) -> float | None:
    return None if entry is None else float(entry[0]) * scale


def _integer(entry: tuple[float, float] | None) -> int | None:
    return None if entry is None else int(entry[0])
