"""The cost-aware NVML poller on the fake driver (real pynvml): slow groups at their cadence, the
fast ones every poll whatever the budget, the budget kept by stretching the slow ones, energy
between counter readings integrated from power and corrected by the counter, the cost per call
kind exported, and the settings' bounds."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest

from sidecar.aggregation.gpu_groups import GpuGroups, gpu_view
from sidecar.core import config
from sidecar.exporters.prometheus.gpu import gpu_metric_families
from sidecar.model.gpu import GpuSnapshot
from sidecar.sources.nvml import NvmlSource
from sidecar.sources.nvml_cadence import FAST, SLOW_PERIODS_S, Cadence
from sidecar.sources.nvml_driver import NvmlDriver
from sidecar.sources.nvml_energy import EnergyEstimate
from tests.fake_nvml import H200_COSTS_US, FakeNvml
from tests.fake_nvml.helpers import REPO_ROOT, promtool_check, registry_of, wait_until

pytest_plugins = ["tests.fake_nvml.fixtures"]

Factory = Callable[..., NvmlSource]
INTERVAL_S = 0.05
FAST_CALLS = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetCurrentClocksEventReasons",
              "nvmlDeviceGetMemoryInfo_v2")
SLOW_CALLS = ("nvmlDeviceGetFieldValues", "nvmlGpmSampleGet", "nvmlGpmMetricsGet")
OFFSET_MJ = 1e9
"""The fake's default ``energy_mj``: what its counter adds to the power integrated since boot."""


def _run(fake: FakeNvml, make: Factory, polls: int, **kwargs: Any) -> tuple[NvmlSource, dict[str, int], float]:
    """A source polling every ``INTERVAL_S`` until ``polls`` polls, then shut down: the source, the
    fake's calls per function meanwhile, and the seconds from before start to after shutdown."""
    before = {fn: fake.call_count(fn) for fn in (*FAST_CALLS, *SLOW_CALLS)}
    started = time.monotonic()
    source = make(**kwargs)
    wait_until(lambda: source.status().polls_total >= polls, timeout_s=60.0, what=f"{polls} polls")
    source.shutdown()
    elapsed = time.monotonic() - started
    return source, {fn: fake.call_count(fn) - n for fn, n in before.items()}, elapsed


def test_slow_groups_at_their_cadence_fast_ones_every_poll(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    period = 0.5
    source, calls, elapsed = _run(fake_nvml, nvml_source, 40, slow_periods_s=dict.fromkeys(SLOW_PERIODS_S, period))
    polls, gpus = source.status().polls_total, 2
    for fn in FAST_CALLS:
        assert calls[fn] == gpus * polls, fn  # every GPU, every poll
    # Two reads of a group are at least a period less half a poll apart (its due time has that
    # slack); the first read is at the first poll. A slow machine only makes reads rarer.
    most = gpus * (1 + int(elapsed / (period - INTERVAL_S / 2)))
    for fn in ("nvmlDeviceGetFieldValues", "nvmlGpmSampleGet"):
        assert 1 <= calls[fn] <= most < gpus * polls, (fn, calls[fn], most, polls)
    intervals = dict(source.status().intervals)
    assert {name: intervals[name] for name in FAST} == dict.fromkeys(FAST, INTERVAL_S)
    assert intervals["energy_counter"] == intervals["gpm"] == period  # a whole core: nothing stretched


def test_gpm_takes_its_second_sample_at_the_next_poll_not_a_period_later(fake_nvml: FakeNvml,
                                                                           nvml_source: Factory) -> None:
    # GPM's metrics compare two samples: at start the second comes at once (0.15 s apart, over
    # NVML's 100 ms minimum), then the samples follow the GPM period.
    source = nvml_source(interval_s=0.15, slow_periods_s={**dict.fromkeys(SLOW_PERIODS_S, 30.0), "gpm": 30.0})
    wait_until(lambda: source.status().polls_total >= 2, timeout_s=30.0, what="2 polls")
    snapshot = source.latest()
    assert snapshot is not None and all(g.sm_activity_ratio == pytest.approx(0.6) for g in snapshot.gpus)


def test_every_poll_mode_reads_every_value_every_poll(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    source, calls, _ = _run(fake_nvml, nvml_source, 10, cadence="every-poll", slow_periods_s=None)
    polls = source.status().polls_total
    assert calls["nvmlDeviceGetFieldValues"] == calls["nvmlDeviceGetUtilizationRates"] == 2 * polls
    assert source.status().cpu_budget_ratio is None
    assert dict(source.status().intervals)["ecc_counters"] == INTERVAL_S


def test_the_budget_stretches_the_slow_groups_never_the_fast_ones(fake_nvml: FakeNvml,
                                                                 nvml_source: Factory) -> None:
    """An H200's costs (5 ms a field batch, 5.3 ms of GPM per GPU) on 2 GPUs with slow groups due
    every 0.25 s would take 8 % of a core: a 5 % budget stretches them; the fast ones stay at
    every poll. The slow calls' scripted CPU stays within the budget over the run (beyond the
    first two rounds, read before any cost was measured)."""
    fake_nvml.cost(H200_COSTS_US)
    budget, base = 0.05, 0.25
    source, calls, elapsed = _run(fake_nvml, nvml_source, 60, cpu_budget=budget,
                                  slow_periods_s=dict.fromkeys(SLOW_PERIODS_S, base))
    polls, gpus = source.status().polls_total, 2
    for fn in FAST_CALLS:
        assert calls[fn] == gpus * polls, fn
    intervals = dict(source.status().intervals)
    assert {name: intervals[name] for name in FAST} == dict.fromkeys(FAST, INTERVAL_S)
    assert intervals["energy_counter"] > base and intervals["gpm"] > base
    assert intervals["energy_counter"] == intervals["gpm"]  # one factor for every slow group
    slow_s = sum(calls[fn] * H200_COSTS_US[fn] for fn in SLOW_CALLS) / 1e6
    round_s = gpus * sum(H200_COSTS_US[fn] for fn in SLOW_CALLS) / 1e6
    assert slow_s <= budget * elapsed + 2 * round_s, (slow_s, elapsed, calls)
    costs = {c.call: c for c in source.status().call_costs}
    batch = costs["nvmlDeviceGetFieldValues"]
    assert batch.calls == calls["nvmlDeviceGetFieldValues"]
    assert batch.cpu_s >= batch.calls * H200_COSTS_US["nvmlDeviceGetFieldValues"] / 1e6  # the spin is CPU time


def test_energy_between_counter_readings_is_integrated_and_corrected_by_the_counter(
        fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    fake_nvml.set(devices=1)
    fake_nvml.gpu(0, power_mw=400_000)  # the fake's counter grows by exactly this power
    period = 0.5
    source = nvml_source(slow_periods_s=dict.fromkeys(SLOW_PERIODS_S, period))
    batches = fake_nvml.call_count("nvmlDeviceGetFieldValues")
    wait_until(lambda: source.status().polls_total >= 20, timeout_s=30.0, what="20 polls")
    fake_nvml.gpu(0, energy_mj=OFFSET_MJ + 100e6)  # the counter jumps by 100 kJ: power alone cannot know it
    wait_until(lambda: source.status().polls_total >= 45, timeout_s=30.0, what="45 polls")
    fake_nvml.gpu(0, energy_mj=OFFSET_MJ + 100e6 - 150e3)  # 150 J below the estimate, above its last reading
    wait_until(lambda: source.status().polls_total >= 70, timeout_s=30.0, what="70 polls")
    polls: tuple[GpuSnapshot, ...] = source.recent(60.0)
    source.shutdown()
    batches = fake_nvml.call_count("nvmlDeviceGetFieldValues") - batches
    energy = [(s.taken_monotonic_s, s.gpus[0].energy_joules) for s in polls]
    values = [joules for _, joules in energy]
    assert None not in values
    steps = [b - a for a, b in zip(values, values[1:])]  # type: ignore[operator]
    assert min(steps) >= 0.0, "the energy counter went back"
    rising = sum(1 for step in steps if step > 0)
    assert batches < len(polls) / 3 and rising > batches + len(polls) / 2  # it rose between counter readings
    assert sum(1 for step in steps if step > 50e3) == 1  # the counter's jump, taken at one reading
    truth = _counter_joules(fake_nvml)  # read after the last poll: 400 W more per second since
    last_at, last = energy[-1]
    assert truth - 400.0 * (time.monotonic() - last_at) == pytest.approx(last, abs=200.0)


def _counter_joules(fake: FakeNvml) -> float:
    """GPU 0's energy counter now, read straight from the fake (the source is shut down)."""
    driver = NvmlDriver(logging.getLogger("test"))
    driver.load(str(fake.library))
    try:
        handle = driver.call_raw("nvmlDeviceGetHandleByIndex", 0)
        return float(driver.call_raw("nvmlDeviceGetTotalEnergyConsumption", handle)) / 1e3
    finally:
        driver.shutdown()


def test_energy_estimate_never_goes_back_and_follows_a_reset() -> None:
    energy = EnergyEstimate()
    energy.power(100.0, 0.0)
    assert energy.value() is None  # no counter reading yet
    energy.counter(1000.0, 0.0)
    energy.power(100.0, 2.0)
    assert energy.value() == 1200.0  # integrated: 100 W for 2 s
    energy.counter(1150.0, 2.0)  # the counter says less: hold until it catches up
    assert energy.value() == 1200.0
    energy.power(100.0, 2.4)
    assert energy.value() == 1200.0
    energy.power(100.0, 3.0)
    assert energy.value() == 1250.0
    energy.counter(5.0, 3.0)  # below the last reading: the driver was reloaded
    assert energy.value() == 5.0


def test_the_cost_per_call_kind_is_exported(fake_nvml: FakeNvml, nvml_source: Factory) -> None:
    fake_nvml.cost({"nvmlDeviceGetFieldValues": 2000})
    source = nvml_source()
    wait_until(lambda: source.status().polls_total >= 3, what="3 polls")
    status = source.status()
    families = gpu_metric_families(gpu_view(source.latest(), status, GpuGroups.parse([])), "h", time.monotonic())
    registry = registry_of(lambda: families)
    batch = registry.get_sample_value("dflash_nvml_call_cpu_seconds_total", {"host": "h",
                                                                             "call": "nvmlDeviceGetFieldValues"})
    calls = registry.get_sample_value("dflash_nvml_calls_total", {"host": "h", "call": "nvmlDeviceGetFieldValues"})
    utilization = registry.get_sample_value("dflash_nvml_call_cpu_seconds_total",
                                            {"host": "h", "call": "nvmlDeviceGetUtilizationRates"})
    assert calls is not None and batch is not None and utilization is not None
    assert batch >= calls * 0.002
    assert registry.get_sample_value("dflash_nvml_call_seconds_total",
                                     {"host": "h", "call": "nvmlDeviceGetFieldValues"}) >= batch * 0.5
    assert registry.get_sample_value("dflash_nvml_interval_seconds", {"host": "h", "values": "power"}) == INTERVAL_S
    assert registry.get_sample_value("dflash_nvml_cpu_budget_ratio", {"host": "h"}) == 1.0
    assert registry.get_sample_value("dflash_nvml_cpu_seconds_total", {"host": "h"}) >= batch
    promtool_check(generate_latest(registry))


@pytest.mark.parametrize("raw", ["0", "1.5", "nan", "-0.01"])
def test_a_budget_out_of_bounds_is_refused_with_a_message(raw: str) -> None:
    with pytest.raises(config.ConfigError, match=r"--nvml-cpu-budget.*between 0\.001 and 1 of one core"):
        config.load({"nvml_cpu_budget": raw})


def test_the_command_line_refuses_a_bad_budget_or_cadence() -> None:
    for flag, value, message in (("--nvml-cpu-budget", "2", "nvml_cpu_budget must be between 0.001 and 1"),
                                 ("--nvml-cadence", "sometimes", "expected one of cost-aware, every-poll")):
        result = subprocess.run([sys.executable, "-m", "sidecar", "run", flag, value], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_cadence_refuses_an_unknown_group() -> None:
    with pytest.raises(ValueError, match="slow NVML group 'fan'"):
        Cadence(1.0, 0.01, {"fan": 5.0})
