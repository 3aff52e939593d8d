"""The run ledger's retelling rules: time a window told by its shares, moved to the cause a later
window shows it was (docs/METRICS.md, "Run ledger").

Pure, over one role's record (``record.RoleRecord``): checkpoint and compile seconds are taken
from the idle causes first (``take``); a young sender's lone long step is retold as ``compile``
once the next window's median step shows it compiled (``lone_step``); the idle time nothing
explained in a role's slow first windows is retold as ``warmup`` once its step time settles
(``warmup``); the time told since its last step is retold as ``shutdown`` at a clean end
(``shutdown``). Every move keeps the seconds' and the joules' sums (``retell``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.aggregation.ledger.facts import COMPILE_FACTOR, RoleFact, SenderFact
from sidecar.aggregation.ledger.record import RoleRecord, WarmWatch

TAKE_ORDER = ("unattributed", "host", "data", "queue", "communication", "productive", "throttled")
"""Where checkpoint and compile seconds are taken from: the GPU-idle causes first."""
SHUTDOWN_FROM = TAKE_ORDER
"""The causes a window tells by its shares: after a role's last step, these seconds are its shutdown."""
WARMUP_SETTLE = 1.25
"""A role's step time has settled once two consecutive stretches of its windows take per step
within this factor of each other (``warmup``)."""
WARMUP_MAX_STRETCHES = 20
"""Stretches watched for the step time to settle; a role whose step time never settles in as
many keeps its first windows' idle time ``unattributed``."""


def retell(r: RoleRecord, cause: str, amount: float, sources: tuple[str, ...] = TAKE_ORDER) -> None:
    """Move ``amount`` seconds already in role ``r``'s totals to ``cause`` from ``sources``, in
    order (as far as they hold it), each with its share of the joules they took (the sums are kept)."""
    seconds, joules = r.seconds, r.joules
    for source in sources:
        if amount <= 0:
            return
        have = seconds.get(source, 0.0)
        moved = min(amount, have)
        if moved <= 0:
            continue
        j = joules.get(source, 0.0) * moved / have
        seconds[source] = have - moved
        joules[source] = joules.get(source, 0.0) - j
        seconds[cause] = seconds.get(cause, 0.0) + moved
        joules[cause] = joules.get(cause, 0.0) + j
        amount -= moved


def take(seconds: dict[str, float], cause: str, amount: float) -> None:
    """Move ``amount`` of a window's ``seconds`` (cause -> seconds, every cause present) to
    ``cause`` from the others in ``TAKE_ORDER`` (the sum is kept)."""
    for source in TAKE_ORDER:
        if amount <= 0:
            return
        moved = min(amount, seconds[source])
        seconds[source] -= moved
        seconds[cause] += moved
        amount -= moved


def lone_step(r: RoleRecord, fact: RoleFact, young: bool) -> None:
    """A young sender's step alone in its window (``RoleFact.lone_step_s``) is held until the
    next window's median step tells whether it compiled: its excess is then moved from the
    time already accounted (where the long step lay) to ``compile``, like ``take``."""
    held, r.lone_step_s = r.lone_step_s, 0.0
    reference = fact.median_step_s or fact.lone_step_s
    if held > 0 and reference > 0 and held >= COMPILE_FACTOR * reference:
        retell(r, "compile", held - reference)
    elif not held and young and fact.lone_step_s > 0 and fact.median_step_s <= 0:
        r.lone_step_s = fact.lone_step_s


def warmup(r: RoleRecord, alive_s: float, unattributed_s: float, steps: int) -> None:
    """Fold one stepping window into the role's warm-up watch (``r.warm``; docs/METRICS.md, Run
    ledger): its alive and ``unattributed`` seconds, and the steps it progressed, gathered into
    stretches that each end at a window with progress (the first stepping window is a stretch of
    its own: how many steps it holds is not told). Once two consecutive stretches take per step
    within ``WARMUP_SETTLE`` of each other the step time has settled: the ``unattributed`` seconds
    of every stretch before them beyond those two stretches' ``unattributed`` share are retold
    as ``warmup``. Never settled within ``WARMUP_MAX_STRETCHES``: nothing is retold."""
    if r.warm is None:
        r.warm = WarmWatch()
    warm = r.warm
    if warm.done:
        return
    stretches = warm.stretches
    if not stretches:
        stretches.append((alive_s, unattributed_s, 0))
        return
    warm.open = (warm.open[0] + alive_s, warm.open[1] + unattributed_s)
    if steps <= 0:
        return
    stretches.append((*warm.open, steps))
    warm.open = (0.0, 0.0)
    (a1, u1, n1), (a2, u2, n2) = stretches[-2:]
    if n1 > 0 and max(a1 / n1, a2 / n2) <= WARMUP_SETTLE * min(a1 / n1, a2 / n2):
        share = (u1 + u2) / (a1 + a2) if a1 + a2 > 0 else 0.0
        retell(r, "warmup", sum(max(0.0, u - a * share) for a, u, _ in stretches[:-2]), ("unattributed",))
        warm.done, warm.stretches = True, []
    elif len(stretches) >= WARMUP_MAX_STRETCHES:
        warm.done, warm.stretches = True, []


def shutdown(r: RoleRecord, seconds: Mapping[str, float], progressed: bool, senders: list[SenderFact]) -> None:
    """Keep the seconds the role's windows told by their shares since its last window with step
    progress (``r.tail``); when its senders' window ends with a clean end (one closed, none
    alive), retell them as ``shutdown``: the time from its last step to its exit."""
    tail = r.tail
    if progressed:
        tail.clear()
    elif r.stepped:
        for cause in SHUTDOWN_FROM:
            if seconds.get(cause, 0.0) > 0:
                tail[cause] = tail.get(cause, 0.0) + seconds[cause]
    if tail and any(s.closed for s in senders) and not any(s.sending for s in senders):
        for cause, amount in tail.items():
            retell(r, "shutdown", amount, (cause,))
        tail.clear()
