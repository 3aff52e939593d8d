"""The one interface between the pipeline and its destinations.

The daemon holds a list of exporters and, for each window, calls ``consume(window)`` on every
one of them from the ingest thread; that is the whole route after aggregation. Lifecycle:
create -> ``start()`` -> ``consume()``... -> ``shutdown(timeout_s)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.model.window import IngestReport


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

    def consume(self, window: IngestReport) -> None:
        """Take one window (immutable; the same object goes to every exporter)."""

    def hello(self, hello: Mapping[str, Any]) -> None:
        """A trainer said hello (its hello fields as sent: ``wandb_run_id``, ``pid``, ...)."""

    def shutdown(self, timeout_s: float) -> None:
        """Flush what is buffered and release everything within ``timeout_s`` seconds.
        Idempotent, and safe without ``start``."""
