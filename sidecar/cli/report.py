"""``dflash-sidecar report``: the run ledger as a table (or JSON), read from the state file.

It reads the file the daemon writes once per window (``sidecar.core.ledger_state``), so it works while
the daemon runs, after it stopped, and on a box where only the file was copied. Under systemd the
file is in the service's state folder (readable by the service user and root).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, TextIO

from sidecar.aggregation.ledger.fold import view_of
from sidecar.cli.exit_status import FAILURE, OK
from sidecar.core.ledger_state import FILE_NAME, load, state_dir
from sidecar.model.ends import ALERTING, HOWS
from sidecar.model.ledger import CAUSES, RoleLedger, RunLedgerView, RunVerdicts


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
                  "restart_gap_after": dict(r.gap_after), "last_end": dict(r.last_end)} for r in roles],
        "verdicts": [verdicts_json(v) for v in view.verdicts if run is None or v.run == run],
        "no_trainer_s": view.no_trainer_s,
        "no_trainer_j": view.no_trainer_j,
        "runs_dropped": view.runs_dropped,
    }


def verdicts_json(v: RunVerdicts) -> dict[str, Any]:
    """One run's verdicts as JSON-able data: the dominant one with its evidence, then each with
    its seconds, windows and their shares of the run's (0-1)."""
    top = v.dominant
    return {"run": v.run, "dominant": top.name if top else None,
            "evidence": dict(top.evidence) if top else {}, "detail": top.detail if top else "",
            "seconds": v.seconds, "windows": v.windows,
            "verdicts": [{"verdict": s.name, "seconds": s.seconds, "time_share": v.time_share(s), "windows": s.windows,
                          "window_share": v.window_share(s), "evidence": dict(s.evidence), "detail": s.detail}
                         for s in v.verdicts]}


def verdict_lines(v: RunVerdicts | None) -> list[str]:
    """``verdict: input-bound 78% of the time, 41 of 52 windows (data_wait=0.61 ...)`` and the
    others' shares; a run without verdicts says so."""
    top = v.dominant if v is not None else None
    if v is None or top is None:
        return ["verdict: none kept (the run had no window with a live trainer and an insight)"]
    evidence = " ".join(f"{k}={x:.2f}" for k, x in top.evidence) + (f" {top.detail}" if top.detail else "")
    lines = [f"verdict: {top.name} {v.time_share(top):.0%} of the time, {top.windows} of {v.windows} windows"
             + (f" ({evidence.strip()})" if evidence.strip() else "")]
    others = [f"{s.name} {v.time_share(s):.0%}" for s in v.verdicts if s is not top]
    if others:
        lines.append("  also: " + ", ".join(others))
    return lines


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(view: RunLedgerView, run: str | None = None) -> str:
    """One block per run and role: every cause with its seconds, share and joules, then the
    efficiency figures; a last line with the time no trainer was live."""
    lines: list[str] = []
    shown: set[str] = set()
    for r in (r for r in view.roles if run is None or r.run == run):
        if r.run not in shown:
            shown.add(r.run)
            lines.extend([f"run {r.run} · " + line if i == 0 else line
                          for i, line in enumerate(verdict_lines(view.verdicts_of(r.run)))])
        lines.extend(_role_block(r))
        lines.append("")
    lines.extend(ends_table([r for r in view.roles if run is None or r.run == run]))
    lines.append(f"no live trainer: {view.no_trainer_s:.1f} s, {view.no_trainer_j:.0f} J"
                 + (f" · runs forgotten: {view.runs_dropped}" if view.runs_dropped else ""))
    return "\n".join(lines)


def ends_table(roles: list[RoleLedger]) -> list[str]:
    """How the senders of each run and role ended (docs/RELIABILITY.md), the restart gap seconds
    after each kind of end, and under a role whose last end was not intended, what ended it
    (``last end: failed (exception: RuntimeError: loss is NaN at step 100)``); nothing when no
    end was told."""
    told = [r for r in roles if r.ends]
    if not told:
        return []
    width = max(32, *(len(f"{r.run} {r.role}") + 1 for r in told))  # a run id and role are never cut
    lines = [f"{'sender ends':<{width}}" + "".join(f"{how:>12}" for how in HOWS) + "  restart gap after"]
    for r in told:
        gaps = ", ".join(f"{how} {s:.1f} s" for how, s in sorted(r.gap_after.items()) if s > 0) or "-"
        lines.append(f"{r.run + ' ' + r.role:<{width}}" + "".join(f"{r.ends.get(how, 0):>12}" for how in HOWS)
                     + f"  {gaps}")
        last = r.last_end
        if last.get("how") in ALERTING:
            what = ": ".join(x for x in (last.get("cause", ""), last.get("detail", "")) if x)
            lines.append(f"  last end: {last['how']}" + (f" ({what})" if what else ""))
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


def read_view(configured_dir: str | None, flops_per_token: float | None,
              command: str) -> tuple[RunLedgerView | None, Path]:
    """The ledger of the state file, and its path; None (said on stderr, with the demo's folder
    when only that one has a ledger) when it is absent or unusable."""
    path = Path(state_dir(configured_dir)) / FILE_NAME
    state, problem = load(path, move_aside=False)
    if state is not None:
        return view_of(state, flops_per_token), path
    why = f"unusable ({problem})" if problem else "absent"
    demo = path.parent / "demo" / FILE_NAME
    hint = (f"; the demo's ledger is in {demo.parent}: dflash-sidecar {command} --state-dir {demo.parent}"
            if not problem and demo.is_file() else "")
    print(f"dflash-sidecar {command}: no run ledger: {path} is {why}{hint}", file=sys.stderr)
    return None, path


def run_verdicts(configured_dir: str | None, run: str, out: TextIO = sys.stdout) -> int:
    """``explain --run``: the run's kept verdicts, read from the state file (no daemon needed);
    returns the exit status: 0, 1 without a ledger or such a run."""
    view, path = read_view(configured_dir, None, "explain")
    if view is None:
        return FAILURE
    if not view.run(run):
        print(f"dflash-sidecar explain: no run {run!r} in {path}; runs: {', '.join(view.runs) or 'none'}",
              file=sys.stderr)
        return FAILURE
    kept = view.verdicts_of(run)
    print(f"run {run} (from the run ledger, {path}):", file=out)
    print("  " + verdict_lines(kept)[0], file=out)
    if kept is None:
        return OK
    for v in kept.verdicts:
        evidence = " ".join(f"{k}={x:.2f}" for k, x in v.evidence)
        print(f"  {v.name:<20} {v.seconds:>9.1f} s {kept.time_share(v):>5.0%} of the time {v.windows:>6} windows "
              f"{evidence}".rstrip(), file=out)
    return OK


def run_report(configured_dir: str | None, run: str | None, as_json: bool, flops_per_token: float | None = None,
               out: TextIO = sys.stdout, prometheus: str | None = None) -> int:
    """Print the ledger; returns the exit status: 0, 1 when there is no ledger (or no such run).
    ``prometheus``: a Prometheus base URL whose straggler rules' history says which node held
    each run back most (``sidecar.cli.cluster_history``)."""
    view, path = read_view(configured_dir, flops_per_token, "report")
    if view is None:
        return FAILURE
    if run is not None and not view.run(run):
        print(f"dflash-sidecar report: no run {run!r} in {path}; runs: {', '.join(view.runs) or 'none'}",
              file=sys.stderr)
        return FAILURE
    cluster = None
    if prometheus:
        from sidecar.cli.cluster_history import report_lines

        cluster = report_lines(prometheus, view, run)
    if as_json:
        print(json.dumps(ledger_json(view, run) | ({"cluster": cluster[1]} if cluster else {}), indent=2), file=out)
    else:
        print(format_table(view, run) + ("\n" + "\n".join(cluster[0]) if cluster else ""), file=out)
        where = f" --state-dir {shlex.quote(configured_dir)}" if configured_dir else ""
        print(f"a picture of the run: dflash-sidecar report --html run.html"
              f"{f' --run {shlex.quote(run)}' if run else ''}{where}", file=out)
    return OK
