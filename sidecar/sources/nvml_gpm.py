"""GPM (GPU Performance Monitoring, Hopper and newer) metrics of one GPU.

As NVML documents: allocate two sample buffers, take a sample each poll with
``nvmlGpmSampleGet`` and compute the metrics over the interval between the previous and the
current sample with ``nvmlGpmMetricsGet`` (older sample first). Samples closer than 100 ms give
unreliable numbers (NVML's internal refresh rate), so a poll that comes sooner keeps the last
values and waits for the next one.

The counters are a shared resource. When another profiler holds them the calls fail
(``NVML_ERROR_IN_USE``, or ``NVML_ERROR_INSUFFICIENT_RESOURCES``; NVML does not document a
single code): the sampler drops its samples, reports ``ProfilingState.BUSY``, and retries after
a back-off that doubles up to a cap, instead of fighting the profiler every poll.
"""

from __future__ import annotations

import logging
from typing import Any

from sidecar.model.backoff import Backoff
from sidecar.model.gpu import ProfilingState
from sidecar.sources.nvml_driver import IN_USE, INSUFFICIENT_RESOURCES, NvmlDriver, Outcome, constant

MIN_SAMPLE_GAP_S = 0.1
_MIB = 1024.0 * 1024.0

# metric id -> (GpuReading attribute, scale from NVML's unit to the base unit)
METRICS: dict[int, tuple[str, float]] = {
    constant("NVML_GPM_METRIC_GRAPHICS_UTIL", 1): ("graphics_activity_ratio", 0.01),
    constant("NVML_GPM_METRIC_SM_UTIL", 2): ("sm_activity_ratio", 0.01),
    constant("NVML_GPM_METRIC_SM_OCCUPANCY", 3): ("sm_occupancy_ratio", 0.01),
    constant("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5): ("tensor_activity_ratio", 0.01),
    constant("NVML_GPM_METRIC_DRAM_BW_UTIL", 10): ("dram_bandwidth_ratio", 0.01),
    constant("NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20): ("pcie_tx_bytes_per_second", _MIB),
    constant("NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21): ("pcie_rx_bytes_per_second", _MIB),
    constant("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", 60): ("nvlink_rx_bytes_per_second", _MIB),
    constant("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", 61): ("nvlink_tx_bytes_per_second", _MIB),
}


class GpmSampler:
    """GPM state of one GPU; driven by the poller thread only."""

    def __init__(self, driver: NvmlDriver, handle: Any, index: int, log: logging.Logger,
                 backoff_s: float, max_backoff_s: float) -> None:
        self._driver = driver
        self._handle = handle
        self._index = index
        self._log = log
        self._backoff = Backoff(backoff_s, max_backoff_s)
        self._retry_at = 0.0
        self._samples: list[Any] = []
        self._have_previous = False
        self._current = 0
        self._last_sample_at = float("-inf")
        self.state = ProfilingState.UNSUPPORTED
        self.values: dict[str, float | None] = {}
        """Latest metrics by ``GpuReading`` attribute; empty until two samples exist."""

    @property
    def primed(self) -> bool:
        """False while sampling without metrics yet (the first sample, at start or after a
        failure): the next sample should come at the next poll, not a period later."""
        return bool(self.values) or not self._samples or self.state is not ProfilingState.ACTIVE

    def setup(self) -> None:
        """Find out whether the GPU supports GPM and allocate the two sample buffers."""
        outcome, support = self._driver.try_call("nvmlGpmQueryDeviceSupport", self._handle, gpu=self._index)
        if outcome is not Outcome.OK or not support.isSupportedDevice:
            return
        for _ in range(2):
            outcome, sample = self._driver.try_call("nvmlGpmSampleAlloc", gpu=self._index)
            if outcome is not Outcome.OK:
                self.close()
                return
            self._samples.append(sample)
        self.state = ProfilingState.ACTIVE

    def poll(self, now: float) -> None:
        """Take this interval's sample and update ``values``; may raise ``GpuLostError``."""
        if not self._samples or now < self._retry_at or now - self._last_sample_at < MIN_SAMPLE_GAP_S:
            return
        sample = self._samples[self._current]
        outcome, code = self._driver.gpm_sample(self._handle, sample, self._index)
        if outcome is not Outcome.OK:
            self._fail(outcome, code, now)
            return
        self._last_sample_at = now
        if self._have_previous:
            previous = self._samples[1 - self._current]
            outcome, code, metrics = self._driver.gpm_metrics(previous, sample, list(METRICS), self._index)
            if outcome is not Outcome.OK:
                self._fail(outcome, code, now)
                return
            self.values = {
                attribute: None if metrics.get(metric_id) is None else metrics[metric_id] * scale  # type: ignore[operator]
                for metric_id, (attribute, scale) in METRICS.items()
            }
        if self.state is not ProfilingState.ACTIVE:
            self._log.info("GPU %d: GPM profiling metrics resumed", self._index)
        self.state = ProfilingState.ACTIVE
        self._backoff.reset()
        self._have_previous = True
        self._current = 1 - self._current

    def _fail(self, outcome: Outcome, code: int, now: float) -> None:
        self.values = {}
        self._have_previous = False
        if outcome in (Outcome.MISSING, Outcome.UNSUPPORTED):
            self.state = ProfilingState.UNSUPPORTED
            self.close()
            return
        busy = code in (IN_USE, INSUFFICIENT_RESOURCES)
        new_state = ProfilingState.BUSY if busy else ProfilingState.ERROR
        if new_state is not self.state:
            why = "counters are held by another profiler" if busy else "sampling failed"
            self._log.info("GPU %d: GPM %s; retrying in %.0f s", self._index, why, self._backoff.delay_s)
        self.state = new_state
        self._retry_at = now + self._backoff.failed()

    def close(self) -> None:
        """Free the sample buffers (poller thread, at shutdown)."""
        for sample in self._samples:
            self._driver.try_call("nvmlGpmSampleFree", sample, gpu=self._index)
        self._samples = []
