"""The scrape state: what every exporter may read between windows, at scrape time, in one object.

It is the daemon's host interface to its exporters (a ``sidecar.exporters.base.ScrapeView``):
an exporter gets two things, each window (``consume``) and this object. It reads the GPUs as they
are now (not as at the window's end), ingest's health, the W&B exporter's statistics, the
daemon's own telemetry and the ``/explain`` report; it never writes here and never calls a stage.
The daemon wires the providers in one ``attach``, before anything starts, each by its own typed
parameter (none is looked up by a name); a provider left out reads as None. The latest window
is kept here too (the scrape state is a listener of the fan-out): everything of a window a
scrape shows is read from that window (one source per figure), and the admin side is handed it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from sidecar.core.selfstats import read_self
from sidecar.exporters.base import WandbStatsLike
from sidecar.model.gpu import GpuView
from sidecar.model.trace import CaptureView
from sidecar.model.window import DaemonTelemetry, IngestHealth, IngestReport, SenderView


class _GpuSide(Protocol):
    def view(self) -> GpuView: ...


class _IngestSide(Protocol):
    def health(self) -> IngestHealth: ...


class _WandbSide(Protocol):
    """The W&B exporter (``sidecar.exporters.wandb.exporter.WandbExporter``)."""

    def stats(self) -> WandbStatsLike: ...


class _AdminSide(Protocol):
    """``sidecar.core.admin.Admin``: it reads nothing back from here (it is handed the report)."""

    def explain(self, report: IngestReport | None) -> Mapping[str, Any]: ...

    def last_capture(self) -> CaptureView | None: ...


class ScrapeState:
    """Read-only at scrape time (any thread); each reader returns None where its provider is
    absent (GPU metrics off, W&B off, a bare state in a test)."""

    name = "scrape state"

    def __init__(self, *, gpus: _GpuSide | None = None) -> None:
        """``gpus``: an ``aggregation.gpu_groups.GpuAggregates``."""
        self._gpus = gpus
        self._ingest: _IngestSide | None = None
        self._wandb: _WandbSide | None = None
        self._admin: _AdminSide | None = None
        self._report: IngestReport | None = None

    def attach(self, *, ingest: _IngestSide, wandb: _WandbSide | None, admin: _AdminSide | None) -> None:
        """Wire the providers made after this object, at once (the daemon, before it starts
        anything): ``ingest``: the pipeline (its ``health``); ``wandb``: the W&B exporter (None:
        W&B is off); ``admin``: a ``sidecar.core.admin.Admin``."""
        self._ingest, self._wandb, self._admin = ingest, wandb, admin

    # -- readers -----------------------------------------------------------------------------------

    @property
    def has_gpus(self) -> bool:
        """Whether GPU metrics are on (``gpu_view`` has a provider)."""
        return self._gpus is not None

    @property
    def has_admin(self) -> bool:
        """Whether the admin side (``explain``, ``telemetry``) is wired."""
        return self._admin is not None

    def report(self) -> IngestReport | None:
        """The latest window's report as fanned out (None before the first)."""
        return self._report

    def gpu_view(self) -> GpuView | None:
        """The GPUs now (None without GPU metrics)."""
        return self._gpus.view() if self._gpus is not None else None

    def ingest_health(self) -> IngestHealth | None:
        return self._ingest.health() if self._ingest is not None else None

    def wandb_stats(self) -> WandbStatsLike | None:
        """The W&B exporter's queue, rows and state (None: W&B is off)."""
        return self._wandb.stats() if self._wandb is not None else None

    def telemetry(self) -> DaemonTelemetry | None:
        """The daemon's own CPU, memory, threads, descriptors and ingest health (None without the
        admin side)."""
        if self._admin is None:
            return None
        stats = read_self()
        return DaemonTelemetry(stats.cpu_seconds, stats.rss_bytes, stats.threads, stats.open_fds,
                               self.ingest_health())

    def explain(self) -> Mapping[str, Any] | None:
        """The mapping report ``/explain`` serves, of the latest window (None: the page is absent)."""
        return self._admin.explain(self._report) if self._admin is not None else None

    def last_capture(self) -> CaptureView | None:
        """The newest profiler capture kept in the state folder (None: none, or no admin side)."""
        return self._admin.last_capture() if self._admin is not None else None

    # -- the fan-out's side (ingest thread) ----------------------------------------------------------

    def consume(self, report: IngestReport) -> None:
        self._report = report

    def hello(self, view: SenderView) -> None:
        """Hellos change nothing here."""
