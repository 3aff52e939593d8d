"""The run ledger's part of a W&B row: ``ledger/<role>/...`` for the run being logged.

Each window's row carries the run's totals so far (seconds and joules by cause, goodput and the
efficiency figures): the last row of a run is its summary, and a panel of ``seconds/<cause>``
over the trainer's step shows where time went as the run progressed.
"""

from __future__ import annotations

import math

from sidecar.model.ledger import RunLedgerView

FIGURES = (("goodput_ratio", "goodput_ratio"), ("tokens_per_gpu_per_s", "tokens_per_s_per_gpu"),
           ("mfu_ratio", "mfu_ratio"), ("joules_per_token", "joules_per_token"), ("joules_per_step", "joules_per_step"))
"""(key under ``ledger/<role>/``, attribute of the role's ledger) of each efficiency figure."""


def ledger_row(view: RunLedgerView) -> dict[str, float]:
    """Keys for each role of the most recent run (the run a W&B row belongs to)."""
    runs = view.runs
    row: dict[str, float] = {}
    for r in view.run(runs[-1]) if runs else ():
        p = f"ledger/{r.role}"
        row[f"{p}/wall_s"] = r.wall_s
        for cause, value in r.seconds.items():
            row[f"{p}/seconds/{cause}"] = value
        for cause, value in r.joules.items():
            row[f"{p}/joules/{cause}"] = value
        for key, attribute in FIGURES:
            maybe = getattr(r, attribute)
            if maybe is not None:
                row[f"{p}/{key}"] = maybe
    return {k: v for k, v in row.items() if math.isfinite(v)}
