"""The run ledger's verdicts: for each run, the pipeline insight's verdict window by window, kept
as the seconds and windows each verdict held and its evidence averaged over its seconds, so a run
that ended still says why it was slow (``dflash-sidecar report``, ``explain --run``).

Pure data in and out (typed records, ``VerdictRecord``; ``RunLedger`` persists them): a verdict's
entry in the state file is ``{"seconds", "windows", "evidence": {name: [value x seconds, seconds]}, "detail"}``.
A state without verdicts (written before they were kept) loads as none; a malformed entry is
dropped alone (``clean``), never the ledger with it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TypeGuard

from sidecar.model.insight import VERDICT_CODES, Verdict
from sidecar.model.ledger import RunVerdicts, VerdictShare

NOT_A_RUN_VERDICT = ("idle",)
"""Verdicts that say nothing about a run (``idle``: no trainer sent anything)."""
MAX_EVIDENCE = 16
"""Evidence names kept per verdict and run (a verdict's rules read a handful)."""
MAX_DETAIL = 200
"""Characters of a verdict's detail kept."""


@dataclass(slots=True)
class VerdictRecord:
    """One verdict over one run: the ``seconds`` and ``windows`` it held, its ``evidence`` (name ->
    (value x seconds, seconds) summed) and the latest ``detail`` it gave."""

    seconds: float = 0.0
    windows: int = 0
    evidence: dict[str, tuple[float, float]] = field(default_factory=dict)
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {"seconds": self.seconds, "windows": self.windows,
                "evidence": {k: list(v) for k, v in self.evidence.items()}, "detail": self.detail}

    @classmethod
    def from_json(cls, entry: object) -> VerdictRecord | None:
        """The entry of a state file, None when malformed."""
        if not isinstance(entry, dict) or not isinstance(entry.get("detail", ""), str):
            return None
        seconds, windows, evidence = entry.get("seconds", -1.0), entry.get("windows"), entry.get("evidence", {})
        if not (_finite(seconds) and seconds >= 0 and isinstance(windows, int) and windows >= 0
                and isinstance(evidence, dict)):
            return None
        if not all(isinstance(v, list) and len(v) == 2 and all(_finite(x) for x in v) for v in evidence.values()):
            return None
        return cls(float(seconds), windows, {str(k): (float(w), float(c)) for k, (w, c) in evidence.items()},
                   str(entry.get("detail", "")))


Verdicts = dict[str, dict[str, VerdictRecord]]
"""run -> verdict name -> its record."""


def fold(verdicts: Verdicts, run: str, verdict: Verdict, seconds: float) -> None:
    """Add one window's ``verdict`` to ``run``: ``seconds`` of the run it covered (>= 0)."""
    if verdict.name in NOT_A_RUN_VERDICT or verdict.name not in VERDICT_CODES or not seconds > 0:
        return
    entry = verdicts.setdefault(run, {}).setdefault(verdict.name, VerdictRecord())
    entry.seconds += seconds
    entry.windows += 1
    evidence = entry.evidence
    for name, value in verdict.evidence:
        if not math.isfinite(value) or (name not in evidence and len(evidence) >= MAX_EVIDENCE):
            continue
        weighted, covered = evidence.get(name, (0.0, 0.0))
        evidence[name] = (weighted + value * seconds, covered + seconds)
    if verdict.detail:
        entry.detail = verdict.detail[:MAX_DETAIL]


def clean(raw: object, runs: Collection[str]) -> Verdicts:
    """The well-formed entries of ``raw`` (a state's ``verdicts``) for runs in ``runs``."""
    out: Verdicts = {}
    if not isinstance(raw, dict):
        return out
    for run, by_name in raw.items():
        if run not in runs or not isinstance(by_name, dict):
            continue
        kept = {name: entry for name, entry in ((name, VerdictRecord.from_json(e)) for name, e in by_name.items()
                                                if name in VERDICT_CODES) if entry is not None}
        if kept:
            out[run] = kept
    return out


def to_json(verdicts: Verdicts) -> dict[str, object]:
    """The state's ``verdicts`` (the module docstring)."""
    return {run: {name: e.to_json() for name, e in by_name.items()} for run, by_name in verdicts.items()}


def _finite(x: object) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def views(verdicts: Mapping[str, Mapping[str, VerdictRecord]]) -> tuple[RunVerdicts, ...]:
    """Each run's ``RunVerdicts`` (verdicts by seconds, most first)."""
    out = []
    for run, by_name in verdicts.items():
        shares = [VerdictShare(name, e.seconds, e.windows,
                               tuple((k, w / s) for k, (w, s) in e.evidence.items() if s > 0), e.detail)
                  for name, e in by_name.items()]
        out.append(RunVerdicts(run, tuple(sorted(shares, key=lambda v: (-v.seconds, v.name)))))
    return tuple(out)
