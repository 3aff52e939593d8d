"""The book of senders' ends (``EndBook.count``): how many per role and how, the last per role, the new ones of the
current window. Ingest thread only; the window copies it (``view``)."""

from __future__ import annotations

from sidecar.model.ends import HOWS, EndsView, SenderEnd

MAX_ROLES = 1024
"""Roles whose last end is kept (the label table's bound: a role has a label pair)."""
MAX_NEW = 256
"""Ends kept for the next window's events; beyond it the oldest go (still counted)."""


class EndBook:
    """Counts each end once; ``view`` hands the window its copy and starts a new list of events."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.last: dict[str, SenderEnd] = {}
        self._new: list[SenderEnd] = []

    def count(self, end: SenderEnd) -> None:
        """Count ``end`` and keep it as its role's last (a role beyond ``MAX_ROLES``, from tallies
        made up by hand, is neither)."""
        key = (end.role, end.how)
        if key in self.counts or len(self.counts) < MAX_ROLES * len(HOWS):
            self.counts[key] = self.counts.get(key, 0) + 1
        if end.role in self.last or len(self.last) < MAX_ROLES:
            self.last[end.role] = end
        self._new.append(end)
        del self._new[:-MAX_NEW]

    def view(self) -> EndsView:
        """The ends so far, with the new ones since the last call."""
        new, self._new = tuple(self._new), []
        return EndsView(dict(self.counts), dict(self.last), new)
