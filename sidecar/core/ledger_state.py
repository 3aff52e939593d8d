"""The run ledger's state file: where it lives, and reading and writing it safely.

One JSON file, ``run-ledger.json``, in the state folder: ``$STATE_DIRECTORY`` (its first entry)
when systemd sets it, else the ``state_dir`` setting, else ``$XDG_STATE_HOME/dflash-sidecar``
(``~/.local/state/dflash-sidecar``). Written atomically (a temporary file in the same folder,
fsync, rename), with a version (``STATE_VERSION`` and its rule, ``state_problem``, beside the typed record in
``sidecar.aggregation.ledger.record``): a file of a newer version, or one that does
not parse, is moved aside (``.v<N>`` / ``.corrupt``) and the ledger starts empty, so a downgrade or
a torn disk never stops the daemon and never overwrites what a newer daemon wrote. Each run's
timeline is kept beside it, in ``timeline/`` (``sidecar.core.timeline_state``), by the same stage.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from sidecar.aggregation.ledger.facts import window_facts
from sidecar.aggregation.ledger.fold import RunLedger
from sidecar.aggregation.ledger.record import state_problem
from sidecar.aggregation.timeline import ledger_mark
from sidecar.core import timeline_state
from sidecar.model.ledger import RunLedgerView
from sidecar.model.timeline import RunTimeline
from sidecar.model.window import IngestReport

log = logging.getLogger("sidecar")

FILE_NAME = "run-ledger.json"
MAX_STATE_BYTES = 16 * 2**20
"""A state file larger than this is not read (the ledger is bounded far below it)."""


def state_dir(configured: str | None = None) -> Path:
    """The state folder by the rule of the module docstring (not created here)."""
    systemd_dir = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd_dir:
        return Path(systemd_dir)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "dflash-sidecar"


def load(path: Path, move_aside: bool = True) -> tuple[dict[str, object] | None, str | None]:
    """``(state, problem)``: the state of ``path`` (None when absent or unusable) and, when it was
    unusable, why (``corrupt``, ``newer_version``, ``unreadable``); an unusable file is moved aside
    when ``move_aside`` (the daemon's load; a reader such as ``report`` leaves it)."""
    try:
        if path.stat().st_size > MAX_STATE_BYTES:
            return _aside(path, "corrupt", "larger than the ledger can be", move_aside)
        state = json.loads(path.read_text(), parse_constant=_no_constant)
    except FileNotFoundError:
        return None, None
    except (ValueError, UnicodeDecodeError) as exc:
        return _aside(path, "corrupt", str(exc), move_aside)
    except OSError as exc:
        log.error("sidecar: run ledger state %s cannot be read (%s); starting an empty ledger", path, exc)
        return None, "unreadable"
    problem = state_problem(state)
    if problem is not None:
        return _aside(path, *problem, move_aside)
    return state, None


def save(path: Path, state: Mapping[str, object]) -> None:
    """Write ``state`` atomically (readers see the old file or the new one, never a mix).
    Raises ``OSError`` when the folder cannot be created or written."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = json.dumps(state, separators=(",", ":"), allow_nan=False).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a ledger holds")


def _aside(path: Path, why: str, detail: str, move: bool) -> tuple[None, str]:
    if not move:
        return None, why
    suffix = ".corrupt" if why == "corrupt" else ".newer"
    try:
        os.replace(path, path.with_name(path.name + suffix))
    except OSError:
        pass
    log.error("sidecar: run ledger state %s is unusable (%s); moved aside to %s, starting an empty ledger",
              path, detail, path.name + suffix)
    return None, why


class LedgerStage:
    """The pipeline's run-ledger stage: window -> window with the ledger's totals after it
    (``IngestReport.run_ledger``), the state saved after each window (ingest thread). A failure
    to load, update or save is counted by reason and logged once; the ledger never stops the
    other exports (its part is None where the update failed)."""

    def __init__(self, path: Path, flops_per_token: float | None, run_gap_s: float) -> None:
        self.path = path
        self.flops_per_token = flops_per_token
        self.run_gap_s = run_gap_s
        self.errors: dict[str, int] = {}
        """Reason -> failed loads, saves or window updates of the run ledger."""
        self.ledger = RunLedger(None, flops_per_token, run_gap_s)
        self.timeline = timeline_state.TimelineKeeper(path.parent / timeline_state.FOLDER, save)
        """Each run's timeline beside the ledger (``sidecar.core.timeline_state``)."""

    def load(self) -> None:
        """Continue from the state file (an unusable one is moved aside, counted)."""
        state, problem = load(self.path)
        if problem:
            self._error(f"load_{problem}")
        try:
            self.ledger = RunLedger(state, self.flops_per_token, self.run_gap_s)
        except (TypeError, ValueError, KeyError, AttributeError):
            self._error("load_corrupt")
            self.ledger = RunLedger(None, self.flops_per_token, self.run_gap_s)
        if state is not None:
            log.info("dflash-sidecar: run ledger continued from %s (%d runs)", self.path, len(self.ledger.runs))

    def __call__(self, report: IngestReport) -> IngestReport:
        view, timelines = self.view_after(report)
        return dataclasses.replace(report, run_ledger=view, timelines=timelines)

    def view_after(self, report: IngestReport) -> tuple[RunLedgerView | None, Mapping[str, RunTimeline]]:
        """Fold the window into the ledger and the touched runs' timelines and save them; the
        ledger's view (None if the update failed) and the touched runs' timelines."""
        try:
            before = ledger_mark(self.ledger)
            facts = window_facts(report)
            self.ledger.add(facts)
        except Exception:  # noqa: BLE001
            self._error("update_failed", exc_info=True)
            return None, {}
        try:
            save(self.path, self.ledger.state())
        except OSError as exc:
            self._error("save_failed", detail=f"{self.path}: {exc}")
        timelines: Mapping[str, RunTimeline] = {}
        try:
            timelines = self.timeline.fold(self.ledger, before, facts, report)
        except OSError as exc:
            self._error("timeline_save_failed", detail=f"{self.timeline.folder}: {exc}")
        except Exception:  # noqa: BLE001  (the timeline never costs the ledger its window)
            self._error("timeline_update_failed", exc_info=True)
        return self.ledger.view({**self.errors, **self.timeline.errors}), timelines

    def _error(self, reason: str, detail: str = "", exc_info: bool = False) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1
        if self.errors[reason] == 1:
            log.error("sidecar: run ledger %s (counted, logged once)%s", reason.replace("_", " "),
                      f": {detail}" if detail else "", exc_info=exc_info)
