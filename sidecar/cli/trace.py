"""``dflash-sidecar trace``: N steps of ``torch.profiler`` from a live trainer, and where they went.

How the request travels and where the capture is kept: ``sidecar.core.capture_request``. This
module picks the trainers, prints what came back and says why when nothing did.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from sidecar.cli.exit_status import FAILURE, OK
from sidecar.cli.trace_view import capture_lines
from sidecar.core.capture_request import TraceError, Trainer, choose, collect, live_trainers, request
from trainer_shim.endpoint import tally_dir
from trainer_shim.tally import process_start_ticks

STEPS_DEFAULT = 3
WAIT_DEFAULT_S = 60.0


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
    """A trainer named by pid where its directory cannot be listed (a member of the socket's group)."""
    ticks = process_start_ticks(pid)
    directory = next((d for e in endpoints if (d := tally_dir(e)) is not None and os.path.isdir(d)), None)
    if ticks is None or directory is None:
        raise TraceError(f"no live trainer: no process {pid}" if ticks is None else "no daemon's tally directory")
    return Trainer(pid, ticks, directory, ())
