"""Whether the kernel's OOM killer ended a process, from its memory cgroup's counters.

While a sender's process lives, ``oom_baseline`` reads which memory cgroup it is in
(``/proc/<pid>/cgroup``) and that cgroup's OOM-kill count and its ancestors' (cgroup v2:
``memory.events`` ``oom_kill``; v1: ``memory.oom_control`` ``oom_kill``, Linux 4.13 or later).
Once the process is gone without a final tally, ``oom_killed`` reads them again: a count that rose
says the OOM killer killed a process there in between. The deepest cgroup still readable decides
(a container's or a systemd scope's cgroup may be removed with its last process; v2 counts a
child's kills in its ancestors too). Needs read access to ``/proc/<pid>/cgroup`` and the cgroup
files (the trainer's own user or root; both world-readable by default). The kernel log's OOM record
is not read: ``/dev/kmsg`` needs ``CAP_SYSLOG`` where ``dmesg_restrict`` is set. Nothing here raises.
"""

from __future__ import annotations

import os

ROOTS = (("/sys/fs/cgroup", "memory.events"), ("/sys/fs/cgroup/unified", "memory.events"),
         ("/sys/fs/cgroup/memory", "memory.oom_control"))
"""Where the cgroup hierarchies are mounted (v2, v2 beside v1, v1's memory controller) and the
file in each cgroup that holds the ``oom_kill`` count."""
MAX_DEPTH = 16
"""Ancestors read at most (a cgroup path is a few levels deep)."""

Baseline = tuple[tuple[str, int], ...]
"""(file, its ``oom_kill`` count), deepest cgroup first."""


def oom_baseline(pid: int) -> Baseline:
    """The ``oom_kill`` counts of process ``pid``'s memory cgroup and its ancestors now; empty if
    none can be read (no such process, no memory cgroup, no access)."""
    out: list[tuple[str, int]] = []
    for path in _memory_cgroup_files(pid):
        count = _oom_kills(path)
        if count is not None:
            out.append((path, count))
    return tuple(out)


def oom_killed(baseline: Baseline) -> bool:
    """Whether the deepest cgroup of ``baseline`` still readable counts more OOM kills now."""
    for path, before in baseline:
        now = _oom_kills(path)
        if now is not None:
            return now > before
    return False


def _memory_cgroup_files(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read(65536).splitlines()
    except OSError:
        return []
    files = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            roots = [r for r in ROOTS if r[1] == "memory.events"]
        elif "memory" in controllers.split(","):
            roots = [r for r in ROOTS if r[1] == "memory.oom_control"]
        else:
            continue
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        for root, name in roots:
            for depth in range(len(parts), max(-1, len(parts) - MAX_DEPTH), -1):
                candidate = os.path.join(root, *parts[:depth], name)
                if os.path.exists(candidate):
                    files.append(candidate)
    return files


def _oom_kills(path: str) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f.read(4096).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
    except OSError:
        return None
    return None
