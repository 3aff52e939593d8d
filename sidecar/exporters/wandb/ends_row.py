"""The senders' ends in a W&B row (``ends/<role>/...``) and the alerts they raise.

A window in which a process ended carries, per role, the count of ends by how so far and the last
end's pid, step and the records it left unknown: the event row. An end that was not intended
(``ALERTING``: failed, unclean, oom, crashed) also raises a W&B alert (``run.alert``) whose title
names the cause (``trainer process ended oom (cuda_oom) on n1``) and whose text has the end's
detail (the exception's type and first line), at most one per role and how every
``ALERT_EVERY_S`` (W&B's own ``wait_duration`` says the same to the service).
"""

from __future__ import annotations

from sidecar.model.ends import ALERTING, EndsView

ALERT_EVERY_S = 300.0
"""The least time between two alerts for the same role and how (seconds)."""
MAX_TITLE = 63
"""W&B refuses alert titles of 64 characters or more."""


def ends_row(view: EndsView) -> dict[str, float]:
    """Keys for each role with an end in this window (none otherwise)."""
    row: dict[str, float] = {}
    for end in view.new:
        p = f"ends/{end.role}"
        for (role, how), n in view.counts.items():
            if role == end.role:
                row[f"{p}/{how}"] = float(n)
        row[f"{p}/pid"] = float(end.pid)
        row[f"{p}/unknown_records"] = float(end.unknown_max)
        if end.step is not None:
            row[f"{p}/step"] = float(end.step)
    return row


class AlertLimiter:
    """Which of a window's ends raise an alert: one per role and how per ``ALERT_EVERY_S``."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], float] = {}

    def alerts(self, view: EndsView, host: str, now: float) -> list[tuple[str, str]]:
        """``(title, text)`` for the new ends that alert now; ``now``: monotonic seconds."""
        out = []
        for end in view.new:
            key = (end.role, end.how)
            if end.how not in ALERTING or now - self._last.get(key, -ALERT_EVERY_S) < ALERT_EVERY_S:
                continue
            if len(self._last) >= 4096:
                self._last.clear()  # made-up roles from forged tallies: forget, alert again at worst
            self._last[key] = now
            cause = f" ({end.cause})" if end.cause and end.cause != "signal" else ""
            title = f"{end.role} process ended {end.how}{cause} on {host}"[:MAX_TITLE]
            out.append((title, f"dflash-sidecar on {host}: {end.text()}"))
        return out
