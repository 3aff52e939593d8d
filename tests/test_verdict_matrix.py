"""The verdict conformance matrix in CI (``tests/verdict_matrix.py``): plain loop (2 ranks on gloo,
every occurrence and snapshots), Hugging Face ``Trainer``, Lightning, a ``torch.compile``d model and
2-rank ``DistributedDataParallel`` on gloo, each under injected input-, host- and GPU-saturated
conditions and with one phase under an unmapped name, the 2-rank rows also under communication-bound
and straggler conditions and a slow collective on GPUs NVML reads busy (``spin``:
communication-bound), on the fake NVML driver; real shim, real daemon, real sockets (32 cells; about
1.5-2 minutes on 2 loaded cores, three rows side by side). Every cell gets its verdict in >= 95 % of
its windows (those after every rank took its condition up, less the first), no window of the run
says ``host-bound`` outside host overhead (the trainer's first and last windows included), and once
the trainer has exited the verdict is ``idle``."""

from __future__ import annotations

import pytest

from tests import verdict_matrix as matrix
from tests.fake_nvml.helpers import library_or_skip


@pytest.mark.timeout(360)
def test_every_framework_gets_the_injected_verdict() -> None:
    library_or_skip("full")
    rows = matrix.run_matrix(windows=7, interval_s=0.5, parallel=3)
    report = {f: {c: dict(matrix.counts(cell)) for c, cell in r.cells.items()} for f, r in rows.items()}
    for framework, row in rows.items():
        assert set(row.cells) == set(matrix.ROWS[framework]), report
        for condition, cell in row.cells.items():
            assert len(cell) >= 3, (framework, condition, report)  # enough full windows were scored
            wrong = [(v, e[:400]) for v, e in cell if v != matrix.EXPECTED[condition]]
            assert matrix.accuracy(cell, condition) >= 0.95, (framework, condition, wrong, report)
        assert not row.stray_host, (framework, row.stray_host, report)
        assert row.idle_after_exit, (framework, row.log_tail)
    unmapped = [e for r in rows.values() for v, e in r.cells.get("unmapped", []) if "unmapped: add a rule" in e]
    assert unmapped, report  # the unmapped phase is named in the evidence
