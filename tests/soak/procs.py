"""Processes of the soak and what /proc says about them: RSS, CPU, file descriptors, threads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.daemon_harness import ROOT, Samples, env
from tests.launcher import cpu_seconds, memory_bytes


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (bytes); 0 if it is gone."""
    try:
        return memory_bytes(pid)[0]
    except OSError:
        return 0


def open_fds(pid: int) -> list[str]:
    """What each open file descriptor of ``pid`` points at (``/proc/<pid>/fd``)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return sorted(out)


def thread_names(pid: int) -> list[str]:
    """Names of the threads of ``pid`` (``/proc/<pid>/task/*/comm``)."""
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip())
        except OSError:
            pass
    return sorted(names)


class Sampler:
    """Samples a process's RSS and CPU time every ``period_s`` on a background thread."""

    def __init__(self, pid: int, period_s: float = 0.5) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int, float]] = []
        """(monotonic time, RSS bytes, CPU seconds)"""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._thread.start()

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            try:
                rss, cpu = memory_bytes(self.pid)[0], cpu_seconds(self.pid)
            except OSError:  # gone: nothing to sample
                rss, cpu = 0, 0.0
            if rss:
                self.samples.append((time.monotonic(), rss, cpu))
            self._stop.wait(period_s)

    def stop(self) -> list[tuple[float, int, float]]:
        self._stop.set()
        self._thread.join()
        return self.samples


class Controlled:
    """A child process speaking one JSON line per command over stdin/stdout."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env=env(), cwd=ROOT, text=True, bufsize=1)
        self.log_path = log_path

    def command(self, line: str | None, timeout_s: float = 30.0) -> dict[str, Any]:
        """Send ``line`` (None: send nothing) and return the next JSON answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        answer: list[str] = []
        reader = threading.Thread(target=lambda: answer.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout_s)
        if not answer or not answer[0]:
            raise AssertionError(f"no answer to {line!r} within {timeout_s}s; stderr:\n{self.stderr()}")
        return json.loads(answer[0])

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()


class PublisherProc(Controlled):
    """``tests.soak.publisher`` in a subprocess (see that module for the commands)."""

    def __init__(self, tmp: Path, spec: dict[str, Any]) -> None:
        super().__init__(["-m", "tests.soak.publisher", json.dumps(spec)], tmp / f"publisher-{spec['name']}.log")
        self.spec = spec
        self.ready = self.command(None)

    def stop(self) -> dict[str, Any]:
        out = self.command("stop")
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)
        self._log.close()
        return out


class GarbageProc(Controlled):
    """``tests.soak.garbage`` in a subprocess: floods the endpoint until told to stop."""

    def __init__(self, tmp: Path, spec: dict[str, Any]) -> None:
        super().__init__(["-m", "tests.soak.garbage", json.dumps(spec)], tmp / "garbage.log")

    def stop(self) -> dict[str, Any]:
        out = self.command("stop")
        self.proc.wait(10)
        self._log.close()
        return out


def terminate(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL after 5 s: for processes this test started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def label_accounting(samples: Samples) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (role, worker): ``accepted`` and ``dropped`` by reason, from one scrape."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for labels, value in samples.get("dflash_sidecar_records_accepted_total", []):
        out.setdefault((labels["role"], labels["worker"]), {"accepted": 0, "dropped": {}})["accepted"] = int(value)
    for labels, value in samples.get("dflash_sidecar_records_dropped_total", []):
        entry = out.setdefault((labels["role"], labels["worker"]), {"accepted": 0, "dropped": {}})
        entry["dropped"][labels["reason"]] = int(value)
    return out


def transport_total(entry: dict[str, Any]) -> int:
    """``records_total`` as the daemon accounts it: accepted + rejected + before_join +
    lost_in_transit (every reason except the sender's own ``sender_*`` drops)."""
    return entry["accepted"] + sum(v for r, v in entry["dropped"].items() if not r.startswith("sender_"))


def sender_drops(entry: dict[str, Any]) -> int:
    return sum(v for r, v in entry["dropped"].items() if r.startswith("sender_"))
