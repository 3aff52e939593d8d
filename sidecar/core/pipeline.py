"""The daemon's pipeline: the one owner of the order a record and a window go through.

A frame, each hop a plain call whose input and output are ``sidecar.model`` values::

    bytes --decode--> BatchMessage | HelloMessage --resolve--> SenderState (or dropped, counted)
          --aggregate--> Ingested (accepted, rejected by reason; and where the batch met names
                         new to the sender's table, the PendingBatch: the rest and those names
                         --map--> their Mapped --resume--> the rest, aggregated)
          --add_outcome--> the sender's and its labels' counts (the registry's own write)

``resolve`` is the registry's (entered once per frame, and once more to count the outcome);
``aggregate`` the aggregator's, which finds each record's series in its sender's table; ``map``
the mapping stage's (``Mapped``, from the mapper's own cache or mapped now), asked only for the
names the aggregator handed back (at most the owner's budget of new names a window). Neither
stage calls the other.

A window (at each boundary)::

    the receiver's counters (``Received``) + the registry's part (``SendersPart``) + the
    aggregator's part (``AggregatesPart``) --window--> IngestReport --window stages-->
    IngestReport (+ gpu, insight, run ledger: ``window_stages``, their one order) --fan-out-->
    every listener's ``consume`` (exporters, the scrape state, the NVML trainer attribution),
    the same immutable object to each

each part a value its stage hands back (``sidecar.model.handoff``), copied at the window's end.
A hello goes to every listener's ``hello`` as a ``SenderView``. A gone sender's tally
(``reconcile_gone``) is reconciled by the registry and its end, with the aggregator's latest step of it,
counted by the end book, which the next window carries. Everything here runs on the ingest thread
(``sidecar.core.ingest.IngestLoop`` drives it).
Nothing a client sends can raise out of ``frame``: bad frames and records are counted by reason.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.aggregation.aggregator import Aggregator
from sidecar.aggregation.ends import EndBook
from sidecar.aggregation.gpu_groups import GpuAggregates
from sidecar.aggregation.insight import compute_insight
from sidecar.aggregation.senders import SenderRegistry
from sidecar.aggregation.settings import InsightSettings, WindowSettings
from sidecar.aggregation.verdict import Hysteresis
from sidecar.model.ends import ALERTING, MAX_GPU_INDEX, EndFacts, SenderEnd, how_ended
from sidecar.model.handoff import Received
from sidecar.model.insight import PipelineInsight
from sidecar.model.messages import BatchMessage
from sidecar.model.window import IngestHealth, IngestReport, SenderView
from sidecar.processing.mapping import Mapper
from sidecar.sources.decode import DecodeError, decode
from sidecar.sources.tallies import ReadyTally
from trainer_shim import exit_causes
from trainer_shim.wire import TallyChannel

if TYPE_CHECKING:
    from sidecar.core.config import Config

log = logging.getLogger("sidecar")


class Listener(Protocol):
    """The fan-out's one interface (``sidecar.exporters.base.Exporter`` is one). Both calls run on
    the ingest thread and must not block; an exception is logged and reaches no other listener."""

    name: str

    def consume(self, report: IngestReport) -> None: ...

    def hello(self, view: SenderView) -> None: ...


WindowStage = Callable[[IngestReport], IngestReport]
"""A stage between the window and the fan-out: a window's report in, the report with its part
added out (``dataclasses.replace``: the ingest's report is never mutated)."""


def aggregate(aggregator: Aggregator, mapper: Mapper, sender_id: int, owner: Hashable, role: str, worker: str,
              records: Sequence[object]) -> tuple[int, dict[str, int]]:
    """aggregate -> map -> aggregate: a batch of the sender ``sender_id``'s ``records`` (labelled
    (role, worker); its new series count against ``owner``) through the aggregator, the names it
    hands back mapped by ``mapper`` (the mapping stage) on the way, as often as it stops for names.
    Returns the records accepted and the rejected ones by reason, the whole batch's."""
    accepted, rejected, pending = aggregator.ingest(sender_id, owner, role, worker, records)
    while pending is not None:
        names = mapper.map_names(pending.unmapped, role, worker)
        more, more_rejected, pending = aggregator.resume(pending, names)
        accepted += more
        for reason, count in more_rejected.items():
            rejected[reason] = rejected.get(reason, 0) + count
    return accepted, rejected


def ingest_records(aggregator: Aggregator, role: str, worker: str, records: list[Any], mapper: Mapper,
                   sender_id: int = 0, owner: Hashable | None = None) -> tuple[int, dict[str, int]]:
    """``aggregate`` of ``records`` from one sender labelled (role, worker), ``owner`` by default
    the sender (tests, benchmarks: the pipeline's ``frame`` without the registry)."""
    return aggregate(aggregator, mapper, sender_id, sender_id if owner is None else owner, role, worker, records)


class Pipeline:
    """decode -> resolve -> aggregate (-> map -> aggregate) -> count; window -> window stages ->
    fan-out (module docstring).
    Ingest thread only, except ``reload``, ``mapping`` and ``health`` (any thread)."""

    def __init__(self, *, mapper: Mapper | None = None, max_series: int = WindowSettings.max_series,
                 stages: Sequence[WindowStage] = (), listeners: Sequence[Listener] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``stages``: run in order on each window before the fan-out; ``listeners``: get each
        window and hello, in order."""
        self.registry = SenderRegistry()
        self.ends = EndBook()
        self.aggregator = Aggregator(max_series=max_series)
        self.mapper = mapper or Mapper()
        self.stages = list(stages)
        self.listeners = list(listeners)
        self.clock = clock
        self.internal_errors = 0
        """Bugs survived (each counted, its frame dropped)."""
        self.last_data_monotonic: float | None = None
        self._accepted_in_window = 0
        self._next_mapper: Mapper | None = None

    def health(self) -> IngestHealth:
        """Internal errors survived and the age of the newest trainer data (any thread)."""
        last = self.last_data_monotonic
        return IngestHealth(self.internal_errors, None if last is None else self.clock() - last)

    def reload(self, settings: Config) -> None:
        """New settings (a config reload; any thread): ``settings`` is a ``MappingSettings`` and a
        ``RoleSettings`` (``sidecar.core.config.Config`` is both). A changed mapping or role names map
        from the next frame on (the ingest thread swaps the new mapper in, so the stages stay
        single-threaded; its cache starts empty and every name is mapped again)."""
        mapper, now = Mapper.from_settings(settings, settings), self.mapping()
        if not mapper.maps_like(now):
            self._next_mapper = mapper

    def mapping(self) -> Mapper:
        """The mapping in force from the next frame on (any thread)."""
        return self._next_mapper or self.mapper

    def internal_error(self, what: str, exc: BaseException) -> None:
        """Count a bug survived (logged the first time only)."""
        self.internal_errors += 1
        self.registry.drop_message("internal_error")
        if self.internal_errors == 1:
            log.exception("sidecar: internal error while %s (counted, continuing): %r", what, exc)

    # -- a frame -----------------------------------------------------------------------------------

    def frame(self, frame: bytes, now: float, peer_pid: int | None = None) -> None:
        """decode -> resolve -> aggregate (-> map -> aggregate) -> count for one frame (a hello:
        -> fan-out).
        ``peer_pid``: the process at the other end of its connection, where the kernel says
        (ipc). Never raises."""
        registry = self.registry
        if self._next_mapper is not None:
            self.mapper, self._next_mapper = self._next_mapper, None
            self.aggregator.remap()
        try:
            msg = decode(frame)
        except DecodeError as exc:
            registry.drop_message(exc.reason)
            return
        try:
            if isinstance(msg, BatchMessage):
                state = registry.on_batch(msg, now, time.time(), peer_pid)
                if state is None:
                    return
                owner = state.peer_pid if state.peer_pid is not None else state.sender  # the kernel's pid (ipc)
                accepted, rejected = aggregate(self.aggregator, self.mapper, state.sender, owner, state.role,
                                               state.worker, msg.records)
                registry.add_outcome(state, accepted, rejected)
                self._accepted_in_window += accepted
                self.last_data_monotonic = now
            else:
                state = registry.on_hello(msg, now, time.time(), peer_pid)
                if state is not None:
                    self.fan_out_hello(state.view(now))
        except Exception as exc:  # noqa: BLE001 - a bug must not stop ingest; count and go on
            self.internal_error("ingesting", exc)

    # -- a sender's end ----------------------------------------------------------------------------

    def refuse_tallies(self, count: int) -> None:
        """Count ``count`` tally files that are no tally (``messages_dropped{reason="tally_refused"}``,
        as the registry counts a tally's channel it refuses)."""
        self.registry.drop_message("tally_refused", count)

    def reconcile_gone(self, ready: ReadyTally, now: float, grace_s: float, witnessed: bool) -> bool:
        """A gone process's tally (``sources.tallies``): its channels reconciled by the registry, once
        each of its senders has been silent for ``grace_s`` seconds (``now``: the monotonic clock;
        ``witnessed``: the tally was last written while this daemon ran), and how it ended told to
        the end book, once per role among the channels reconciled now, with the latest step the
        aggregator has of them; one log line per end. False: one of its senders spoke lately (its
        last frames may still be on the way: ask again)."""
        reconciled = self.registry.reconcile_gone(ready.tally, ready.uid, ready.final, now, time.time(), grace_s,
                                                  witnessed=witnessed)
        if reconciled is None:
            return False
        steps = {c.sender: self.aggregator.latest_step(c.sender) for c in reconciled}
        for end in sender_ends(ready, reconciled, steps):
            self.ends.count(end)
            log.log(logging.WARNING if end.how in ALERTING else logging.INFO, "sidecar: sender ended: %s", end.text())
        return True

    # -- a window ----------------------------------------------------------------------------------

    def close_window(self, now: float, end_unix_s: float, duration_s: float,
                     received: Received = Received()) -> IngestReport:
        """window -> window stages -> fan-out: the stages' parts as one report, the window stages
        run and the result handed to every listener. ``now``: the window's end on the monotonic
        clock, ``end_unix_s`` the same moment on the unix clock; ``received``: the receiver's part
        (``Receiver.received``). Returns the window's report as fanned out."""
        report = self.window(now, end_unix_s, duration_s, received)
        try:
            report = self.finish(report)
        except Exception:  # noqa: BLE001 - the stages guard themselves; a bug here must not stop ingest
            self.internal_errors += 1
            log.exception("sidecar: window stage failed (continuing)")
        self.fan_out(report)
        return report

    def window(self, now: float, end_unix_s: float, duration_s: float, received: Received = Received()) -> IngestReport:
        """The window stage: the registry's, the aggregator's and the receiver's parts as one
        immutable report (the receiver's refusals counted with the registry's dropped messages)."""
        senders = self.registry.window(now, duration_s)
        aggregates = self.aggregator.close(now, end_unix_s, duration_s, senders.live, senders.known)
        dropped = dict(senders.messages_dropped)
        for reason, n in received.refused.items():  # dropped unread by the receiver (CPU share)
            dropped[reason] = dropped.get(reason, 0) + n
        report = IngestReport(
            aggregates.window, senders.senders, senders.totals, dropped, aggregates.profile_entries_rejected,
            received.frames, received.bytes, received.disconnects, aggregates.series, self._accepted_in_window,
            ends=self.ends.view(),
        )
        self._accepted_in_window = 0
        return report

    def finish(self, report: IngestReport) -> IngestReport:
        """The window stages (GPU view, insight, run ledger), in order."""
        for stage in self.stages:
            report = stage(report)
        return report

    def fan_out(self, report: IngestReport) -> None:
        """The same report to every listener, in order; one failing never stops the others."""
        for listener in self.listeners:
            try:
                listener.consume(report)
            except Exception:  # noqa: BLE001 - one listener must not stop the others
                log.exception("sidecar: %s failed on a window", listener.name)

    def fan_out_hello(self, view: SenderView) -> None:
        for listener in self.listeners:
            try:
                listener.hello(view)
            except Exception:  # noqa: BLE001
                log.exception("sidecar: %s failed on a hello", listener.name)


def sender_ends(ready: ReadyTally, reconciled: Sequence[TallyChannel],
                latest_steps: Mapping[int, int | None]) -> list[SenderEnd]:
    """How the process of ``ready`` ended, one ``SenderEnd`` per role among its channels
    ``reconciled`` (reconciled now: not before, and not refused); ``latest_steps``: sender -> the step of
    its latest profile (the aggregator's ``latest_step``), None if it sent none."""
    tally = ready.tally
    told = how_ended(EndFacts(ready.final, tally.signal, ready.crash, ready.oom, ready.exit_status, tally.cause,
                              exit_causes.cut(tally.detail), tally.thread))
    gpu = tally.gpu if told.cause == "cuda_oom" and 0 <= tally.gpu < MAX_GPU_INDEX else -1
    roles: dict[str, list[TallyChannel]] = {}
    for channel in reconciled:
        roles.setdefault(channel.role, []).append(channel)
    ends = []
    for role, channels in roles.items():
        steps = [s for s in (latest_steps.get(c.sender) for c in channels) if s is not None]
        unknown = 0 if ready.final else ready.tally.max_pending * len(channels)
        ends.append(SenderEnd(role, min(c.worker for c in channels), told.how, told.signal, tally.pid,
                              max(steps) if steps else None, ready.written_unix_s, unknown, told.detail, told.cause,
                              gpu, ready.final))
    return ends


def window_stages(insight: InsightStage, ledger: WindowStage, gpu: GpuStage | None = None) -> list[WindowStage]:
    """The window stages in their one order: the GPUs' view (with GPU metrics on; None: off),
    the insight (which reads it), the run ledger (``ledger_state.LedgerStage``, which reads
    both)."""
    return [*([gpu] if gpu is not None else []), insight, ledger]


class GpuStage:
    """window -> window with the GPUs' view at its end, with what the insight reads of them over
    the window (``IngestReport.gpu``, ``GpuView.facts``)."""

    def __init__(self, gpus: GpuAggregates) -> None:
        self.gpus = gpus
        self.failures = 0
        """Windows whose GPU reading failed (logged once; their insight reads no GPU)."""

    def __call__(self, report: IngestReport) -> IngestReport:
        try:
            view = self.gpus.view(report.window.duration_s)
        except Exception:  # noqa: BLE001 - the GPUs' reading must never stop the window
            self.failures += 1
            if self.failures == 1:
                log.exception("sidecar: reading the GPUs for a window failed (counted, logged once)")
            view = self.gpus.view()
        return dataclasses.replace(report, gpu=view)


class InsightStage:
    """window -> window with its pipeline insight, the shown verdict held by ``Hysteresis``; the
    GPUs as the window's GPU part has them (none without it). ``reload`` takes new settings
    between windows."""

    def __init__(self, settings: InsightSettings) -> None:
        self.settings = settings
        self.hysteresis = Hysteresis()
        self.failures = 0
        """Windows whose insight failed (logged once; their ``insight`` is None)."""

    def reload(self, settings: InsightSettings) -> None:
        """The verdict's settings from the next window on (a config reload)."""
        self.settings = settings

    def __call__(self, report: IngestReport) -> IngestReport:
        return dataclasses.replace(report, insight=self.insight(report))

    def insight(self, report: IngestReport) -> PipelineInsight | None:
        """The window's pipeline insight, or None (counted, logged once) if computing it failed:
        the insight must never stop the raw exports."""
        try:
            gpu = report.gpu.facts if report.gpu is not None else None
            insight = compute_insight(report.window, self.settings, gpu, report.senders)
        except Exception:  # noqa: BLE001
            self.failures += 1
            if self.failures == 1:
                log.exception("sidecar: pipeline insight failed (counted, logged once)")
            return None
        shown = self.hysteresis.update(insight.verdict)
        if shown is not insight.verdict:
            insight = dataclasses.replace(insight, verdict=shown, raw_verdict=insight.verdict)
        return insight


class TrainerAttribution:
    """A listener that tells the NVML source which GPU processes are trainers: a hello adds its
    sender's pid, a window sets exactly its senders' (forgetting senders the registry forgot).
    ``attribute``: the source's ``attribute_trainers``."""

    name = "nvml attribution"

    def __init__(self, attribute: Callable[..., None]) -> None:
        self._attribute = attribute

    def consume(self, report: IngestReport) -> None:
        self._attribute({s.pid: (s.role, s.worker) for s in report.senders if s.pid is not None}, complete=True)

    def hello(self, view: SenderView) -> None:
        if view.pid is not None:
            self._attribute({view.pid: (view.role, view.worker)}, complete=False)


class OnWindow:
    """A listener that calls ``take(window)`` for each window and ignores hellos (tests, benches)."""

    name = "window callback"

    def __init__(self, take: Callable[[IngestReport], object]) -> None:
        self._take = take

    def consume(self, report: IngestReport) -> None:
        self._take(report)

    def hello(self, view: SenderView) -> None:
        """Hellos are not windows."""
