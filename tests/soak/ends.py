"""How trainer processes end, and what the daemon tells of it: the end cases, shared by
``tests/test_sender_ends.py``. Each case runs one real shim process (its own role) against a running
``DaemonProc``, ends it its way, and ``read_end`` then reads what the daemon exports for the role:
the ends per ``how``, the last end's labels, and the loss accounting (``exits.counted``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.daemon_harness import DaemonProc, env
from tests.soak.exits import PRELUDE, counted

CHILD = PRELUDE + textwrap.dedent("""
    mode, role = sys.argv[2], sys.argv[3]
    ch, calls = connect(role, "0", 0.05)
    for i in range(500):
        ch.count("n"); calls += 1
    ch.publish(7, {"step_ms": 1.0}); calls += 1
    assert telemetry.flush(wait_s=10)
    print(json.dumps({"made": calls}), flush=True)
    time.sleep(0.3)  # flush() returns once ZeroMQ has the frames: let its I/O thread write them
    if mode == "exit":
        sys.exit(3)
    if mode == "exception":
        raise ValueError("the trainer's own bug")
    if mode == "abort":
        os.abort()
    if mode == "segfault":
        import ctypes
        ctypes.string_at(0)
    if mode == "oom":
        hog = []
        while True:
            hog.append(b"x" * (16 << 20))
    if mode in ("sigterm", "sigint", "sigkill"):
        time.sleep(120)  # the test signals it
""")

POOL = PRELUDE + textwrap.dedent("""
    import multiprocessing as mp
    def work(args):
        i, q = args
        ch, calls = connect(sys.argv[3], f"w{i}", 0.05)
        for j in range(300):
            ch.count("n"); calls += 1
        assert telemetry.flush(wait_s=10)
        q.put(calls)
        time.sleep(120)
    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        m = ctx.Manager(); q = m.Queue()
        pool = ctx.Pool(2)
        pool.map_async(work, [(i, q) for i in range(2)], chunksize=1)
        calls = sum(q.get(timeout=60) for _ in range(2))
        pool.terminate(); pool.join()
        print(json.dumps({"made": calls}), flush=True)
""")

FORKED_COUNTER = PRELUDE + textwrap.dedent("""
    import multiprocessing as mp
    def count(made, ready):
        ch, calls = connect(sys.argv[3], "0", 0.1)
        made.value = calls
        ready.set()
        while True:  # 4,000 calls/s: 40 calls every 10 ms
            for _ in range(40):
                ch.count("n"); made.value += 1
            time.sleep(0.01)
    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        made, ready = ctx.RawValue("q", 0), ctx.Event()
        child = ctx.Process(target=count, args=(made, ready))
        child.start()
        assert ready.wait(60)
        time.sleep(3)
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        print(json.dumps({"made": made.value, "pid": child.pid, "exitcode": child.exitcode,
                          "killed_unix_s": time.time()}), flush=True)
""")


@dataclass
class Ended:
    """What a case made and what the daemon told of its role."""

    role: str
    made: int
    status: int | None
    out: dict[str, Any] = field(default_factory=dict)


def start(d: DaemonProc, mode: str, role: str, script: str = CHILD,
          preexec: Callable[[], None] | None = None) -> subprocess.Popen[str]:
    """A shim process running ``script`` with ``mode`` and ``role``."""
    return subprocess.Popen([sys.executable, "-c", script, d.endpoint, mode, role], env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)


def finish(p: subprocess.Popen[str], role: str, sig: int | None = None, timeout_s: float = 120.0) -> Ended:
    """Read the case's first line (what it made up to its last flush), send ``sig`` if given, and
    wait for the process to end."""
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        p.wait(timeout_s)
        raise AssertionError(f"{role}: no output, status {p.returncode}: {p.stderr.read() if p.stderr else ''}")
    out = json.loads(line)
    if sig is not None:
        os.kill(p.pid, sig)
    p.communicate(timeout=timeout_s)
    return Ended(role, int(out["made"]), p.returncode, out)


def ends_of(d: DaemonProc, role: str) -> dict[str, int]:
    """``dflash_sidecar_sender_exits_total`` of ``role``, per how (those above 0)."""
    return {lab["how"]: int(v) for lab, v in d.samples().get("dflash_sidecar_sender_exits_total", [])
            if lab.get("role") == role and v > 0}


def last_end(d: DaemonProc, role: str) -> dict[str, str] | None:
    """The labels of ``role``'s last end (``dflash_sidecar_sender_last_exit_timestamp_seconds``)."""
    for lab, _ in d.samples().get("dflash_sidecar_sender_last_exit_timestamp_seconds", []):
        if lab.get("role") == role:
            return dict(lab)
    return None


def losses(d: DaemonProc, role: str) -> tuple[int, dict[str, int]]:
    """``exits.counted``: accepted + every drop reason for ``role``, and the drops by reason."""
    return counted(d, role)


def memory_cgroup(limit_bytes: int) -> tuple[Path, Callable[[], None]] | str:
    """A new memory cgroup under this process's own, limited to ``limit_bytes`` (cgroup v1's memory
    controller, or v2 where this cgroup may enable it for a child), and a ``preexec_fn`` that moves
    a child process into it at its start; or, where none can be made, the reason."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        return f"no /proc/self/cgroup: {exc}"
    reasons = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            base, files = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), ("memory.limit_in_bytes",)
        elif hierarchy == "0" and controllers == "":
            base, files = Path("/sys/fs/cgroup") / path.lstrip("/"), ("memory.max",)
            if not (base / "memory.max").exists() and not _enable_v2_memory(base, reasons):
                continue
        else:
            continue
        made = _make(base / f"dflash-oom-{os.getpid()}", files[0], limit_bytes, reasons)
        if made is not None:
            return made
    return "; ".join(reasons) or "no memory cgroup controller is mounted"


def _enable_v2_memory(base: Path, reasons: list[str]) -> bool:
    try:
        if "memory" not in (base / "cgroup.controllers").read_text().split():
            reasons.append(f"cgroup v2 at {base} has no memory controller")
            return False
        (base / "cgroup.subtree_control").write_text("+memory")
        return True
    except OSError as exc:
        reasons.append(f"cannot enable memory for children of {base}: {exc.strerror}")
        return False


def _make(group: Path, limit_file: str, limit_bytes: int, reasons: list[str]) -> tuple[Path, Callable[[], None]] | None:
    try:
        group.mkdir()
    except OSError as exc:
        reasons.append(f"cannot create {group}: {exc.strerror}")
        return None
    try:
        (group / limit_file).write_text(str(limit_bytes))
        swap = group / ("memory.memsw.limit_in_bytes" if limit_file == "memory.limit_in_bytes" else "memory.swap.max")
        if swap.exists():
            swap.write_text(str(limit_bytes) if limit_file == "memory.limit_in_bytes" else "0")
    except OSError as exc:
        reasons.append(f"cannot limit {group}: {exc.strerror}")
        group.rmdir()
        return None
    procs = str(group / "cgroup.procs")

    def enter() -> None:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    return group, enter


def remove_cgroup(group: Path) -> None:
    """Remove the cgroup once its processes are gone."""
    try:
        group.rmdir()
    except OSError:
        pass


SIGNALS = {"sigterm": signal.SIGTERM, "sigint": signal.SIGINT, "sigkill": signal.SIGKILL}
"""The modes the test ends with a signal of its own."""
