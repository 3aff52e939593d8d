"""Prometheus families and W&B rows from GPU snapshots; promtool-clean exposition."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.exposition import generate_latest

from sidecar.aggregation.gpu_groups import GpuGroups, gpu_view
from sidecar.exporters.prometheus.gpu import gpu_metric_families
from sidecar.exporters.wandb.gpu_rows import gpu_wandb_row
from sidecar.model.gpu import GpuProcess, GpuReading, GpuSnapshot, NvmlState, NvmlStatus, ProfilingState
from sidecar.sources.nvml import NvmlSource
from tests.fake_nvml import FakeNvml
from tests.fake_nvml.helpers import promtool_check, registry_of, wait_until

pytest_plugins = ["tests.fake_nvml.fixtures"]

GIB = 1024**3
ALLOWED_LABELS = {"host", "gpu", "group", "role", "worker", "reason", "type", "pid", "call", "values"}


def _full_gpu(index: int) -> GpuReading:
    return GpuReading(
        index, f"GPU-{index}", "fake", utilization_ratio=0.5, memory_utilization_ratio=0.25,
        memory_used_bytes=10 * GIB, memory_free_bytes=70 * GIB, memory_total_bytes=80 * GIB, power_watts=300.0,
        power_limit_watts=700.0, energy_joules=1e6, temperature_celsius=60.0, memory_temperature_celsius=70.0,
        sm_clock_hertz=1.98e9, memory_clock_hertz=2.6e9, clock_event_mask=0x4, pcie_rx_bytes_per_second=2e9,
        pcie_tx_bytes_per_second=1e9, ecc_corrected_total=3, ecc_uncorrected_total=0, xid_errors_total=1,
        last_xid=79, processes=(GpuProcess(4242, "target", "0", 5 * GIB),), profiling=ProfilingState.ACTIVE,
        sm_activity_ratio=0.6, sm_occupancy_ratio=0.2, tensor_activity_ratio=0.4, dram_bandwidth_ratio=0.3,
        nvlink_rx_bytes_per_second=1e9, nvlink_tx_bytes_per_second=2e9,
    )


SNAPSHOT = GpuSnapshot(
    taken_monotonic_s=100.0, poll_duration_s=0.002, nvml_calls=19, driver_version="570",
    gpus=(
        _full_gpu(0),
        GpuReading(1, "GPU-1", "fake", utilization_ratio=0.25, power_watts=None, profiling=ProfilingState.BUSY),
        GpuReading(2, "GPU-2", "fake", up=False, xid_errors_total=2, last_xid=79),
    ),
)
STATUS = NvmlStatus(NvmlState.AVAILABLE, polls_total=42, errors=(("gpu_is_lost", 1), ("stalled_call", 2)))
GROUPS = GpuGroups.parse(["target=0,1", "drafter=2"])


def test_families_values_labels_and_absence() -> None:
    registry = registry_of(lambda: gpu_metric_families(gpu_view(SNAPSHOT, STATUS, GROUPS), "node1", 103.5))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"host": "node1", **labels})

    assert value("dflash_nvml_up") == 1.0 and value("dflash_nvml_stalled") == 0.0
    assert value("dflash_nvml_data_age_seconds") == pytest.approx(3.5)
    assert value("dflash_nvml_poll_duration_seconds") == pytest.approx(0.002)
    assert value("dflash_nvml_poll_calls") == 19.0
    assert value("dflash_nvml_polls_total") == 42.0
    assert value("dflash_nvml_errors_total", reason="stalled_call") == 2.0
    assert [value("dflash_gpu_up", gpu=g) for g in "012"] == [1.0, 1.0, 0.0]
    assert value("dflash_gpu_utilization_ratio", gpu="0") == 0.5
    assert value("dflash_gpu_memory_free_bytes", gpu="0") == 70 * GIB
    assert value("dflash_gpu_energy_joules_total", gpu="0") == 1e6
    assert value("dflash_gpu_sm_clock_hertz", gpu="0") == 1.98e9
    assert value("dflash_gpu_clock_event_active", gpu="0", reason="sw_power_cap") == 1.0
    assert value("dflash_gpu_clock_event_active", gpu="0", reason="hw_slowdown") == 0.0
    assert value("dflash_gpu_ecc_errors_total", gpu="0", type="corrected") == 3.0
    assert value("dflash_gpu_ecc_errors_total", gpu="0", type="uncorrected") == 0.0
    assert value("dflash_gpu_xid_errors_total", gpu="0") == 1.0 and value("dflash_gpu_last_xid", gpu="0") == 79
    assert value("dflash_gpu_process_memory_bytes", gpu="0", pid="4242", role="target", worker="0") == 5 * GIB
    assert value("dflash_gpu_tensor_activity_ratio", gpu="0") == 0.4
    assert value("dflash_gpu_profiling_available", gpu="0") == 1.0
    assert value("dflash_gpu_profiling_busy", gpu="1") == 1.0
    # not reported -> no sample at all, never a fake zero
    assert value("dflash_gpu_power_watts", gpu="1") is None
    assert value("dflash_gpu_clock_event_active", gpu="1", reason="sw_power_cap") is None
    # a lost GPU keeps only up=0 and its XID history
    assert value("dflash_gpu_utilization_ratio", gpu="2") is None
    assert value("dflash_gpu_profiling_available", gpu="2") is None
    assert value("dflash_gpu_xid_errors_total", gpu="2") == 2.0
    assert value("dflash_group_gpu_utilization_ratio", group="target") == pytest.approx(0.375)
    assert value("dflash_group_power_watts", group="target") == 300.0
    assert value("dflash_group_temperature_max_celsius", group="target") == 60.0
    assert value("dflash_group_memory_free_min_bytes", group="target") == 70 * GIB
    assert value("dflash_group_gpus_up", group="drafter") == 0.0
    assert value("dflash_group_power_watts", group="drafter") is None
    assert value("dflash_gpu_group_info", gpu="2", group="drafter") == 1.0


def test_every_family_has_help_base_units_and_allowed_labels() -> None:
    families = gpu_metric_families(gpu_view(SNAPSHOT, STATUS, GROUPS), "node1", 103.5)
    names = [f.name for f in families]
    assert len(names) == len(set(names))
    for family in families:
        assert family.name.startswith("dflash_") and family.documentation
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, (family.name, sample.labels)
            assert sample.labels["host"] == "node1"


def test_exposition_passes_promtool() -> None:
    stalled = NvmlStatus(NvmlState.STALLED, polls_total=1, errors=(("stalled_call", 1),))
    for snapshot, status in ((SNAPSHOT, STATUS), (SNAPSHOT, stalled), (None, NvmlStatus(NvmlState.UNAVAILABLE))):
        promtool_check(generate_latest(registry_of(
            lambda view=gpu_view(snapshot, status, GROUPS): gpu_metric_families(view, "h", 101.0))))


def test_disabled_and_unavailable_sources() -> None:
    assert gpu_metric_families(gpu_view(None, NvmlStatus(NvmlState.DISABLED), GROUPS), "h", 0.0) == []
    assert gpu_wandb_row(gpu_view(None, NvmlStatus(NvmlState.DISABLED), GROUPS), 0.0) == {}
    unavailable = gpu_view(None, NvmlStatus(NvmlState.UNAVAILABLE, reason="no library"), GROUPS)
    families = gpu_metric_families(unavailable, "h", 0.0)
    assert {f.name for f in families} == {"dflash_nvml_up", "dflash_nvml_stalled", "dflash_nvml_polls"}
    assert gpu_wandb_row(gpu_view(None, NvmlStatus(NvmlState.UNAVAILABLE), GROUPS), 0.0) == {"nvml/up": 0.0}


def test_wandb_row_matches_the_families() -> None:
    row = gpu_wandb_row(gpu_view(SNAPSHOT, STATUS, GROUPS), 103.5)
    assert row["nvml/up"] == 1.0 and row["nvml/data_age_seconds"] == pytest.approx(3.5)
    assert row["gpu/0/utilization"] == 0.5 and row["gpu/0/power_watts"] == 300.0
    assert row["gpu/0/energy_joules"] == 1e6 and row["gpu/0/sm_clock_hertz"] == 1.98e9
    assert row["gpu/0/clock_event/sw_power_cap"] == 1.0 and row["gpu/0/clock_event/gpu_idle"] == 0.0
    assert row["gpu/0/ecc_corrected_errors"] == 3.0 and row["gpu/0/xid_errors"] == 1.0
    assert row["gpu/0/process/target/0/memory_bytes"] == 5 * GIB
    assert row["gpu/0/tensor_activity"] == 0.4 and row["gpu/1/profiling_busy"] == 1.0
    assert "gpu/1/power_watts" not in row and "gpu/1/clock_event/gpu_idle" not in row
    assert row["gpu/2/up"] == 0.0 and "gpu/2/utilization" not in row and row["gpu/2/xid_errors"] == 2.0
    assert row["group/target/utilization"] == pytest.approx(0.375)
    assert row["group/target/power_watts"] == 300.0 and "group/drafter/power_watts" not in row
    assert all(isinstance(v, float) and v == v for v in row.values())  # no NaN


def test_live_source_scrape_is_promtool_clean_and_serves_the_last_values_while_stalled(
        fake_nvml: FakeNvml, nvml_source: Callable[..., NvmlSource]) -> None:
    fake_nvml.set(devices=8)
    fake_nvml.gpu(3, lost=1)
    fake_nvml.gpu(0, processes={777: GIB}, xids=[], temperature_memory="unsupported")
    source: NvmlSource = nvml_source(stall_after_s=0.3)
    source.set_trainer_processes({777: ("target", "0")})
    wait_until(lambda: (s := source.latest()) and s.gpus[0].processes and s.gpus[0].sm_activity_ratio is not None,
               what="processes and GPM")
    groups = GpuGroups.parse(["target=0-5", "drafter=6,7"])
    clock = {"now": 0.0}
    registry = registry_of(lambda: gpu_metric_families(gpu_view(source.latest(), source.status(), groups), "node",
                                                     clock["now"]))
    clock["now"] = source.latest().taken_monotonic_s  # type: ignore[union-attr]
    exposition = generate_latest(registry)
    promtool_check(exposition)
    assert registry.get_sample_value("dflash_gpu_up", {"host": "node", "gpu": "3"}) == 0.0
    assert registry.get_sample_value("dflash_gpu_memory_temperature_celsius", {"host": "node", "gpu": "0"}) is None
    assert registry.get_sample_value("dflash_gpu_memory_temperature_celsius", {"host": "node", "gpu": "1"}) == 50.0
    assert registry.get_sample_value("dflash_group_power_watts", {"host": "node", "group": "target"}) == 1500.0

    fake_nvml.sleep("nvmlDeviceGetFieldValues", 2000, gpu=5)
    wait_until(lambda: source.status().state is NvmlState.STALLED, what="STALLED")
    fake_nvml.sleep("nvmlDeviceGetFieldValues", 0, gpu=5)
    import time

    clock["now"] = time.monotonic()
    started = time.monotonic()
    generate_latest(registry)
    assert time.monotonic() - started < 0.5
    assert registry.get_sample_value("dflash_nvml_stalled", {"host": "node"}) == 1.0
    assert registry.get_sample_value("dflash_nvml_up", {"host": "node"}) == 0.0
    assert registry.get_sample_value("dflash_nvml_data_age_seconds", {"host": "node"}) > 0.3  # type: ignore[operator]
    assert registry.get_sample_value("dflash_gpu_power_watts", {"host": "node", "gpu": "1"}) == 300.0
    wait_until(lambda: source.status().state is NvmlState.AVAILABLE, what="recovery")
