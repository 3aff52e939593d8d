"""How a sender's process ended, as every exporter reads it (docs/RELIABILITY.md, "How a sender
ended"; the families in docs/METRICS.md).

The daemon tells an end once a sender's tally is booked (``sidecar.core.ingest``): from the tally
(final or not, the signal the shim saw), the process's crash file and its memory cgroup.
"""

from __future__ import annotations

import signal as signals
from collections.abc import Mapping
from dataclasses import dataclass, field

HOWS: tuple[str, ...] = ("clean", "terminated", "unclean", "oom", "crashed")
"""``clean``: the final tally arrived (``close()``, atexit, multiprocessing's exit path; also
after an uncaught exception); ``terminated``: the final tally arrived after SIGTERM or SIGINT;
``unclean``: no final tally (SIGKILL, a lost process); ``oom``: no final tally and its memory
cgroup counted an OOM kill; ``crashed``: no final tally and faulthandler wrote down a fatal
signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL)."""
ALERTING: frozenset[str] = frozenset({"unclean", "oom", "crashed"})
"""The ends that lose what the process made after its last flush, and that alert."""


def how_ended(final: bool, signum: int, crash: str, oom: bool) -> tuple[str, str]:
    """``(how, signal name)`` from the tally's facts: ``final`` (written by ``close()`` or the
    signal handler), ``signum`` (the SIGTERM/SIGINT the shim saw, 0: none), ``crash`` (the fatal
    signal in the crash file, empty: none) and ``oom`` (its cgroup counted an OOM kill)."""
    if final:
        return ("terminated", signal_name(signum)) if signum else ("clean", "")
    if crash:
        return "crashed", crash
    if oom:
        return "oom", "SIGKILL"
    return "unclean", ""


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; ``SIG<n>`` for a number Python does not name."""
    try:
        return signals.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


@dataclass(frozen=True, slots=True)
class SenderEnd:
    """One process's end under one role. ``unix_s``: its tally's last write (Unix seconds: the
    final word, or the last flush of a process that died without one); ``step``: the latest step it
    published (None: none); ``unknown_max``: records it made after its last flush whose fate is
    unknown, at most (its channels' queue size; 0 for a final tally); ``detail``: the uncaught
    exception's type the shim saw, if any."""

    role: str
    worker: str
    how: str
    signal: str
    pid: int
    step: int | None
    unix_s: float
    unknown_max: int
    detail: str = ""

    def text(self) -> str:
        """``trainer/0 pid 4242 unclean at step 57 (after its last flush at most 100,000 records unknown)``."""
        parts = [f"{self.role}/{self.worker} pid {self.pid} {self.how}"]
        if self.signal:
            parts.append(f"({self.signal})")
        if self.detail:
            parts.append(f"[{self.detail}]")
        if self.step is not None:
            parts.append(f"at step {self.step}")
        if self.how in ALERTING:
            bound = f"at most {self.unknown_max:,}" if self.unknown_max else "an unknown number of"
            parts.append(f"(after its last flush {bound} records unknown)")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class EndsView:
    """The ends told in this daemon's life: ``counts`` per (role, how), ``last`` per role, and
    ``new``: those told since the previous window, oldest first."""

    counts: Mapping[tuple[str, str], int] = field(default_factory=dict)
    last: Mapping[str, SenderEnd] = field(default_factory=dict)
    new: tuple[SenderEnd, ...] = ()
