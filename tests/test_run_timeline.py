"""The run timeline (``sidecar.aggregation.timeline``): bounded however long the run, its merged
buckets exact where they must be (verdict seconds, windows, counts) and time-weighted where they
average; its files versioned and bounded; a state folder from before timelines still reports.

Size and load time of long runs are measured in bench/bench_html.py (bench/RESULTS_HTML.md); the
real daemon's timeline across a daemon restart is checked in tests/test_run_ledger.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.aggregation.ledger.facts import RoleFact, SenderFact, WindowFacts
from sidecar.aggregation.ledger.fold import RunLedger
from sidecar.aggregation.timeline import FIRST_BUCKET_S, MAX_BUCKETS, RECENT_POINTS, RunTimelineBook, merge
from sidecar.core import timeline_state
from sidecar.core.ledger_state import FILE_NAME, save
from sidecar.model.ledger import CAUSES
from sidecar.model.timeline import TIMELINE_VERSION
from tests import timeline_synth
from tests.daemon_harness import env


def test_a_30_day_run_is_bounded_and_its_buckets_keep_verdict_seconds_windows_and_order() -> None:
    windows, window_s = 30 * 288, 300.0  # 30 days of 5-minute windows (bench: 10 s windows)
    book, fed = timeline_synth.book(windows, window_s)
    view = book.view()
    assert len(view.points) <= RECENT_POINTS + MAX_BUCKETS
    assert view.bucket_s > FIRST_BUCKET_S  # the buckets' width doubled
    assert sum(p["n"] for p in view.points) == windows == view.windows
    assert view.verdict_seconds() == pytest.approx(fed, abs=1e-6)  # exact, however merged
    assert sum(p["s"] for p in view.points) == pytest.approx(windows * window_s)
    assert sum(p.get("c", {}).get("drops", 0) for p in view.points) == 3 * len(range(500, windows, 997))
    older = view.points[:-RECENT_POINTS]
    for a, b in zip(view.points, view.points[1:]):
        assert a["t1"] <= b["t0"] + 1e-6  # in order, none overlapping
    for p in older:  # each bucket holds windows that began in one slot of the final width
        slot = int(p["t0"] // view.bucket_s)
        assert p["t1"] - window_s < (slot + 1) * view.bucket_s and p["n"] <= view.bucket_s / window_s + 1
    # the recent windows are kept as they were
    again, _ = timeline_synth.book(windows, window_s)
    assert list(view.points[-RECENT_POINTS:]) == list(again.recent)
    assert [e.kind for e in view.events] == ["end", "start"]


def test_a_merged_point_averages_each_series_over_the_seconds_that_had_it() -> None:
    a = {"t0": 0.0, "t1": 10.0, "s": 10.0, "n": 1, "v": {"balanced": 10.0}, "m": {"x": 1.0, "y": 5.0}}
    b = {"t0": 10.0, "t1": 40.0, "s": 30.0, "n": 3, "v": {"input-bound": 20.0}, "m": {"x": 3.0}, "c": {"drops": 2}}
    ab = merge(a, b)
    assert ab["m"] == {"x": 2.5, "y": 5.0} and ab["w"] == {"y": 10.0}  # y: only a's 10 s had it
    assert ab["v"] == {"balanced": 10.0, "input-bound": 20.0} and ab["c"] == {"drops": 2} and ab["n"] == 4
    c = {"t0": 40.0, "t1": 50.0, "s": 10.0, "n": 1, "v": {}, "m": {"y": 1.0}}
    abc = merge(ab, c)
    assert abc["m"]["y"] == pytest.approx(3.0) and abc["w"]["y"] == 20.0  # (5 x 10 + 1 x 10) / 20
    assert abc["m"]["x"] == pytest.approx(2.5) and abc["w"]["x"] == 40.0
    assert a["m"] == {"x": 1.0, "y": 5.0} and "w" not in a  # neither input changed


def test_a_book_reads_back_its_own_state_and_goes_on_alike(tmp_path: Path) -> None:
    book, _ = timeline_synth.book(2000, 10.0, gpus=2)
    folder = tmp_path / timeline_state.FOLDER
    save(timeline_state.file_of(folder, book.run), book.state())
    state, problem = timeline_state.read(folder, book.run)
    assert problem is None and state is not None
    again = RunTimelineBook(book.run, state)
    extra = {"t0": 1e10, "t1": 1e10 + 10, "s": 10.0, "n": 1, "v": {"balanced": 10.0}, "m": {}}
    book.add(dict(extra))
    again.add(dict(extra))
    assert json.loads(json.dumps(again.state())) == json.loads(json.dumps(book.state()))


def test_timeline_files_of_a_newer_version_or_corrupt_are_refused_and_moved_aside_by_the_daemon(
        tmp_path: Path) -> None:
    folder = tmp_path / timeline_state.FOLDER
    folder.mkdir()
    path = timeline_state.file_of(folder, "r1")
    path.write_text(json.dumps({"version": TIMELINE_VERSION + 1, "run": "r1", "recent": [], "older": []}))
    assert timeline_state.read(folder, "r1") == (None, "newer_version")
    assert timeline_state.load_view(tmp_path, "r1") == (None, "newer_version") and path.exists()  # a reader
    keeper = timeline_state.TimelineKeeper(folder, save)
    assert keeper._book_of("r1").windows == 0 and not path.exists()  # the daemon starts anew, the file kept aside
    assert path.with_name(path.name + ".newer").exists() and keeper.errors == {"timeline_load_newer_version": 1}
    timeline_state.file_of(folder, "r2").write_text("{not json")
    assert timeline_state.read(folder, "r2") == (None, "corrupt")
    assert timeline_state.read(folder, "r3") == (None, "absent")


def test_at_most_max_timeline_runs_files_are_kept(tmp_path: Path) -> None:
    folder = tmp_path / timeline_state.FOLDER
    keeper = timeline_state.TimelineKeeper(folder, save)
    for i in range(timeline_state.MAX_TIMELINE_RUNS + 3):
        run = f"run-{i}"
        keeper._book_of(run).add({"t0": i, "t1": i + 1.0, "s": 1.0, "n": 1, "v": {}, "m": {}})
        save(timeline_state.file_of(folder, run), keeper.books[run].state())
        keeper._bound({run})
    kept = {json.loads(p.read_text())["run"] for p in folder.glob("*.json")}
    assert len(kept) == len(keeper.books) == timeline_state.MAX_TIMELINE_RUNS and "run-18" in kept


def test_a_state_folder_from_before_timelines_still_reports_and_says_what_it_lacks(tmp_path: Path) -> None:
    led = RunLedger()
    shares = dict.fromkeys(CAUSES, 0.0) | {"productive": 0.7, "data": 0.3}
    for end in range(101, 111):
        facts = (SenderFact("1@100", "old-run", "trainer", 100.0, end - 1.0, float(end), end),)
        led.add(WindowFacts(float(end), 1.0, facts, {"trainer": RoleFact(shares, tokens=10.0)}))
    save(tmp_path / FILE_NAME, led.state())  # a ledger, no timeline/ beside it
    page = tmp_path / "old.html"
    out = subprocess.run([sys.executable, "-m", "sidecar", "report", "--state-dir", str(tmp_path), "--html",
                          str(page)], capture_output=True, text=True, env=env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert "no timeline: absent" in out.stdout and "old-run" in out.stdout
    text = page.read_text()
    assert "No timeline for this run" in text and "the run ledger&#x27;s totals" in text
    assert "trainer productive" in text  # the ledger's bar is there
    table = subprocess.run([sys.executable, "-m", "sidecar", "report", "--state-dir", str(tmp_path)],
                           capture_output=True, text=True, env=env(), timeout=60)
    assert table.returncode == 0 and "dflash-sidecar report --html" in table.stdout
    missing = subprocess.run([sys.executable, "-m", "sidecar", "report", "--state-dir", str(tmp_path), "--html",
                              str(page), "--run", "nope"], capture_output=True, text=True, env=env(), timeout=60)
    assert missing.returncode == 1 and "no run 'nope'" in missing.stderr


def test_gpu_series_are_per_gpu_up_to_16_then_per_group_then_the_box() -> None:
    from sidecar.aggregation.timeline import gpu_means
    from sidecar.model.gpu import NVML_DISABLED, GpuReading, GpuSnapshot, GpuView, GroupAggregate
    from sidecar.model.insight import GpuFacts
    from tests.insight_synth import report

    def window(n: int, groups: tuple[GroupAggregate, ...] = ()) -> dict[str, float]:
        gpus = tuple(GpuReading(i, f"uuid-{i}", "H100", utilization_ratio=0.5, power_watts=100.0 + i)
                     for i in range(n))
        facts = GpuFacts(busy={"0": 0.9})  # GPM's SM activity wins over NVML utilization
        view = GpuView(GpuSnapshot(0.0, 0.0, 0, gpus), NVML_DISABLED, groups, facts)
        return gpu_means(dataclasses.replace(report([]), gpu=view))

    few = window(2)
    assert few == {"busy|gpu0": 0.9, "power|gpu0": 100.0, "busy|gpu1": 0.5, "power|gpu1": 101.0}
    groups = (GroupAggregate("target", tuple(range(10)), 10, 0.4, 1000.0, None, None),
              GroupAggregate("drafter", tuple(range(10, 20)), 10, 0.8, 2000.0, None, None))
    assert window(20, groups) == {"busy|target": 0.4, "power|target": 1000.0, "busy|drafter": 0.8,
                                  "power|drafter": 2000.0}
    box = window(20)
    assert box["busy|all"] == pytest.approx((0.9 + 19 * 0.5) / 20, rel=1e-3)
    assert box["power|all"] == pytest.approx(sum(100.0 + i for i in range(20)))


def test_every_phase_a_step_is_kept_by_has_its_colour_on_the_page() -> None:
    from sidecar.aggregation.timeline import STEP_PHASES
    from sidecar.exporters.html.words import PHASE_COLOURS

    assert set(PHASE_COLOURS) == set(STEP_PHASES)
