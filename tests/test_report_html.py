"""``dflash-sidecar report --html``: one self-contained page, opened by a real headless Chromium
with the network off (``tests/chromium.py``): no JavaScript error, no request but the file itself,
every chart drawn (canvases with painted pixels; a screenshot saved), the verdict band's seconds
per verdict equal to the run's recorded ones (within one window), the verdict named at the top,
and no URL in the file a browser would fetch.

The pages come from real demos (the daemon, the shim, the simulated trainers: the plain loop and
the DFlash two-role pipeline) and from synthetic timelines for what a short CPU demo lacks (GPU
readings, a week of windows, a single window)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.aggregation.timeline import RunTimelineBook
from sidecar.core.timeline_state import load_view
from sidecar.exporters.html.render import render
from tests import timeline_synth
from tests.chromium import Chromium, chromium_or_skip
from tests.daemon_harness import env
from tests.launcher import free_port

READY = "window.dflashReport && window.dflashReport.done"
PAINTED = """JSON.stringify(Array.from(document.querySelectorAll('canvas')).map(function (cv) {
  var d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data, n = 0;
  for (var i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
  return {chart: cv.closest('figure').id, painted: n / (cv.width * cv.height)};
}))"""
FETCHING = [r"\bsrc\s*=", r"\bhref\s*=", r"url\(", r"@import", r"\bfetch\s*\(", r"XMLHttpRequest", r"WebSocket",
            r"sendBeacon", r"EventSource", r"importScripts", r"\bimport\s*\(", r"<link\b", r"<iframe\b", r"<img\b"]


def fetches_nothing(text: str) -> None:
    """No element or script in ``text`` that would fetch: no src/href/url()/fetch and the like,
    and every ``http(s)://`` inside a ``/*! ... */`` license comment (which no browser fetches)."""
    for pattern in FETCHING:
        assert not re.search(pattern, text), pattern
    comments = [(m.start(), m.end()) for m in re.finditer(r"/\*!.*?\*/", text, re.DOTALL)]
    for m in re.finditer(r"https?://", text):
        assert any(a <= m.start() < b for a, b in comments), text[m.start() - 80:m.end() + 80]


def open_page(page: Path, shot: Path) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """(what the page says it drew, each canvas's painted share, the top verdict's text); asserts
    no error and no request but the file's own."""
    with Chromium() as c:
        seen = c.open(page, READY)
        drawn = json.loads(c.evaluate("JSON.stringify(window.dflashReport)"))
        painted = json.loads(c.evaluate(PAINTED))
        headline = c.evaluate("document.getElementById('verdict').textContent")
        c.screenshot(shot)
    assert seen.errors == [], seen.errors
    assert seen.requests == [page.resolve().as_uri()], seen.requests
    assert shot.stat().st_size > 10_000
    return drawn, painted, headline


def demo(tmp_path: Path, *args: str) -> tuple[Path, dict[str, Any], str]:
    """Run a short real demo into its own state folder; (its page, the ledger's JSON, demo's stdout)."""
    state = tmp_path / "state"
    out = subprocess.run([sys.executable, "-m", "sidecar", "demo", *args, "--interval", "1", "--state-dir", str(state),
                          "--prometheus-addr", f"127.0.0.1:{free_port()}", "--endpoint",
                          f"ipc://{tmp_path}/demo.sock", "--no-gpu-metrics"],
                         capture_output=True, text=True, env=env(), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    page = tmp_path / "run.html"
    made = subprocess.run([sys.executable, "-m", "sidecar", "report", "--state-dir", str(state), "--html", str(page)],
                          capture_output=True, text=True, env=env(), timeout=60)
    assert made.returncode == 0 and f"wrote {page}" in made.stdout, made.stderr
    ledger = subprocess.run([sys.executable, "-m", "sidecar", "report", "--state-dir", str(state), "--json"],
                            capture_output=True, text=True, env=env(), timeout=60)
    return page, json.loads(ledger.stdout), out.stdout


@pytest.mark.parametrize("args, verdict, roles, step", [
    (("--style", "generic", "--bottleneck", "input", "--duration", "6"), "input-bound", ("trainer",),
     {"trainer|data_wait": 0.060, "trainer|backward": 0.024}),  # demo_loops.LoopTimings: data 60 ms, backward 24
    (("--bottleneck", "drafter", "--duration", "6"), "drafter-bound", ("drafter", "target"),
     {"drafter|backward": 0.080, "drafter|forward": 0.040}),  # demo.PipelineTimings' drafter bottleneck
], ids=["plain-loop-input", "dflash-two-roles"])
def test_a_demos_page_opens_offline_draws_every_chart_and_its_band_holds_the_runs_verdict_seconds(
        tmp_path: Path, args: tuple[str, ...], verdict: str, roles: tuple[str, ...], step: dict[str, float]) -> None:
    chromium_or_skip()
    page, ledger, said = demo(tmp_path, *args)
    assert f"a picture of this run: {tmp_path / 'state' / 'demo.html'}" in said  # the demo wrote its own
    text = page.read_text()
    fetches_nothing(text)
    drawn, painted, headline = open_page(page, tmp_path / "run.png")
    assert headline.startswith(verdict), headline
    # band, step time per role, step rate (no GPU chart: --no-gpu-metrics)
    assert drawn["drawn"] == 2 + len(roles) and len(painted) == drawn["drawn"], (drawn, painted)
    assert all(c["painted"] > 0.05 for c in painted), painted
    assert {c["chart"] for c in painted} == {"band", "rate", *(f"step-{r}" for r in roles)}
    [kept] = ledger["verdicts"]
    recorded = {v["verdict"]: v["seconds"] for v in kept["verdicts"]}
    assert set(drawn["band"]) == set(recorded)
    for name, seconds in recorded.items():
        assert drawn["band"][name] == pytest.approx(seconds, abs=1.0), (drawn["band"], recorded)  # one window: 1 s
    assert "No GPU readings in this run" in text
    # the step time by phase the timeline kept: the demo's sleeps (slower, never faster, on a loaded box)
    timeline, _ = load_view(tmp_path / "state", kept["run"])
    assert timeline is not None
    for key, seconds in step.items():
        kept_means = [p["m"][f"step|{key}"] for p in timeline.points if f"step|{key}" in p["m"]]
        assert kept_means and 0.9 * seconds <= statistics.median(kept_means) <= 1.5 * seconds, (key, kept_means)


def test_a_week_with_gpus_and_a_single_window_run_draw_their_charts(tmp_path: Path) -> None:
    chromium_or_skip()
    windows = 7 * 8640 // 10  # a week of 100 s windows (the bench: 10 s ones)
    book, fed = timeline_synth.book(windows, 100.0, gpus=4)
    week = tmp_path / "week.html"
    week.write_text(render(timeline_synth.RUN, timeline_synth.ledger_view(fed, windows, 100.0), book.view()))
    fetches_nothing(week.read_text())
    assert f"{3 * len(range(500, windows, 997)):,} records dropped or lost" in week.read_text()
    drawn, painted, headline = open_page(week, tmp_path / "week.png")
    assert headline.startswith("balanced") and drawn["drawn"] == 4  # band, GPUs, step time, rate
    assert all(c["painted"] > 0.05 for c in painted), painted
    for name, seconds in fed.items():
        assert drawn["band"][name] == pytest.approx(seconds, rel=0.01), (drawn["band"], fed)
    with Chromium() as c:  # hovering shows values, dragging zooms every chart on the same time
        c.open(week, READY)
        box = c.evaluate("JSON.stringify(document.querySelector('#band .u-over').getBoundingClientRect())")
        box = json.loads(box)
        y = box["y"] + box["height"] / 2
        before = c.evaluate("window.dflashReport.xRanges()")
        for kind, x in (("mouseMoved", 0.45), ("mousePressed", 0.45), ("mouseMoved", 0.5), ("mouseMoved", 0.55),
                        ("mouseReleased", 0.55)):
            c.call("Input.dispatchMouseEvent", type=kind, x=box["x"] + x * box["width"], y=y, button="left",
                   buttons=0 if kind == "mouseReleased" else 1, clickCount=1)
        after = c.evaluate("window.dflashReport.xRanges()")
        c.call("Input.dispatchMouseEvent", type="mouseMoved", x=box["x"] + 0.5 * box["width"], y=y)
        shown = c.evaluate("Array.from(document.querySelectorAll('#band .u-legend .u-value')).map(e => e.textContent)")
    assert len({tuple(r) for r in before}) == 1 and len({tuple(r) for r in after}) == 1, (before, after)
    (lo, hi), (lo2, hi2) = before[0], after[0]
    assert lo < lo2 < hi2 < hi and (hi2 - lo2) == pytest.approx(0.1 * (hi - lo), rel=0.2), (before[0], after[0])
    assert "input-bound" in shown, shown  # the middle of the week is the input-bound stretch
    one = RunTimelineBook(timeline_synth.RUN)
    odd = ("a.b </script> c",)  # a role name no selector or markup may trip on
    first, fed_one = timeline_synth.book(1, 10.0, gpus=0, roles=odd)
    one.add(first.recent[0])
    single = tmp_path / "one.html"
    single.write_text(render(timeline_synth.RUN, timeline_synth.ledger_view(fed_one, 1, 10.0, odd), one.view()))
    drawn, painted, _ = open_page(single, tmp_path / "one.png")
    assert drawn["drawn"] == 3 and all(c["painted"] > 0.02 for c in painted), painted
    assert drawn["band"] == pytest.approx(fed_one, rel=0.05)
