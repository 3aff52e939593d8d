"""Units read from the name: the same run reported in ms, s, us and as a percent of the step gives
one verdict and one ledger (within 2 %), through the real mapping stage, series, insight and run
ledger (in process; ``tests/test_framework_presets.py`` drives real daemons)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sidecar.aggregation.aggregator import Aggregator
from sidecar.aggregation.insight import compute_insight
from sidecar.aggregation.ledger.facts import window_facts
from sidecar.aggregation.ledger.fold import RunLedger
from sidecar.core.pipeline import ingest_records
from sidecar.model.window import PROFILE, TIMING, IngestReport
from sidecar.processing.mapping import Mapper
from tests.insight_synth import sender

PHASES = ("data_wait", "forward_backward", "optimizer")
T0 = 1_700_000_000.0

FORMS: dict[str, tuple[str, float]] = {"ms": ("_ms", 1.0), "s": ("_s", 1e-3), "us": ("_us", 1e3),
                                       "sec": ("(s)", 1e-3), "min": ("_min", 1e-3 / 60)}
"""Form -> (how the name says its unit, the factor from milliseconds)."""


def _dict(form: str, phases: dict[str, float], step_ms: float) -> dict[str, float]:
    """One step's profile dict in ``form`` (``pct``: phases as a percent of the step, the step in s)."""
    if form == "pct":
        return {**{f"{p}(%)": 100.0 * ms / step_ms for p, ms in phases.items()}, "step_s": step_ms / 1e3}
    unit, factor = FORMS[form]
    return {f"{p}{unit}": ms * factor for p, ms in {**phases, "step": step_ms}.items()}


def _timings(form: str, phases: dict[str, float], step_ms: float) -> list[list[Any]]:
    unit, factor = FORMS[form]
    return [[TIMING, f"{p}{unit}", ms * factor] for p, ms in {**phases, "step": step_ms}.items()]


def run(form: str, phases: dict[str, float], step_ms: float, every_occurrence: bool = False,
        windows: int = 4, duration_s: float = 2.0) -> tuple[list[str], dict[str, float], dict[str, float]]:
    """(raw verdict per window, the last window's time shares, the ledger's seconds by cause) of
    a trainer stepping back to back (``duration_s / step_ms`` steps a window), reported in ``form``."""
    agg, mapper, ledger = Aggregator(), Mapper(), RunLedger()
    steps = max(1, int(duration_s * 1000 / step_ms))
    verdicts: list[str] = []
    shares: dict[str, float] = {}
    for w in range(windows):
        for i in range(steps):
            step = w * steps + i
            records = (_timings(form, phases, step_ms) + [[PROFILE, step, {}]] if every_occurrence
                       else [[PROFILE, step, _dict(form, phases, step_ms)]])
            _, rejected = ingest_records(agg, "trainer", "0", records, mapper, sender_id=1)
            assert not rejected, rejected
        end = T0 + (w + 1) * duration_s
        window = agg.roll(float(w + 1) * duration_s, end, duration_s)
        # heard at the window's end
        who = dataclasses.replace(sender("trainer", "0", end_unix_s=end), hello={"started_unix_s": T0 - 1.0})
        report = IngestReport(window, (who,), {}, {}, {}, 0, 0, 0, len(window.series), 0)
        insight = compute_insight(window, senders=report.senders)
        report = dataclasses.replace(report, insight=insight)
        ledger.add(window_facts(report))
        verdicts.append(insight.raw_verdict.name if insight.raw_verdict else insight.verdict.name)
        role = insight.roles.get("trainer")
        shares = dict(role.time_share) if role is not None else {}
    [led] = ledger.view().roles
    return verdicts, shares, dict(led.seconds)


def _close(a: dict[str, float], b: dict[str, float], scale: float) -> bool:
    return all(abs(a.get(k, 0.0) - b.get(k, 0.0)) <= 0.02 * scale for k in set(a) | set(b))


def _phases(step_ms: float, data: float, rest: float) -> dict[str, float]:
    """Phases covering all but ``rest`` of the step: ``data`` of it waiting on data, the rest
    forward/backward and a tenth of that optimizer."""
    compute = step_ms * (1.0 - data - rest)
    return {"data_wait": step_ms * data, "forward_backward": compute * 0.9, "optimizer": compute * 0.1}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step_ms=st.floats(40.0, 400.0), data=st.floats(0.02, 0.9), rest=st.floats(0.0, 0.08))
@example(step_ms=40.0, data=0.25, rest=0.0)  # on the data wait's threshold: 25 % read back was 0.2499...
def test_one_run_in_ms_s_us_and_percent_gives_one_verdict_and_ledger(step_ms: float, data: float,
                                                                      rest: float) -> None:
    phases = _phases(step_ms, data, rest)
    base = run("ms", phases, step_ms)
    wall = sum(base[2].values())
    for form in ("s", "us", "sec", "min", "pct"):
        verdicts, shares, seconds = run(form, phases, step_ms)
        assert verdicts == base[0], form
        assert _close(shares, base[1], 1.0), (form, shares, base[1])
        assert _close(seconds, base[2], wall), (form, seconds, base[2])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step_ms=st.floats(40.0, 400.0), data=st.floats(0.02, 0.9))
def test_every_occurrence_timings_in_ms_s_and_us_give_one_verdict_and_ledger(step_ms: float, data: float) -> None:
    phases = _phases(step_ms, data, 0.02)
    base = run("ms", phases, step_ms, every_occurrence=True)
    wall = sum(base[2].values())
    for form in ("s", "us", "sec"):
        verdicts, shares, seconds = run(form, phases, step_ms, every_occurrence=True)
        assert verdicts == base[0], form
        assert _close(shares, base[1], 1.0) and _close(seconds, base[2], wall), form


def test_data_loading_as_a_percent_alone_is_its_share_of_the_step() -> None:
    # no timing of the data phase at all: only its percent and the step (torchtitan's (%) key)
    verdicts, shares, _ = run("pct", {"data_wait": 70.0, "forward_backward": 25.0}, 100.0)
    assert shares["data_wait"] == pytest.approx(0.7, abs=0.01) and verdicts[-1] == "input-bound"
