"""Script the fake NVML driver while the code under test runs.

The driver reads ``$FAKE_NVML_CONTROL`` at ``nvmlInit`` and re-reads that file whenever it
changes. ``FakeNvml`` keeps the settings in a dict and rewrites the whole file atomically
(write + rename) on every change, so the driver never sees half a file.

Keys (``<i>`` is a GPU index or ``*`` for every GPU; per-GPU keys override ``gpu.*``):

- ``devices`` (default 8), ``driver_version``, ``nvml_version``
- ``sleep_ms.<nvml function>`` / ``gpu.<i>.sleep_ms.<fn>``: that call sleeps N ms first
- ``fail.<nvml function>`` / ``gpu.<i>.fail.<fn>``: that call returns the NVML error code N
- ``cost_us.<nvml function>`` / ``gpu.<i>.cost_us.<fn>``: that call burns N µs of the calling
  thread's CPU time first (a busy spin), like a real driver's per-call cost (``H200_COSTS_US``:
  an H200's in a VM; ``FakeNvml.cost`` sets them)
- ``gpu.<i>.lost = 1``: every call on that GPU returns ``NVML_ERROR_GPU_IS_LOST``
- ``gpu.<i>.<value>``: a number, ``unsupported`` (``NVML_ERROR_NOT_SUPPORTED``) or
  ``error:<code>``; values are listed in ``VALUES`` with their NVML units
- ``gpu.<i>.processes``: ``{pid: used_bytes}``; ``gpu.<i>.xids``: every XID raised so far
  (append to raise more; only those added after event registration are delivered)
- ``gpu.<i>.gpm_supported``, ``gpu.<i>.gpm_busy`` (GPM calls return ``NVML_ERROR_IN_USE``),
  ``gpu.<i>.events_supported``, ``gpu.<i>.name``, ``gpu.<i>.uuid``, ``gpu.<i>.pci_bus_id``
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

UNSUPPORTED = "unsupported"

VALUES: dict[str, str] = {
    "utilization_gpu": "percent",
    "utilization_memory": "percent",
    "memory_total": "bytes",
    "memory_used": "bytes (excluding reserved)",
    "memory_reserved": "bytes",
    "temperature_gpu": "celsius",
    "temperature_memory": "celsius (field NVML_FI_DEV_MEMORY_TEMP)",
    "clock_sm_mhz": "MHz",
    "clock_mem_mhz": "MHz",
    "clock_reasons": "bit mask of nvmlClocksEventReason*",
    "power_mw": "milliwatts",
    "power_limit_mw": "milliwatts",
    "energy_mj": "millijoules added to the counter, which grows by power_mw per second since boot (a driver's)",
    "pcie_tx_bytes_per_s": "the PCIe TX byte counter grows at this rate",
    "pcie_rx_bytes_per_s": "the PCIe RX byte counter grows at this rate",
    "ecc_sbe_volatile": "count",
    "ecc_dbe_volatile": "count",
    "gpm_sm_util": "percent",
    "gpm_sm_occupancy": "percent",
    "gpm_any_tensor_util": "percent",
    "gpm_dram_bw_util": "percent",
    "gpm_pcie_tx_mib_per_s": "MiB/s",
    "gpm_pcie_rx_mib_per_s": "MiB/s",
    "gpm_nvlink_tx_mib_per_s": "MiB/s",
    "gpm_nvlink_rx_mib_per_s": "MiB/s",
    "gpm_graphics_util": "percent",
    "violation_power": "share of time (0-1); the violation counter grows at this rate",
    "violation_thermal": "share of time (0-1)",
    "violation_sync_boost": "share of time (0-1)",
    "violation_board_limit": "share of time (0-1)",
    "violation_low_utilization": "share of time (0-1)",
    "violation_reliability": "share of time (0-1)",
}
_GPU_KEYS = {"lost", "gpm_supported", "gpm_busy", "events_supported", "name", "uuid", "pci_bus_id", "processes", "xids",
             *VALUES}
_KEY = re.compile(
    r"^(devices|driver_version|nvml_version|(sleep_ms|fail|cost_us)\.nvml\w+"
    r"|gpu\.(\*|\d+)\.((sleep_ms|fail|cost_us)\.nvml\w+|(?P<gpu_key>\w+)))$"
)

_MICRO_US = 12
"""The cheap calls' cost: the H200 measured 3-12 µs for utilization, power, clocks and
temperatures; every call it did not report separately is given the top of that range."""

H200_COSTS_US: dict[str, int] = {
    "nvmlDeviceGetFieldValues": 5000,
    "nvmlDeviceGetTotalEnergyConsumption": 3100,
    "nvmlGpmMetricsGet": 1300,
    "nvmlGpmSampleGet": 4000,
    **dict.fromkeys((
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature", "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlEventSetWait_v2", "nvmlDeviceGetViolationStatus"),
        _MICRO_US),
}
"""Per-call CPU costs (µs) of an NVIDIA H200 in a VM (driver 580.159.04, issue 38's first GPU
run): medians of ``nvmlDeviceGetFieldValues`` (14 fields) 5.0 ms, the energy counter 3.1 ms,
``nvmlGpmMetricsGet`` 1.3 ms. ``nvmlGpmSampleGet`` was not reported alone: 4.0 ms is what a poll
with GPM cost beyond one without (11.2 - 5.9 ms per GPU) less the metrics call."""


def error(code: int) -> str:
    """Value that makes a scripted reading fail with the NVML error ``code``."""
    return f"error:{code}"


def _format(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, Mapping):
        return ",".join(f"{pid}:{used}" for pid, used in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    text = str(value)
    if "\n" in text or "#" in text:
        raise ValueError(f"control values cannot contain newlines or '#': {text!r}")
    return text


class FakeNvml:
    """The control file of one fake driver session."""

    def __init__(self, path: Path, library: Path | None = None, settings: Mapping[str, object] | None = None) -> None:
        self.path = Path(path)
        self.library = library
        self._settings: dict[str, str] = {}
        self.set(settings or {})

    def set(self, settings: Mapping[str, object] | None = None, /, **keywords: object) -> None:
        """Add or change settings (a dict for dotted keys, keywords for plain ones); rewrite the file."""
        merged = {**(settings or {}), **keywords}
        for key, value in merged.items():
            match = _KEY.match(key)
            if match is None or (match.group("gpu_key") and match.group("gpu_key") not in _GPU_KEYS):
                raise KeyError(f"unknown fake NVML control key: {key!r}")
            self._settings[key] = _format(value)
        self._write()

    def gpu(self, index: int | str, **values: object) -> None:
        """Set values of one GPU (or ``"*"``): ``fake.gpu(0, power_mw=250_000)``."""
        self.set({f"gpu.{index}.{key}": value for key, value in values.items()})

    def unset(self, *keys: str) -> None:
        """Remove settings (they go back to the driver's defaults)."""
        for key in keys:
            self._settings.pop(key, None)
        self._write()

    def sleep(self, function: str, ms: int, gpu: int | None = None) -> None:
        """Make every call of ``function`` (on one GPU, or all) sleep ``ms`` first; 0 stops it."""
        key = f"sleep_ms.{function}" if gpu is None else f"gpu.{gpu}.sleep_ms.{function}"
        if ms:
            self.set({key: ms})
        else:
            self.unset(key)

    def cost(self, costs_us: Mapping[str, int], gpu: int | None = None) -> None:
        """Charge each named function that many µs of CPU per call (``H200_COSTS_US``); 0 removes it."""
        prefix = "cost_us." if gpu is None else f"gpu.{gpu}.cost_us."
        self.unset(*(prefix + function for function, us in costs_us.items() if not us))
        self.set({prefix + function: us for function, us in costs_us.items() if us})

    def fail(self, function: str, code: int, gpu: int | None = None) -> None:
        """Make ``function`` return the NVML error ``code``; 0 stops it."""
        key = f"fail.{function}" if gpu is None else f"gpu.{gpu}.fail.{function}"
        if code:
            self.set({key: code})
        else:
            self.unset(key)

    def add_xids(self, gpu: int, codes: Iterable[int]) -> None:
        """Raise more XID events on ``gpu``."""
        key = f"gpu.{gpu}.xids"
        known = [c for c in self._settings.get(key, "").split(",") if c]
        self.set({key: [*known, *codes]})

    def call_count(self, function: str | None = None) -> int:
        """NVML calls the loaded driver has answered so far, of one function or of all.

        A test hook of the fake (not NVML); counts are cumulative for the process.
        """
        if self.library is None:
            raise RuntimeError("FakeNvml was created without the library path")
        counter = ctypes.CDLL(str(self.library)).fakeNvmlCallCount
        counter.restype = ctypes.c_ulonglong
        counter.argtypes = [ctypes.c_char_p]
        return int(counter(function.encode() if function else None))

    def _write(self) -> None:
        text = "".join(f"{key} = {value}\n" for key, value in self._settings.items())
        partial = self.path.with_name(f".{self.path.name}.tmp")
        partial.write_text(text)
        os.replace(partial, self.path)
