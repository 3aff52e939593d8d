"""The daemon's side of profiler captures, once per window (a fan-out listener on the ingest thread):

- a capture newly kept in the state folder (``dflash-sidecar trace``, or an automatic one) goes to
  W&B once, as a row of its figures (``exporters.wandb.capture_row``);
- **automatic captures** (off by default): one capture when the verdict changes
  (``--capture-on-verdict-change``) or when a role's step time moves by more than a set share
  from the step time of the last capture (``--capture-on-step-change``), at most once per
  ``--capture-period``; each is logged with why it was taken, and the reason is kept with it.

A capture is asked and waited for on a thread of its own (``core.capture_request``): the ingest
thread never waits. One at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sidecar.core.capture_request import TraceError, capture_one, live_trainers
from sidecar.core.captures import LatestCapture
from sidecar.exporters.wandb.capture_row import capture_row
from sidecar.model.insight import PipelineInsight
from sidecar.model.settings import setting
from sidecar.model.window import IngestReport, SenderView

log = logging.getLogger("sidecar")

QUIET_VERDICTS = frozenset({"idle", "unknown"})
"""Verdicts a change to or from never triggers a capture (no trainer, or nothing to tell)."""
WAIT_S = 60.0
"""How long an automatic capture waits for its steps."""


@dataclass(frozen=True)
class CaptureSettings:
    """Automatic profiler captures (docs/SHIM.md, "A capture on request")."""

    TITLE: ClassVar[str] = "automatic captures"
    """The options' group in ``--help`` and the docs."""

    capture_on_verdict_change: bool = setting(
        False, kind="switch", reloadable=True,
        help="Take one profiler capture of a live trainer when the verdict changes (not to or from idle or "
             "unknown), at most once per --capture-period.")
    capture_on_step_change: float = setting(
        0.0, check=float, bounds=(0.0, 10.0), unit="share", metavar="SHARE", reloadable=True,
        help="Take one profiler capture when a role's step time moves by more than this share (0.5: by half) "
             "from its step time at the last capture, at most once per --capture-period; 0: never.")
    capture_period_s: float = setting(
        3600.0, check=float, bounds=(60.0, 7 * 86400.0), unit="seconds", metavar="S", reloadable=True,
        help="The least time between two automatic captures (seconds).")
    capture_steps: int = setting(
        3, check=int, bounds=(1, 20), unit="steps", metavar="N", reloadable=True,
        help="Steps an automatic capture takes.")


class CaptureWatch:
    """The fan-out listener (see the module docstring)."""

    name = "captures"

    def __init__(self, state_dir: Path, endpoints: tuple[str, ...], settings: CaptureSettings, host: str,
                 wandb: Any = None) -> None:
        """``wandb``: the W&B exporter (its ``submit``), or None."""
        self._state_dir, self._endpoints, self.settings, self._host = state_dir, endpoints, settings, host
        self._wandb = wandb
        self._latest = LatestCapture(state_dir)
        self._started_unix_s = time.time()
        self._told: float | None = None
        self._verdict: str | None = None
        self._step_ref: dict[str, float] = {}
        self._last_auto: float | None = None
        self._thread: threading.Thread | None = None
        self.taken: list[str] = []
        """Why each automatic capture was taken (the reasons, oldest first; at most 100 kept)."""

    def consume(self, report: IngestReport) -> None:
        self._tell_wandb(report)
        why = self._why(report.insight) if report.insight is not None else None
        if why is not None:
            self._take(why)

    def hello(self, view: SenderView) -> None:
        """Hellos change nothing here."""

    def reload(self, settings: CaptureSettings) -> None:
        """A SIGHUP's settings (``Config`` is a ``CaptureSettings``): every one of them applies at once."""
        self.settings = settings

    def _tell_wandb(self, report: IngestReport) -> None:
        view = self._latest.view()
        if view is None or view.ended_unix_s == self._told:
            return
        self._told = view.ended_unix_s
        if self._wandb is not None and view.ended_unix_s >= self._started_unix_s:  # not one from before the daemon
            row = {f"{self._host}/{key}": value for key, value in capture_row(view).items()}
            self._wandb.submit(row, report.window.trainer_step)

    def _why(self, insight: PipelineInsight) -> str | None:
        """Why a capture is due now, or None (the references move on either way)."""
        s = self.settings
        verdict, previous = insight.verdict.name, self._verdict
        self._verdict = verdict
        why = None
        if (s.capture_on_verdict_change and previous is not None and verdict != previous
                and not {verdict, previous} & QUIET_VERDICTS):
            why = f"the verdict changed from {previous} to {verdict}"
        for role, r in sorted(insight.roles.items()):
            if r.batches_per_s <= 0:
                continue
            step_s = r.workers / r.batches_per_s  # per worker: each worker's batches are its steps
            ref = self._step_ref.setdefault(role, step_s)
            if why is None and s.capture_on_step_change > 0 and abs(step_s / ref - 1.0) > s.capture_on_step_change:
                why = f"the {role} step time moved from {ref * 1e3:.1f} ms to {step_s * 1e3:.1f} ms"
        if why is None:
            return None
        if self._last_auto is not None and time.monotonic() - self._last_auto < s.capture_period_s:
            return None
        if self._thread is not None and self._thread.is_alive():
            return None
        for role, r in insight.roles.items():  # the step time at this capture is the next reference
            if r.batches_per_s > 0:
                self._step_ref[role] = r.workers / r.batches_per_s
        return why

    def _take(self, why: str) -> None:
        self._last_auto = time.monotonic()
        self.taken = [*self.taken[-99:], why]
        log.info("sidecar: automatic capture: %s", why)
        self._thread = threading.Thread(target=self._capture, args=(why,), name="sidecar-capture", daemon=True)
        self._thread.start()

    def _capture(self, why: str) -> None:
        """On the capture's thread: ask the first live trainer that answers, keep its capture."""
        try:
            trainers = live_trainers(self._endpoints)
        except TraceError as exc:
            log.warning("sidecar: automatic capture (%s) not taken: %s", why, exc)
            return
        for t in trainers:
            try:
                kept = capture_one(t, self.settings.capture_steps, None, None, WAIT_S, self._state_dir,
                                   why=f"automatic: {why}")
            except TraceError as exc:
                log.info("sidecar: automatic capture (%s): %s", why, exc)
                continue
            except OSError as exc:
                log.warning("sidecar: automatic capture (%s) failed: %s", why, exc)
                return
            log.info("sidecar: automatic capture of %s kept in %s (%s)", t.label(), kept.trace, why)
            return
        log.warning("sidecar: automatic capture (%s) not taken: no live trainer captured", why)
