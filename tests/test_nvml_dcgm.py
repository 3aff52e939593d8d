"""DCGM-compatible families and what DCGM does not give: XID counts per code, throttle seconds,
per-process attribution, ``up`` that drops on a hang. The real NVML source through the real
pynvml, on the fake NVML driver with scripted events (in process)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
from prometheus_client.core import CollectorRegistry, Metric
from prometheus_client.exposition import generate_latest

from sidecar.aggregation.gpu_groups import GpuGroups, gpu_view
from sidecar.exporters.prometheus.dcgm import DCGM_FIELDS, DCGM_LABELS, dcgm_families
from sidecar.exporters.prometheus.gpu import gpu_metric_families
from sidecar.model.gpu import GpuReading, GpuSnapshot, NvmlState, NvmlStatus
from sidecar.sources.nvml import NvmlSource
from tests.fake_nvml import UNSUPPORTED, FakeNvml
from tests.fake_nvml.helpers import wait_until

pytest_plugins = ["tests.fake_nvml.fixtures"]

GIB = 1024**3
MIB = 1024**2
NO_GROUPS = GpuGroups.parse([])


class _Collector:
    def __init__(self, build: Callable[[], list[Metric]]) -> None:
        self._build = build

    def collect(self) -> Iterator[Metric]:
        yield from self._build()


def _registry(source: NvmlSource, dcgm: bool = True) -> CollectorRegistry:
    def build() -> list[Metric]:
        view = gpu_view(source.latest(), source.status(), NO_GROUPS)
        return gpu_metric_families(view, "node", 0.0) + (dcgm_families(view, "node") if dcgm else [])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(build))  # type: ignore[arg-type]
    return registry


def _dcgm(registry: CollectorRegistry, name: str, gpu: str) -> float | None:
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels.get("gpu") == gpu:
                return sample.value
    return None


def _fresh(source: NvmlSource, polls: int = 2) -> GpuSnapshot:
    target = source.status().polls_total + polls
    wait_until(lambda: source.status().polls_total >= target, what=f"{polls} more polls")
    snapshot = source.latest()
    assert snapshot is not None
    return snapshot


def test_dcgm_names_units_and_labels_from_the_fake_driver(fake_nvml: FakeNvml,
                                                         nvml_source: Callable[..., NvmlSource]) -> None:
    fake_nvml.gpu(0, utilization_gpu=73, utilization_memory=41, memory_total=80 * GIB, memory_used=20 * GIB,
                  memory_reserved=GIB // 2, power_mw=412_345, temperature_gpu=67, temperature_memory=81,
                  clock_sm_mhz=1755, clock_mem_mhz=2619, energy_mj=2_000_000, gpm_sm_util=61,
                  gpm_sm_occupancy=22.5, gpm_any_tensor_util=48, gpm_dram_bw_util=35, gpm_graphics_util=77,
                  pci_bus_id="00000000:1B:00.0")
    fake_nvml.gpu(1, temperature_memory=UNSUPPORTED, gpm_supported=0)
    source = nvml_source()
    wait_until(lambda: (s := source.latest()) and s.gpus[0].sm_activity_ratio is not None, what="GPM values")
    registry = _registry(source)
    expected = {"DCGM_FI_DEV_GPU_UTIL": 73, "DCGM_FI_DEV_MEM_COPY_UTIL": 41, "DCGM_FI_DEV_FB_USED": 20 * 1024,
                "DCGM_FI_DEV_FB_RESERVED": 512, "DCGM_FI_DEV_FB_FREE": 80 * 1024 - 20 * 1024 - 512,
                "DCGM_FI_DEV_POWER_USAGE": 412.345, "DCGM_FI_DEV_GPU_TEMP": 67, "DCGM_FI_DEV_MEMORY_TEMP": 81,
                "DCGM_FI_DEV_SM_CLOCK": 1755, "DCGM_FI_DEV_MEM_CLOCK": 2619, "DCGM_FI_PROF_SM_ACTIVE": 0.61,
                "DCGM_FI_PROF_SM_OCCUPANCY": 0.225, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.48,
                "DCGM_FI_PROF_DRAM_ACTIVE": 0.35, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.77}
    for name, value in expected.items():
        assert _dcgm(registry, name, "0") == pytest.approx(value), name
    energy = _dcgm(registry, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0")
    assert energy is not None and energy >= 2_000_000 and energy == int(energy)  # mJ, as DCGM gives it
    assert _dcgm(registry, "DCGM_FI_DEV_XID_ERRORS", "0") == 0.0  # events registered, none seen
    # what NVML cannot supply for a GPU is absent, never zero
    assert _dcgm(registry, "DCGM_FI_DEV_MEMORY_TEMP", "1") is None
    assert _dcgm(registry, "DCGM_FI_PROF_SM_ACTIVE", "1") is None
    assert _dcgm(registry, "DCGM_FI_DEV_GPU_TEMP", "1") is not None
    labels = next(s.labels for f in registry.collect() for s in f.samples
                  if s.name == "DCGM_FI_DEV_GPU_TEMP" and s.labels["gpu"] == "0")
    assert list(labels) == DCGM_LABELS
    assert labels == {"gpu": "0", "UUID": source.latest().gpus[0].uuid,  # type: ignore[union-attr]
                      "pci_bus_id": "00000000:1B:00.0", "device": "nvidia0",
                      "modelName": "NVIDIA H100 80GB HBM3 (fake)", "Hostname": "node", "hostname": "node",
                      "DCGM_FI_DRIVER_VERSION": "570.00.fake", "host": "node"}
    assert not dcgm_families(gpu_view(None, NvmlStatus(NvmlState.DISABLED), NO_GROUPS), "node")


def test_every_dcgm_family_says_what_feeds_it_and_promtool_finds_only_dcgms_own_names() -> None:
    for field in DCGM_FIELDS:
        assert field.name.startswith("DCGM_FI_") and ("From nvml" in field.help or "From GPM" in field.help
                                                      or "From the NVML" in field.help), field.name
    reading = GpuReading(0, "GPU-0", "fake", pci_bus_id="00000000:18:00.0", utilization_ratio=0.5,
                         energy_joules=12.5, temperature_celsius=40.0, xid_errors_total=1, last_xid=79,
                         violation_seconds_total=(("power", 1.5),))
    view = gpu_view(GpuSnapshot(1.0, 0.001, 10, (reading,), "570"), NvmlStatus(NvmlState.AVAILABLE), NO_GROUPS)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(lambda: dcgm_families(view, "h")))  # type: ignore[arg-type]
    text = generate_latest(registry)
    assert b'DCGM_FI_DEV_POWER_VIOLATION{' in text and b"1.5e+09" in text  # ns, exact name, no _total
    xid = [line for line in text.splitlines() if line.startswith(b"DCGM_FI_DEV_XID_ERRORS{")]
    assert len(xid) == 1 and b'err_code="79"' in xid[0] and xid[0].endswith(b"} 79.0")
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, check=False)
    findings = (result.stdout + result.stderr).decode().splitlines()
    assert findings, "promtool should flag dcgm-exporter's camelCase labels (modelName)"
    for line in findings:  # dcgm-exporter's own label names, nothing of ours
        assert line.startswith("DCGM_FI_") and line.endswith("label names should be written in 'snake_case' "
                                                              "not 'camelCase'"), line


def test_xid_events_are_counted_per_code(fake_nvml: FakeNvml, nvml_source: Callable[..., NvmlSource]) -> None:
    fake_nvml.gpu(0, xids=[])
    source = nvml_source()
    _fresh(source)
    fake_nvml.add_xids(0, [79, 13, 79])
    snapshot = wait_until(lambda: (s := source.latest()) and s.gpus[0].xid_errors_total == 3 and s, what="3 XIDs")
    assert snapshot.gpus[0].xid_counts == ((13, 1), (79, 2))
    registry = _registry(source)
    assert registry.get_sample_value("dflash_gpu_xid_events_total", {"host": "node", "gpu": "0", "xid": "79"}) == 2
    assert registry.get_sample_value("dflash_gpu_xid_events_total", {"host": "node", "gpu": "0", "xid": "13"}) == 1
    assert registry.get_sample_value("dflash_gpu_xid_events_total", {"host": "node", "gpu": "1", "xid": "79"}) is None
    assert _dcgm(registry, "DCGM_FI_DEV_XID_ERRORS", "0") == 79.0  # DCGM's gauge: the last code
    fake_nvml.add_xids(0, [79])
    wait_until(lambda: registry.get_sample_value(
        "dflash_gpu_xid_events_total", {"host": "node", "gpu": "0", "xid": "79"}) == 3, what="a 4th XID")


def test_throttle_seconds_and_share_per_reason(fake_nvml: FakeNvml, nvml_source: Callable[..., NvmlSource]) -> None:
    fake_nvml.gpu(0, violation_power=0.25, violation_thermal=0.5, violation_reliability=UNSUPPORTED)
    source = nvml_source(interval_s=0.1)
    snapshot = wait_until(lambda: (s := source.latest()) and dict(s.gpus[0].violation_ratio).get("power") and s,
                          what="violation shares")
    gpu = snapshot.gpus[0]
    shares = dict(gpu.violation_ratio)
    assert shares["power"] == pytest.approx(0.25, abs=0.02)
    assert shares["thermal"] == pytest.approx(0.5, abs=0.02)
    assert shares["sync_boost"] == 0.0
    assert "reliability" not in shares and "reliability" not in dict(gpu.violation_seconds_total)
    before = dict(gpu.violation_seconds_total)["power"]
    later = dict(_fresh(source, 3).gpus[0].violation_seconds_total)["power"]
    assert later > before > 0
    registry = _registry(source)
    labels = {"host": "node", "gpu": "0", "reason": "thermal"}
    assert registry.get_sample_value("dflash_gpu_throttle_seconds_total", labels) > 0  # type: ignore[operator]
    assert registry.get_sample_value("dflash_gpu_throttle_ratio", labels) == pytest.approx(0.5, abs=0.02)
    assert _dcgm(registry, "DCGM_FI_DEV_THERMAL_VIOLATION", "0") > 0  # type: ignore[operator]
    assert _dcgm(registry, "DCGM_FI_DEV_RELIABILITY_VIOLATION", "0") is None


def test_process_memory_by_role_and_foreign_processes(fake_nvml: FakeNvml,
                                                      nvml_source: Callable[..., NvmlSource]) -> None:
    fake_nvml.gpu(0, processes={777: 3 * GIB, 4040: GIB, 4041: 2 * GIB})
    fake_nvml.gpu(1, processes={888: 5 * GIB})
    source = nvml_source()
    source.set_trainer_processes({777: ("target", "0"), 888: ("drafter", "1")})
    snapshot = wait_until(lambda: (s := source.latest()) and s.gpus[1].processes and s, what="processes")
    first, second = snapshot.gpus
    assert [(p.pid, p.role, p.worker, p.memory_bytes) for p in first.processes] == [(777, "target", "0", 3 * GIB)]
    assert (first.foreign_processes, first.foreign_memory_bytes) == (2, 3 * GIB)
    assert (second.foreign_processes, second.foreign_memory_bytes) == (0, 0)
    registry = _registry(source, dcgm=False)
    assert registry.get_sample_value("dflash_gpu_foreign_processes", {"host": "node", "gpu": "0"}) == 2
    assert registry.get_sample_value("dflash_gpu_process_memory_bytes", {
        "host": "node", "gpu": "1", "pid": "888", "role": "drafter", "worker": "1"}) == 5 * GIB
    source.set_trainer_processes({})  # no trainer known: processes are not listed, foreign is unknown
    wait_until(lambda: (s := source.latest()) and s.gpus[0].foreign_processes is None, what="no listing")
    assert registry.get_sample_value("dflash_gpu_foreign_processes", {"host": "node", "gpu": "0"}) is None


def test_a_hanging_call_or_a_lost_gpu_drops_up_and_its_series(fake_nvml: FakeNvml,
                                                              nvml_source: Callable[..., NvmlSource]) -> None:
    source = nvml_source(interval_s=0.1)
    registry = _registry(source)
    _fresh(source)
    node1 = {"host": "node", "gpu": "1"}
    assert registry.get_sample_value("dflash_gpu_up", node1) == 1.0
    fake_nvml.sleep("nvmlDeviceGetFieldValues", 3000, gpu=1)
    wait_until(lambda: source.status().hung_gpus == (1,), what="GPU 1 reported hung")
    assert registry.get_sample_value("dflash_gpu_up", node1) == 0.0
    assert registry.get_sample_value("dflash_gpu_power_watts", node1) is None  # stale, not frozen
    assert _dcgm(registry, "DCGM_FI_DEV_POWER_USAGE", "1") is None
    assert registry.get_sample_value("dflash_gpu_up", {"host": "node", "gpu": "0"}) == 1.0
    assert registry.get_sample_value("dflash_gpu_power_watts", {"host": "node", "gpu": "0"}) == 300.0
    fake_nvml.sleep("nvmlDeviceGetFieldValues", 0, gpu=1)
    wait_until(lambda: registry.get_sample_value("dflash_gpu_up", node1) == 1.0, what="GPU 1 back")
    assert registry.get_sample_value("dflash_gpu_power_watts", node1) == 300.0
    fake_nvml.gpu(1, lost=1)
    wait_until(lambda: registry.get_sample_value("dflash_gpu_up", node1) == 0.0, what="GPU 1 lost")
    assert _dcgm(registry, "DCGM_FI_DEV_GPU_TEMP", "1") is None
    assert registry.get_sample_value("dflash_gpu_temperature_celsius", node1) is None


def test_hung_threshold_is_one_poll_interval(fake_nvml: FakeNvml, nvml_source: Callable[..., NvmlSource]) -> None:
    now = {"t": 1000.0}
    source = nvml_source(interval_s=5.0, clock=lambda: now["t"])
    wait_until(lambda: source.latest() is not None, what="a poll")
    source._driver.in_flight = ("nvmlDeviceGetFieldValues", 1000.0, 1)  # as the poller sets it
    now["t"] = 1004.9
    assert source.status().hung_gpus == ()
    now["t"] = 1005.1  # past one interval: "up" drops before the GPU misses a second poll
    assert source.status().hung_gpus == (1,)
    source._driver.in_flight = ("nvmlEventSetWait_v2", 1000.0, None)
    assert source.status().hung_gpus == ()  # a system call hangs: no GPU to blame (status says STALLED)
    source._driver.in_flight = None


def test_served_page_with_compat_equals_generate_latest_byte_for_byte() -> None:
    import dataclasses
    import math
    import random

    from prometheus_client.utils import floatToGoString

    from sidecar.core.scrape_state import ScrapeState
    from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector
    from sidecar.exporters.prometheus.exposition import go_float
    from sidecar.exporters.prometheus.page import MetricsPage
    from sidecar.model.gpu import VIOLATION_POLICIES, ProfilingState

    rng = random.Random(24)
    full = GpuReading(
        0, "GPU-0", 'na"me\\x', pci_bus_id="00000000:18:00.0", utilization_ratio=0.57, memory_utilization_ratio=0.3,
        memory_used_bytes=10 * GIB + 123, memory_free_bytes=70 * GIB, memory_reserved_bytes=GIB // 2,
        power_watts=312.25, energy_joules=123456.789, temperature_celsius=61.0, memory_temperature_celsius=70.0,
        sm_clock_hertz=1.98e9, memory_clock_hertz=2.619e9, pcie_rx_bytes_per_second=2.2e9,
        pcie_tx_bytes_per_second=rng.uniform(1e6, 1e10), ecc_corrected_total=3, ecc_uncorrected_total=0,
        xid_errors_total=2, last_xid=79, profiling=ProfilingState.ACTIVE, graphics_activity_ratio=0.7,
        sm_activity_ratio=0.61, sm_occupancy_ratio=0.225, tensor_activity_ratio=0.48, dram_bandwidth_ratio=0.35,
        nvlink_rx_bytes_per_second=1.5e9, nvlink_tx_bytes_per_second=rng.uniform(1e6, 1e12),
        violation_seconds_total=tuple((reason, rng.uniform(0, 1e7)) for _, reason in VIOLATION_POLICIES))
    gpus = (full, dataclasses.replace(full, index=1, uuid="GPU-1", power_watts=None, xid_errors_total=None),
            GpuReading(2, "GPU-2", "lost", up=False, xid_errors_total=1, last_xid=48),
            dataclasses.replace(full, index=3))
    view = gpu_view(GpuSnapshot(1.0, 0.001, 10, gpus, "570.1"),
                    NvmlStatus(NvmlState.AVAILABLE, hung_gpus=(3,)), NO_GROUPS)
    scraped = ScrapeState(gpus=SimpleNamespace(view=lambda: view))
    state = ExportState(host='h"o\\st', started_unix_s=1.5e9, scrape_state=scraped, dcgm_compat=True)
    collector = SidecarCollector(state)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    def timeless(text: bytes) -> bytes:  # the data age moves between two renders
        return b"\n".join(line for line in text.split(b"\n") if not line.startswith(b"dflash_nvml_data_age_seconds{"))

    page = MetricsPage(collector).render()
    assert timeless(page) == timeless(generate_latest(registry))
    values = page.split(b"# HELP DCGM_FI_DEV_SM_CLOCK", 1)[1].split(b"# HELP DCGM_FI_DEV_XID_ERRORS", 1)[0]
    assert b'DCGM_FI_DEV_POWER_USAGE{' in values and b'gpu="3"' not in values  # hung: no values (XID stays)
    for value in [1e6, 2.5e9, 1e15, 1.23e15, 1e16, 1e22, math.inf, math.nan, -3e9] + [
            10 ** rng.uniform(6, 300) for _ in range(2000)]:
        assert go_float(value) == floatToGoString(value), value
