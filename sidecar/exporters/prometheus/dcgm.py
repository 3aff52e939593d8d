"""dcgm-exporter compatible families (``--dcgm-compat``), built fresh at every scrape.

The names, units, types and HELP texts are dcgm-exporter's (its ``etc/default-counters.csv``
and ``etc/dcp-metrics-included.csv``), so dashboards and alerts written for it (Grafana 12239)
work unchanged; each HELP adds the NVML or GPM call that feeds the family here. The label set
is dcgm-exporter's (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``
as before its 2026 rename and ``hostname`` after it, ``DCGM_FI_DRIVER_VERSION``), plus ``host``.
The list of families and where each comes from is in ``docs/METRICS.md`` ("DCGM compatibility").

Like the native families, this never calls NVML: it reads the source's latest snapshot. A value
NVML cannot give for a GPU has no sample (never a fake 0); a GPU that is down (lost, or an NVML
call on it hanging) has none either, so Prometheus marks its series stale. dcgm-exporter's
counters have no ``_total`` suffix, which prometheus_client would add to a counter family, so
they are exposed untyped under their exact names (PromQL's ``rate`` works the same).

``dcgm_families`` is the reference (what registries and tests read); the served page uses
``render_dcgm``, the same text byte for byte (a test holds the two together) written straight
from the snapshot, because ``generate_latest`` would double the cost of a scrape at 8 GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from prometheus_client.core import GaugeMetricFamily, Metric, UnknownMetricFamily

from sidecar.exporters.prometheus.exposition import _header, escape, go_float
from sidecar.exporters.prometheus.gpu import answering
from sidecar.model.gpu import VIOLATION_POLICIES, GpuReading, GpuView, NvmlState

MIB = 1024 * 1024
_INF = math.inf

DCGM_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "hostname",
               "DCGM_FI_DRIVER_VERSION", "host"]
"""Labels of every compat series, in this order."""

Value = Callable[[GpuReading], float | None]


class DcgmField(NamedTuple):
    """One dcgm-exporter family: its DCGM name, HELP (dcgm-exporter's text + our source) and value
    (a row of ``DCGM_FIELDS``)."""

    name: str
    help: str
    value: Value
    counter: bool = False
    """A counter in dcgm-exporter (exposed untyped here: see the module docstring)."""


def _scaled(attribute: str, scale: float, whole: bool = False) -> Value:
    def value(reading: GpuReading) -> float | None:
        raw = getattr(reading, attribute)
        if raw is None:
            return None
        scaled = raw * scale
        return float(round(scaled)) if whole else float(scaled)
    return value


def _mib(attribute: str) -> Value:
    def value(reading: GpuReading) -> float | None:
        raw = getattr(reading, attribute)
        return None if raw is None else float(int(raw) // MIB)
    return value


def _violation_ns(reason: str) -> Value:
    def value(reading: GpuReading) -> float | None:
        seconds = dict(reading.violation_seconds_total).get(reason)
        return None if seconds is None else float(round(seconds * 1e9))
    return value


def _violation(name: str, words: str, reason: str) -> DcgmField:
    """A throttling counter of one ``VIOLATION_POLICIES`` reason; ``words``: its HELP's cause as
    dcgm-exporter words it. Raises ``ValueError`` (at import) for a reason NVML's policies lack."""
    if reason not in {known for _, known in VIOLATION_POLICIES}:
        raise ValueError(f"{name}: {reason!r} is not a VIOLATION_POLICIES reason")
    return DcgmField(name, f"Throttling duration due to {words} (in ns). From nvmlDeviceGetFieldValues("
                     f"NVML_FI_DEV_PERF_POLICY_{reason.upper()}), else nvmlDeviceGetViolationStatus.",
                     _violation_ns(reason), counter=True)


DCGM_FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz). From nvmlDeviceGetClockInfo(NVML_CLOCK_SM).",
              _scaled("sm_clock_hertz", 1e-6, whole=True)),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz). From nvmlDeviceGetClockInfo(NVML_CLOCK_MEM).",
              _scaled("memory_clock_hertz", 1e-6, whole=True)),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C). From nvmlDeviceGetFieldValues("
              "NVML_FI_DEV_MEMORY_TEMP).", _scaled("memory_temperature_celsius", 1.0)),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C). From nvmlDeviceGetTemperatureV(NVML_TEMPERATURE_GPU).",
              _scaled("temperature_celsius", 1.0)),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W). From nvmlDeviceGetFieldValues(NVML_FI_DEV_POWER_INSTANT).",
              _scaled("power_watts", 1.0)),
    DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ). From "
              "nvmlDeviceGetFieldValues(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION).",
              _scaled("energy_joules", 1e3, whole=True), counter=True),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %). From nvmlDeviceGetUtilizationRates (gpu).",
              _scaled("utilization_ratio", 100.0, whole=True)),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %). From nvmlDeviceGetUtilizationRates (memory).",
              _scaled("memory_utilization_ratio", 100.0, whole=True)),
    DcgmField("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB). From nvmlDeviceGetMemoryInfo_v2.",
              _mib("memory_free_bytes")),
    DcgmField("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB). From nvmlDeviceGetMemoryInfo_v2.",
              _mib("memory_used_bytes")),
    DcgmField("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB). From nvmlDeviceGetMemoryInfo_v2.",
              _mib("memory_reserved_bytes")),
    DcgmField("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors. From "
              "nvmlDeviceGetFieldValues(NVML_FI_DEV_ECC_SBE_VOL_TOTAL).", _scaled("ecc_corrected_total", 1.0),
              counter=True),
    DcgmField("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors. From "
              "nvmlDeviceGetFieldValues(NVML_FI_DEV_ECC_DBE_VOL_TOTAL).", _scaled("ecc_uncorrected_total", 1.0),
              counter=True),
    _violation("DCGM_FI_DEV_POWER_VIOLATION", "power constraints", "power"),
    _violation("DCGM_FI_DEV_THERMAL_VIOLATION", "thermal constraints", "thermal"),
    _violation("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "sync-boost constraints", "sync_boost"),
    _violation("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "board limit constraints", "board_limit"),
    _violation("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "low utilization", "low_utilization"),
    _violation("DCGM_FI_DEV_RELIABILITY_VIOLATION", "reliability constraints", "reliability"),
    DcgmField("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active. From GPM "
              "NVML_GPM_METRIC_GRAPHICS_UTIL.", _scaled("graphics_activity_ratio", 1.0)),
    DcgmField("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned. From GPM "
              "NVML_GPM_METRIC_SM_UTIL.", _scaled("sm_activity_ratio", 1.0)),
    DcgmField("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM. From GPM "
              "NVML_GPM_METRIC_SM_OCCUPANCY.", _scaled("sm_occupancy_ratio", 1.0)),
    DcgmField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active. From GPM "
              "NVML_GPM_METRIC_ANY_TENSOR_UTIL (any tensor precision).", _scaled("tensor_activity_ratio", 1.0)),
    DcgmField("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or "
              "receiving data. From GPM NVML_GPM_METRIC_DRAM_BW_UTIL.", _scaled("dram_bandwidth_ratio", 1.0)),
    DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus - including both "
              "protocol headers and data payloads - in bytes per second. From the NVML_FI_DEV_PCIE_COUNT_TX_BYTES "
              "counter, else GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC.", _scaled("pcie_tx_bytes_per_second", 1.0)),
    DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus - including both "
              "protocol headers and data payloads - in bytes per second. From the NVML_FI_DEV_PCIE_COUNT_RX_BYTES "
              "counter, else GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC.", _scaled("pcie_rx_bytes_per_second", 1.0)),
    DcgmField("DCGM_FI_PROF_NVLINK_TX_BYTES", "The rate of data transmitted over NVLink, not including protocol "
              "headers, in bytes per second. From GPM NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC.",
              _scaled("nvlink_tx_bytes_per_second", 1.0)),
    DcgmField("DCGM_FI_PROF_NVLINK_RX_BYTES", "The rate of data received over NVLink, not including protocol "
              "headers, in bytes per second. From GPM NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC.",
              _scaled("nvlink_rx_bytes_per_second", 1.0)),
)

_XID_HELP = ("Value of the last XID error encountered (0: none since the sidecar started). From NVML events "
             "(nvmlEventTypeXidCriticalError); see dflash_gpu_xid_events_total for counts per code.")


class DcgmSource:
    """The compat families of one scrape: called, the reference families; ``text()``, the same
    as exposition text (what the served page uses)."""

    def __init__(self, view: Callable[[], GpuView], host: str) -> None:
        self._view = view
        self._host = host

    def __call__(self) -> list[Metric]:
        return dcgm_families(self._view(), self._host)

    def text(self) -> str:
        return render_dcgm(self._view(), self._host)


def dcgm_labels(reading: GpuReading, host: str, driver_version: str) -> list[str]:
    """The DCGM label values of one GPU, in ``DCGM_LABELS`` order."""
    return [str(reading.index), reading.uuid, reading.pci_bus_id, f"nvidia{reading.index}", reading.name,
            host, host, driver_version, host]


def dcgm_families(view: GpuView, host: str) -> list[Metric]:
    """Every compat family with at least one sample; empty without NVML data."""
    snapshot, status = view.snapshot, view.status
    if snapshot is None or status.state is NvmlState.DISABLED:
        return []
    up = answering(snapshot.gpus, status)
    labelled = [(reading, dcgm_labels(reading, host, snapshot.driver_version)) for reading in up]
    families: list[Metric] = []
    for field in DCGM_FIELDS:
        family: GaugeMetricFamily | UnknownMetricFamily = (
            UnknownMetricFamily(field.name, field.help, labels=DCGM_LABELS) if field.counter
            else GaugeMetricFamily(field.name, field.help, labels=DCGM_LABELS))
        for reading, labels in labelled:
            value = field.value(reading)
            if value is not None:
                family.add_metric(labels, value)
        if family.samples:
            families.append(family)
    xid = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", _XID_HELP, labels=[*DCGM_LABELS, "err_code"])
    for reading in snapshot.gpus:
        if reading.xid_errors_total is not None:
            code = reading.last_xid or 0
            xid.add_metric([*dcgm_labels(reading, host, snapshot.driver_version), str(code)], float(code))
    if xid.samples:
        families.append(xid)
    return families


def _label_text(names: list[str], values: list[str]) -> str:
    """``{a="1",b="2"}`` with the labels sorted by name, as ``generate_latest`` writes them."""
    pairs = sorted(zip(names, values))
    return "{" + ",".join(f'{name}="{escape(value)}"' for name, value in pairs) + "}"


_LABEL_CACHE: dict[tuple[int, str, str, str, str, str, str | None], str] = {}
_LABEL_CACHE_MAX = 1024


def _labels_of(reading: GpuReading, host: str, driver: str, err_code: str | None = None) -> str:
    """The sorted DCGM label text of a GPU (with ``err_code`` if given), built once: the identity
    of a GPU rarely changes."""
    key = (reading.index, reading.uuid, reading.pci_bus_id, reading.name, host, driver, err_code)
    text = _LABEL_CACHE.get(key)
    if text is None:
        if len(_LABEL_CACHE) >= _LABEL_CACHE_MAX:
            _LABEL_CACHE.clear()
        values = dcgm_labels(reading, host, driver)
        text = _LABEL_CACHE[key] = (_label_text(DCGM_LABELS, values) if err_code is None
                                    else _label_text([*DCGM_LABELS, "err_code"], [*values, err_code]))
    return text


def render_dcgm(view: GpuView, host: str) -> str:
    """``dcgm_families`` as exposition text (format 0.0.4), without prometheus_client."""
    snapshot, status = view.snapshot, view.status
    if snapshot is None or status.state is NvmlState.DISABLED:
        return ""
    driver = snapshot.driver_version
    up = [(reading, _labels_of(reading, host, driver)) for reading in answering(snapshot.gpus, status)]
    out: list[str] = []
    for name, header, value_of in _RENDER:
        lines = [f"{name}{labels} {repr(value) if -_INF < value < 1e6 else go_float(value)}\n"  # go_float inlined
                 for reading, labels in up if (value := value_of(reading)) is not None]
        if lines:
            out.append(header)
            out.extend(lines)
    xid = [f"DCGM_FI_DEV_XID_ERRORS{_labels_of(r, host, driver, str(r.last_xid or 0))} {go_float(r.last_xid or 0)}\n"
           for r in snapshot.gpus if r.xid_errors_total is not None]
    if xid:
        out.append(_header("DCGM_FI_DEV_XID_ERRORS", "gauge", _XID_HELP))
        out.extend(xid)
    return "".join(out)


_RENDER = tuple((f.name, _header(f.name, "untyped" if f.counter else "gauge", f.help), f.value) for f in DCGM_FIELDS)
"""Per field: name, its HELP and TYPE lines, its value (built once)."""
