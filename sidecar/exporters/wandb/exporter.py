"""W&B exporter: writes the sidecar's rows into the trainer's W&B run without disturbing it.

The one module of the daemon that imports ``wandb``, and only lazily, on the exporter's own
thread: the daemon starts fast and works without W&B. Everything the caller touches
(``consume`` and ``submit``, ``hello`` and ``on_trainer_hello``, ``stats``, ``shutdown``)
returns at once or within its stated timeout, whatever W&B does; the wandb calls (which can
block for seconds when the wandb service stalls) happen behind a bounded queue whose drops are
counted by reason.

How the run is chosen and why (shared mode, refusal, offline fallback): ``join``.
Users' page: ``docs/WANDB.md``.
"""

from __future__ import annotations

import enum
import importlib
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from sidecar.exporters.base import Exporter
from sidecar.exporters.wandb import join
from sidecar.exporters.wandb.ends_row import ALERT_EVERY_S, AlertLimiter
from sidecar.exporters.wandb.join import Plan, PlanKind, TrainerRun
from sidecar.exporters.wandb.picture import PICTURE_KEY, RunPicture, Snapshot
from sidecar.exporters.wandb.rows import window_row
from sidecar.exporters.wandb.settings import QUEUE, RUN, WandbSettings
from sidecar.model.backoff import Backoff
from sidecar.model.window import IngestReport, SenderView

POLL_S: Final = 0.2
"""How often the idle exporter thread looks for a new target run (seconds)."""
RETRY_MIN_S: Final = 5.0
RETRY_MAX_S: Final = 300.0
"""Back-off between failed attempts to start logging (seconds, doubling)."""
MAX_SEEN_RUNS: Final = 64


class WandbState(str, enum.Enum):
    """``WandbStats.state``."""

    DISABLED = "disabled"
    WAITING = "waiting-for-run"
    ATTACHED = "attached"
    """Writing into the trainer's run (shared mode)."""
    REFUSED = "refused"
    OFFLINE = "offline"
    """Writing into the sidecar's own offline run, grouped with the trainer's run."""
    ERROR = "error"
    """The last attempt to start logging (or to log) failed; retried with back-off."""


@dataclass(frozen=True)
class WandbConfig:
    """Configuration of the W&B exporter."""

    run: str | None
    """A W&B run id to join, ``"auto"`` (follow the run id the trainer's shim announces), or
    ``None``: W&B export disabled."""
    project: str | None = None
    """W&B project; falls back to the trainer's announced project, then ``WANDB_PROJECT``."""
    entity: str | None = None
    """W&B entity; falls back to the trainer's announced entity, then ``WANDB_ENTITY``."""
    queue_size: int = QUEUE.default
    """Rows held while W&B is slow or not yet attached; further rows are dropped and counted."""
    shutdown_timeout_s: float = 5.0
    """Longest ``shutdown()`` waits to flush and close (seconds)."""
    offline: bool = False
    """Log to the sidecar's own offline run even when W&B is reachable (as ``WANDB_MODE=offline``
    in the daemon's environment does)."""
    dir: str | None = None
    """Directory under which wandb writes its ``wandb/`` run folders; default ``WANDB_DIR``,
    then ``$STATE_DIRECTORY`` (systemd), then the working directory."""

    @classmethod
    def from_settings(cls, settings: WandbSettings, **rest: Any) -> WandbConfig:
        """The exporter's configuration from the daemon's W&B settings; ``rest``: the other fields."""
        return cls(run=settings.wandb_run, project=settings.wandb_project, entity=settings.wandb_entity,
                   queue_size=settings.wandb_queue, **rest)

    def validate(self) -> None:
        """Raise ``ValueError`` with a clear message for an unusable configuration: the run id and
        queue size are checked by their settings' declarations (``settings``)."""
        if self.run is not None:
            try:
                RUN.check(self.run)
            except ValueError as exc:
                raise ValueError(f"--wandb-run: {self.run!r}: {exc}") from None
        QUEUE.parse(self.queue_size)
        if self.shutdown_timeout_s < 0:
            raise ValueError(f"W&B shutdown_timeout_s must be >= 0, got {self.shutdown_timeout_s}")


@dataclass(frozen=True)
class WandbStats:
    """A snapshot of the exporter, for self-telemetry."""

    state: WandbState
    reason: str
    run_id: str | None
    """The run rows go to: the trainer's (attached) or the sidecar's own (offline)."""
    trainer_run_id: str | None
    queue_depth: int
    queue_capacity: int
    rows_logged: int
    rows_dropped: Mapping[str, int] = field(default_factory=dict)
    """Rows dropped, by reason: ``queue_full``, ``disabled``, ``refused``, ``shutdown``,
    ``log_error``."""
    values_skipped: int = 0
    """Row values that were not numbers."""
    last_error: str | None = None
    busy_s: float = 0.0
    """How long the wandb call in progress has been running (0 when idle): a growing value
    means the wandb service is stalled."""


class _Item(NamedTuple):
    generation: int
    """The target (see ``WandbExporter._target``) current when the row was submitted."""
    plan: Plan
    row: dict[str, Any]
    step: int | None
    alerts: tuple[tuple[str, str], ...] = ()
    """``(title, text)`` of the W&B alerts to raise with the row (``ends_row.AlertLimiter``)."""
    picture: Snapshot | None = None
    """Log the run's picture as of this snapshot after the row (``picture.RunPicture``): its last
    senders ended."""


_LOGGING: Final = frozenset({PlanKind.SHARED, PlanKind.OFFLINE})


class WandbExporter(Exporter):
    """Bounded-queue W&B writer; see the module docstring. Thread-safe."""

    name = "wandb"

    def __init__(self, config: WandbConfig, host: str, log: logging.Logger | None = None,
                 environ: Mapping[str, str] | None = None, *, own_run: Callable[[object], None] | None = None) -> None:
        """``environ``: where the W&B variables are read (default ``os.environ``). ``own_run``:
        told each W&B run this exporter starts, before its first row, so that a logger tap in
        this process never forwards the sidecar's own rows back to it (the daemon hands the
        shim's ``trainer_shim.integrations.tap_targets.exclude``: the shim keeps what its taps
        skip; None: nothing to tell). Raises ``ValueError`` for an invalid ``config``."""
        config.validate()
        self._own_run = own_run
        self._config = config
        self._host = host
        self._log = log or logging.getLogger("sidecar.wandb")
        self._environ = dict(os.environ if environ is None else environ)
        self._mode = join.daemon_mode(self._environ, config.offline)
        self._project = config.project or self._environ.get("WANDB_PROJECT") or None
        self._entity = config.entity or self._environ.get("WANDB_ENTITY") or None
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=config.queue_size)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._final = False  # shutdown() has finished: the state no longer changes
        self._deadline = float("inf")
        # desired target, under _lock
        self._trainer: TrainerRun | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._target: tuple[int, Plan] = (1, self._decide())
        """(generation, plan): replaced as a whole, so that ``submit`` reads it without a lock;
        the generation grows with every new plan."""
        # published state, under _lock
        self._state = WandbState.DISABLED
        self._reason = self._target[1].reason
        self._dropped: Counter[str] = Counter()
        self._last_error: str | None = None
        self._logged = 0
        self._skipped = 0
        self._busy_since: float | None = None
        self._run_id: str | None = None
        self._publish_plan(self._target[1])
        # exporter thread only
        self._run: Any = None
        self._run_generation = 0
        self._run_plan: Plan = Plan(PlanKind.WAIT)
        self._axis_defined = False
        self._pending: _Item | None = None
        self._retry_at = 0.0
        self._backoff = Backoff(RETRY_MIN_S, RETRY_MAX_S)
        self._alerts = AlertLimiter()
        self._picture = RunPicture()

    # ---- caller side ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the exporter thread and return at once. A no-op when disabled or started."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            plan = self._target[1]
            if plan.kind is PlanKind.DISABLED:
                self._log.info("W&B: %s", plan.reason)
                return
            self._thread = threading.Thread(target=self._main, name="sidecar-wandb", daemon=True)
        self._prepare_environ()
        cred = join.credential_source(self._environ)
        self._log.info("W&B exporter starting: run=%s mode=%s credentials=%s", self._config.run,
                       self._mode, cred or ("none found" if self._mode == "online" else "n/a"))
        if cred is None and self._mode == "online":
            self._log.warning(
                "W&B: %s. Meanwhile everything else runs (Prometheus, the run ledger, the console); the W&B "
                "exporter retries joining %s every %.0f s, backing off to every %.0f s, and holds up to %d rows "
                "until it joins (beyond, rows are dropped, counted in dflash_sidecar_wandb_dropped_total"
                "{reason=\"queue_full\"})", join.NO_CREDENTIALS,
                "the run the trainer announces" if self._config.run == "auto" else f"run {self._config.run}",
                RETRY_MIN_S, RETRY_MAX_S, self._config.queue_size)
        self._log.info("W&B: %s", plan.reason)
        self._thread.start()

    def submit(self, row: Mapping[str, float], trainer_step: int | None,
               alerts: tuple[tuple[str, str], ...] = (), picture: Snapshot | None = None) -> bool:
        """Queue one flat row (keys without the ``sidecar/`` prefix) logged against
        ``trainer_step`` when known, the ``(title, text)`` alerts to raise after it, and whether
        the run's picture to log after it (``picture``: as of a ``RunPicture.keep``). Never
        blocks; returns False when the row is dropped (counted by reason in
        ``stats().rows_dropped``; its alerts with it)."""
        state = self._state
        if self._closed:
            return self._drop("shutdown")
        if state is WandbState.DISABLED or self._thread is None:
            return self._drop("disabled")
        if state is WandbState.REFUSED:
            return self._drop("refused")
        try:
            self._queue.put_nowait(_Item(*self._target, dict(row), trainer_step, alerts, picture))
        except queue.Full:
            return self._drop("queue_full")
        return True

    def consume(self, report: IngestReport) -> None:
        """Queue the window's row (``rows.window_row``) against the trainer's step, with an alert
        for each end that loses records (``ends_row.AlertLimiter``), and the run's picture when
        its last senders ended in it (none live after an end)."""
        alerts = tuple(self._alerts.alerts(report.ends, self._host, time.monotonic())) if report.ends.new else ()
        kept = self._picture.keep(report)
        ended = bool(report.ends.new) and not report.live_senders
        self.submit(window_row(report, self._host), report.window.trainer_step, alerts, kept if ended else None)

    def hello(self, view: SenderView) -> None:
        """A shim hello: what it says about the trainer's W&B run (``on_trainer_hello``)."""
        hello = view.hello or {}
        self.on_trainer_hello(hello.get("wandb_run_id"), hello.get("wandb_project"), hello.get("wandb_entity"),
                              hello.get("wandb_mode"), hello.get("wandb_primary"))

    def on_trainer_hello(self, run_id: str | None, project: str | None, entity: str | None,
                         mode: str | None, primary: bool | None) -> None:
        """Take note of what a shim hello says about the trainer's W&B run. Cheap; call it for
        every hello. In auto mode a run id never announced before becomes the new target (the
        exporter leaves the old run and joins the new one); a run id seen before never takes
        the target back, so two trainers announcing themselves cannot make it flap."""
        if not run_id or self._config.run is None:
            return
        hello = TrainerRun(run_id, project or None, entity or None, mode or None, primary)
        previous: str | None = None
        with self._lock:
            current = self._trainer
            if self._config.run == "auto" and run_id not in self._seen:
                self._seen[run_id] = None
                if len(self._seen) > MAX_SEEN_RUNS:
                    self._seen.popitem(last=False)
                previous, current = (current.run_id if current else None), None
            elif current is None or current.run_id != run_id:
                if self._config.run == "auto" or run_id != self._config.run:
                    return
            self._trainer = _merge(current, hello)
            plan = self._decide()
            if plan == self._target[1]:
                return
            self._target = (self._target[0] + 1, plan)
            self._publish_plan(plan)
        self._wake.set()
        if previous is not None:
            self._log.info("W&B: trainer announced a new run %s (was %s)", run_id, previous)
        level = logging.WARNING if plan.kind is PlanKind.REFUSE else logging.INFO
        self._log.log(level, "W&B: %s", plan.reason)

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Flush what can be flushed within ``timeout_s`` (default ``shutdown_timeout_s``) and
        close; returns within ``timeout_s`` + 1.5 s. Idempotent, safe without ``start()``.
        Never marks the trainer's run finished. When the wandb service does not answer in
        time, the exporter gives up on it: it stops the wandb-core process it started, so that
        the daemon's exit cannot hang on it either."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            timeout = self._config.shutdown_timeout_s if timeout_s is None else max(0.0, timeout_s)
            self._deadline = time.monotonic() + timeout
            thread = self._thread
        self._stop.set()
        self._wake.set()
        if thread is None:
            self._set_state(WandbState.DISABLED, "shut down")
            self._final = True
            return
        thread.join(timeout)
        if thread.is_alive():
            self._abandon(thread)
        self._drain("shutdown", held=not thread.is_alive())
        self._set_state(WandbState.DISABLED, "shut down")
        self._final = True
        self._log.info("W&B exporter stopped: %d rows logged, dropped %s", self._logged,
                       dict(self._dropped) or "none")

    def stats(self) -> WandbStats:
        """A consistent snapshot of the exporter's state and counters."""
        with self._lock:
            busy = 0.0 if self._busy_since is None else time.monotonic() - self._busy_since
            return WandbStats(
                state=self._state, reason=self._reason, run_id=self._run_id,
                trainer_run_id=self._target[1].run_id, queue_depth=self._queue.qsize(),
                queue_capacity=self._config.queue_size, rows_logged=self._logged,
                rows_dropped=dict(self._dropped), values_skipped=self._skipped,
                last_error=self._last_error, busy_s=busy)

    # ---- bookkeeping ---------------------------------------------------------------------

    def _decide(self) -> Plan:
        return join.decide(self._config.run, self._trainer, mode=self._mode,
                           project=self._project, entity=self._entity)

    def _publish_plan(self, plan: Plan) -> None:
        """Reflect a new plan in the published state (under ``_lock`` or before start); the
        exporter thread moves it on to attached/offline/error."""
        state = {PlanKind.DISABLED: WandbState.DISABLED, PlanKind.REFUSE: WandbState.REFUSED}
        self._state, self._reason = state.get(plan.kind, WandbState.WAITING), plan.reason

    def _set_state(self, state: WandbState, reason: str, error: str | None = None) -> None:
        with self._lock:
            if self._final:
                return
            self._state, self._reason = state, reason
            if error is not None:
                self._last_error = error

    def _drop(self, reason: str, n: int = 1) -> bool:
        with self._lock:
            self._dropped[reason] += n
        return False

    def _drain(self, reason: str, held: bool = True) -> None:
        """Count every queued row (and, when ``held``, the row the thread holds) as dropped for
        ``reason``."""
        n = 0
        if held and self._pending is not None:
            n, self._pending = 1, None
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            n += 1
        if n:
            self._drop(reason, n)

    def _prepare_environ(self) -> None:
        """Remove inherited run-scoped ``WANDB_*`` variables from the process environment,
        which ``wandb`` reads itself and passes to the service it spawns."""
        _, removed = join.clean_environ(os.environ)
        for name in removed:
            os.environ.pop(name, None)
        if removed:
            self._log.info("W&B: removed from the environment wandb sees (run-scoped, or set "
                           "by the exporter itself): %s", ", ".join(removed))

    def _wandb_dir(self) -> str | None:
        """Where wandb puts its ``wandb/`` folder (created if missing; ``None``: the working
        directory). ``$STATE_DIRECTORY`` may list several directories: the first is used."""
        path = (self._config.dir or self._environ.get("WANDB_DIR")
                or self._environ.get("STATE_DIRECTORY", "").split(":")[0] or None)
        if path:
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:  # wandb falls back to a temporary directory and says so
                self._log.warning("W&B: cannot create %s: %s", path, exc)
        return path

    # ---- exporter thread -----------------------------------------------------------------

    def _main(self) -> None:
        try:
            wandb = importlib.import_module("wandb")
        except Exception as exc:  # noqa: BLE001 - any import failure disables the exporter
            self._set_state(WandbState.ERROR, "the wandb package cannot be imported",
                            error=repr(exc))
            self._log.error("W&B: cannot import wandb (%r); W&B export is off", exc)
            return
        try:
            self._loop(wandb)
            self._flush_and_close(wandb)
        except Exception as exc:  # noqa: BLE001 - never let the thread die silently
            msg = join.redact(repr(exc), self._environ)
            self._set_state(WandbState.ERROR, "exporter thread failed", error=msg)
            self._log.error("W&B exporter thread failed: %s", msg)

    def _loop(self, wandb: Any) -> None:
        """Log rows in order, each into the run that was the target when it was submitted;
        follow a new target once no row for an earlier one is waiting."""
        while not self._stop.is_set():
            if self._pending is None:
                try:
                    self._pending = self._queue.get(timeout=POLL_S)
                except queue.Empty:
                    pass
            item = self._pending
            generation, plan = self._target
            if item is not None and item.generation > self._run_generation \
                    and item.plan.kind in _LOGGING:
                self._switch(wandb, item.plan, item.generation)
            elif generation != self._run_generation and (
                    item is None or item.plan.kind not in _LOGGING or self._run is None):
                self._switch(wandb, plan, generation)
            elif self._run is None and self._run_plan.kind in _LOGGING \
                    and time.monotonic() >= self._retry_at:
                self._switch(wandb, self._run_plan, self._run_generation)  # retry
            if item is None:
                continue
            if self._run is not None:
                self._pending = None
                self._log_row(item)
            elif self._run_plan.kind in (PlanKind.REFUSE, PlanKind.DISABLED):
                self._pending = None
                self._drop("refused" if self._run_plan.kind is PlanKind.REFUSE else "disabled")
            else:
                self._wake.wait(POLL_S)  # hold the row until a run is attached
                self._wake.clear()

    def _switch(self, wandb: Any, plan: Plan, generation: int) -> None:
        """Leave the current run (if any) and carry out ``plan``."""
        self._close_run()
        self._run_generation, self._run_plan = generation, plan
        if plan.kind not in _LOGGING:
            return  # state already published by on_trainer_hello / __init__
        settings_kw = (join.shared_join_settings(self._host) if plan.kind is PlanKind.SHARED
                       else join.offline_run_settings(self._host))
        try:
            settings = wandb.Settings(**settings_kw)
            run = self._call(wandb.init, settings=settings,
                             **join.init_kwargs(plan, self._host, self._wandb_dir()))
        except Exception as exc:  # noqa: BLE001 - network, auth, disk: all retried
            msg = join.redact(f"{type(exc).__name__}: {exc}", self._environ)
            self._set_state(WandbState.ERROR, f"could not start logging for run {plan.run_id}; "
                            f"retrying in {self._backoff.delay_s:.0f} s", error=msg)
            self._log.warning("W&B: could not start logging for run %s (%s); retrying in %.0f s",
                              plan.run_id, msg, self._backoff.delay_s)
            _quiet_teardown()  # the failed run stays registered in the service: start afresh
            self._retry_at = time.monotonic() + self._backoff.failed()
            return
        if self._own_run is not None:
            self._own_run(run)  # a tapped wandb.log in this process must not send our rows back
        self._run, self._axis_defined = run, False
        self._backoff.reset()
        with self._lock:
            self._run_id = run.id
        if plan.kind is PlanKind.SHARED:
            self._set_state(WandbState.ATTACHED, f"writing into run {plan.run_id} (shared mode)")
            self._log.info("W&B: joined run %s as %s/sidecar", plan.run_id, self._host)
        else:
            self._set_state(WandbState.OFFLINE, f"writing into own offline run {run.id} "
                            f"grouped with {plan.run_id}")
            self._log.info("W&B: offline run %s grouped with %s in %s", run.id, plan.run_id,
                           getattr(run.settings, "sync_dir", "?"))

    def _log_row(self, item: _Item) -> None:
        row, skipped = join.prefixed(item.row, item.step)
        try:
            if not self._axis_defined and item.step is not None:
                self._call(self._run.define_metric, join.STEP_KEY)
                self._call(self._run.define_metric, join.KEY_PREFIX + "*",
                           step_metric=join.STEP_KEY)
                self._axis_defined = True
            self._call(self._run.log, row)
        except Exception as exc:  # noqa: BLE001 - the service died or refused the row
            msg = join.redact(f"{type(exc).__name__}: {exc}", self._environ)
            self._drop("log_error")
            self._set_state(WandbState.ERROR, "logging failed; starting over", error=msg)
            if self._stop.is_set():
                self._log.info("W&B: logging failed while shutting down (%s)", msg)
            else:
                self._log.warning("W&B: logging failed (%s); starting over in %.0f s", msg,
                                  self._backoff.delay_s)
            self._close_run()
            _quiet_teardown()  # the service is likely gone: the next attempt starts a new one
            self._retry_at = time.monotonic() + self._backoff.delay_s  # a failed log: no doubling
            return
        with self._lock:
            self._logged += 1
            self._skipped += skipped
        for title, text in item.alerts:
            self._alert(title, text)
        if item.picture is not None:
            self._log_picture(self._run, item.picture)

    def _alert(self, title: str, text: str) -> None:
        """Raise one W&B alert (``WARN``); a failure is counted (``alert_error``) and logged."""
        try:
            self._call(self._run.alert, title=title, text=text, level="WARN", wait_duration=ALERT_EVERY_S)
        except Exception as exc:  # noqa: BLE001 - the row is logged; an alert the service refuses is not fatal
            self._drop("alert_error")
            self._log.warning("W&B: alert %r failed (%s)", title, join.redact(repr(exc), self._environ))

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one wandb call, publishing how long it has been running (``busy_s``)."""
        with self._lock:
            self._busy_since = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            with self._lock:
                self._busy_since = None

    def _close_run(self) -> None:
        """Finish the sidecar's writer. In shared mode ``x_update_finish_state=False`` keeps
        this from marking the trainer's run finished."""
        run, self._run = self._run, None
        with self._lock:
            self._run_id = None
        if run is None:
            return
        self._log_picture(run, None, only_new=True)
        try:
            self._call(run.finish)
        except Exception as exc:  # noqa: BLE001 - best effort
            self._log.warning("W&B: closing run %s failed: %s", getattr(run, "id", "?"),
                              join.redact(repr(exc), self._environ))

    def _log_picture(self, run: Any, at: Snapshot | None, only_new: bool = False) -> None:
        """Log the run's picture (``picture.RunPicture``) into ``run`` as an HTML panel (when its
        last senders ended, and on leaving it if the run went on since: ``only_new``); a failure is
        counted (``picture_error``) and logged."""
        try:
            page = self._picture.page(self._run_plan.run_id, at, only_new)
            if page is not None:
                html = importlib.import_module("wandb").Html(page, inject=False)  # inject would fetch a stylesheet
                self._call(run.log, {join.KEY_PREFIX + self._host + "/" + PICTURE_KEY: html})
        except Exception as exc:  # noqa: BLE001 - the rows are logged; a refused panel is not fatal
            self._drop("picture_error")
            self._log.warning("W&B: the run's picture failed (%s)", join.redact(repr(exc), self._environ))

    def _flush_and_close(self, wandb: Any) -> None:
        """On shutdown: log queued rows while time allows (half the timeout; the rest is for
        closing), count the others dropped, close the run and stop the wandb service."""
        flush_until = time.monotonic() + max(0.0, self._deadline - time.monotonic()) / 2
        while self._run is not None and time.monotonic() < flush_until:
            item = self._pending
            self._pending = None
            if item is None:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            self._log_row(item)
        self._drain("shutdown")
        self._close_run()
        try:
            wandb.teardown()
        except Exception as exc:  # noqa: BLE001 - best effort
            self._log.debug("W&B: teardown failed: %r", exc)

    # ---- giving up on a stalled service --------------------------------------------------

    def _abandon(self, thread: threading.Thread) -> None:
        """The exporter thread is stuck in a wandb call: stop the wandb-core process this
        daemon started (so wandb's own exit hooks cannot hang the daemon's exit), then let
        wandb close its side. Data the service had not written yet is lost; logged."""
        pids = wandb_core_children()
        self._log.warning("W&B: the wandb service did not answer within the shutdown timeout; "
                          "stopping it (pid %s); unsent rows are lost",
                          ", ".join(map(str, pids)) or "none found")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        thread.join(0.5)
        if "wandb" in sys.modules:
            closer = threading.Thread(target=_quiet_teardown, name="sidecar-wandb-teardown",
                                      daemon=True)
            closer.start()
            closer.join(1.0)


def _merge(old: TrainerRun | None, new: TrainerRun) -> TrainerRun:
    """``new``, with the fields it leaves unknown filled from ``old`` about the same run (the
    workers of one trainer do not all know everything)."""
    if old is None or old.run_id != new.run_id:
        return new
    return TrainerRun(new.run_id, new.project or old.project, new.entity or old.entity,
                      new.mode or old.mode, old.primary if new.primary is None else new.primary)


def _quiet_teardown() -> None:
    """``wandb.teardown()`` swallowing the errors of a connection to a dead service; this also
    unregisters wandb's exit hook that would otherwise report them at interpreter exit."""
    try:
        wandb = sys.modules.get("wandb")
        if wandb is not None:
            wandb.teardown()
    except Exception:  # noqa: BLE001 - the service is gone; nothing to report
        pass


def wandb_core_children(parent: int | None = None) -> list[int]:
    """Pids of ``wandb-core`` processes whose parent is ``parent`` (default: this process),
    read from ``/proc`` (Linux; elsewhere an empty list)."""
    parent = os.getpid() if parent is None else parent
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2:].split()
        if comm.startswith("wandb-core") and len(fields) > 1 and int(fields[1]) == parent:
            pids.append(int(entry))
    return pids
