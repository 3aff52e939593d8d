"""The run's picture as a W&B HTML panel: ``report --html``'s page (``sidecar.exporters.html``),
logged once into the run when the W&B exporter leaves it (the daemon stops, or the trainer
announces another run), under ``sidecar/<host>/run_picture`` (``PICTURE_KEY``).

``RunPicture.keep`` runs on the ingest thread (each window: it only keeps references to the
window's immutable ledger view and timelines); ``RunPicture.page`` on the exporter thread, once.
"""

from __future__ import annotations

import threading

from sidecar.exporters.html.render import render
from sidecar.model.ledger import RunLedgerView
from sidecar.model.timeline import RunTimeline
from sidecar.model.window import IngestReport

PICTURE_KEY = "run_picture"
"""The panel's key, under ``sidecar/<host>/`` (``keys.KEY_SCHEME`` lists it)."""
MAX_TIMELINES = 8
"""Runs whose latest timeline is kept (the exporter writes into one run at a time)."""


class RunPicture:
    """The latest ledger view and each run's latest timeline, for the page at the run's end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ledger: RunLedgerView | None = None
        self._timelines: dict[str, RunTimeline] = {}

    def keep(self, window: IngestReport) -> None:
        """Remember the window's ledger view and the timelines of the runs it touched."""
        with self._lock:
            if window.run_ledger is not None:
                self._ledger = window.run_ledger
            for run, timeline in window.timelines.items():
                self._timelines.pop(run, None)
                self._timelines[run] = timeline
            while len(self._timelines) > MAX_TIMELINES:
                del self._timelines[next(iter(self._timelines))]

    def page(self, run: str | None) -> str | None:
        """The page of ``run`` (the trainer's W&B run id: the run ledger's run when the trainer
        announced it), else of the ledger's most recent run (a W&B run named by the daemon's
        ``wandb_run`` setting: its trainers' run is the host's or the launcher's); None without a ledger."""
        with self._lock:
            ledger, timelines = self._ledger, dict(self._timelines)
        if ledger is None or not ledger.runs:
            return None
        chosen = run if run is not None and ledger.run(run) else ledger.runs[-1]
        timeline = timelines.get(chosen)
        return render(chosen, ledger, timeline, None if timeline is not None else "absent")
