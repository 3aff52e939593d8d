"""The one interface between the pipeline and its destinations.

The pipeline's fan-out (``sidecar.core.pipeline``) calls ``consume(report)`` (a window's report,
``model.window.IngestReport``; ``report.window`` is the window) on every exporter from the ingest
thread, and ``hello(view)`` (the sender's view) for each hello; that is the whole route after aggregation. What
an exporter reads between windows comes from the one scrape state it is given (a ``ScrapeView``:
the daemon's is ``sidecar.core.scrape_state.ScrapeState``). The daemon starts every exporter
through ``start`` and stops it through ``shutdown``, in the reverse order.
Lifecycle: create -> ``start()`` -> ``consume()``... -> ``shutdown(timeout_s)``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Protocol

from sidecar.model.gpu import GpuView
from sidecar.model.trace import CaptureView
from sidecar.model.window import DaemonTelemetry, IngestReport, SenderView


class WandbStatsLike(Protocol):
    """What a scrape reads of the W&B exporter's ``stats()``
    (``sidecar.exporters.wandb.exporter.WandbStats``)."""

    @property
    def state(self) -> enum.Enum: ...
    @property
    def queue_depth(self) -> int: ...
    @property
    def rows_logged(self) -> int: ...
    @property
    def rows_dropped(self) -> Mapping[str, int]: ...


class ScrapeView(Protocol):
    """What an exporter reads between windows, at scrape time (any thread), read-only; each
    reader returns None where the daemon has no such provider. The daemon's is
    ``sidecar.core.scrape_state.ScrapeState``; ``Unscraped`` reads nothing."""

    @property
    def has_gpus(self) -> bool: ...
    @property
    def has_admin(self) -> bool: ...
    def report(self) -> IngestReport | None: ...
    def gpu_view(self) -> GpuView | None: ...
    def wandb_stats(self) -> WandbStatsLike | None: ...
    def telemetry(self) -> DaemonTelemetry | None: ...
    def explain(self) -> Mapping[str, Any] | None: ...
    def last_capture(self) -> CaptureView | None: ...


class Unscraped:
    """A ``ScrapeView`` with no provider at all (an exporter handed none: tests, benchmarks)."""

    has_gpus = False
    has_admin = False

    def report(self) -> IngestReport | None:
        return None

    def gpu_view(self) -> GpuView | None:
        return None

    def wandb_stats(self) -> WandbStatsLike | None:
        return None

    def telemetry(self) -> DaemonTelemetry | None:
        return None

    def explain(self) -> Mapping[str, Any] | None:
        return None

    def last_capture(self) -> CaptureView | None:
        return None


class Exporter:
    """A destination of windows. Subclasses override ``consume`` and what else they need.

    ``consume`` and ``hello`` run on the ingest thread and must not block: an exporter that
    does I/O queues (bounded, drops counted) or swaps a reference for its own thread to read.
    An exception from either is logged by the daemon and does not reach the other exporters.
    """

    name = "exporter"
    """Short name for logs."""

    def start(self) -> None:
        """Acquire resources (bind a port, start a thread). Raises with a message that says what
        to fix (``OSError`` for a port that cannot be bound)."""

    def consume(self, report: IngestReport) -> None:
        """Take one window's report (``report.window`` is the window itself; immutable: the same
        object goes to every exporter)."""

    def hello(self, view: SenderView) -> None:
        """A trainer said hello (``view``: the sender's view; ``view.hello``: its fields as sent,
        ``wandb_run_id``, ``pid``, ...)."""

    def reload(self, settings: Any) -> None:
        """New settings (a config reload; ``settings``: ``sidecar.core.config.Config``, which is every
        exporter's own section): take the reloadable ones (none by default)."""

    def shutdown(self, timeout_s: float) -> None:
        """Flush what is buffered and release everything within ``timeout_s`` seconds.
        Idempotent, and safe without ``start``."""
