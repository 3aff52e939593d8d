"""The run timelines' state files: one per run, in ``timeline/`` beside the run ledger's file.

A run's file is ``timeline/<hash of the run id>.json``, the run id inside it, written atomically
after each window that touched the run (``sidecar.core.ledger_state.save``) and versioned
(``model.timeline.TIMELINE_VERSION``): a file of a newer version, or one that does not parse, is
moved aside (``.newer`` / ``.corrupt``) by the daemon and the run's timeline starts anew; a reader
(``report --html``) leaves it and says what it lacks. At most ``MAX_TIMELINE_RUNS`` files are kept
(the least recently written removed first); each is bounded by ``sidecar.aggregation.timeline``.
A state folder written before timelines were kept has no ``timeline/``: the ledger still reports.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sidecar.aggregation.ledger.facts import WindowFacts
from sidecar.aggregation.ledger.fold import RunLedger
from sidecar.aggregation.timeline import LedgerMark, RunTimelineBook, observe
from sidecar.model.timeline import TIMELINE_VERSION, RunTimeline
from sidecar.model.window import IngestReport

log = logging.getLogger("sidecar")

FOLDER = "timeline"
"""The timelines' folder, in the state folder."""
MAX_TIMELINE_RUNS = 16
"""Runs whose timeline is kept (files and memory); the ledger keeps more runs' totals."""
MAX_FILE_BYTES = 8 * 2**20
"""A timeline file larger than this is not read (a timeline is bounded far below it)."""


def file_of(folder: Path, run: str) -> Path:
    """The file of ``run``'s timeline in ``folder``."""
    return folder / (hashlib.sha256(run.encode()).hexdigest()[:24] + ".json")


def read(folder: Path, run: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(state, problem)``: ``run``'s timeline state in ``folder``; None with ``absent``,
    ``corrupt``, ``newer_version`` or ``unreadable`` when there is none to use."""
    path = file_of(folder, run)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None, "corrupt"
        state = json.loads(path.read_text(), parse_constant=_no_constant)
    except FileNotFoundError:
        return None, "absent"
    except (ValueError, UnicodeDecodeError):
        return None, "corrupt"
    except OSError:
        return None, "unreadable"
    if not _valid(state, run):
        return None, "corrupt"
    if state["version"] > TIMELINE_VERSION:
        return None, "newer_version"
    return state, None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a timeline holds")


def _valid(state: Any, run: str) -> bool:
    """The shape ``RunTimelineBook`` reads: version, run, lists of points with numeric bounds."""
    if not isinstance(state, dict) or not isinstance(state.get("version"), int) or state.get("run") != run:
        return False
    points = [*state.get("recent", []), *state.get("older", [])]
    if not all(isinstance(p, dict) and all(isinstance(p.get(k), (int, float)) for k in ("t0", "t1", "s", "n"))
               and isinstance(p.get("v", {}), dict) and isinstance(p.get("m", {}), dict) for p in points):
        return False
    return isinstance(state.get("events", []), list) and all(
        isinstance(e, list) and len(e) == 4 and isinstance(e[0], (int, float)) for e in state.get("events", []))


def load_view(state_dir: Path, run: str) -> tuple[RunTimeline | None, str | None]:
    """``run``'s timeline read from the state folder ``state_dir`` (a reader: nothing moved),
    or None and why (``read``)."""
    state, problem = read(state_dir / FOLDER, run)
    return (RunTimelineBook(run, state).view(), None) if state is not None else (None, problem)


class TimelineKeeper:
    """The run timelines of the daemon (ingest thread): each run's book loaded from its file when
    the run is first touched, folded window by window, saved when it changed."""

    def __init__(self, folder: Path, save: Callable[[Path, dict[str, Any]], None]) -> None:
        """``folder``: the timelines' folder; ``save(path, state)``: the atomic writer (raises ``OSError``)."""
        self.folder = folder
        self.save = save
        self.books: dict[str, RunTimelineBook] = {}
        """Run -> its book, the most recently touched last (at most ``MAX_TIMELINE_RUNS``)."""
        self.session_begin: float | None = None
        self.errors: dict[str, int] = {}

    def fold(self, ledger: RunLedger, before: LedgerMark, facts: WindowFacts,
             report: IngestReport) -> Mapping[str, RunTimeline]:
        """Fold the window into the touched runs' timelines and save them; returns their views.
        Raises ``OSError`` when a file cannot be written (the others are written first)."""
        if self.session_begin is None:
            self.session_begin = facts.end_unix_s - facts.duration_s
        changed = observe(ledger, before, facts, report, self._book_of)
        failed: OSError | None = None
        for run in sorted(changed):
            try:
                self.save(file_of(self.folder, run), self.books[run].state())
            except OSError as exc:
                failed = exc
        self._bound(changed)
        if failed is not None:
            raise failed
        return {run: self.books[run].view() for run in changed}

    def _book_of(self, run: str) -> RunTimelineBook:
        book = self.books.pop(run, None)
        if book is None:
            state, problem = read(self.folder, run)
            if problem in ("corrupt", "newer_version"):
                self._aside(run, problem)
            book = RunTimelineBook(run, state)
            if state is not None and self.session_begin is not None:
                book.mark(self.session_begin, "daemon", "", "the daemon restarted; it did not watch the time before")
        self.books[run] = book
        return book

    def _aside(self, run: str, problem: str) -> None:
        path = file_of(self.folder, run)
        suffix = ".newer" if problem == "newer_version" else ".corrupt"
        self.errors[f"timeline_load_{problem}"] = self.errors.get(f"timeline_load_{problem}", 0) + 1
        try:
            os.replace(path, path.with_name(path.name + suffix))
        except OSError:
            pass
        log.error("sidecar: run timeline %s of run %s is unusable (%s); moved aside, its timeline starts anew",
                  path, run, problem)

    def _bound(self, changed: set[str]) -> None:
        """At most ``MAX_TIMELINE_RUNS`` books in memory and files on disk (least recent first)."""
        while len(self.books) > MAX_TIMELINE_RUNS:
            del self.books[next(iter(self.books))]
        try:
            files = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
        except OSError:
            return
        keep = {file_of(self.folder, run) for run in changed}
        for path in files[: max(0, len(files) - MAX_TIMELINE_RUNS)]:
            if path not in keep:
                path.unlink(missing_ok=True)
