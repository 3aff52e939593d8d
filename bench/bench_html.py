"""The run's picture (``report --html``): its timeline's size and load time for long runs, and two
charting libraries side by side in a real headless Chromium (network off).

For a 10-minute run (60 windows of 10 s) and a 7-day run (60,480 windows, merged by the run
timeline's bound on the server side: ``sidecar.aggregation.timeline``), it writes the same charts
(verdict band, 8 GPUs' busy and power, the step time stacked by phase, the step rate) with

- uPlot (the page ``report --html`` writes, ``sidecar.exporters.html``), and
- Chart.js (a page made here with the same data, line charts with ``parsing: false`` and no
  animation; its file given with ``--chartjs``, e.g. from ``npm pack chart.js@4.6.2``),

and measures each page's size and, over ``--repeat`` loads after one warm-up, the median time
from navigation to the first contentful paint and to every chart drawn (a ``performance`` mark
set in the frame after the last chart). It also measures, for a 30-day run of 10 s windows, the
timeline's file size, the time to fold one window in and the time to read the file back.

    python bench/bench_html.py --chartjs /tmp/chartjs/package/dist/chart.umd.min.js
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.core import timeline_state  # noqa: E402
from sidecar.core.ledger_state import save  # noqa: E402
from sidecar.exporters.html.render import chart_data, render  # noqa: E402
from sidecar.exporters.html.words import COLOURS, PHASE_COLOURS  # noqa: E402
from tests import timeline_synth  # noqa: E402
from tests.chromium import Chromium  # noqa: E402

CHARTJS_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>chart.js</title>
<style>div{width:1100px;height:%(h)spx}</style></head><body>%(divs)s
<script type="application/json" id="d">%(data)s</script><script>%(lib)s</script><script>
var D = JSON.parse(document.getElementById('d').textContent), X = D.x, drawn = 0;
function ds(label, ys, colour, extra) { var o = {label: label, borderColor: colour, backgroundColor: colour,
  pointRadius: 0, borderWidth: 1.5, spanGaps: false, data: X.map(function (x, i) { return {x: x, y: ys[i]}; })};
  for (var k in (extra || {})) o[k] = extra[k]; return o; }
function chart(id, sets, scales) { new Chart(document.getElementById(id), {type: 'line', data: {datasets: sets},
  options: {parsing: false, animation: false, normalized: true, maintainAspectRatio: false,
  interaction: {mode: 'index', intersect: false}, scales: Object.assign({x: {type: 'linear'}}, scales || {})}});
  drawn++; }
var verdicts = Object.keys(D.colours), bands = verdicts.map(function (v) {
  return ds(v, D.band.map(function (p) { var best = null;
    for (var k in p[3]) if (!best || p[3][k] > p[3][best]) best = k;
    return best === v ? 1 : null; }), D.colours[v], {fill: 'origin', stepped: true}); });
chart('band', bands, {y: {min: 0, max: 1}});
var g = [];
D.gpus.forEach(function (k, i) { g.push(ds(k + ' busy', D.series['busy|' + k].map(function (v) {
  return v == null ? null : v * 100; }), '#0072b2')); });
D.gpus.forEach(function (k, i) { g.push(ds(k + ' power', D.series['power|' + k], '#d55e00', {yAxisID: 'w'})); });
chart('gpu', g, {w: {position: 'right'}});
var run = X.map(function () { return 0; }), s = [];
D.classes.forEach(function (c, i) { var raw = D.series['step|trainer|' + c]; if (!raw) return;
  run = run.map(function (v, j) { return v + (raw[j] || 0) * 1000; });
  s.push(ds(c, run.slice(), D.phases[c], {fill: s.length ? '-1' : 'origin'})); });
chart('step', s, {y: {stacked: false}});
chart('rate', [ds('trainer', D.series['rate|trainer'], '#0072b2')]);
requestAnimationFrame(function () {
  performance.mark('dflash-drawn'); window.dflashReport = {done: true, drawn: drawn}; });
</script></body></html>"""


def chartjs_page(data: dict[str, Any], lib: str) -> str:
    divs = "".join(f'<div><canvas id="{c}"></canvas></div>' for c in ("band", "gpu", "step", "rate"))
    return CHARTJS_PAGE % {"h": 200, "divs": divs, "lib": lib,
                           "data": json.dumps(data).replace("</", "<\\/")}


def pages(windows: int, folder: Path, chartjs: str | None) -> tuple[dict[str, Path], int]:
    """The run's pages, one per library, and the points its timeline keeps."""
    book, fed = timeline_synth.book(windows, 10.0, gpus=8)
    view = timeline_synth.ledger_view(fed, windows, 10.0)
    out = {"uPlot": folder / f"uplot-{windows}.html"}
    out["uPlot"].write_text(render(timeline_synth.RUN, view, book.view()))
    if chartjs:
        data = chart_data(book.view()) | {"colours": COLOURS, "phases": PHASE_COLOURS, "classes": list(PHASE_COLOURS),
                                          "gpus": [f"gpu{g}" for g in range(8)]}
        out["Chart.js"] = folder / f"chartjs-{windows}.html"
        out["Chart.js"].write_text(chartjs_page(data, Path(chartjs).read_text()))
    return out, len(book.view().points)


def paint_ms(c: Chromium, page: Path, repeat: int) -> tuple[float, float, int]:
    """(median ms to the first contentful paint, median ms to every chart drawn, charts) over
    ``repeat`` loads after one warm-up."""
    fcp, drawn, charts = [], [], 0
    for i in range(repeat + 1):
        seen = c.open(page, "window.dflashReport && window.dflashReport.done && "
                            "performance.getEntriesByName('first-contentful-paint').length")
        if seen.errors or len(seen.requests) != 1:
            raise RuntimeError(f"{page}: errors {seen.errors}, requests {seen.requests}")
        marks = c.evaluate("JSON.stringify([performance.getEntriesByName('first-contentful-paint')[0].startTime,"
                           "performance.getEntriesByName('dflash-drawn')[0].startTime, window.dflashReport.drawn])")
        first, done, charts = json.loads(marks)
        if i:
            fcp.append(first)
            drawn.append(done)
    return statistics.median(fcp), statistics.median(drawn), charts


def timeline_cost(folder: Path) -> dict[str, float]:
    """A 30-day run of 10 s windows: the file's size, ms to fold a window in (median of the last
    1,000) and ms to read the file back into a view (median of 5)."""
    windows = 30 * 8640
    book, _ = timeline_synth.book(windows - 1000, 10.0, gpus=8)
    import random

    rng = random.Random(1)
    fold = []
    for i in range(windows - 1000, windows):
        p = timeline_synth.point(i, windows, 10.0, 8, ("trainer",), rng)
        t = time.perf_counter()
        book.add(p)
        fold.append((time.perf_counter() - t) * 1000)
    path = timeline_state.file_of(folder / timeline_state.FOLDER, book.run)
    t = time.perf_counter()
    save(path, book.state())
    save_ms = (time.perf_counter() - t) * 1000
    loads = []
    for _ in range(5):
        t = time.perf_counter()
        view, problem = timeline_state.load_view(folder, book.run)
        loads.append((time.perf_counter() - t) * 1000)
        assert view is not None and problem is None
    return {"bytes": path.stat().st_size, "points": len(book.view().points), "fold_ms": statistics.median(fold),
            "save_ms": save_ms, "load_ms": statistics.median(loads)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chartjs", default=None, help="Chart.js's chart.umd.min.js, to compare")
    parser.add_argument("--repeat", type=int, default=5)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Chromium() as c:
        folder = Path(tmp)
        print("| run | library | file bytes | points | first contentful paint ms | all charts drawn ms |")
        print("|---|---|---:|---:|---:|---:|")
        for name, windows in (("10 minutes", 60), ("7 days", 60_480)):
            made, points = pages(windows, folder, ns.chartjs)
            for lib, page in made.items():
                fcp, drawn, charts = paint_ms(c, page, ns.repeat)
                print(f"| {name} ({windows:,} windows) | {lib} | {page.stat().st_size:,} | {points:,} | "
                      f"{fcp:.0f} | {drawn:.0f} ({charts} charts) |", flush=True)
        cost = timeline_cost(folder)
        print(f"\n30-day run of 10 s windows: timeline file {cost['bytes']:,} bytes ({cost['points']:,} points), "
              f"fold one window {cost['fold_ms']:.3f} ms (median), save {cost['save_ms']:.1f} ms, "
              f"read back {cost['load_ms']:.1f} ms (median of 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
