"""``dflash-sidecar trace``: N steps of ``torch.profiler`` from a live trainer, and where they went.

How the request travels and where the capture is kept: ``sidecar.core.capture_request``. This
module picks the trainers, prints what came back and says why when nothing did.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from sidecar.cli.exit_status import FAILURE, OK
from sidecar.cli.trace_view import capture_lines
from sidecar.core.capture_request import TraceError, Trainer, choose, collect, live_trainers, request
from trainer_shim.capture import MAX_STEPS
from trainer_shim.endpoint import tally_dir
from trainer_shim.tally import process_start_ticks

STEPS_DEFAULT = 3
WAIT_DEFAULT_S = 60.0


def _steps(raw: str) -> int:
    value = int(raw)
    if not 1 <= value <= MAX_STEPS:
        raise argparse.ArgumentTypeError(f"--steps must be from 1 to {MAX_STEPS}")
    return value


def add_trace_arguments(trace: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``trace``'s options (docs/SHIM.md, "A capture on request"); returns ``trace``."""
    trace.add_argument("--steps", type=_steps, default=STEPS_DEFAULT, help=f"steps to capture (1 to {MAX_STEPS})")
    trace.add_argument("--role", default=None, help="only the trainer publishing this role")
    trace.add_argument("--worker", default=None, help="only the trainer publishing this worker")
    trace.add_argument("--pid", type=int, default=None,
                       help="only this process (also where the tally folder cannot be listed)")
    trace.add_argument("--wait", type=float, default=WAIT_DEFAULT_S, help="seconds to wait for the steps")
    trace.add_argument("--endpoint", action="append", default=None,
                       help="the daemon's endpoint (default: as the daemon)")
    trace.add_argument("--state-dir", default=None, help="where the trace is kept (default: as the daemon)")
    trace.add_argument("--config", dest="config_file", metavar="FILE", default=None,
                       help="the daemon's TOML config file: trace reads its endpoint and state_dir")
    return trace


def run_trace(endpoints: tuple[str, ...], state_dir: Path, steps: int, role: str | None, worker: str | None,
              pid: int | None, wait_s: float, out: Any = sys.stdout) -> int:
    """The command: ask, wait, keep, print. Returns the exit status."""
    try:
        if pid is not None and not any(t.pid == pid for t in _listable(endpoints)):
            targets = [_by_pid(endpoints, pid)]
        else:
            targets = choose(live_trainers(endpoints), role, worker, pid)
    except TraceError as exc:
        print(f"dflash-sidecar trace: {exc}", file=sys.stderr)
        return FAILURE
    status, asked = OK, []
    for t in targets:  # every request first: the trainers capture at the same time
        try:
            asked.append((t, request(t, steps, role, worker, wait_s)))
        except TraceError as exc:
            print(f"dflash-sidecar trace: {exc}", file=sys.stderr)
            status = FAILURE
    for t, rid in asked:
        try:
            kept = collect(t, rid, wait_s, state_dir)
        except TraceError as exc:
            print(f"dflash-sidecar trace: {exc}", file=sys.stderr)
            status = FAILURE
            continue
        print("\n".join(capture_lines(kept)), file=out)
    return status


def _listable(endpoints: tuple[str, ...]) -> list[Trainer]:
    try:
        return live_trainers(endpoints)
    except TraceError:
        return []


def _by_pid(endpoints: tuple[str, ...], pid: int) -> Trainer:
    """A trainer named by pid where its directory cannot be listed (a member of the socket's group).
    Asked in ``tally_dir`` alone: a shim of the previous release, which polls the deprecated
    directory, is reached only when listed (docs/PROTOCOL.md)."""
    ticks = process_start_ticks(pid)
    directory = next((d for e in endpoints if (d := tally_dir(e)) is not None and os.path.isdir(d)), None)
    if ticks is None or directory is None:
        raise TraceError(f"no live trainer: no process {pid}" if ticks is None else "no daemon's tally directory")
    return Trainer(pid, ticks, directory, ())
