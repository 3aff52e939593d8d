"""The run ledger's typed record and the state file's JSON: a state an earlier daemon of the same
version wrote (with the fields it left out) loads and folds on as it would have; the record
writes back what it read; the version rule moves a newer or malformed file aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.aggregation.ledger.facts import RoleFact, SenderFact, WindowFacts
from sidecar.aggregation.ledger.fold import RunLedger
from sidecar.aggregation.ledger.record import STATE_VERSION, LedgerRecord, RoleRecord, state_problem
from sidecar.core.ledger_state import FILE_NAME, load
from sidecar.model.ledger import CAUSES

SHARES = dict.fromkeys(CAUSES, 0.0) | {"productive": 1.0}

EARLIER = {
    "version": 1, "no_trainer_s": 2.0, "runs_dropped": 1, "energy_prev": {"gpu-0": 500.0},
    "now_unix_s": 110.0, "trainer_until": 109.5, "idle_until": 0.0, "host_runs": {"host:box": "host:box", "x": 3},
    "runs": {"run-1": {"trainer": {
        "seconds": {"productive": 8.0, "startup": 1.0}, "joules": {"productive": 800.0}, "tokens": 40,
        "steps": 9, "gpus": 1, "gpu_name": "NVIDIA H100 80GB HBM3", "first_unix_s": 100,
        "observed_until": 109.5, "stepped": True, "pending_startup": 0.0, "live": True,
        "senders": {"7@100.000": {"windows_stepped": 9, "step": 9, "seen_unix_s": 109.5}},
        "warm": {"stretches": [[1.0, 0.5, 0]], "open": [0.0, 0.0], "done": False},
        "last_end": {"how": "clean", "cause": "", "detail": "x"}, "end_waiting": "clean", "gap_j": 0.0}}},
    "verdicts": {"run-1": {"balanced": {"seconds": 9.0, "windows": 9, "evidence": {"a": [4.5, 9.0]}, "detail": ""},
                           "input-bound": {"seconds": "nine"}}},
}
"""A state as an earlier daemon of version 1 wrote it: no ``tail``, ``carry_j``, ``ends``..., an
int where a float is kept, a malformed verdict and host run."""


def test_an_earlier_state_loads_with_its_defaults_and_writes_back_what_it_read() -> None:
    rec = LedgerRecord.from_json(EARLIER)
    r = rec.runs["run-1"]["trainer"]
    assert isinstance(r, RoleRecord) and r.first_unix_s == 100.0 and r.tokens == 40.0
    assert r.tail == {} and r.carry_j == 0.0 and r.ends == {} and r.gap_waiting is None and r.gap_j == 0.0
    assert r.senders["7@100.000"].step == 9 and r.warm is not None and r.warm.stretches == [(1.0, 0.5, 0)]
    assert rec.host_runs == {"host:box": "host:box"} and list(rec.verdicts["run-1"]) == ["balanced"]
    again = LedgerRecord.from_json(json.loads(json.dumps(rec.to_json())))
    assert again == rec
    written = rec.to_json()
    assert written["version"] == STATE_VERSION and "gap_waiting" not in written["runs"]["run-1"]["trainer"]


def test_an_earlier_state_folds_on() -> None:
    """The successor of the earlier state's sender: the held gap energy (0 J, but held) keeps the
    gap's seconds apart, the waiting end takes the gap, and the totals carry on."""
    led = RunLedger(EARLIER)
    successor = SenderFact("8@111.000", "run-1", "trainer", 111.0, 111.0, 112.0, 1, closed=False)
    led.add(WindowFacts(112.0, 1.0, (successor,), {"trainer": RoleFact(SHARES)}, {"gpu-0": 600.0},
                        {"gpu-0": "trainer"}))
    [r] = led.view().roles
    assert r.seconds["restart_gap"] == pytest.approx(1.5) and r.gap_after == pytest.approx({"clean": 1.5})
    assert r.steps == 10 and r.first_unix_s == 100.0 and r.last_end == {"how": "clean", "cause": "", "detail": "x"}
    assert led.view().runs_dropped == 1 and led.view().verdicts[0].verdicts[0].name == "balanced"


@pytest.mark.parametrize(("state", "problem"), [
    (EARLIER, None),
    ({**EARLIER, "version": STATE_VERSION + 1}, "newer_version"),
    ({**EARLIER, "version": "1"}, "corrupt"),
    ({**EARLIER, "runs": {"run-1": {"trainer": {"senders": {}, "seconds": []}}}}, "corrupt"),
    ({**EARLIER, "runs": {"run-1": {"trainer": {"senders": {}, "tokens": float("nan")}}}}, "corrupt"),
])
def test_the_version_rule(state: dict[str, object], problem: str | None) -> None:
    found = state_problem(state)
    assert (found[0] if found else None) == problem


def test_a_newer_state_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_text(json.dumps({**EARLIER, "version": STATE_VERSION + 1}))
    assert load(path) == (None, "newer_version")
    assert not path.exists() and (tmp_path / (FILE_NAME + ".newer")).exists()
