"""The scrape state: what every exporter may read between windows, at scrape time, in one object.

An exporter gets two things: each window (``consume``) and this object. It reads the GPUs as they
are now (not as at the window's end), ingest's health, the W&B exporter's statistics, the
daemon's own telemetry and the ``/explain`` report; it never writes here and never calls a stage.
The daemon wires the providers in one ``attach``, before anything starts, each by its own typed
parameter (none is looked up by a name); a provider left out reads as None.
The latest window is kept here too (the scrape state is a listener of the fan-out), so that admin
pages read it from the pipeline's side, never back out of an exporter. It sits beside the
exporters, its readers; the daemon's core builds it and hands it to them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar.model.ends import EndsView
from sidecar.model.gpu import GpuView
from sidecar.model.trace import CaptureView
from sidecar.model.window import IngestHealth, IngestReport, SenderView


class _GpuSide(Protocol):
    def view(self) -> GpuView: ...


class _IngestSide(Protocol):
    def health(self) -> IngestHealth: ...

    def ends_now(self) -> EndsView: ...


class WandbStatsLike(Protocol):
    """What the scrape state's readers read of the W&B exporter's ``stats()``
    (``sidecar.exporters.wandb.exporter.WandbStats``)."""

    @property
    def state(self) -> enum.Enum: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def rows_logged(self) -> int: ...
    @property
    def rows_dropped(self) -> Mapping[str, int]: ...


class _WandbSide(Protocol):
    """The W&B exporter (``sidecar.exporters.wandb.exporter.WandbExporter``)."""

    def stats(self) -> WandbStatsLike: ...


class _AdminSide(Protocol):
    def explain(self) -> Mapping[str, Any]: ...

    def telemetry(self) -> DaemonTelemetry: ...

    def last_capture(self) -> CaptureView | None: ...


@dataclass(frozen=True, slots=True)
class DaemonTelemetry:
    """The daemon's own figures at one moment (``sidecar.core.admin``)."""

    cpu_seconds: float
    """User + system CPU time of the process (seconds)."""
    rss_bytes: int
    threads: int
    open_fds: int
    ingest: IngestHealth | None
    """None until ingest runs."""


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
        self._window: IngestReport | None = None

    def attach(self, *, ingest: _IngestSide, wandb: _WandbSide | None, admin: _AdminSide) -> None:
        """Wire the providers made after this object, at once (the daemon, before it starts
        anything): ``ingest``: the pipeline (its ``health``, its ends); ``wandb``: the W&B
        exporter (None: W&B is off); ``admin``: a ``sidecar.core.admin.Admin``."""
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

    def window(self) -> IngestReport | None:
        """The latest window as fanned out (None before the first)."""
        return self._window

    def gpu_view(self) -> GpuView | None:
        """The GPUs now (None without GPU metrics)."""
        return self._gpus.view() if self._gpus is not None else None

    def ingest_health(self) -> IngestHealth | None:
        return self._ingest.health() if self._ingest is not None else None

    def ends(self) -> EndsView | None:
        """The senders' ends told so far, as of the latest (None without ingest)."""
        return self._ingest.ends_now() if self._ingest is not None else None

    def wandb_stats(self) -> WandbStatsLike | None:
        """The W&B exporter's queue, rows and state (None: W&B is off)."""
        return self._wandb.stats() if self._wandb is not None else None

    def telemetry(self) -> DaemonTelemetry | None:
        """The daemon's own CPU, memory, threads, descriptors and ingest health."""
        return self._admin.telemetry() if self._admin is not None else None

    def explain(self) -> Mapping[str, Any] | None:
        """The mapping report ``/explain`` serves (None: the page is absent)."""
        return self._admin.explain() if self._admin is not None else None

    def last_capture(self) -> CaptureView | None:
        """The newest profiler capture kept in the state folder (None: none, or no admin side)."""
        return self._admin.last_capture() if self._admin is not None else None

    # -- the fan-out's side (ingest thread) ----------------------------------------------------------

    def consume(self, window: IngestReport) -> None:
        self._window = window

    def hello(self, sender: SenderView) -> None:
        """Hellos change nothing here."""
