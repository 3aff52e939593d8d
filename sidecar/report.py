"""``dflash-sidecar report``: the run ledger as a table (or JSON), read from the state file.

It reads the file the daemon writes once per window (``sidecar.ledger_state``), so it works while
the daemon runs, after it stopped, and on a box where only the file was copied. Under systemd the
file is in the service's state folder (readable by the service user and root).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from sidecar.aggregation.ledger import view_of
from sidecar.ledger_state import FILE_NAME, load, state_dir
from sidecar.model.ends import HOWS
from sidecar.model.ledger import CAUSES, RoleLedger, RunLedgerView


def ledger_json(view: RunLedgerView, run: str | None = None) -> dict[str, Any]:
    """The ledger as JSON-able data: per run and role, seconds and joules by cause and the
    efficiency figures (None where their inputs do not exist)."""
    roles = [r for r in view.roles if run is None or r.run == run]
    return {
        "runs": [{"run": r.run, "role": r.role, "wall_s": r.wall_s, "seconds": dict(r.seconds),
                  "joules": dict(r.joules), "goodput_ratio": r.goodput_ratio, "tokens": r.tokens, "steps": r.steps,
                  "gpus": r.gpus, "gpu_name": r.gpu_name, "tokens_per_gpu_per_s": r.tokens_per_s_per_gpu,
                  "mfu_ratio": r.mfu_ratio, "mfu_source": r.mfu_source, "joules_per_token": r.joules_per_token,
                  "joules_per_step": r.joules_per_step, "first_unix_s": r.first_unix_s,
                  "last_unix_s": r.last_unix_s, "open_gap_s": r.open_gap_s, "ends": dict(r.ends),
                  "restart_gap_after": dict(r.gap_after)} for r in roles],
        "no_trainer_s": view.no_trainer_s,
        "no_trainer_j": view.no_trainer_j,
        "runs_dropped": view.runs_dropped,
    }


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(view: RunLedgerView, run: str | None = None) -> str:
    """One block per run and role: every cause with its seconds, share and joules, then the
    efficiency figures; a last line with the time no trainer was live."""
    lines: list[str] = []
    for r in (r for r in view.roles if run is None or r.run == run):
        lines.extend(_role_block(r))
        lines.append("")
    lines.extend(ends_table([r for r in view.roles if run is None or r.run == run]))
    lines.append(f"no live trainer: {view.no_trainer_s:.1f} s, {view.no_trainer_j:.0f} J"
                 + (f" · runs forgotten: {view.runs_dropped}" if view.runs_dropped else ""))
    return "\n".join(lines)


def ends_table(roles: list[RoleLedger]) -> list[str]:
    """How the senders of each run and role ended (docs/RELIABILITY.md), and the restart gap
    seconds after each kind of end; nothing when no end was told."""
    told = [r for r in roles if r.ends]
    if not told:
        return []
    lines = [f"{'sender ends':<32}" + "".join(f"{how:>12}" for how in HOWS) + "  restart gap after"]
    for r in told:
        gaps = ", ".join(f"{how} {s:.1f} s" for how, s in sorted(r.gap_after.items()) if s > 0) or "-"
        lines.append(f"{(r.run + ' ' + r.role)[:31]:<32}" + "".join(f"{r.ends.get(how, 0):>12}" for how in HOWS)
                     + f"  {gaps}")
    return [*lines, ""]


def _role_block(r: RoleLedger) -> list[str]:
    wall = r.wall_s
    head = (f"run {r.run} · role {r.role} · wall {wall:.1f} s · goodput {_num(r.goodput_ratio, '.1%')}"
            + (f" · open gap {r.open_gap_s:.1f} s" if r.open_gap_s else ""))
    lines = [head, f"  {'cause':<14}{'seconds':>12}{'share':>9}{'joules':>14}"]
    for cause in CAUSES:
        s = r.seconds[cause]
        share = s / wall if wall > 0 else 0.0
        lines.append(f"  {cause:<14}{s:>12.1f}{share:>9.1%}{r.joules[cause]:>14.0f}")
    lines.append(f"  tokens {r.tokens:.0f} · steps {r.steps} · GPUs {r.gpus} {r.gpu_name}".rstrip())
    told = " (the trainer's own)" if (r.mfu_source or "").startswith("trainer") else ""
    lines.append(f"  tokens/s/GPU {_num(r.tokens_per_s_per_gpu, '.1f')} · MFU {_num(r.mfu_ratio, '.1%')}{told} · "
                 f"J/token {_num(r.joules_per_token, '.3g')} · J/step {_num(r.joules_per_step, '.3g')}")
    if r.starting_s > 0:
        lines.append(f"  held until its first step: {r.starting_s:.1f} s (startup or compile once a step is told)")
    return lines


def run_report(configured_dir: str | None, run: str | None, as_json: bool, flops_per_token: float | None = None,
               out: TextIO = sys.stdout) -> int:
    """Print the ledger; returns the exit status: 0, 1 when there is no ledger (or no such run)."""
    path = Path(state_dir(configured_dir)) / FILE_NAME
    state, problem = load(path, move_aside=False)
    if state is None:
        why = f"unusable ({problem})" if problem else "absent"
        print(f"dflash-sidecar report: no run ledger: {path} is {why}", file=sys.stderr)
        return 1
    view = view_of(state, flops_per_token)
    if run is not None and not view.run(run):
        print(f"dflash-sidecar report: no run {run!r} in {path}; runs: {', '.join(view.runs) or 'none'}",
              file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(ledger_json(view, run), indent=2), file=out)
    else:
        print(format_table(view, run), file=out)
    return 0
