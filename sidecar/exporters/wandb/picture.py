"""The run's picture as a W&B HTML panel: ``report --html``'s page (``sidecar.exporters.html``),
logged into the run when its last senders end (a window with an end and no live sender), and
when the W&B exporter leaves the run (the daemon stops, or the trainer announces another run) if
the run went on since, under ``sidecar/<host>/run_picture`` (``PICTURE_KEY``).

``RunPicture.keep`` runs on the ingest thread (each window: it only keeps references to the
window's immutable ledger view and timelines); ``RunPicture.page`` on the exporter thread, once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.exporters.html.render import render
from sidecar.model.ledger import RunLedgerView
from sidecar.model.timeline import RunTimeline
from sidecar.model.window import IngestReport

PICTURE_KEY = "run_picture"
"""The panel's key, under ``sidecar/<host>/`` (``keys.KEY_SCHEME`` lists it)."""
MAX_TIMELINES = 8
"""Runs whose latest timeline is kept (the exporter writes into one run at a time)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a page is drawn from: the ledger view and the runs' timelines at one window, and the
    count of windows that had touched a run by then."""

    ledger: RunLedgerView | None
    timelines: Mapping[str, RunTimeline]
    touched: int


class RunPicture:
    """The latest ledger view and each run's latest timeline, for the page at the run's end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = Snapshot(None, {}, 0)
        self._drawn = -1
        """``Snapshot.touched`` of the last page made."""

    def keep(self, report: IngestReport) -> Snapshot:
        """Remember the window's ledger view and the timelines of the runs it touched; returns
        the snapshot after it (to draw the page as of this window later)."""
        with self._lock:
            now = self._now
            timelines = dict(now.timelines)
            for run, timeline in report.timelines.items():
                timelines.pop(run, None)
                timelines[run] = timeline
            while len(timelines) > MAX_TIMELINES:
                del timelines[next(iter(timelines))]
            self._now = Snapshot(report.run_ledger or now.ledger, timelines, now.touched + bool(report.timelines))
            return self._now

    def page(self, run: str | None, at: Snapshot | None = None, only_new: bool = False) -> str | None:
        """The page of ``run`` (the trainer's W&B run id: the run ledger's run when the trainer
        announced it), else of the ledger's most recent run (a W&B run named by the daemon's
        ``wandb_run`` setting: its trainers' run is the host's or the launcher's), as of ``at``
        (default: the latest window); None without a ledger, and with ``only_new`` when no window
        touched a run since the last page."""
        with self._lock:
            snap = at or self._now
            if only_new and snap.touched == self._drawn:
                return None
            self._drawn = snap.touched
        ledger = snap.ledger
        if ledger is None or not ledger.runs:
            return None
        chosen = run if run is not None and ledger.run(run) else ledger.runs[-1]
        timeline = snap.timelines.get(chosen)
        return render(chosen, ledger, timeline, None if timeline is not None else "absent")
