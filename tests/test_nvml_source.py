"""The real NVML source, through the real pynvml, against the fake NVML driver (in process)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from sidecar.aggregation.gpu_groups import GpuGroups, aggregate_groups
from sidecar.model.gpu import GpuProcess, GpuSnapshot, NvmlState, ProfilingState
from sidecar.sources.nvml import NvmlSource, probe_nvml
from tests.fake_nvml import UNSUPPORTED, FakeNvml
from tests.fake_nvml.helpers import wait_until

pytest_plugins = ["tests.fake_nvml.fixtures"]

GIB = 1024**3
Factory = Callable[..., NvmlSource]


def polls_after(source: NvmlSource, count: int = 2) -> GpuSnapshot:
    """The first snapshot taken at least ``count`` polls from now (so it reflects recent changes)."""
    target = source.status().polls_total + count
    wait_until(lambda: source.status().polls_total >= target, what=f"{count} more polls")
    snapshot = source.latest()
    assert snapshot is not None
    return snapshot


def test_values_are_mapped_to_base_units(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    fake_nvml.gpu(0, utilization_gpu=73, utilization_memory=41, memory_total=80 * GIB, memory_used=20 * GIB,
                  memory_reserved=1 * GIB, power_mw=412_345, power_limit_mw=650_000, temperature_gpu=67,
                  temperature_memory=81, clock_sm_mhz=1755, clock_mem_mhz=2619, clock_reasons=0x4 | 0x40,
                  pcie_rx_bytes_per_s=3e9, pcie_tx_bytes_per_s=1.5e9, ecc_sbe_volatile=5, ecc_dbe_volatile=1,
                  energy_mj=2_000_000, gpm_sm_util=61, gpm_sm_occupancy=22.5, gpm_any_tensor_util=48,
                  gpm_dram_bw_util=35, gpm_nvlink_rx_mib_per_s=100, gpm_nvlink_tx_mib_per_s=50)
    source = nvml_source()
    snapshot = wait_until(lambda: (s := source.latest()) and s.gpus[0].sm_activity_ratio is not None and s,
                          what="GPM values")
    gpu = snapshot.gpus[0]
    assert (gpu.index, gpu.up, gpu.name) == (0, True, "NVIDIA H100 80GB HBM3 (fake)")
    assert gpu.uuid.startswith("GPU-")
    assert gpu.utilization_ratio == pytest.approx(0.73)
    assert gpu.memory_utilization_ratio == pytest.approx(0.41)
    assert gpu.memory_total_bytes == 80 * GIB
    assert gpu.memory_used_bytes == 20 * GIB  # v2: reserved memory is not "used"
    assert gpu.memory_free_bytes == 59 * GIB
    assert gpu.power_watts == pytest.approx(412.345)
    assert gpu.power_limit_watts == pytest.approx(650.0)
    assert gpu.temperature_celsius == 67.0
    assert gpu.memory_temperature_celsius == 81.0
    assert gpu.sm_clock_hertz == pytest.approx(1.755e9)
    assert gpu.memory_clock_hertz == pytest.approx(2.619e9)
    assert gpu.clock_event_mask == 0x44
    active = {reason for reason, on in gpu.clock_events() or () if on}
    assert active == {"sw_power_cap", "hw_thermal_slowdown"}
    assert gpu.pcie_rx_bytes_per_second == pytest.approx(3e9, rel=0.01)
    assert gpu.pcie_tx_bytes_per_second == pytest.approx(1.5e9, rel=0.01)
    assert (gpu.ecc_corrected_total, gpu.ecc_uncorrected_total) == (5, 1)
    assert gpu.energy_joules is not None and gpu.energy_joules >= 2000.0  # mJ -> J, and it grows
    later = polls_after(source).gpus[0]
    assert later.energy_joules is not None and later.energy_joules > gpu.energy_joules
    assert gpu.profiling is ProfilingState.ACTIVE
    assert gpu.sm_activity_ratio == pytest.approx(0.61)
    assert gpu.sm_occupancy_ratio == pytest.approx(0.225)
    assert gpu.tensor_activity_ratio == pytest.approx(0.48)
    assert gpu.dram_bandwidth_ratio == pytest.approx(0.35)
    assert gpu.nvlink_rx_bytes_per_second == pytest.approx(100 * 1024**2)
    assert gpu.nvlink_tx_bytes_per_second == pytest.approx(50 * 1024**2)
    assert gpu.xid_errors_total == 0 and gpu.last_xid is None
    assert snapshot.driver_version == "570.00.fake"
    status = source.status()
    assert status.state is NvmlState.AVAILABLE and status.available
    assert status.errors == ()


def test_batched_field_values_keep_calls_per_gpu_low(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    fake_nvml.set(devices=8)
    energy_calls = fake_nvml.call_count("nvmlDeviceGetTotalEnergyConsumption")
    violation_calls = fake_nvml.call_count("nvmlDeviceGetViolationStatus")
    process_calls = fake_nvml.call_count("nvmlDeviceGetComputeRunningProcesses_v3")
    source = nvml_source()
    snapshot = polls_after(source, 4)
    assert len(snapshot.gpus) == 8
    # fields batch (with the violation counters) + utilization + memory + power + temperature +
    # 2 clocks + clock events + 2 GPM, and one event-set drain for all GPUs
    assert snapshot.nvml_calls <= 10 * 8 + 1
    assert all(g.power_watts == pytest.approx(300.0) for g in snapshot.gpus)
    assert fake_nvml.call_count("nvmlDeviceGetTotalEnergyConsumption") == energy_calls  # energy came from the batch
    assert fake_nvml.call_count("nvmlDeviceGetViolationStatus") == violation_calls  # and the violation counters
    assert all(len(g.violation_seconds_total) == 6 for g in snapshot.gpus)
    assert fake_nvml.call_count("nvmlDeviceGetComputeRunningProcesses_v3") == process_calls  # no trainer pids yet


def test_unsupported_values_are_absent_not_zero(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    fake_nvml.gpu(0, temperature_memory=UNSUPPORTED, power_mw=UNSUPPORTED, ecc_sbe_volatile=UNSUPPORTED,
                  ecc_dbe_volatile=UNSUPPORTED, clock_reasons=UNSUPPORTED, clock_sm_mhz=UNSUPPORTED,
                  gpm_dram_bw_util=UNSUPPORTED)
    source = nvml_source()
    snapshot = wait_until(lambda: (s := source.latest()) and s.gpus[0].sm_activity_ratio is not None and s,
                          what="GPM values")
    gpu, other = snapshot.gpus
    assert gpu.memory_temperature_celsius is None
    assert gpu.power_watts is None
    assert gpu.ecc_corrected_total is None and gpu.ecc_uncorrected_total is None
    assert gpu.clock_event_mask is None and gpu.clock_events() is None
    assert gpu.sm_clock_hertz is None
    assert gpu.dram_bandwidth_ratio is None and gpu.sm_activity_ratio is not None
    assert gpu.utilization_ratio is not None and gpu.memory_clock_hertz is not None  # the rest goes on
    assert other.memory_temperature_celsius == 50.0 and other.power_watts == 300.0
    assert source.status().errors == ()  # "not supported" is a state, not an error

    fake_nvml.gpu(0, utilization_gpu=UNSUPPORTED)  # mid-run
    gpu = wait_until(lambda: (s := source.latest()) and s.gpus[0].utilization_ratio is None and s.gpus[0],
                     what="utilization to disappear")
    assert gpu.up and gpu.memory_used_bytes is not None
    assert polls_after(source).gpus[1].utilization_ratio == pytest.approx(0.5)


def test_lost_gpu_is_marked_down_counted_and_logged_once(
        fake_nvml: FakeNvml, nvml_source: Factory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.nvml")
    source = nvml_source()
    polls_after(source)
    fake_nvml.gpu(1, lost=1)
    wait_until(lambda: source.status().gpus_lost == (1,), what="GPU 1 lost")
    fake_nvml.gpu(0, power_mw=123_000)
    snapshot = wait_until(lambda: (s := source.latest()) and s.gpus[0].power_watts == pytest.approx(123.0) and s,
                          what="GPU 0 to go on")
    snapshot = polls_after(source, 3)
    lost = snapshot.gpus[1]
    assert lost.up is False and lost.utilization_ratio is None and lost.power_watts is None
    assert snapshot.gpus[0].up
    status = source.status()
    assert status.error_count("gpu_is_lost") == 1
    assert status.state is NvmlState.AVAILABLE
    lost_logs = [r for r in caplog.records if "lost" in r.getMessage() and r.levelno >= logging.ERROR]
    assert len(lost_logs) == 1 and "GPU 1" in lost_logs[0].getMessage()


def test_hanging_call_does_not_stall_readers_and_the_poller_recovers(
        fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    source = nvml_source(stall_after_s=0.5)
    before = polls_after(source)
    fake_nvml.sleep("nvmlDeviceGetUtilizationRates", 3000, gpu=1)
    status = wait_until(lambda: (s := source.status()).state is NvmlState.STALLED and s, what="STALLED")
    fake_nvml.sleep("nvmlDeviceGetUtilizationRates", 0, gpu=1)  # only the call in flight still hangs
    assert status.stalled_call == "nvmlDeviceGetUtilizationRates"
    assert status.since_monotonic_s is not None and "has not returned" in status.reason
    assert not status.available
    frozen = source.latest()
    assert frozen is not None and frozen.taken_monotonic_s >= before.taken_monotonic_s
    worst = 0.0
    for _ in range(50):  # readers answer at once while the call hangs, with the last good data
        started = time.monotonic()
        assert source.latest() is frozen
        assert source.status().state is NvmlState.STALLED
        worst = max(worst, time.monotonic() - started)
        time.sleep(0.01)
    assert worst < 0.5
    assert time.monotonic() - frozen.taken_monotonic_s > 0.5  # the data keeps its age
    recovered = wait_until(lambda: (s := source.status()).state is NvmlState.AVAILABLE and s, timeout_s=6.0,
                           what="recovery")
    assert recovered.error_count("stalled_call") == 1
    after = polls_after(source)
    assert after.taken_monotonic_s > frozen.taken_monotonic_s and all(g.up for g in after.gpus)


def test_shutdown_never_hangs_on_a_wedged_call(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    source = nvml_source()
    polls_after(source)
    fake_nvml.sleep("nvmlDeviceGetClockInfo", 1500)
    wait_until(lambda: (f := source._driver.in_flight) and f[0].startswith("nvmlDeviceGetClockInfo"),
               what="the hanging call")
    fake_nvml.sleep("nvmlDeviceGetClockInfo", 0)
    started = time.monotonic()
    source.shutdown(timeout_s=0.2)
    assert time.monotonic() - started < 1.0
    assert source.status().state is NvmlState.STOPPED
    source.shutdown()  # idempotent
    with pytest.raises(RuntimeError):
        source.start()


def test_shutdown_is_safe_without_start_and_start_returns_at_once(fake_nvml: FakeNvml) -> None:
    never_started = NvmlSource(library_path=str(fake_nvml.library))
    never_started.shutdown()
    never_started.shutdown()
    assert never_started.status().state is NvmlState.STOPPED
    assert NvmlSource(library_path=str(fake_nvml.library)).status().state is NvmlState.DISABLED
    fake_nvml.sleep("nvmlInitWithFlags", 1500)
    source = NvmlSource(library_path=str(fake_nvml.library), interval_s=0.05)
    source.start()
    source.start()
    # start() returned while nvmlInit still sleeps on the poller thread
    assert source.status().state in (NvmlState.STARTING, NvmlState.STALLED)
    assert source.latest() is None
    fake_nvml.sleep("nvmlInitWithFlags", 0)
    wait_until(lambda: source.latest(), what="first snapshot")
    source.shutdown()
    with pytest.raises(ValueError, match="interval_s"):
        NvmlSource(interval_s=0)


def test_xid_events_are_counted_with_the_last_code(fake_nvml: FakeNvml, nvml_source: Factory,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sidecar.nvml")
    fake_nvml.gpu(0, xids=[13])  # raised before the source registered: not seen, like NVML
    source = nvml_source()
    polls_after(source)
    fake_nvml.add_xids(1, [79, 48])
    gpu = wait_until(lambda: (s := source.latest()) and s.gpus[1].xid_errors_total == 2 and s.gpus[1],
                     what="2 XIDs on GPU 1")
    assert gpu.last_xid == 48
    assert source.latest().gpus[0].xid_errors_total == 0  # type: ignore[union-attr]
    fake_nvml.add_xids(0, [31])
    gpu0 = wait_until(lambda: (s := source.latest()) and s.gpus[0].xid_errors_total == 1 and s.gpus[0],
                      what="XID on GPU 0")
    assert gpu0.last_xid == 31
    assert sum("XID" in r.getMessage() for r in caplog.records) == 3


def test_xid_unsupported_gpu_reports_none(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    fake_nvml.gpu(1, events_supported=0)
    snapshot = polls_after(nvml_source())
    assert snapshot.gpus[0].xid_errors_total == 0
    assert snapshot.gpus[1].xid_errors_total is None


def test_trainer_processes_are_matched_by_pid(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    fake_nvml.gpu(0, processes={1111: 2 * GIB, 2222: 3 * GIB})
    fake_nvml.gpu(1, processes={3333: 4 * GIB, 4444: 1 * GIB})
    source = nvml_source()
    assert polls_after(source).gpus[0].processes == ()
    source.set_trainer_processes({1111: ("target", "0"), 3333: ("drafter", "1"), 4444: ("target", "7")})
    snapshot = wait_until(lambda: (s := source.latest()) and s.gpus[1].processes and s, what="processes")
    assert snapshot.gpus[0].processes == (GpuProcess(1111, "target", "0", 2 * GIB),)
    assert snapshot.gpus[1].processes == (GpuProcess(3333, "drafter", "1", 4 * GIB),
                                          GpuProcess(4444, "target", "7", 1 * GIB))
    assert GpuGroups().resolve(snapshot) == {"drafter": (1,), "target": (0,)}
    (drafter, target) = aggregate_groups(snapshot, GpuGroups())
    assert (drafter.name, drafter.gpus, target.name, target.gpus) == ("drafter", (1,), "target", (0,))
    source.set_trainer_processes({})
    calls = fake_nvml.call_count("nvmlDeviceGetComputeRunningProcesses_v3")
    assert polls_after(source, 3).gpus[0].processes == ()
    assert fake_nvml.call_count("nvmlDeviceGetComputeRunningProcesses_v3") <= calls + 2 * 2  # at most 1 poll


def test_profiler_busy_backs_off_reports_and_resumes(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    fake_nvml.gpu(1, gpm_supported=0)  # so every nvmlGpmSampleGet below is GPU 0's
    source = nvml_source(profiler_backoff_s=0.3, max_backoff_s=0.6)
    wait_until(lambda: (s := source.latest()) and s.gpus[0].sm_activity_ratio is not None, what="GPM values")
    fake_nvml.gpu(0, gpm_busy=1)
    gpu = wait_until(lambda: (s := source.latest()) and s.gpus[0].profiling is ProfilingState.BUSY and s.gpus[0],
                     what="BUSY")
    assert gpu.sm_activity_ratio is None and gpu.tensor_activity_ratio is None  # no stale GPM values
    assert gpu.utilization_ratio is not None  # the rest goes on
    assert source.status().profiler_busy_gpus == (0,)
    samples, polls, started = fake_nvml.call_count("nvmlGpmSampleGet"), source.status().polls_total, time.monotonic()
    wait_until(lambda: source.status().polls_total >= polls + 20, what="20 polls")
    attempts = fake_nvml.call_count("nvmlGpmSampleGet") - samples
    # backing off 0.3 s, then 0.6 s: a few attempts, not one per poll
    assert attempts <= 2 + (time.monotonic() - started) / 0.3 and attempts <= 10
    assert source.status().errors == ()  # a busy profiler is a state, not an error
    fake_nvml.gpu(0, gpm_busy=0)
    gpu = wait_until(lambda: (s := source.latest()) and s.gpus[0].sm_activity_ratio is not None and s.gpus[0],
                     what="GPM to resume")
    assert gpu.profiling is ProfilingState.ACTIVE and source.status().profiler_busy_gpus == ()


def test_gpm_unsupported_gpu_has_no_profiling_values(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    fake_nvml.gpu(1, gpm_supported=0)
    source = nvml_source()
    snapshot = wait_until(lambda: (s := source.latest()) and s.gpus[0].sm_activity_ratio is not None and s,
                          what="GPM values")
    gpu = snapshot.gpus[1]
    assert gpu.profiling is ProfilingState.UNSUPPORTED
    assert gpu.sm_activity_ratio is None and gpu.nvlink_rx_bytes_per_second is None
    assert gpu.pcie_rx_bytes_per_second is not None  # from the field counters


def test_failed_init_is_retried_until_the_driver_answers(fake_nvml: FakeNvml, nvml_source: Factory,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.nvml")
    fake_nvml.fail("nvmlInitWithFlags", 9)  # NVML_ERROR_DRIVER_NOT_LOADED
    source = nvml_source(init_retry_s=0.05)
    status = wait_until(lambda: (s := source.status()).state is NvmlState.UNAVAILABLE and s, what="UNAVAILABLE")
    assert "driver_not_loaded" in status.reason
    time.sleep(0.3)  # several retries, one log line
    assert source.latest() is None
    fake_nvml.fail("nvmlInitWithFlags", 0)
    wait_until(lambda: source.latest(), timeout_s=5.0, what="recovery after init failures")
    assert source.status().state is NvmlState.AVAILABLE
    assert sum("driver_not_loaded" in r.getMessage() for r in caplog.records) == 1


def test_no_nvml_library_in_process(monkeypatch: pytest.MonkeyPatch, fake_nvml: FakeNvml,
                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sidecar.nvml")
    monkeypatch.delenv("FAKE_NVML_CONTROL")  # the fake then answers like a host without NVML
    source = NvmlSource(library_path=str(fake_nvml.library), interval_s=0.05)
    source.start()
    status = wait_until(lambda: (s := source.status()).state is NvmlState.UNAVAILABLE and s, what="UNAVAILABLE")
    time.sleep(0.2)
    assert source.latest() is None and "not found" in status.reason
    assert len([r for r in caplog.records if r.name == "sidecar.nvml"]) == 1
    source.shutdown()
    ok, message = probe_nvml(str(fake_nvml.library))
    assert not ok and "not found" in message


def test_missing_library_file_is_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="sidecar.nvml")
    source = NvmlSource(library_path="/nonexistent/libnvidia-ml.so.1")
    source.start()
    status = wait_until(lambda: (s := source.status()).state is NvmlState.UNAVAILABLE and s, what="UNAVAILABLE")
    assert "/nonexistent/libnvidia-ml.so.1" in status.reason
    source.shutdown()
    assert len(caplog.records) == 1


def test_probe_reports_gpus_and_never_hangs(fake_nvml: FakeNvml) -> None:
    ok, message = probe_nvml(str(fake_nvml.library))
    assert ok and "2 GPU(s)" in message and "570.00.fake" in message
    fake_nvml.sleep("nvmlDeviceGetCount_v2", 1500)
    started = time.monotonic()
    ok, message = probe_nvml(str(fake_nvml.library), timeout_s=0.3)
    assert not ok and "did not answer" in message and "nvmlDeviceGetCount" in message
    assert time.monotonic() - started < 1.0
    fake_nvml.sleep("nvmlDeviceGetCount_v2", 0)
    deadline = time.monotonic() + 5
    while any(t.name == "nvml-probe" and t.is_alive() for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_nvml_runs_on_the_poller_thread_only(fake_nvml: FakeNvml, nvml_source: Factory,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar.sources import nvml_driver

    threads: set[str] = set()
    real_call = nvml_driver.NvmlDriver.call_raw

    def recording(self: Any, function: str, *args: Any, label: str | None = None, gpu: int | None = None) -> Any:
        threads.add(threading.current_thread().name)
        return real_call(self, function, *args, label=label, gpu=gpu)

    monkeypatch.setattr(nvml_driver.NvmlDriver, "call_raw", recording)
    source = nvml_source()
    polls_after(source, 3)
    source.set_trainer_processes({1: ("target", "0")})
    source.status()
    source.latest()
    source.shutdown()
    assert threads == {"nvml-poller"}


def test_an_unexpected_error_in_one_poll_is_counted_and_polling_goes_on(
        fake_nvml: FakeNvml, nvml_source: Factory, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from sidecar.sources import nvml_gpu

    caplog.set_level(logging.ERROR, logger="sidecar.nvml")
    real_read = nvml_gpu.GpuReader.read
    reads = {"n": 0}

    def flaky(self: Any, trainer: Any, now: float, slow: Any) -> Any:
        reads["n"] += 1
        if reads["n"] in (3, 6):
            raise RuntimeError("a bug")
        return real_read(self, trainer, now, slow)

    monkeypatch.setattr(nvml_gpu.GpuReader, "read", flaky)
    source = nvml_source()
    wait_until(lambda: source.status().error_count("internal_error") == 2, what="two failed polls")
    polls = source.status().polls_total
    wait_until(lambda: source.status().polls_total > polls + 2, what="polling to go on")
    assert source.status().state is NvmlState.AVAILABLE
    assert sum("NVML poll failed" in r.getMessage() for r in caplog.records) == 1


def test_attribute_trainers_adds_on_hello_and_forgets_on_window() -> None:
    source = NvmlSource(interval_s=1.0)  # never started: the mapping is plain state
    source.attribute_trainers({1: ("target", "0")}, complete=False)
    source.attribute_trainers({2: ("drafter", "1")}, complete=False)
    assert source._trainer == {1: ("target", "0"), 2: ("drafter", "1")}
    kept = source._trainer
    source.attribute_trainers({2: ("drafter", "1"), 1: ("target", "0")}, complete=True)
    assert source._trainer is kept  # nothing changed: the poller's mapping is left alone
    source.attribute_trainers({2: ("drafter", "1")}, complete=True)  # sender 1 expired
    assert source._trainer == {2: ("drafter", "1")}
