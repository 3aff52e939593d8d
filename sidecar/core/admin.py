"""The daemon's admin side, served beside ``/metrics``: the ``/explain`` report and the daemon's
own telemetry (CPU, memory, threads, descriptors, ingest health).

Both are read at scrape time through the scrape state (``sidecar.exporters.scrape_state.ScrapeState``), from the
pipeline's side: the latest window as the fan-out handed it out (its GPU part included: what the
window's insight had of the GPUs) and the mapping in force. Nothing here is read back out of an
exporter or a stage.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.core.captures import LatestCapture
from sidecar.core.selfstats import read_self
from sidecar.exporters.scrape_state import DaemonTelemetry, ScrapeState
from sidecar.model.gpu import NVML_DISABLED
from sidecar.model.settings import RoleSettings
from sidecar.model.trace import CaptureView
from sidecar.model.window import IngestReport
from sidecar.processing.explain import explain_data
from sidecar.processing.mapping import Mapper


class Admin:
    """``explain`` and ``telemetry`` for the scrape state (any thread)."""

    def __init__(self, scrape_state: ScrapeState, mapper: Callable[[], tuple[Mapper, RoleSettings]],
                 gpu_metrics: bool, state_dir: Path | None = None) -> None:
        """``mapper``: the mapping and the role names in force (they change on reload);
        ``gpu_metrics``: whether the GPUs are polled (false: ``--no-gpu-metrics``); ``state_dir``:
        the state folder, whose newest profiler capture ``last_capture`` reads (None: none)."""
        self.scrape_state = scrape_state
        self._mapper = mapper
        self._gpu_metrics = gpu_metrics
        self._captures = LatestCapture(state_dir) if state_dir is not None else None

    def explain(self) -> dict[str, Any]:
        """What ``dflash-sidecar explain`` prints (``processing.explain.explain_data``)."""
        window = self.scrape_state.window()
        mapper, roles = self._mapper()
        return explain_data(window, mapper, roles, gpu_missing(window, self._gpu_metrics))

    def last_capture(self) -> CaptureView | None:
        """The newest kept profiler capture (``sidecar.core.captures``), or None."""
        return self._captures.view() if self._captures is not None else None

    def telemetry(self) -> DaemonTelemetry:
        stats = read_self()
        return DaemonTelemetry(stats.cpu_seconds, stats.rss_bytes, stats.threads, stats.open_fds,
                               self.scrape_state.ingest_health())


def gpu_missing(window: IngestReport | None, gpu_metrics: bool) -> str | None:
    """Why the insight of ``window`` (the latest) had no GPU busy share or clock-event reasons,
    from the window's GPU part (its ``facts`` and the NVML status at its end); None: it had them."""
    if not gpu_metrics:
        status = NVML_DISABLED
    elif window is None:
        return "no window yet"
    elif window.gpu is None:
        return "no GPU reading in the latest window"
    elif window.gpu.facts is not None and window.gpu.facts.busy:
        return None
    else:
        status = window.gpu.status
    return f"NVML {status.state.value}{': ' + status.reason if status.reason else ''}"
