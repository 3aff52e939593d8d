"""``dflash-sidecar report --html FILE [--run ID]``: one run as one self-contained HTML page
(``sidecar.exporters.html.render``), read from the state folder: the run ledger's file and the
run's timeline (``sidecar.core.timeline_state``). A run without a timeline (a state folder from
before timelines were kept) still gets its page, which says what it lacks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from sidecar.cli.exit_status import FAILURE, OK
from sidecar.cli.report import read_view
from sidecar.core.timeline_state import load_view
from sidecar.exporters.html.render import render
from sidecar.model.ledger import RunLedgerView


def write_page(view: RunLedgerView, state_dir: Path, run: str, path: Path) -> str | None:
    """Write ``run``'s page to ``path``; returns what its timeline lacks (None: it has one).
    Raises ``OSError`` when the file cannot be written."""
    timeline, problem = load_view(state_dir, run)
    path.write_text(render(run, view, timeline, problem), encoding="utf-8")
    return problem


def run_report_html(configured_dir: str | None, run: str | None, file: str, flops_per_token: float | None = None,
                    out: TextIO = sys.stdout) -> int:
    """Write the page of ``run`` (default: the most recent run) to ``file``; returns the exit
    status: 0, 1 without a ledger, such a run, or a writable file."""
    view, ledger_path = read_view(configured_dir, flops_per_token, "report")
    if view is None:
        return FAILURE
    if run is None and not view.runs:
        print(f"dflash-sidecar report: no run in {ledger_path} yet", file=sys.stderr)
        return FAILURE
    chosen = run if run is not None else view.runs[-1]
    if not view.run(chosen):
        print(f"dflash-sidecar report: no run {chosen!r} in {ledger_path}; runs: {', '.join(view.runs) or 'none'}",
              file=sys.stderr)
        return FAILURE
    path = Path(file)
    try:
        problem = write_page(view, ledger_path.parent, chosen, path)
    except OSError as exc:
        print(f"dflash-sidecar report: cannot write {path}: {exc}", file=sys.stderr)
        return FAILURE
    lacks = f" (no timeline: {problem}; the page says what it lacks)" if problem else ""
    print(f"wrote {path} (run {chosen}){lacks}: open it in a browser, it fetches nothing", file=out)
    return OK
