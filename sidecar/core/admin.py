"""The daemon's admin side, served beside ``/metrics``: the ``/explain`` report and the daemon's
own telemetry (CPU, memory, threads, descriptors, ingest health).

Both are read at scrape time through the scrape state (``sidecar.exporters.scrape_state.ScrapeState``), from the
pipeline's side: the latest window as the fan-out handed it out, the mapping in force, the GPU
source's status. Nothing here is read back out of an exporter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sidecar.aggregation.gpu_groups import GpuAggregates
from sidecar.core.selfstats import read_self
from sidecar.exporters.scrape_state import DaemonTelemetry, ScrapeState
from sidecar.model.gpu import NvmlStatus
from sidecar.model.settings import RoleSettings
from sidecar.processing.explain import explain_data
from sidecar.processing.mapping import Mapper


class Admin:
    """``explain`` and ``telemetry`` for the scrape state (any thread)."""

    def __init__(self, scrape_state: ScrapeState, mapper: Callable[[], tuple[Mapper, RoleSettings]],
                 gpus: GpuAggregates, nvml_status: Callable[[], NvmlStatus] | None) -> None:
        """``mapper``: the mapping and the role names in force (they change on reload);
        ``nvml_status``: the NVML source's ``status`` (None: GPU metrics are off)."""
        self.scrape_state = scrape_state
        self._mapper = mapper
        self._gpus = gpus
        self._nvml_status = nvml_status

    def explain(self) -> dict[str, Any]:
        """What ``dflash-sidecar explain`` prints (``processing.explain.explain_data``)."""
        facts = self._gpus.facts()
        if facts is not None and facts.busy:
            gpu_missing = None
        elif self._nvml_status is None:
            gpu_missing = "NVML disabled: --no-gpu-metrics"
        else:
            status = self._nvml_status()
            gpu_missing = f"NVML {status.state.value}{': ' + status.reason if status.reason else ''}"
        mapper, roles = self._mapper()
        return explain_data(self.scrape_state.window(), mapper, roles, gpu_missing)

    def telemetry(self) -> DaemonTelemetry:
        stats = read_self()
        return DaemonTelemetry(stats.cpu_seconds, stats.rss_bytes, stats.threads, stats.open_fds,
                               self.scrape_state.ingest_health())
