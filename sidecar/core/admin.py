"""The daemon's admin side, served beside ``/metrics``: the ``/explain`` report and the newest
kept profiler capture.

Both are read at scrape time through the scrape state (``sidecar.core.scrape_state.ScrapeState``),
which hands ``explain`` the latest window as the fan-out handed it out (its GPU part included:
what the window's insight had of the GPUs); the mapping in force comes from the daemon. Nothing
here is read back out of the scrape state, an exporter or a stage.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.core.captures import LatestCapture
from sidecar.model.gpu import NVML_DISABLED
from sidecar.model.settings import RoleSettings
from sidecar.model.trace import CaptureView
from sidecar.model.window import IngestReport
from sidecar.processing.explain import explain_data
from sidecar.processing.mapping import Mapper


class Admin:
    """``explain`` and ``last_capture`` for the scrape state (any thread)."""

    def __init__(self, mapper: Callable[[], tuple[Mapper, RoleSettings]], gpu_metrics: bool,
                 state_dir: Path | None = None) -> None:
        """``mapper``: the mapping and the role names in force (they change on reload);
        ``gpu_metrics``: whether the GPUs are polled (false: ``--no-gpu-metrics``); ``state_dir``:
        the state folder, whose newest profiler capture ``last_capture`` reads (None: none)."""
        self._mapper = mapper
        self._gpu_metrics = gpu_metrics
        self._captures = LatestCapture(state_dir) if state_dir is not None else None

    def explain(self, report: IngestReport | None) -> dict[str, Any]:
        """What ``dflash-sidecar explain`` prints of ``report`` (the latest window's; None before the first:
        ``processing.explain.explain_data``)."""
        mapper, roles = self._mapper()
        return explain_data(report, mapper, roles, gpu_missing(report, self._gpu_metrics))

    def last_capture(self) -> CaptureView | None:
        """The newest kept profiler capture (``sidecar.core.captures``), or None."""
        return self._captures.view() if self._captures is not None else None


def gpu_missing(report: IngestReport | None, gpu_metrics: bool) -> str | None:
    """Why the insight of ``report`` (the latest window's) had no GPU busy share or clock-event reasons,
    from the window's GPU part (its ``facts`` and the NVML status at its end); None: it had them."""
    if not gpu_metrics:
        status = NVML_DISABLED
    elif report is None:
        return "no window yet"
    elif report.gpu is None:
        return "no GPU reading in the latest window"
    elif report.gpu.facts is not None and report.gpu.facts.busy:
        return None
    else:
        status = report.gpu.status
    return f"NVML {status.state.value}{': ' + status.reason if status.reason else ''}"
