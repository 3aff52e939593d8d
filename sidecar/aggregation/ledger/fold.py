"""The run ledger's fold: one window's facts at a time into each run's and role's record.

Pure (no I/O, no clock, no locks; the ingest thread owns it): ``RunLedger.add`` folds a window's
``facts.WindowFacts`` into the typed ``record.LedgerRecord``, which ``state()`` / ``RunLedger(state)``
write and read as the state file's JSON, so ``sidecar.core.ledger_state`` can persist it across
daemon restarts. How each cause is told is in ``sidecar.model.ledger.CAUSES`` and
docs/METRICS.md ("Run ledger").

A role's timeline: it starts at its first sender's start (``started_unix_s`` of its hello: the
shim's first use) and is accounted, window by window, up to its senders' last message. The
time since the last accounted moment is split by the window's shares: the GPU group's busy share
and idle attribution where NVML reads the GPUs, else the role's phase time shares; a timing named
``checkpoint`` or ``compile`` and the excess of a sender's first long steps are taken out of the
idle causes first. Before a role's first step (a step number, else ``facts.step_cycles``) its
time is held (``starting_s``) and told as ``startup`` or ``compile`` once that step arrives, or
as ``unobserved`` if its senders all go before one. Once its step time settles, the idle time
nothing explained in its slow first windows is retold as ``warmup``; at a clean end (a sender
that closed), the time told since its last step is retold as ``shutdown`` (both in
``sidecar.aggregation.ledger.retell``). Time the daemon did not run while the same sender
process lived is ``unobserved``; a successor's arrival turns the gap since its predecessor's
last message into ``restart_gap`` up to the successor's start.

The run (``facts.run_of``): the W&B run id of the hello, else its run label (the shim's, from the
launcher's environment), else the host; a host's senders after no sender of its current run sent
for ``run_gap_s`` start a new run, ``host:<name>@<UTC start>`` (``RunLedger._host_runs``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from sidecar.aggregation import run_verdicts
from sidecar.aggregation.ledger import retell
from sidecar.aggregation.ledger.facts import COMPILE_WINDOWS, HOST_RUN, RoleFact, SenderFact, WindowFacts
from sidecar.aggregation.ledger.record import LAST_END_DETAIL, LastEnd, LedgerRecord, RoleRecord, SenderMemory
from sidecar.model.insight import Verdict
from sidecar.model.ledger import CAUSES, RoleLedger, RunLedgerView
from sidecar.model.liveness import LIVE_S

MAX_RUNS = 64
"""Runs kept; beyond, the one seen least recently is forgotten (counted)."""
MAX_SENDERS_PER_ROLE = 64
"""Sender processes remembered per run and role (to tell a daemon restart from a trainer restart)."""
RUN_GAP_S = 300.0
"""Default ``run_gap_s``: a host's senders without a W&B run or run label start a new run when no
sender of the host's current run sent for longer than this (seconds)."""


class RunLedger:
    """The runs' records (``record``), fed one window at a time (``add``), saved as JSON (``state()``)."""

    def __init__(self, state: Mapping[str, object] | None = None, flops_per_token: float | None = None,
                 run_gap_s: float = RUN_GAP_S) -> None:
        """``state``: what ``state()`` returned before (a daemon restart), its version checked by
        the caller (``sidecar.core.ledger_state``; a value of the wrong kind raises ``TypeError``).
        ``flops_per_token``: the model FLOPs per token, for MFU, where the trainer's hello states
        none. ``run_gap_s``: seconds without a sender after which a host's next sender (no W&B
        run, no run label) starts a new run."""
        self.flops_per_token = flops_per_token
        self.run_gap_s = run_gap_s
        self.record = LedgerRecord.from_json(state)
        """Everything kept across daemon restarts."""
        self.session_begin: float | None = None
        """Begin of the first window this daemon folded: earlier time was not watched."""

    @property
    def runs(self) -> dict[str, dict[str, RoleRecord]]:
        """Run -> role -> its record."""
        return self.record.runs

    @property
    def verdicts(self) -> run_verdicts.Verdicts:
        """Each run's verdicts (``sidecar.aggregation.run_verdicts``)."""
        return self.record.verdicts

    def state(self) -> dict[str, object]:
        """Everything the ledger holds, as JSON-able data (the state file's content)."""
        return self.record.to_json()

    def add(self, facts: WindowFacts) -> None:
        """Fold one window in."""
        begin = facts.end_unix_s - facts.duration_s
        if self.session_begin is None:
            self.session_begin = begin
        joules = self._energy(facts)
        groups: dict[tuple[str, str], list[SenderFact]] = {}
        for s in self._host_runs(facts.senders):
            groups.setdefault((s.run, s.role), []).append(s)
        self._hold_gap_energy(joules, {role for _, role in groups})
        for (run, role), senders in sorted(groups.items()):
            fact = facts.roles.get(role) or RoleFact(dict.fromkeys(CAUSES, 0.0) | {"unattributed": 1.0})
            self._add_role(run, role, senders, fact, joules.get(role), begin)
        for run, members in self.runs.items():
            for role, r in members.items():
                r.sending = any(s.sending for s in groups.get((run, role), ()))
                heard = max(r.until, self.session_begin or 0.0)
                if (run, role) not in groups and r.pending_startup > 0 and facts.end_unix_s - heard > LIVE_S:
                    _unplaced(r)
        for end in facts.ends:
            _count_end(self.runs, *end[:4])
        self._verdicts(groups, facts.verdict, begin, facts.end_unix_s)
        self._no_trainer(facts, begin, sum(joules.values()))
        self.record.now_unix_s = facts.end_unix_s
        self._bound()

    def _verdicts(self, groups: Mapping[tuple[str, str], list[SenderFact]], verdict: Verdict | None,
                  begin: float, end: float) -> None:
        """The window's verdict goes to each run with a live sender, for the seconds of the window
        the run was alive: from the later of the window's begin and its senders' first start to the
        window's end."""
        if verdict is None:
            return
        by_run: dict[str, list[SenderFact]] = {}
        for (run, _), senders in groups.items():
            by_run.setdefault(run, []).extend(senders)
        for run, senders in by_run.items():
            if any(s.sending for s in senders):
                run_verdicts.fold(self.verdicts, run, verdict, end - max(begin, min(s.begin for s in senders)))

    def _hold_gap_energy(self, joules: Mapping[str, float], present: set[str]) -> None:
        """The energy of a role's GPUs while none of its senders is there is held in the role of
        the most recent run that has it (``gap_j``): a successor tells it as ``restart_gap``; if
        the run ended, it stays outside the run like the gap's seconds. GPUs of no role go to
        that run's role when it has only one."""
        latest: dict[str, RoleRecord] = {}
        runs = sorted(self.runs.values(), key=lambda m: max(r.until for r in m.values()))
        for members in runs:
            latest.update(members)
        if runs and len(runs[-1]) == 1 and "" in joules:
            [(role, r)] = runs[-1].items()
            if role not in present and r.observed_until is not None:
                r.gap_j = (r.gap_j or 0.0) + joules[""]
        for role, j in joules.items():
            if role and role not in present and role in latest:
                r = latest[role]
                if r.observed_until is not None:
                    r.gap_j = (r.gap_j or 0.0) + j

    def _host_runs(self, senders: tuple[SenderFact, ...]) -> list[SenderFact]:
        """``senders`` with each host run (``host:<name>``: no W&B run, no run label) resolved: a
        sender the host's current run knows stays in it; new ones join it when they started within
        ``run_gap_s`` of its last message, else they start a new run, ``host:<name>@<their first
        start, UTC>``."""
        resolved: dict[str, str] = {}
        host_runs = self.record.host_runs
        for base in sorted({s.run for s in senders if s.run.startswith(HOST_RUN)}):
            mine = [s for s in senders if s.run == base]
            current = host_runs.get(base) or base  # a state from before run gaps: the host's one run
            members = self.runs.get(current, {})
            runs = [run for run in self.runs if run == base or run.startswith(base + "@")]
            for s in mine:  # a sender stays in the run that knows it, the current one or an earlier one
                run = next((run for run in runs if any(s.key in r.senders for r in self.runs[run].values())), None)
                if run is not None:
                    resolved[s.key] = run
            known = [s for s in mine if resolved.get(s.key) == current]
            new = [s for s in mine if s.key not in resolved]
            if new:
                ends = [r.observed_until or r.first_unix_s for r in members.values()]
                last = max(ends + [s.end for s in known], default=None)
                if last is None or _start(new) - last > self.run_gap_s:
                    current = f"{base}@{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(_start(new)))}"
                for s in new:
                    resolved[s.key] = current
            host_runs[base] = current
        return [dataclasses.replace(s, run=resolved[s.key]) if s.key in resolved else s for s in senders]

    def _no_trainer(self, facts: WindowFacts, begin: float, joules: float) -> None:
        """Daemon time with no live sender: from the later of the last message, the last time
        accounted so and this session's start, to the window's end (or to the first message of a
        sender that came after it)."""
        rec = self.record
        floor = max(rec.idle_until, rec.trainer_until, self.session_begin or begin)
        sending = [s for s in facts.senders if s.sending]
        if facts.senders:
            rec.trainer_until = max(rec.trainer_until, max(s.end for s in facts.senders))
        if sending:
            first = min(s.begin for s in sending)  # a gone one still listed began long before
            if rec.idle_until > 0 and first > floor:
                rec.no_trainer_s += first - floor
            rec.idle_until = 0.0
            return
        start = max(floor, rec.trainer_until)
        if facts.end_unix_s > start:
            rec.no_trainer_s += facts.end_unix_s - start
            if facts.duration_s > 0:
                rec.no_trainer_j += joules * min(1.0, (facts.end_unix_s - start) / facts.duration_s)
        rec.idle_until = facts.end_unix_s

    def _energy(self, facts: WindowFacts) -> dict[str, float]:
        """Role -> joules its GPUs used since the previous window ("" for GPUs of no role)."""
        out: dict[str, float] = {}
        energy_prev = self.record.energy_prev
        for uuid, value in facts.energy.items():
            prev = energy_prev.get(uuid)
            if prev is not None and value >= prev:
                role = facts.gpu_roles.get(uuid, "")
                out[role] = out.get(role, 0.0) + value - prev
        energy_prev.update(facts.energy)  # a window without a poll yet keeps the last readings
        return out

    def _add_role(self, run: str, role: str, senders: list[SenderFact], fact: RoleFact,
                  joules: float | None, begin: float) -> None:
        """Account one (run, role) from where it was accounted up to its senders' last message."""
        members = self.runs.setdefault(run, {})
        r = members.get(role) or members.setdefault(role, RoleRecord(min(s.begin for s in senders)))
        known = r.senders
        stepped = [s for s in senders if s.step is not None or s.cycles or _windows_stepped(known, s.key)]
        b = max(s.end for s in senders)
        prev, continuing, joules_now = _resume(r, senders, joules)
        if b <= prev:  # nothing new from its senders: the energy waits for the seconds it goes with
            r.carry_j = joules_now
            return
        seconds = dict.fromkeys(CAUSES, 0.0)
        released: dict[str, float] = {}
        """Held startup seconds told this window (they take the held joules, not this window's)."""
        apart = 0.0
        """Restart-gap seconds before this window whose energy was held apart (``gap_j``)."""
        if not continuing:  # a successor: the gap until it started; a predecessor's unfinished startup stands
            prev, apart = _successor(r, senders, prev, b, begin, seconds, released)
        session = self.session_begin or 0.0
        if prev < session:  # the daemon was not running: the trainer was alive unseen
            unseen = min(session, b) - prev
            seconds["startup" if not stepped and not r.steps and not r.stepped else "unobserved"] += unseen
            prev += unseen
        alive, pended = _split_alive(r, fact, stepped, prev, b, begin, seconds, released)
        progress = _advance_senders(senders, known)
        r.steps += max(progress, default=0)  # data-parallel workers step together
        r.pending_startup += pended
        _joules(r, seconds, released, pended, joules_now, apart)
        if stepped:
            retell.warmup(r, alive, seconds["unattributed"], max(progress, default=0))
        retell.shutdown(r, seconds, bool(progress), senders)
        self._close_role(r, senders, fact, b)

    def _close_role(self, r: RoleRecord, senders: list[SenderFact], fact: RoleFact, b: float) -> None:
        """The role's facts as of ``b`` (its senders' last message); the longest-silent senders
        forgotten beyond ``MAX_SENDERS_PER_ROLE``."""
        stated = next((s.flops_per_token for s in senders if s.flops_per_token), None)
        if stated or self.flops_per_token:  # the trainer's statement wins over the daemon's setting
            r.flops_per_token = stated or self.flops_per_token
        r.gpus = max(r.gpus, fact.gpus)
        r.gpu_name = fact.gpu_name or r.gpu_name
        r.observed_until = b
        known = r.senders
        if len(known) > MAX_SENDERS_PER_ROLE:
            for key in sorted(known, key=lambda k: known[k].seen_unix_s)[: len(known) - MAX_SENDERS_PER_ROLE]:
                del known[key]

    def _bound(self) -> None:
        rec = self.record
        while len(rec.runs) > MAX_RUNS:
            oldest = min(rec.runs, key=lambda run: max(r.until for r in rec.runs[run].values()))
            del rec.runs[oldest]
            rec.runs_dropped += 1
        rec.host_runs = {k: v for k, v in rec.host_runs.items() if v in rec.runs}
        rec.verdicts = {k: v for k, v in rec.verdicts.items() if k in rec.runs}

    def view(self, state_errors: Mapping[str, int] | None = None) -> RunLedgerView:
        """The totals as exporters read them (a copy)."""
        return _view(self.record, self.flops_per_token, state_errors)


def view_of(state: Mapping[str, object], flops_per_token: float | None = None,
            state_errors: Mapping[str, int] | None = None) -> RunLedgerView:
    """A ``RunLedgerView`` of ledger state (``RunLedger.state()``, or a state file read back).
    ``flops_per_token``: for roles whose state holds none (neither the trainer's hello nor the
    daemon's setting stated one while it accounted them)."""
    return _view(LedgerRecord.from_json(state), flops_per_token, state_errors)


def _view(rec: LedgerRecord, flops_per_token: float | None, state_errors: Mapping[str, int] | None) -> RunLedgerView:
    roles = []
    for run, members in rec.runs.items():
        for role, r in members.items():
            last = r.until
            roles.append(RoleLedger(run, role, {c: r.seconds.get(c, 0.0) for c in CAUSES},
                                    {c: r.joules.get(c, 0.0) for c in CAUSES}, r.tokens, r.steps, r.gpus, r.gpu_name,
                                    r.first_unix_s, last, max(0.0, rec.now_unix_s - last) if not r.sending else 0.0,
                                    r.flops_per_token or flops_per_token, r.pending_startup, r.reported_mfu_s,
                                    r.reported_flop, dict(r.ends), dict(r.gap_after),
                                    r.last_end.told() if r.last_end is not None else {}))
    return RunLedgerView(tuple(roles), rec.no_trainer_s, rec.no_trainer_j, rec.runs_dropped, dict(state_errors or {}),
                         run_verdicts.views(rec.verdicts))


def _count_end(runs: Mapping[str, dict[str, RoleRecord]], role: str, how: str, cause: str = "",
              detail: str = "") -> None:
    """Count a sender end of ``role`` (``model.ends``) in the most recent run that has the role,
    keep it as the role's last (how, cause and detail: ``report`` shows what ended it), and give
    it the restart gap its successor opened, if that came first (else the next one)."""
    members = [m[role] for m in runs.values() if role in m]
    if not members:
        return
    r = max(members, key=lambda m: m.until)
    r.ends[how] = r.ends.get(how, 0) + 1
    r.last_end = LastEnd(how, cause, detail[:LAST_END_DETAIL])
    gap, r.gap_waiting = r.gap_waiting, None
    if gap is None:
        r.end_waiting = how
    else:
        r.gap_after[how] = r.gap_after.get(how, 0.0) + gap


def _resume(r: RoleRecord, senders: list[SenderFact], joules: float | None) -> tuple[float, bool, float]:
    """(where the role was accounted up to, whether a sender it knows sent more (else a successor
    took over), the joules to book now: this window's ``joules`` with what was held)."""
    known = r.senders
    prev = r.observed_until
    if prev is None:  # the role's first window: from its first sender's start
        prev = _start(senders)
        r.first_unix_s = prev
        continuing = True
    else:  # a known one sent more
        continuing = any(s.key in known and s.end > prev for s in senders)
    total = (joules or 0.0) + r.carry_j
    r.carry_j = 0.0
    if continuing and r.gap_j is not None:  # a known sender heard again (after a daemon restart, say):
        total += r.gap_j  # the energy held while none was heard goes with the seconds booked now
        r.gap_j = None
    return prev, continuing, total


def _successor(r: RoleRecord, senders: list[SenderFact], prev: float, b: float, begin: float,
               seconds: dict[str, float], released: dict[str, float]) -> tuple[float, float]:
    """A successor's start: the gap since ``prev`` booked as ``restart_gap`` and the predecessor's
    held startup released. Returns (the successor's start, the restart-gap seconds before this
    window whose energy was held apart)."""
    r.warm = None  # it warms up anew
    r.tail = {}
    known = r.senders
    succ = _start([s for s in senders if s.key not in known] or senders)
    succ = min(max(succ, prev), b)
    seconds["restart_gap"] += succ - prev
    _gap_after_end(r, succ - prev)
    apart = 0.0
    if r.gap_j is not None:
        r.joules["restart_gap"] = r.joules.get("restart_gap", 0.0) + r.gap_j
        r.gap_j = None
        apart = max(0.0, min(succ, begin) - prev)
    released["startup"] = r.pending_startup
    seconds["startup"] += r.pending_startup
    r.pending_startup = 0.0
    return succ, apart


def _split_alive(r: RoleRecord, fact: RoleFact, stepped: list[SenderFact], prev: float, b: float,
                 begin: float, seconds: dict[str, float], released: dict[str, float]) -> tuple[float, float]:
    """The seconds from ``prev`` to ``b`` into ``seconds`` by cause: (the seconds alive, the
    seconds held as startup until the first step tells how much of it was compilation)."""
    alive = max(0.0, b - prev)
    pended = 0.0
    if stepped and not r.stepped:  # the first steps: the span before them is startup still
        stepping = fact.step_s if fact.step_s > 0 else b - max(prev, begin)
        pended += max(0.0, alive - stepping)
        alive = min(alive, max(0.0, stepping))
    if not stepped:  # held until the first step tells how much of it was the first step's compilation
        pended += seconds["startup"] + alive
        seconds["startup"] = 0.0
        return alive, pended
    for cause, share in fact.shares.items():
        seconds[cause] += alive * share
    young = any(_windows_stepped(r.senders, s.key) < COMPILE_WINDOWS for s in stepped)
    excess = fact.first_step_excess_s if young else 0.0
    retell.lone_step(r, fact, young)
    pending, r.pending_startup = r.pending_startup + pended, 0.0
    # with step timings the long step lies in this window's stepping part; without them
    # it may lie in the held startup
    from_pending = min(excess, pending) if fact.step_s <= 0 else 0.0
    seconds["compile"] += from_pending
    seconds["startup"] += pending - from_pending
    released["compile"] = released.get("compile", 0.0) + from_pending
    released["startup"] = released.get("startup", 0.0) + pending - from_pending
    left = fact.compile_s + excess - from_pending
    for cause, amount in (("checkpoint", fact.checkpoint_s), ("compile", left)):
        retell.take(seconds, cause, min(amount, alive))
    r.stepped = True
    _efficiency(r, fact, alive)
    return alive, 0.0


def _efficiency(r: RoleRecord, fact: RoleFact, seconds: float) -> None:
    """Tokens from the trainer's ``tokens`` counter, else from the tokens/s it reports over the
    ``seconds`` accounted as stepping; its own MFU and FLOP/s per GPU over those seconds."""
    own = fact.reported
    r.tokens += fact.tokens if fact.tokens > 0 else own.get("tokens_per_s", 0.0) * seconds
    if "mfu" in own:
        r.reported_mfu_s += own["mfu"] * seconds
    if "flops_per_s" in own:
        r.reported_flop += own["flops_per_s"] * seconds


def _unplaced(r: RoleRecord) -> None:
    """A role whose senders all went (none listed in the window, none heard for ``LIVE_S``,
    nor since this daemon began: a restarted daemon waits for them to reconnect) with time
    still held before a first step: no step ever told how much of it was startup, so it is
    ``unobserved``, with the energy held with it (never left out of the wall time)."""
    held, r.pending_startup = r.pending_startup, 0.0
    _joules(r, dict.fromkeys(CAUSES, 0.0) | {"unobserved": held}, {"unobserved": held}, 0.0, 0.0)


def _joules(r: RoleRecord, seconds: dict[str, float], released: dict[str, float], pended: float,
            joules: float, apart: float = 0.0) -> None:
    """Add the window's seconds, and its GPU energy split in proportion to them: the seconds
    the window itself accounted or held take this window's joules; held seconds told now take
    the joules held with them; ``apart`` restart-gap seconds took the gap's own (none here)."""
    own = {c: max(0.0, v - released.get(c, 0.0)) for c, v in seconds.items()}
    own["restart_gap"] = max(0.0, own["restart_gap"] - apart)
    denom = sum(own.values()) + pended
    held_j = r.pending_j if released else 0.0
    if released:
        r.pending_j = 0.0
    told = sum(released.values())
    for cause, value in seconds.items():
        r.seconds[cause] = r.seconds.get(cause, 0.0) + value
        j = joules * own[cause] / denom if denom > 0 else 0.0
        j += held_j * released.get(cause, 0.0) / told if told > 0 else 0.0
        r.joules[cause] = r.joules.get(cause, 0.0) + j
    if denom > 0:
        r.pending_j += joules * pended / denom


def _advance_senders(senders: list[SenderFact], known: dict[str, SenderMemory]) -> list[int]:
    """Each sender's steps since the last window (those that advanced), its record in ``known``
    brought up to date."""
    progress = []
    for s in senders:
        k = known.setdefault(s.key, SenderMemory(s.end))
        advanced = _advance(s, k)
        if advanced > 0:
            progress.append(advanced)
        k.seen_unix_s = max(k.seen_unix_s, s.end)
    return progress


def _windows_stepped(known: Mapping[str, SenderMemory], key: str) -> int:
    """The windows in which sender ``key`` told steps (0: none, or not known)."""
    k = known.get(key)
    return k.windows_stepped if k is not None else 0


def _gap_after_end(r: RoleRecord, gap_s: float) -> None:
    """Book a restart gap under the end that opened it (``gap_after``): the end told before its
    successor came, or the next one told (the daemon tells an end ``sender_gone_after`` after it)."""
    how, r.end_waiting = r.end_waiting, None
    if how is None:
        r.gap_waiting = gap_s
    else:
        r.gap_after[how] = r.gap_after.get(how, 0.0) + gap_s


def _start(senders: list[SenderFact]) -> float:
    """When the first of ``senders`` started (its hello), else its first moment in a window."""
    return min((s.started_unix_s for s in senders if s.started_unix_s > 0), default=min(s.begin for s in senders))


def _advance(s: SenderFact, k: SenderMemory) -> int:
    """Steps sender ``s`` advanced this window, its memory ``k`` updated. Its step number wins:
    its rise since the previous window, and in its first window with one, the steps from the
    first number the daemon had from it, that one included (``publish(step)`` says step ``step``
    is done); without step numbers, its ``cycles``."""
    n = 0
    if s.step is not None:
        if k.step is not None:
            n = max(0, s.step - k.step)
        elif not k.windows_stepped:
            first = s.first_step if s.first_step is not None and s.first_step <= s.step else s.step
            n = s.step - first + 1
        else:  # counted by cycles so far: its step numbers count from this one on
            n = s.cycles or 0
        k.step = s.step
    elif s.cycles and k.step is None:  # a sender with step numbers counts them when the next one comes
        n = s.cycles
    if s.step is not None or s.cycles or k.windows_stepped:
        k.windows_stepped += 1
    return n
