"""Per-sender accounting: every record a shim handed to its transport is accepted, rejected,
or counted as lost, exactly.

For each sender, within one daemon life::

    records_total (as the sender last reported) == before_join + lost_in_transit + received
    received == accepted + sum(rejected)

and the sender reports its own drops (``sender_dropped``), so that the trainer's calls equal
``records_total + sum(sender_dropped)``. ``before_join`` is what a sender sent before this daemon
saw its first message (a daemon started or restarted after the trainer).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sidecar.model.handoff import SendersPart
from sidecar.model.liveness import FORGET_AFTER_S
from sidecar.model.messages import BatchMessage, HelloMessage
from sidecar.model.names import label_value
from sidecar.model.window import LabelTotals, SenderView, is_live
from trainer_shim.wire import Tally, TallyChannel

MAX_SENDERS = 4096
MAX_LABEL_PAIRS = 1024
"""Distinct (role, worker) pairs whose totals are kept; a batch under a further pair, while none
can be evicted (see ``EVICT_IDLE_S``), is dropped and counted
(``messages_dropped{reason="too_many_labels"}``)."""
LABEL_TTL_S = 3600.0
"""A (role, worker) pair without a message this long is forgotten (its series leave the page;
if it comes back its counters restart from zero, which Prometheus reads as a reset)."""
EVICT_IDLE_S = 30.0
"""When the sender or label table is full, its least recently heard entry is evicted for a new
one if it has been silent this long. A live shim sends at least every 2 s (its heartbeat), so a
flood of made-up senders or labels can hold the tables for at most this long, and a trainer
that starts after it always gets in."""
MAX_CALLS_PER_S = 10_000_000
"""More record calls per second than any one sender can make (the shim costs about 0.2 us a
call). A sender's claimed ``records_total + sum(dropped)`` above this rate over its age is no
claim a real process can make: the message is dropped (``messages_dropped{reason="impossible_count"}``)."""
MAX_SENDER_AGE_S = 30 * 86400.0
"""The age a sender's claims are bounded by when its hello gives none (or an older one)."""
CLAIM_SLACK_S = 60.0
"""Added to the age of a sender with a hello: clocks of the trainer and the daemon may differ a
little."""
NO_HELLO_SLACK_S = 1.0
"""Added to the age of a sender without a hello (no clock to disagree with)."""
MAX_ENDED = 16384
"""Sender ids whose exit was reconciled, remembered so that a frame of theirs arriving afterwards is
never counted a second time (``messages_dropped{reason="after_exit"}``)."""
_MAX_COUNT = 2**63 - 1


@dataclass(slots=True)
class SenderState:
    sender: int
    role: str
    worker: str
    first_seen: float
    last_seen: float
    last_seen_unix_s: float
    """The unix time read when its last message came (like ``last_seen``; a refused message counts
    only as its first): where the run ledger places that message, the same float in every window.
    Kept beside ``last_seen`` because the window's end less the message's age would move with the
    unix clock's corrections against the monotonic one."""
    hello: dict[str, Any] | None = None
    next_seq: int = 0
    records_total: int = 0
    received: int = 0
    accepted: int = 0
    before_join: int = 0
    lost_in_transit: int = 0
    messages_lost: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    sender_dropped: dict[str, int] = field(default_factory=dict)
    seen_batch: bool = False
    peer_pid: int | None = None
    """The process whose connection this sender's first message came on (ipc only)."""
    peer_uid: int | None = None
    """The owner of that process when its first message came (its tally file must be its)."""
    closed: bool = False
    """Its latest hello said it was closing (``trainer_shim.wire.Hello.closing``): a clean end."""
    totals: LabelTotals | None = None
    """The totals of the labels its latest batch came under (set by ``SenderRegistry.on_batch``)."""

    @property
    def pid(self) -> int | None:
        """The sender's process id in the daemon's own pid namespace: the kernel's word for ipc
        peers (also right for a trainer in a container, whose hello states the pid in its own
        namespace), else the pid its hello states."""
        if self.peer_pid is not None:
            return self.peer_pid
        pid = (self.hello or {}).get("pid")
        return pid if pid.__class__ is int else None

    def view(self, now: float) -> SenderView:
        """This sender as the listeners see it (a copy), at ``now`` (monotonic seconds)."""
        return SenderView(self.sender, self.role, self.worker, self.pid, self.hello, now - self.last_seen,
                          self.last_seen_unix_s, self.records_total, self.received, self.accepted, self.before_join,
                          self.lost_in_transit, self.messages_lost, dict(self.rejected), dict(self.sender_dropped),
                          first_seen_age_s=now - self.first_seen, closed=self.closed)


class SenderRegistry:
    """Tracks senders and turns their sequence numbers and counters into exact loss counts."""

    def __init__(self, max_senders: int = MAX_SENDERS, ttl_s: float = FORGET_AFTER_S,
                 max_label_pairs: int = MAX_LABEL_PAIRS) -> None:
        self.max_senders = max_senders
        self.max_label_pairs = max_label_pairs
        self.ttl_s = ttl_s
        self.senders: dict[int, SenderState] = {}
        """Least recently heard first (re-inserted on every message)."""
        self.totals: dict[tuple[str, str], LabelTotals] = {}
        """Least recently used first (re-inserted on every batch)."""
        self.messages_dropped: dict[str, int] = {}
        self.evicted: dict[str, int] = {}
        """Entries evicted from a full table for a new one, by table (``senders``, ``labels``)."""
        self.ended: OrderedDict[int, None] = OrderedDict()
        """Senders whose exit was reconciled from their tally (oldest first, at most ``MAX_ENDED``)."""

    def __iter__(self) -> Iterator[SenderState]:
        return iter(self.senders.values())

    def drop_message(self, reason: str, count: int = 1) -> None:
        """Count ``count`` messages (or tallies) dropped for ``reason``."""
        self.messages_dropped[reason] = self.messages_dropped.get(reason, 0) + count

    def _state(self, sender: int, role: str, worker: str, now: float, now_unix: float) -> SenderState | None:
        senders = self.senders
        state = senders.pop(sender, None)
        if state is None:
            if len(senders) >= self.max_senders and not self._evict(senders, "senders", now):
                return None
            state = SenderState(sender, role, worker, now, now, now_unix)
        senders[sender] = state  # most recently heard last
        return state

    def _evict(self, table: dict[Any, Any], name: str, now: float) -> bool:
        """Make room in a full ``table`` by evicting its least recently heard entry, if it has been
        silent for ``EVICT_IDLE_S``; False if none may go."""
        oldest = next(iter(table))
        if now - table[oldest].last_seen < EVICT_IDLE_S:
            return False
        del table[oldest]
        self.evicted[name] = self.evicted.get(name, 0) + 1
        return True

    def _wrong_peer(self, state: SenderState, peer_pid: int | None) -> bool:
        """Whether a message for ``state`` came from another process than the sender's (counted
        ``wrong_peer``): a sender id is bound to the pid its first message came from. The pid a
        hello states is not compared (a trainer in a container states the pid of its own pid
        namespace); ``SenderState.pid`` takes the kernel's. Unknown (tcp) peers are not checked."""
        if peer_pid is None:
            return False
        if state.peer_pid is None:
            state.peer_pid = peer_pid
            state.peer_uid = _process_uid(peer_pid)
        if state.peer_pid != peer_pid:
            self.drop_message("wrong_peer")
            return True
        return False

    def on_hello(self, msg: HelloMessage, now: float, now_unix: float,
                 peer_pid: int | None = None) -> SenderState | None:
        """Record a hello. Returns the sender's state, or None if refused (too many senders, or
        from another process than the sender's)."""
        if msg.sender in self.ended:
            self.drop_message("after_exit")
            return None
        info = msg.info
        role, worker = info.get("role"), info.get("worker")
        role = role if isinstance(role, str) else "unknown"  # decoded: exactly str or not at all
        worker = worker if isinstance(worker, str) else "unknown"
        state = self._state(msg.sender, role, worker, now, now_unix)
        if state is None:
            self.drop_message("too_many_senders")
            return None
        if self._wrong_peer(state, peer_pid):
            return None
        state.hello = info
        state.closed = info.get("closing") is True
        state.last_seen, state.last_seen_unix_s = now, now_unix
        self._check_seq(state, msg.seq)
        return state

    def on_batch(self, msg: BatchMessage, now: float, now_unix: float,
                 peer_pid: int | None = None) -> SenderState | None:
        """Account a batch's header. Returns the state to aggregate into, or None if the batch
        must be dropped (counted here)."""
        if msg.sender in self.ended:
            self.drop_message("after_exit")  # its tally was reconciled: these records are in it
            return None
        state = self._state(msg.sender, msg.role, msg.worker, now, now_unix)
        if state is None:
            self.drop_message("too_many_senders")
            return None
        if self._wrong_peer(state, peer_pid):
            return None
        slack = CLAIM_SLACK_S if state.hello is not None else NO_HELLO_SLACK_S
        if msg.records_total + sum(msg.dropped.values()) > MAX_CALLS_PER_S * (_age_s(state, now, now_unix) + slack):
            self.drop_message("impossible_count")
            return None
        n = len(msg.records)
        previous = state.records_total if state.seen_batch else None
        if previous is not None and msg.records_total - n < previous:
            self.drop_message("bad_sequence")  # a replayed or forged counter: never count twice
            return None
        totals = self._totals((msg.role, msg.worker), now)
        if totals is None:
            return None
        if (state.role, state.worker) != (msg.role, msg.worker):
            state.role, state.worker = msg.role, msg.worker  # the aggregator's name table follows the labels
        if previous is None:
            state.before_join = msg.records_total - n
            totals.add_dropped("before_join", state.before_join)
        else:
            gap = msg.records_total - n - previous
            state.lost_in_transit += gap
            totals.add_dropped("lost_in_transit", gap)
        for reason, count in msg.dropped.items():
            delta = count - state.sender_dropped.get(reason, 0)
            if delta > 0:
                totals.add_dropped("sender_" + reason, delta)
                state.sender_dropped[reason] = count
        state.seen_batch = True
        state.totals = totals
        state.records_total = msg.records_total
        state.received += n
        state.last_seen, state.last_seen_unix_s = now, now_unix
        totals.last_seen_unix_s = now_unix
        self._check_seq(state, msg.seq)
        return state

    def _totals(self, key: tuple[str, str], now: float) -> LabelTotals | None:
        """The totals of a label pair, made most recently used; None (counted ``too_many_labels``)
        if the table is full and none may go."""
        totals = self.totals.pop(key, None)
        if totals is None:
            if len(self.totals) >= self.max_label_pairs and not self._evict(self.totals, "labels", now):
                self.drop_message("too_many_labels")  # a label-value flood: bounded, counted
                return None
            totals = LabelTotals()
        self.totals[key] = totals  # most recently used last
        totals.last_seen = now
        return totals

    def reconcile_gone(self, tally: Tally, uid: int, final: bool, now: float, now_unix: float, grace_s: float,
                       witnessed: bool = True) -> list[TallyChannel] | None:
        """``reconcile_tally`` for the tally of a process that is gone, once each of its senders has
        been silent for ``grace_s`` seconds (``now``: the monotonic clock): the channels reconciled,
        or None if one of them spoke lately (its last frames may still be on the way: ask again)."""
        for channel in tally.channels:
            state = self.senders.get(channel.sender)
            if state is not None and now - state.last_seen < grace_s:
                return None
        return self.reconcile_tally(tally, uid, final, now, now_unix, witnessed)

    def reconcile_tally(self, tally: Tally, uid: int, final: bool, now: float, now_unix: float,
                        witnessed: bool = True) -> list[TallyChannel]:
        """Reconcile the tally of a process that is gone (or closed its publisher): per channel, what
        it made and this daemon has not counted. ``uid``: the tally file's owner; ``final``: the
        tally holds the process's last totals (``lost_at_exit``), else those of its last flush
        (``ended_unclean``; what it made after that flush is unknown). Returns the channels
        reconciled (for telling the process's end); a channel that does not belong to the file's
        process, or claims what no process can, is refused (``messages_dropped{reason="tally_refused"}``).
        ``witnessed``: the tally was last written while this daemon ran; if not, the process ended
        before it, and what it sent went to an earlier daemon (``before_join``): only what it never
        sent is lost."""
        reconciled: list[TallyChannel] = []
        for entry in tally.channels:
            if entry.sender in self.ended:
                continue
            if self._reconcile_channel(entry, tally, uid, final, now, now_unix, witnessed):
                reconciled.append(entry)
            self.ended[entry.sender] = None
            if len(self.ended) > MAX_ENDED:
                self.ended.popitem(last=False)
        return reconciled

    def _reconcile_channel(self, entry: TallyChannel, tally: Tally, uid: int, final: bool, now: float,
                           now_unix: float, witnessed: bool) -> bool:
        role, worker = label_value(entry.role), label_value(entry.worker)
        counts = [entry.records_total, entry.pending, entry.at_join, *entry.dropped.values()]
        reasons = [label_value(r) for r in entry.dropped]
        state = self.senders.get(entry.sender)
        if (role is None or worker is None or None in reasons or not all(0 <= c <= _MAX_COUNT for c in counts)
                or (state is not None and not _owned_by(state, tally.pid, uid))
                or (state is not None and state.seen_batch and entry.records_total < state.records_total)
                or sum(counts) - entry.at_join > MAX_CALLS_PER_S * (_tally_age_s(tally, now_unix) + CLAIM_SLACK_S)):
            self.drop_message("tally_refused")
            return False
        seen = state is not None and state.seen_batch
        key = (state.role, state.worker) if seen and state is not None else (role, worker)
        totals = self._totals(key, now)
        if totals is None:
            return False
        if seen and state is not None:
            before, lost = 0, entry.records_total - state.records_total + entry.pending
            known = state.sender_dropped
        else:
            # Never a batch in this life: what it sent before its latest subscriber joined went to
            # an earlier daemon (or none), as ``before_join`` says for a batch; the rest is lost.
            # A process that ended before this daemon started sent all it sent to an earlier one.
            before = (min(entry.at_join, entry.records_total) if entry.subscribed and witnessed
                      else entry.records_total)
            lost = entry.records_total - before + entry.pending
            known = {}
        totals.add_dropped("before_join", before)
        for reason, count in entry.dropped.items():
            totals.add_dropped("sender_" + reason, count - known.get(reason, 0))
        totals.add_dropped("lost_at_exit" if final else "ended_unclean", lost)
        if state is not None:
            state.records_total = max(state.records_total, entry.records_total)
            state.sender_dropped = {**state.sender_dropped, **entry.dropped}
        return True

    def _check_seq(self, state: SenderState, seq: int) -> None:
        if seq > state.next_seq and state.next_seq > 0:
            state.messages_lost += seq - state.next_seq
        state.next_seq = max(state.next_seq, seq + 1)

    def expire(self, now: float) -> int:
        """Forget senders silent for longer than ``ttl_s`` and label pairs unused for
        ``LABEL_TTL_S``; returns how many senders."""
        dead = [s for s, st in self.senders.items() if now - st.last_seen > self.ttl_s]
        for sender in dead:
            del self.senders[sender]
        idle = [k for k, t in self.totals.items() if now - t.last_seen > LABEL_TTL_S]
        for key in idle:
            del self.totals[key]
        return len(dead)

    def add_outcome(self, state: SenderState, accepted: int, rejected: dict[str, int]) -> None:
        """Count the aggregator's outcome for the batch ``on_batch`` just accounted for ``state``
        (into the sender and the totals of the labels the batch came under)."""
        state.accepted += accepted
        totals = state.totals
        assert totals is not None  # on_batch set it before returning this state
        totals.accepted += accepted
        for reason, count in rejected.items():
            state.rejected[reason] = state.rejected.get(reason, 0) + count
            totals.add_dropped(reason, count)

    def window(self, now: float, duration_s: float) -> SendersPart:
        """The registry's part of the window of ``duration_s`` seconds ending at ``now``
        (monotonic): senders and label pairs past their time forgotten first (``expire``), then
        copies of what is left."""
        self.expire(now)
        totals = {k: LabelTotals(v.accepted, dict(v.dropped), v.last_seen_unix_s) for k, v in self.totals.items()}
        return SendersPart(tuple(s.sender for s in self.live(now, duration_s)), frozenset(self.senders),
                           tuple(s.view(now) for s in self.senders.values()), totals, dict(self.messages_dropped))

    def live(self, now: float, window_s: float) -> list[SenderState]:
        """The senders live in the window of ``window_s`` seconds ending at ``now``
        (``sidecar.model.window.is_live``)."""
        return [st for st in self.senders.values() if is_live(now - st.last_seen, st.closed, window_s)]


def _owned_by(state: SenderState, pid: int, uid: int) -> bool:
    """Whether a tally of process ``pid`` in a file owned by ``uid`` may speak for ``state``: the
    kernel's pid and owner of the process its messages came from, where known."""
    return (state.peer_pid is None or state.peer_pid == pid) and (state.peer_uid is None or state.peer_uid == uid)


def _process_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _tally_age_s(tally: Tally, now_unix: float) -> float:
    """How long the tally's process can have been making calls (at most ``MAX_SENDER_AGE_S``)."""
    started = tally.started_unix_s
    return min(MAX_SENDER_AGE_S, max(0.0, now_unix - started)) if started == started else 0.0


def _age_s(state: SenderState, now: float, now_unix: float) -> float:
    """How long the sender can have been making calls: since the start its hello states, at most
    ``MAX_SENDER_AGE_S`` before the daemon first heard of it. Without a hello, only since the
    daemon first heard of it: a shim says hello before its first batch and again every few
    seconds, so a sender that never said one has no earlier history to claim."""
    if state.hello is None:
        return now - state.first_seen
    started = state.hello.get("started_unix_s")
    before = MAX_SENDER_AGE_S
    if (started.__class__ is float or started.__class__ is int) and started <= now_unix:
        before = min(before, now_unix - started - (now - state.first_seen))
    return max(0.0, before) + (now - state.first_seen)
