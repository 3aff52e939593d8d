"""The daemon's own process: its cost (CPU time and resident memory, read from /proc without
dependencies) and its limits (``raise_nofile_limit``, before anything opens descriptors)."""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass

_PAGE = os.sysconf("SC_PAGE_SIZE")
log = logging.getLogger("sidecar")


@dataclass(frozen=True, slots=True)
class SelfStats:
    cpu_seconds: float
    """User + system CPU time of the whole process (seconds)."""
    rss_bytes: int
    """Resident set size (bytes)."""
    threads: int
    open_fds: int


def read_self() -> SelfStats:
    """Current figures for this process. Falls back to ``getrusage`` where /proc is missing."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * _PAGE
        threads = len(os.listdir("/proc/self/task"))
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        rss, threads, fds = usage.ru_maxrss * 1024, 0, 0
    return SelfStats(cpu, rss, threads, fds)


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (where allowed); returns (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("sidecar: cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft, hard
