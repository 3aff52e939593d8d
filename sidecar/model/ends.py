"""How a sender's process ended, as every exporter reads it (docs/RELIABILITY.md, "How a sender
ended"; the families in docs/METRICS.md).

The daemon tells an end once a sender's tally is reconciled (``sidecar.core.ingest``): from the tally
(final or not, the signal and the exception the shim saw), the process's crash file, its
exit-status file and its memory cgroup (``EndFacts``, ``how_ended``).
"""

from __future__ import annotations

import signal as signals
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainer_shim import exit_causes

HOWS: tuple[str, ...] = ("clean", "terminated", "failed", "unclean", "oom", "crashed")
"""``clean``: the process ended as intended (exit status 0, or its publisher closed and nothing
failed); ``terminated``: the final tally arrived after SIGTERM or SIGINT; ``failed``: an uncaught
exception, a non-zero exit status or an error of the distributed backend ended it (``cause``
says which: ``exception``, ``exit_code``, ``nccl``); ``unclean``: no final tally and nothing
more is known (SIGKILL, a lost process); ``oom``: out of memory: torch's CUDA out-of-memory error
(``cuda_oom``), ``MemoryError`` or the host allocator's (``host_oom``), or, with no final tally, its
memory cgroup counted an OOM kill (``host_oom``, SIGKILL); ``crashed``: no final tally and
faulthandler wrote down a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL)."""
ALERTING: frozenset[str] = frozenset({"failed", "unclean", "oom", "crashed"})
"""The ends that alert: every end but an intended one."""
MAX_GPU_INDEX = 1024
"""A GPU index a tally may name for a ``cuda_oom`` is below this (another is not told)."""
CAUSES: tuple[str, ...] = exit_causes.CAUSES
"""What ended a process, in one word (``trainer_shim.exit_causes``); empty: nothing known."""


@dataclass(frozen=True, slots=True)
class EndFacts:
    """What the daemon knows of one process's end (``sources.tallies.ReadyTally`` and its tally)."""

    final: bool
    """Its final tally arrived (``close()``, atexit, the shim's signal handler)."""
    signum: int = 0
    """The SIGTERM or SIGINT the shim saw (0: none)."""
    crash: str = ""
    """The fatal signal its crash file names (empty: none)."""
    kernel_oom: bool = False
    """Its memory cgroup counted an OOM kill."""
    exit_status: int | None = None
    """The status it exited with, if the C library wrote it down (None: not told)."""
    cause: str = ""
    """What the shim saw end it (``CAUSES``; anything else is read as ``exception``)."""
    detail: str = ""
    thread: str = ""
    """Non-empty: ``cause`` tells a thread's exception, not the process's end."""


@dataclass(frozen=True, slots=True)
class HowEnded:
    """``how`` (``HOWS``), the signal's name, ``cause`` (``CAUSES`` or empty) and the detail."""

    how: str
    signal: str = ""
    cause: str = ""
    detail: str = ""


def how_ended(facts: EndFacts) -> HowEnded:
    """How a process ended (docs/RELIABILITY.md, "How a sender ended"). A crash file or an OOM
    kill decide a non-final end; a signal the shim saw a final one; then the exit status, where
    told, says whether it failed (0: ``clean`` whatever a thread raised), and the shim's cause
    what of; without a status, the exception the shim saw end the process does."""
    if not facts.final and facts.crash:
        return HowEnded("crashed", facts.crash, "signal", _with_thread(facts))
    if not facts.final and facts.kernel_oom:
        return HowEnded("oom", "SIGKILL", "host_oom")
    if facts.final and facts.signum:
        return HowEnded("terminated", signal_name(facts.signum), "signal")
    cause = facts.cause if facts.cause in CAUSES else ("exception" if facts.cause else "")
    if not cause and facts.detail and not facts.thread:  # a shim before ``cause``: the bare type name
        cause = exit_causes.classify_names([facts.detail])
    failing = cause and not facts.thread  # the process's own end, not a thread's
    if facts.exit_status is not None:
        if facts.exit_status == 0:
            return HowEnded("clean")
        if not cause:
            return HowEnded("failed", "", "exit_code", f"exit status {facts.exit_status}")
        return HowEnded(_how_of(cause), "", cause, _with_thread(facts))
    if failing:
        return HowEnded(_how_of(cause), "", cause, facts.detail)
    if facts.final:
        return HowEnded("clean")
    return HowEnded("unclean", "", cause, _with_thread(facts))


def _how_of(cause: str) -> str:
    return "oom" if cause in exit_causes.OOM_CAUSES else "terminated" if cause == "signal" else "failed"


def _with_thread(facts: EndFacts) -> str:
    """The detail, saying the thread it comes from when it is a thread's."""
    if facts.thread and facts.detail:
        return exit_causes.cut(f"in thread {facts.thread}: {facts.detail}")
    return facts.detail


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
    unknown, at most (its channels' queue size; 0 for a final tally); ``detail``: what ended it in
    a few words (``RuntimeError: loss is NaN at step 100``, ``exit status 2``; at most 160
    characters, never a traceback), empty if nothing is known."""

    role: str
    worker: str
    how: str
    signal: str
    pid: int
    step: int | None
    unix_s: float
    unknown_max: int
    detail: str = ""
    cause: str = ""
    """What ended it (``CAUSES``; empty: nothing known, as for a clean end)."""
    gpu: int = -1
    """For a ``cuda_oom``: the GPU torch's message names (-1: none)."""
    final: bool = True
    """Its final tally arrived: nothing it made is unknown."""

    def text(self) -> str:
        """``trainer/0 pid 4242 failed (exception: RuntimeError: loss is NaN) at step 100``, or
        ``trainer/0 pid 4242 unclean at step 57 (after its last flush at most 100,000 records
        unknown)``."""
        parts = [f"{self.role}/{self.worker} pid {self.pid} {self.how}"]
        if self.signal:
            parts.append(f"({self.signal})")
        if self.cause and self.cause != "signal":
            gpu = f" on GPU {self.gpu}" if self.gpu >= 0 else ""
            parts.append(f"({self.cause}{gpu}: {self.detail})" if self.detail else f"({self.cause}{gpu})")
        elif self.detail:
            parts.append(f"[{self.detail}]")
        if self.step is not None:
            parts.append(f"at step {self.step}")
        if not self.final:
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
