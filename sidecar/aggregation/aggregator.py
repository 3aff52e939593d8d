"""Aggregation: records in, one ``WindowReport`` out per window.

Single-threaded by design: the ingest thread calls ``ingest`` for every batch and ``close`` at
each window boundary, so no lock is needed and a scrape never waits on ingest (exporters only
read the immutable reports). Each batch's rejected records are counted by reason in what
``ingest`` returns (``model.mapped.Ingested``).

The aggregator never maps names itself and calls nothing back: at the first record whose name
the sender's series table does not know yet, ``ingest`` stops and hands the rest of the batch
back (``model.mapped.PendingBatch``) with the names it needs; the pipeline has the mapping stage
map them (``sidecar.processing.mapping.Mapper``, which keeps its own cache of what it mapped) and
hands the rest back to ``resume`` with their ``Mapped``. The series tables (a sender's name ->
its series' bound ``add``) are the aggregator's own, one per sender, dropped whenever series
expire or are evicted (their adds would point at dead series).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import length_hint
from typing import Any

from sidecar.aggregation.clocks import Clocks
from sidecar.aggregation.parts import settle
from sidecar.aggregation.series import (
    WINDOW_KEYS_BUDGET,
    CategorySeries,
    CounterSeries,
    GaugeSeries,
    KeyBudget,
    Series,
    TimingSeries,
)
from sidecar.aggregation.settings import WindowSettings
from sidecar.aggregation.step_axis import StepAxes
from sidecar.model.handoff import AggregatesPart
from sidecar.model.mapped import NO_NAMES, Ingested, Mapped, NameKey, PendingBatch
from sidecar.model.names import claimed_names, counter_token, metric_token, timing_token
from sidecar.model.window import (
    ALLOCATOR,
    CATEGORY,
    COUNT,
    GAUGE,
    KIND_NAMES,
    PROFILE,
    SCALAR,
    TIMING,
    SeriesView,
    WindowReport,
)
from trainer_shim.wire import name_problem, profile_entry_kind, profile_entry_problem, record_problem, record_rule

_FACTORIES = {TIMING: TimingSeries, COUNT: CounterSeries, GAUGE: GaugeSeries,
              CATEGORY: CategorySeries, SCALAR: GaugeSeries}
_TOKENS = {TIMING: timing_token, COUNT: counter_token, GAUGE: metric_token,
           CATEGORY: metric_token, SCALAR: metric_token}

RESERVED_FAMILIES = ("dflash_trainer_step", "dflash_trainer_last_seen_timestamp_seconds",
                     "dflash_trainer_last_seen_timestamp")
"""Families the daemon itself exports in the trainer namespace; trainer series may not claim them."""

log = logging.getLogger("sidecar")

MAX_LOGGED_COLLISIONS = 256
"""Distinct colliding names logged (each once); beyond, collisions are only counted."""

Adder = Callable[[Any], bool]
"""A series' bound ``add``: True if the value was taken, False if it is invalid."""

MAX_CACHED_REJECTIONS = 1024
"""Per sender, how many distinct rejected names are remembered (beyond: re-checked each time)."""

EVICT_CHUNK = 64
"""Series taken at once from the sender holding the most, when the table is full and a sender
below its fair share needs room (each eviction clears every sender's name cache, so in chunks)."""

MAX_ALLOCATOR_SERIES = 1024
"""Distinct (role, worker, device) allocator samples held; a further one is refused as
``cardinality`` (device indexes come from the client and are otherwise unbounded)."""


def _scaled(add: Adder, scale: float) -> Adder:
    """``add`` of values in the unit the name says, converted to the series' own by one multiply
    (the mapping stage's ``Mapped.scale``, decided once per series): only series whose unit is
    not the series' own pay it (a timing in ``_ms`` or a gauge in its base unit does not)."""
    def scaled(value: Any) -> bool:
        if value.__class__ is float or value.__class__ is int:
            return add(value * scale)
        return False
    return scaled


SeriesKey = tuple[int, str, str, str]
"""A series: (kind, exported token, role, worker)."""
NameTable = dict[Any, "Adder | str"]
"""A sender's series table: (kind as sent, name as sent) -> its series' ``add`` or the reason
such records are refused; a profile entry under (PROFILE, key). Keys are whatever a client sent."""


class _NeedNames(Exception):
    """A record (or a profile's key ``entry``) whose name the batch has no mapping for yet."""

    def __init__(self, entry: int | None) -> None:
        super().__init__()
        self.entry = entry


class _Turn:
    """A sender's turn in ``Aggregator.ingest``: the name table of the sender as labelled, and the
    progress of the batch being ingested, handed back with its rest (``PendingBatch.resume``) where
    it waits for names to be mapped. One per sender and labels, reused batch after batch (a
    sender's batches go through one at a time): a batch allocates nothing of its own here
    (bench/RESULTS_DAEMON.md, "The second step's path")."""

    __slots__ = ("role", "worker", "table", "owner", "left", "memo", "names", "entries_from", "batch")

    def __init__(self, role: str, worker: str) -> None:
        self.role = role
        self.worker = worker
        self.table: NameTable = {}
        """The sender's series table (a resumed batch keeps its own, even if the tables are dropped meanwhile)."""
        self.owner: Hashable = None
        self.left = 0
        """Names ``owner`` may still resolve this window without finding their series."""
        self.memo: dict[Any, Adder | str] = {}
        """This batch's names whose outcome ``table`` does not keep (``cardinality``, or rejections
        beyond its bound): each is resolved once per batch, so a batch's work is bounded by its size."""
        self.names: Mapping[NameKey, Mapped] = NO_NAMES
        self.entries_from: int | None = None
        """The batch stopped in its first record's profile: its keys from this one on are left."""
        self.batch = 0
        """Which of the sender's batches is in progress (a ``PendingBatch`` names it)."""


@dataclass(frozen=True, slots=True)
class _Owner:
    """The series that first claimed a Prometheus name: kind and token decide sharing; raw
    name, role and worker are for the collision message."""

    kind: int
    token: str
    raw: str
    role: str
    worker: str


class Aggregator:
    """Holds every series in use, bounded by ``max_series`` (the cardinality budget)."""

    def __init__(self, max_series: int = WindowSettings.max_series, series_ttl_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: monotonic seconds, read when a sender's step moves (its step axis's pace)."""
        self._turns: dict[int, _Turn] = {}
        """Sender -> its turn: the role and worker it was labelled, its name table ((kind, name) ->
        the series' bound ``add`` or the reason such records are refused; profile entries under
        (PROFILE, key)) and its batch in progress."""
        self._meta: dict[SeriesKey, tuple[Mapped, bool]] = {}
        """Series key -> (its mapping, snapshot), decided once when the series is first resolved."""
        self._snapshot_last: dict[SeriesKey, tuple[float, float]] = {}
        self.max_series = max_series
        self.series_ttl_s = series_ttl_s
        self._series: dict[SeriesKey, Series] = {}
        self._raw_names: dict[SeriesKey, str] = {}
        self._family_owner: dict[str, _Owner] = {}
        """Prometheus family (or sample) name -> the series that claimed it first. Series of the
        same kind and sanitized name share a family whatever their role and worker (their labels
        tell them apart); any other series claiming one of its names collides."""
        self._reset_owners()
        self._logged_collisions: set[tuple[int, str, str, str]] = set()
        """(kind, name, role, worker) of the collisions logged."""
        self._last_active: dict[SeriesKey, float] = {}
        self._steps: dict[int, tuple[str, str, int]] = {}
        """sender id -> (role, worker, latest step) of its last profile."""
        self._axes = StepAxes(clock)
        """Whose step counts samples or tokens (``step_axis``)."""
        self._clocks = Clocks()
        """Which bare times read as the step are seconds since the start (``clocks``)."""
        self._first_steps: dict[int, int] = {}
        """sender id -> the step of its first profile the daemon had (the ledger counts from it)."""
        self._rolled_steps: dict[int, int] = {}
        """Sender id -> its step at the last roll (``_steps_moved``)."""
        self._allocator: dict[tuple[str, str, int], tuple[int, int, int]] = {}
        self.profile_entries_rejected: dict[tuple[str, str, str], int] = {}
        """(role, worker, reason) -> profile entries skipped."""
        self._key_budget = KeyBudget()
        self._factories: dict[int, Callable[[], Series]] = {
            **_FACTORIES, CATEGORY: lambda: CategorySeries(budget=self._key_budget)}
        self.generation = 0
        """Bumped whenever series expire or are evicted, or names are remapped (the name tables are
        dropped then)."""
        self._owner_of: dict[SeriesKey, Hashable] = {}
        """Series key -> the owner (``ingest``'s ``owner``) that created it."""
        self._owned: dict[Hashable, dict[SeriesKey, None]] = {}
        """Owner -> its series keys, oldest first: each owner's share of the table."""
        self.evicted_series = 0
        """Series evicted from an owner over its fair share for one below it (their window is lost)."""
        self.resolve_budget = max(1000, max_series)
        """Names an owner may resolve per window without finding its series (new series and refusals):
        a flood of distinct names costs about 10 us a name to map; beyond this budget the owner's
        further new names are refused as ``cardinality`` without mapping (about 0.3 us)."""
        self._resolved: dict[Hashable, int] = {}
        """Owner -> charged resolutions in this window."""

    def series_count(self) -> int:
        return len(self._series)

    def remap(self) -> None:
        """Names map differently from now on (config reload): every name table is dropped, so each
        name is resolved again with its next record. Series the new mapping no longer produces
        stop receiving data and expire with ``series_ttl_s``."""
        self._new_generation()

    def _new_generation(self) -> None:
        self.generation += 1
        self._turns.clear()

    def names_of(self, sender_id: int) -> NameTable:
        """``sender_id``'s name table (read-only use: tests and ``explain``); empty if it has none."""
        turn = self._turns.get(sender_id)
        return turn.table if turn is not None else {}

    # -- ingest ----------------------------------------------------------------------------------

    def ingest(self, sender_id: int, owner: Hashable, role: str, worker: str, records: Sequence[object]) -> Ingested:
        """Aggregate a batch of ``records`` of the sender ``sender_id``, labelled (role, worker), in
        order, each record into its series as the sender's series table finds it. ``owner`` is whom
        the series it creates count against (the table is shared fairly between owners,
        ``_admit``), each with its own ``resolve_budget`` of new names per window. At the first
        record whose name the table does not know, it stops and hands the rest back as a
        ``PendingBatch`` with the names to map (that name, and the further new names before the
        next profile, or a profile's new keys, as far as the budget goes): ``resume`` goes on once
        they are mapped, before the sender's next batch. Returns (accepted, rejected by reason, the
        pending rest or None) for the part of the batch done."""
        turn = self._turns.get(sender_id)
        if turn is None or turn.role != role or turn.worker != worker:  # a relabelled sender maps its names anew
            turn = self._turns[sender_id] = _Turn(role, worker)
        turn.owner = owner
        turn.entries_from = None
        turn.batch += 1
        if turn.memo:
            turn.memo.clear()
        return self._pass(sender_id, turn, iter(records), NO_NAMES)

    def resume(self, pending: PendingBatch, names: Mapping[NameKey, Mapped]) -> Ingested:
        """``ingest`` going on with ``pending``, the rest of a batch it stopped in, once the names
        it asked for are mapped (``names``: the mapping stage's answers). Raises ``ValueError`` if
        the sender's next batch began meanwhile (the batch's place in its profile would be lost)."""
        turn: _Turn = pending.resume  # type: ignore[assignment]
        if turn.batch != pending.batch:
            raise ValueError(f"sender {pending.sender_id}'s batch {pending.batch} resumed after its batch "
                             f"{turn.batch} began")
        return self._pass(pending.sender_id, turn, iter(pending.records), names)

    def _pass(self, sender: int, turn: _Turn, records: Iterator[Any], names: Mapping[NameKey, Mapped]) -> Ingested:
        """A batch's records through its sender's series table, from where ``turn`` stands
        (``ingest``, ``resume``), up to the first record whose name needs mapping (its
        ``PendingBatch``). One function, not a loop and a wrapper: a call per batch is measured
        (bench/RESULTS_DAEMON.md, "The second step's path")."""
        owner, role, worker = turn.owner, turn.role, turn.worker
        turn.left = self.resolve_budget - self._resolved.get(owner, 0)
        turn.names = names
        accepted = 0
        rejected: dict[str, int] = {}
        cache, memo = turn.table, turn.memo
        rec: Any = None
        try:
            for rec in records:
                match rec:  # a sequence pattern: cheaper than len() for a record, and raises nothing for a bad one
                    case [kind, name, value] if rec.__class__ is list:
                        pass
                    case _:
                        rejected["malformed_record"] = rejected.get("malformed_record", 0) + 1
                        continue
                if kind == PROFILE or kind == ALLOCATOR:
                    reason = self._special(kind, name, value, role, worker, sender, turn)
                else:
                    add: Adder | str | None
                    try:
                        add = cache[kind, name]
                    except KeyError:
                        add = memo.get((kind, name))
                        if add is None:
                            add = self._resolve(kind, name, role, worker, turn)
                            if (kind, name) not in cache:
                                memo[kind, name] = add
                    except TypeError:  # an unhashable kind or name
                        add = record_problem(kind, name, value) or "bad_name"
                    if add.__class__ is str:
                        reason = add  # type: ignore[assignment]
                    elif add(value):  # type: ignore[misc,operator]
                        accepted += 1
                        continue
                    else:
                        reason = record_problem(kind, name, value) or "invalid_value"  # the rule's reason
                if reason is None:
                    accepted += 1
                else:
                    rejected[reason] = rejected.get(reason, 0) + 1
        except _NeedNames as need:  # ``rec`` waits for its name: the rest of the batch is handed back
            rest = [rec, *records]
            turn.entries_from = need.entry
            return accepted, rejected, PendingBatch(sender, rest, self._wanted(rest, need.entry, turn), turn,
                                                    turn.batch)
        finally:
            self._resolved[owner] = self.resolve_budget - turn.left
        return accepted, rejected, None

    def _wanted(self, rest: list[Any], entry: int | None, turn: _Turn) -> tuple[NameKey, ...]:
        """The names to map for the rest of a batch to go on, in the order it meets them: from the
        profile entry ``entry`` of its first record on, that profile's new keys; else the new names
        of its plain records up to the next profile (which may make later names known). No more
        than the budget left lets through: each name new to the table spends one (a refund,
        a name that finds its series, only stops the batch again further on)."""
        cache, memo, left = turn.table, turn.memo, turn.left
        wanted: dict[NameKey, None] = {}
        if entry is not None:
            for key in islice(rest[0][2], entry, None):
                if left <= 0:
                    break
                try:
                    if (PROFILE, key) in cache or (PROFILE, key) in memo:
                        continue
                except TypeError:
                    continue
                left -= 1
                if key.__class__ is str and name_problem(key) is None:
                    wanted[PROFILE, key] = None
            return tuple(wanted)
        for rec in rest:
            if left <= 0:
                break
            if rec.__class__ is not list or len(rec) != 3:
                continue
            kind, name = rec[0], rec[1]
            if kind == PROFILE or kind == ALLOCATOR:
                break
            try:
                if (kind, name) in cache or (kind, name) in memo or (kind, name) in wanted:
                    continue
            except TypeError:
                continue
            if record_rule(kind) is None or int(kind) not in self._factories:
                continue
            left -= 1
            if name_problem(name) is None:
                wanted[int(kind), name] = None
        return tuple(wanted)

    def _resolve(self, kind: Any, name: Any, role: str, worker: str, turn: _Turn, snapshot: bool = False,
                 mapped: Mapped | None = None, entry: bool = False) -> Adder | str:
        """The ``add`` of the series for (kind, name) from this sender, created if need be, or the
        reason its records are refused; cached in the sender's table (rejections only up to a
        bound, and never ``cardinality``: room may free up). The name's mapping is the batch's
        (``turn.names``; raises ``_NeedNames`` where it lacks it) unless ``mapped`` is given (a
        dict key, mapped first to decide its kind: ``entry``; None: it could not be). Runs once
        per sender and name, never per record."""
        if record_rule(kind) is None:
            return "unknown_kind"
        kind = int(kind)  # True and 1.0 are 1 (as in the cache's keys), in the table as here
        factory = self._factories.get(kind)
        if factory is None:  # PROFILE and ALLOCATOR, which have no series of their own
            return "unknown_kind"
        if turn.left <= 0:
            return "cardinality"  # over this window's budget: refused unmapped (cheap), not cached
        problem = name_problem(name)
        if problem is None and mapped is None and not entry:
            mapped = turn.names.get((kind, name))
            if mapped is None:
                raise _NeedNames(None)
        sent = kind  # the name table keys by the kind as sent
        if mapped is not None and kind == GAUGE and mapped.kind == TIMING:
            # a gauge whose name reads as a phase's duration is that phase's timing, read as a
            # snapshot (each value one step's), as the same key in a publish() dict is
            kind, factory, snapshot = TIMING, self._factories[TIMING], True
        turn.left -= 1  # refunded below if the name finds its series
        token = (mapped.token or _TOKENS[kind](mapped.name)) if mapped is not None else ""
        if problem is None and not token:
            problem = "bad_name"
        cache = turn.table
        if problem is not None or mapped is None:
            return _cached_rejection(cache, sent, name, problem or "bad_name")
        role, worker, local = mapped.role, mapped.worker, mapped.name
        key = (kind, token, role, worker)
        series: Series | str | None = self._series.get(key)
        if series is None:
            series = self._create_series(key, factory, mapped, snapshot, turn.owner)
            if isinstance(series, str):  # "cardinality" is not cached: room may free up when series expire
                return series if series == "cardinality" else _cached_rejection(cache, sent, name, series)
        elif self._raw_names[key] != local:
            # Two spellings onto one series of one sender ("a.b" and "a_b"): the first one keeps it.
            self._log_collision(kind, local, role, worker, _Owner(kind, token, self._raw_names[key], role, worker))
            return _cached_rejection(cache, sent, name, "name_collision")
        else:
            self._meta[key] = (mapped, self._meta[key][1])  # a reload may remap
            turn.left += 1  # an existing series: re-resolving (after a cache clear) is free
        add: Adder = series.add  # type: ignore[union-attr]
        if mapped.scale != 1.0:
            add = _scaled(add, mapped.scale)
        cache[sent, name] = add
        return add

    def _create_series(self, key: SeriesKey, factory: Callable[[], Series], mapped: Mapped,
                       snapshot: bool, owner: Hashable) -> Series | str:
        """A new series for ``key`` (kind, token, role, worker) of the current sender, or the reason
        it is refused: ``name_collision`` (another kind or name claims its families; logged) or
        ``cardinality`` (``owner``'s share of series is used up)."""
        kind, token, role, worker = key
        local = mapped.name
        families = claimed_names(kind, token)
        clash = next((o for f in families if (o := self._family_owner.get(f)) is not None
                      and (o.kind, o.token) != (kind, token)), None)
        if clash is not None:
            # Another kind (or a different name whose samples land here) would corrupt the family.
            self._log_collision(kind, local, role, worker, clash)
            return "name_collision"
        if not self._admit(owner):
            return "cardinality"
        series = self._series[key] = factory()
        self._owner_of[key] = owner
        self._owned.setdefault(owner, {})[key] = None
        self._raw_names[key] = local
        self._meta[key] = (mapped, snapshot)
        claim = _Owner(kind, token, local, role, worker)  # one for all its names (immutable)
        for f in families:
            self._family_owner.setdefault(f, claim)
        return series

    def _admit(self, owner: Hashable) -> bool:
        """Whether ``owner`` may create one more series. Below ``max_series``: yes. When the table
        is full, an owner holding less than its fair share (``max_series`` / owners holding series,
        itself included) takes room from the owner holding the most, which is over its share: one
        sender's flood of names can never lock a later sender out. An owner at or over its share
        is refused (``cardinality``) and pushes nobody out."""
        if len(self._series) < self.max_series:
            return True
        owned = self._owned
        mine = len(owned.get(owner, ()))
        share = self.max_series // (len(owned) + (0 if mine else 1))
        if mine >= share:
            return False
        biggest = max(owned, key=lambda o: len(owned[o]))
        excess = len(owned[biggest]) - share
        if excess <= 0:
            return False
        victims = list(owned[biggest])[:min(EVICT_CHUNK, excess)]
        for key in victims:
            self._drop_series(key)
        self.evicted_series += len(victims)
        self._new_generation()  # the victim's cached adds point at the evicted series
        self._rebuild_owners()
        return True

    def _drop_series(self, key: SeriesKey) -> None:
        del self._series[key], self._raw_names[key], self._meta[key]
        self._last_active.pop(key, None)
        self._snapshot_last.pop(key, None)
        owner = self._owner_of.pop(key)
        keys = self._owned[owner]
        del keys[key]
        if not keys:
            del self._owned[owner]

    def _rebuild_owners(self) -> None:
        """Families only series still held use keep their owner (otherwise this map would grow
        with every name ever seen, and a freed name could never be reused)."""
        self._reset_owners()
        for (kind, token, role, worker), raw in self._raw_names.items():
            claim = _Owner(kind, token, raw, role, worker)
            for family in claimed_names(kind, token):
                self._family_owner.setdefault(family, claim)

    def _special(self, kind: int, name: Any, value: Any, role: str, worker: str, sender: int,
                 turn: _Turn) -> str | None:
        problem = record_problem(kind, name, value)
        if problem is not None:
            return problem
        if kind == PROFILE:
            items = iter(value.items())
            start, turn.entries_from = turn.entries_from, None
            if start is None:
                self._steps[sender] = (role, worker, name)
                self._first_steps.setdefault(sender, name)
                self._axes.see(sender, name)
            else:  # the profile the batch stopped in, for its keys' mapping: on from that key
                deque(islice(items, start), maxlen=0)
            try:
                self._entries(items, role, worker, sender, turn)
            except _NeedNames as need:
                need.entry = len(value) - length_hint(items) - 1  # the key met, not yet done
                raise
            return None
        device = (role, worker, name)
        if device not in self._allocator and len(self._allocator) >= MAX_ALLOCATOR_SERIES:
            return "cardinality"
        self._allocator[device] = (value[0], value[1], value[2])
        return None

    def _entries(self, entries: Iterator[tuple[Any, Any]], role: str, worker: str, sender: int, turn: _Turn) -> None:
        """A profile dict's (key, value) entries: keys in a time unit are timings, the others gauges.
        The sender's table maps (PROFILE, key) to the entry's series, so the kind is decided once
        per key."""
        rejected = self.profile_entries_rejected
        cache, memo = turn.table, turn.memo
        for entry, number in entries:
            add: Adder | str | None
            try:
                add = cache[PROFILE, entry]
            except KeyError:
                if turn.left <= 0:  # over the budget: no memo either (a flood's keys are each new)
                    reason = "cardinality"
                    k = (role, worker, reason)
                    rejected[k] = rejected.get(k, 0) + 1
                    continue
                add = memo.get((PROFILE, entry))
                if add is None:
                    add = self._resolve_entry(entry, role, worker, sender, turn)
                    if (PROFILE, entry) not in cache:
                        memo[PROFILE, entry] = add
            except TypeError:
                add = "bad_name"
            if add.__class__ is str:
                reason = add  # type: ignore[assignment]
            elif add(number):  # type: ignore[misc,operator]
                continue
            else:
                reason = profile_entry_problem(entry, number) or "invalid_value"  # the rule's reason
            k = (role, worker, reason)
            rejected[k] = rejected.get(k, 0) + 1

    def _resolve_entry(self, entry: Any, role: str, worker: str, sender: int, turn: _Turn) -> Adder | str:
        """A dict key's series under (PROFILE, key): the mapping stage decides its kind
        (``Mapped.kind``: a key in a time unit is a timing), so a key is mapped before its series
        is looked up (only one with room in the budget and a valid name; ``_NeedNames`` where the
        batch lacks its mapping); a key whose namespace says ``sender``'s step counts items names
        its axis (``step_axis``)."""
        mapped = None
        if entry.__class__ is str and turn.left > 0 and name_problem(entry) is None:
            mapped = turn.names.get((PROFILE, entry))
            if mapped is None:
                raise _NeedNames(None)
        kind = mapped.kind if mapped is not None and mapped.kind >= 0 else profile_entry_kind(entry)
        if mapped is not None and mapped.axis:
            self._axes.name(sender)
        add = self._resolve(kind, entry, role, worker, turn, snapshot=True, mapped=mapped, entry=True)
        cache = turn.table
        if add.__class__ is not str or (add != "cardinality" and len(cache) < MAX_CACHED_REJECTIONS):
            cache[PROFILE, entry] = add
        return add

    def _reset_owners(self) -> None:
        self._family_owner = {reserved: _Owner(-1, "", reserved, "", "") for reserved in RESERVED_FAMILIES}

    def _log_collision(self, kind: int, name: str, role: str, worker: str, owner: _Owner) -> None:
        """One warning per colliding (kind, name, role, worker), naming both sides."""
        key = (kind, name, role, worker)
        if key in self._logged_collisions or len(self._logged_collisions) >= MAX_LOGGED_COLLISIONS:
            return
        self._logged_collisions.add(key)
        if owner.kind == -1:
            other = f"the daemon's own {owner.raw}"
        else:
            other = (f"{KIND_NAMES.get(owner.kind, owner.kind)} {owner.raw!r} of role {owner.role!r} "
                     f"worker {owner.worker!r}")
        log.warning("trainer name collision: %s %r of role %r worker %r maps onto the same Prometheus names as %s; "
                    "its records are dropped (counted as reason=\"name_collision\" for that role and worker). "
                    "Rename one of them.", KIND_NAMES.get(kind, kind), name, role, worker, other)

    # -- windows ---------------------------------------------------------------------------------

    def latest_step(self, sender_id: int) -> int | None:
        """The step of ``sender_id``'s latest profile (``publish(step, ...)``), None if it sent none."""
        entry = self._steps.get(sender_id)
        return None if entry is None else entry[2]

    def close(self, now_monotonic: float, end_unix_s: float, duration_s: float, live_senders: Collection[int],
              known_senders: Collection[int]) -> AggregatesPart:
        """The aggregator's part of the window ending now: ``roll``'s report, with copies of the
        profile entries skipped so far and the series held after it."""
        window = self.roll(now_monotonic, end_unix_s, duration_s, live_senders, known_senders)
        return AggregatesPart(window, dict(self.profile_entries_rejected), len(self._series))

    def roll(self, now_monotonic: float, end_unix_s: float, duration_s: float,
             live_senders: Collection[int] | None = None, known_senders: Collection[int] | None = None) -> WindowReport:
        """Close the window: per-series statistics, cumulative values, expiry of series idle for
        longer than ``series_ttl_s``. Steps are reported for ``live_senders`` only (all when
        None); the steps of senders not in ``known_senders`` are forgotten."""
        views = []
        expired = []
        self._key_budget.left = WINDOW_KEYS_BUDGET
        for key, series in self._series.items():
            kind, token, role, worker = key
            if isinstance(series, CounterSeries):
                had_data = series.window != 0.0
                window: dict[str, Any] | None = series.roll(duration_s)
                if not had_data:
                    window = None
                cumulative: dict[str, Any] = {"total": series.total}
            elif isinstance(series, TimingSeries):
                window = series.roll()
                cumulative = {"count": series.total_count, "sum_s": series.total_sum_ms / 1000.0}
                if self._meta[key][1]:  # a snapshot: its last per-batch mean stands until the next one
                    if window is not None:
                        self._snapshot_last[key] = (window["mean"], now_monotonic)
                    last = self._snapshot_last.get(key)
                    if last is not None:
                        cumulative["last_mean"], cumulative["last_age_s"] = last[0], now_monotonic - last[1]
            elif isinstance(series, GaugeSeries):
                window = series.roll()
                cumulative = {"last": series.last}
            else:
                window = series.roll()
                cumulative = {"totals": dict(series.totals)}
            if window is not None:
                self._last_active[key] = now_monotonic
            elif now_monotonic - self._last_active.setdefault(key, now_monotonic) > self.series_ttl_s:
                expired.append(key)
                continue
            mapped, snapshot = self._meta[key]
            views.append(SeriesView(kind, token, role, worker, window, cumulative, mapped.meaning, snapshot,
                                    self._raw_names[key], mapped.rule, mapped.certainty, mapped.sibling,
                                    mapped.outside, mapped.stem))
        for key in expired:
            self._drop_series(key)
        if expired:
            self._new_generation()
            self._rebuild_owners()
        self._resolved.clear()
        if known_senders is not None:
            self._forget(set(known_senders))
        live = None if live_senders is None else set(live_senders)
        steps: dict[tuple[str, str], int] = {}
        for sender, (role, worker, step) in self._steps.items():
            if (live is None or sender in live) and step > steps.get((role, worker), -1):
                steps[role, worker] = step
        settled = self._clocks.settle(settle(views), now_monotonic, self._moves())
        counted = self._axes.counted(self._step_ms(settled))  # the step axes' pace by the settled step
        return WindowReport(end_unix_s, duration_s, settled, steps, dict(self._allocator),
                            {sender: step for sender, (_, _, step) in self._steps.items()}, dict(self._first_steps),
                            counted, self._steps_moved(counted, live))

    def _steps_moved(self, counted: Mapping[int, int], live: set[int] | None) -> dict[tuple[str, str], int]:
        """(role, worker) -> how far its live senders' steps moved since the last roll (the most of
        them; ``counted``: the steps of a sender whose axis counts items), and each sender's step
        kept for the next roll. A sender first seen in this window has no move yet."""
        now: dict[int, int] = {}
        moved: dict[tuple[str, str], int] = {}
        for sender, (role, worker, step) in self._steps.items():
            now[sender] = step = counted.get(sender, step)
            before = self._rolled_steps.get(sender)
            if before is not None and (live is None or sender in live) and step - before > moved.get((role, worker), 0):
                moved[role, worker] = step - before
        self._rolled_steps = now
        return moved

    def _moves(self) -> dict[tuple[str, str], dict[int, int]]:
        """(role, worker) -> each of its senders' step moves so far (``StepAxes.moves``)."""
        moves: dict[tuple[str, str], dict[int, int]] = {}
        for sender, changes in self._axes.moves().items():
            if sender in self._steps:
                role, worker, _ = self._steps[sender]
                moves.setdefault((role, worker), {})[sender] = changes
        return moves

    def _step_ms(self, views: Sequence[SeriesView]) -> dict[int, float]:
        """Sender -> its ``step`` timing's mean this window (milliseconds), for the step axes."""
        by_place = {(v.role, v.worker): v.window["mean"] for v in views
                    if v.kind == TIMING and v.meaning == "step" and v.window is not None}
        return {sender: by_place[role, worker] for sender, (role, worker, _) in self._steps.items()
                if (role, worker) in by_place}


    def _forget(self, known: set[int]) -> None:
        """Drop the steps, step axes and name tables of the senders not in ``known``."""
        gone = self._steps.keys() - known
        for sender in gone:
            del self._steps[sender]
            self._first_steps.pop(sender, None)
        self._axes.forget(gone)
        for sender in self._turns.keys() - known:
            del self._turns[sender]


def _cached_rejection(cache: NameTable, kind: int, name: Any, reason: str) -> str:
    """``reason``, remembered for (kind, name) in the sender's ``cache`` while it holds fewer than
    ``MAX_CACHED_REJECTIONS``."""
    if len(cache) < MAX_CACHED_REJECTIONS:
        cache[kind, name] = reason
    return reason
