"""The daemon's GPU side: the NVML source and the GPU groups, and what the other stages read
from them (Prometheus families, W&B rows, the insight's GPU facts). None of these reads calls
NVML: they use the source's latest immutable snapshot."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from prometheus_client.core import Metric

from sidecar.aggregation.gpu_groups import GpuGroups
from sidecar.aggregation.insight import GpuFacts
from sidecar.aggregation.senders import SenderState
from sidecar.exporters.wandb.gpu_rows import gpu_wandb_row
from sidecar.exporters.prometheus.gpu import gpu_metric_families
from sidecar.model.window import IngestReport
from sidecar.model.gpu import NvmlState, NvmlStatus
from sidecar.sources.nvml import NvmlSource

log = logging.getLogger("sidecar")

_DISABLED = NvmlStatus(NvmlState.DISABLED, "--no-gpu-metrics")


class GpuTelemetry:
    """NVML polling when enabled; every accessor degrades to "nothing" when it is not."""

    def __init__(self, enabled: bool, interval_s: float, groups: GpuGroups, host: str) -> None:
        """``groups``: parsed ``--gpu-group`` specs (empty: discovered from trainer processes)."""
        self.groups = groups
        self.host = host
        self.source = NvmlSource(interval_s=interval_s) if enabled else None
        self._pids: dict[int, tuple[str, str]] = {}
        self._warned_unknown = False

    def start(self) -> None:
        if self.source is not None:
            self.source.start()

    def shutdown(self) -> None:
        if self.source is not None:
            self.source.shutdown()

    def status(self) -> NvmlStatus:
        return self.source.status() if self.source is not None else _DISABLED

    def families(self) -> Iterable[Metric]:
        """GPU families for one scrape (empty when disabled)."""
        snapshot = self.source.latest() if self.source is not None else None
        return gpu_metric_families(snapshot, self.status(), self.groups, self.host, time.monotonic())

    def wandb_row(self, report: IngestReport) -> dict[str, float]:
        """GPU values for the window's W&B row (empty when disabled)."""
        snapshot = self.source.latest() if self.source is not None else None
        return gpu_wandb_row(snapshot, self.status(), self.groups, time.monotonic())

    def facts(self) -> GpuFacts | None:
        """Active clock-event (throttle) reasons and the group of each GPU, for the insight."""
        snapshot = self.source.latest() if self.source is not None else None
        if snapshot is None:
            return None
        if not self._warned_unknown and self.groups.specs and self.groups.unknown_gpus(snapshot):
            self._warned_unknown = True
            log.warning("sidecar: --gpu-group names GPUs this host does not have: %s",
                        ", ".join(map(str, self.groups.unknown_gpus(snapshot))))
        events = {str(r.index): frozenset(name for name, on in (r.clock_events() or ()) if on)
                  for r in snapshot.gpus if r.up}
        roles = {str(gpu): group for group, gpus in self.groups.resolve(snapshot).items() for gpu in gpus}
        return GpuFacts(events, roles)

    def on_hello(self, sender: SenderState) -> None:
        """A trainer said hello: its pid's GPU memory is attributed to its role and worker."""
        if self.source is not None and sender.pid is not None and self._pids.get(sender.pid) != (sender.role, sender.worker):
            self._pids[sender.pid] = (sender.role, sender.worker)
            self.source.set_trainer_processes(dict(self._pids))

    def on_window(self, report: IngestReport) -> None:
        """Forget pids of senders the registry has forgotten."""
        if self.source is None:
            return
        live = {s.pid: (s.role, s.worker) for s in report.senders if s.pid is not None}
        if live != self._pids:
            self._pids = live
            self.source.set_trainer_processes(dict(live))
