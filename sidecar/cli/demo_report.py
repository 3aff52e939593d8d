"""What ``dflash-sidecar demo`` tells its user: a progress line from the first second, and on exit
a summary (the verdict, the run ledger, the commands to try next).

The progress line goes to stderr, rewritten in place on a terminal (every second; the daemon's log
lines overwrite it, and it comes back below them) and one line
every ``PIPED_EVERY_S`` otherwise (a log or a pipe keeps a readable history); it reads the daemon's
latest window's report (``ScrapeState.report``) and the simulated trainer's step count, nothing else.
"""

from __future__ import annotations

import shlex
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from sidecar.cli.report import verdict_lines
from sidecar.model.ledger import RoleLedger, RunLedgerView
from sidecar.model.window import IngestReport

PIPED_EVERY_S = 5.0
"""Seconds between progress lines when stderr is not a terminal (the first comes after 1 s)."""


class Progress:
    """A thread printing one progress line a second (``start``/``stop``; ``stop`` is idempotent)."""

    def __init__(self, report: Callable[[], IngestReport | None], steps: Callable[[], int], interval_s: float,
                 duration_s: float | None, out: TextIO = sys.stderr) -> None:
        """``report``: the daemon's latest window's report (None before the first); ``steps``: the simulated
        trainer's steps so far; ``interval_s``: the daemon's window (seconds, for "first verdict in")."""
        self.report, self.steps, self.interval_s, self.duration_s, self.out = report, steps, interval_s, duration_s, out
        self.tty = out.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-progress", daemon=True)
        self._began = time.monotonic()

    def start(self) -> None:
        self._began = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        if self.tty:
            self.out.write("\x1b[2K")  # the summary follows
            self.out.flush()

    def line(self) -> str:
        """``demo 3 s (Ctrl-C to stop) · 41 steps · verdict: first at the window's end, in 7 s``."""
        elapsed = time.monotonic() - self._began
        until = f"of {self.duration_s:g} s" if self.duration_s else "(Ctrl-C to stop)"
        report = self.report()
        verdict = report.insight.verdict.name if report is not None and report.insight is not None else None
        told = (f"verdict {verdict}" if verdict else
                f"verdict: first at the window's end, in {max(0.0, self.interval_s - elapsed):.0f} s")
        return f"demo {elapsed:.0f} s {until} · {self.steps()} steps · {told}"

    def _run(self) -> None:
        every = 1.0 if self.tty else PIPED_EVERY_S
        wait = 1.0
        while not self._stop.wait(wait):
            text = self.line()
            # on a terminal the cursor goes back to the line's start: a log line overwrites it
            self.out.write(f"\x1b[2K{text}\r" if self.tty else text + "\n")
            self.out.flush()
            wait = every


def _role_line(r: RoleLedger) -> str:
    if r.wall_s <= 0:
        return (f"  role {r.role}: wall 0.0 s: no step told yet, {r.starting_s:.1f} s held as startup until "
                "its first (the ledger counts a role's time from its steps)")
    badput = max((c for c in r.seconds if c != "productive"), key=lambda c: r.seconds[c])
    goodput = f"{r.goodput_ratio:.0%}" if r.goodput_ratio is not None else "-"
    return (f"  role {r.role}: wall {r.wall_s:.1f} s, goodput {goodput}, most badput {badput} "
            f"{r.seconds[badput]:.1f} s, steps {r.steps}")


WHY_DROPPED = {
    "lost_at_exit": "sent by a sender as it closed and not received before the daemon stopped",
    "before_join": "made before the daemon's subscription reached the sender (ZeroMQ drops what a PUB "
                   "sends before it)",
    "lost_in_transit": "lost between the shim and the daemon (a full socket buffer)",
}
"""Why a clean demo can drop records, for the reasons it can; any other reason is in
docs/METRICS.md (``dflash_sidecar_records_dropped_total``)."""


def records_line(final: IngestReport | None) -> str:
    """``records: 7,512 accepted, none dropped``, or what was dropped, by reason, and why: from the
    daemon's final window (its totals since it started: this demo's)."""
    if final is None:
        return "records: none received (the demo ended before its first window)"
    accepted = sum(t.accepted for t in final.totals.values())
    dropped: dict[str, int] = dict(final.messages_dropped)
    for totals in final.totals.values():
        for reason, n in totals.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
    dropped = {reason: n for reason, n in dropped.items() if n > 0}
    if not dropped:
        return f"records: {accepted:,} accepted, none dropped"
    why = "; ".join(f"{reason} {n:,}" + (f" ({WHY_DROPPED[reason]})" if reason in WHY_DROPPED else "")
                    for reason, n in sorted(dropped.items()))
    return (f"records: {accepted:,} accepted, {sum(dropped.values()):,} dropped: {why}; every reason is in "
            "docs/METRICS.md (dflash_sidecar_records_dropped_total)")


def summary(view: RunLedgerView | None, state: Path, prometheus_addr: str, since_unix_s: float = 0.0,
            final: IngestReport | None = None, picture: Path | None = None) -> str:
    """The demo's last words: the verdict of each run this demo fed (a role last heard at or after
    ``since_unix_s``, unix seconds; the state folder keeps earlier demos' runs too) and each of its
    roles' wall time, goodput and largest badput, what its records became (``records_line`` of
    ``final``, the daemon's final window), then the three commands to try next (with this demo's
    address and state folder); ``picture``: the run's HTML page, when written."""
    lines = ["", "demo summary"]
    roles = tuple(r for r in view.roles if r.last_unix_s >= since_unix_s) if view is not None else ()
    runs = list(dict.fromkeys(r.run for r in roles))
    for run in runs:
        lines += [f"run {run}: {line}" if i == 0 else line
                  for i, line in enumerate(verdict_lines(view.verdicts_of(run) if view else None))]
        lines += [_role_line(r) for r in roles if r.run == run]
    if not roles:
        lines.append("no run in the ledger (the demo ended before its first window)")
    lines.append(records_line(final))
    if picture is not None:
        lines.append(f"a picture of this run: {picture}   # open it in a browser (it fetches nothing)")
    lines += ["", "try next:",
              f"  curl -s http://{prometheus_addr}/metrics | grep dflash_pipeline_bottleneck   # while a demo runs",
              f"  dflash-sidecar top --prometheus-addr {prometheus_addr}   # the terminal view, while a demo runs",
              f"  dflash-sidecar report --state-dir {state} --run {shlex.quote(runs[-1])}   # this run's ledger, now"
              if runs else f"  dflash-sidecar report --state-dir {state}   # the runs this folder keeps"]
    return "\n".join(lines)
