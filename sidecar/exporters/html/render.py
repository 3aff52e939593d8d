"""A run as one self-contained HTML page: the verdict as a coloured band over time, GPU busy and
power, each role's step time stacked by phase, the step rates, the ledger by cause per role, the
sender ends and restarts as markers, and the dominant verdict with its evidence and the next
thing to check in words at the top (``dflash-sidecar report --html``, the W&B run's HTML panel).

Nothing is fetched: the charting library (uPlot, MIT License, its license text kept in the page)
and the page's own script and style are inlined, the data is a JSON block. Every chart has a text
summary beside it (``sidecar.exporters.html.words``). The page draws its time charts in the
browser; the ledger's bars are inline SVG. When it has drawn, ``window.dflashReport`` says what it
drew (``drawn``: charts, ``band``: seconds per verdict read back from the band's pixels) and
``performance`` holds a ``dflash-drawn`` mark (tests and bench/bench_html.py read them).
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import Any

from sidecar.exporters.html import words
from sidecar.model.ledger import CAUSES, RoleLedger, RunLedgerView
from sidecar.model.timeline import RunTimeline

LIBRARY = "uPlot 1.6.32"
"""The charting library inlined (``assets/uPlot.iife.min.js``, ``assets/uPlot.LICENSE``)."""
MAX_DRAWN_POINTS = 4000
"""Points drawn per chart at most (a timeline keeps fewer: ``sidecar.aggregation.timeline``)."""


def _asset(name: str) -> str:
    return resources.files("sidecar.exporters.html").joinpath("assets", name).read_text(encoding="utf-8")


def _json_safe(text: str) -> str:
    """JSON text safe inside a ``<script>`` element (``</`` and ``<!--`` written as escapes)."""
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")


def _script(code: str) -> str:
    """A ``<script>`` element of ``code``. Raises ``ValueError`` if the code would close it early."""
    if re.search(r"</script|<!--", code, re.IGNORECASE):
        raise ValueError("a script to inline holds </script or <!--")
    return f"<script>{code}</script>"


def _keys(timeline: RunTimeline, prefix: str) -> list[str]:
    """The series names after ``prefix`` (``busy|``) in first-seen order."""
    return [k[len(prefix):] for k in timeline.keys() if k.startswith(prefix)]


def chart_data(timeline: RunTimeline) -> dict[str, Any]:
    """The timeline as the page's script reads it: per point its bounds, seconds and verdict
    seconds, and each series' values (null where a point lacks it, and in the gaps between points
    farther apart than twice their width)."""
    points = list(timeline.points)[-MAX_DRAWN_POINTS:]
    keys = timeline.keys()
    starts = [float(points[0]["t0"])] if points else []
    starts += [e.unix_s for e in timeline.events if points and float(points[0]["t0"]) - 600 < e.unix_s]
    rows: list[tuple[float, dict[str, float] | None]] = [(min(starts), None)] if starts else []  # the axis's start
    prev: dict[str, Any] | None = None
    for p in points:
        width = max(float(p["t1"]) - float(p["t0"]), timeline.window_s, 1e-3)
        if prev is not None and float(p["t0"]) - float(prev["t1"]) > 2 * width:
            rows.append((float(prev["t1"]) + 1e-3, None))  # a gap: lines break here
        rows.append((float(p["t1"]), p.get("m", {})))
        prev = dict(p)
    return {
        "x": [round(t, 3) for t, _ in rows],
        "series": {k: [m.get(k) if m is not None else None for _, m in rows] for k in keys},
        "band": [[p["t0"], p["t1"], p["s"], p.get("v", {})] for p in points],
        "drops": [[p["t1"], p["c"]["drops"]] for p in points if p.get("c", {}).get("drops")],
    }


def _roles(timeline: RunTimeline | None, ledger_roles: list[RoleLedger]) -> list[str]:
    seen = dict.fromkeys(r.role for r in ledger_roles)
    if timeline is not None:
        seen.update(dict.fromkeys(k.split("|")[1] for k in timeline.keys() if k.startswith(("rate|", "step|"))))
    return list(seen)


def page_data(run: str, view: RunLedgerView, timeline: RunTimeline | None) -> dict[str, Any]:
    """Everything the page's script draws, as JSON-able data."""
    roles = _roles(timeline, list(view.run(run)))
    kept = dict.fromkeys(k.split("|")[2] for k in (timeline.keys() if timeline is not None else ())
                         if k.startswith("step|"))
    phases = {p: words.PHASE_COLOURS.get(p, "#888888")
              for p in sorted(kept, key=lambda p: list(words.PHASE_COLOURS).index(p) if p in words.PHASE_COLOURS
                              else len(words.PHASE_COLOURS))}  # the colours' order, any other phase last
    data: dict[str, Any] = {"run": run, "roles": roles, "colours": words.COLOURS, "phases": phases, "charts": []}
    if timeline is None:
        return data
    data.update(chart_data(timeline), events=words.event_rows(timeline.events), gpus=_keys(timeline, "busy|"),
                power=_keys(timeline, "power|"))
    charts = ["band"]
    if data["gpus"] or data["power"]:
        charts.append("gpu")
    charts += [f"step|{r}" for r in roles if any(k.startswith(f"step|{r}|") for k in timeline.keys())]
    if any(k.startswith("rate|") or k == "queue" for k in timeline.keys()):
        charts.append("rate")
    data["charts"] = charts
    return data


def ledger_svg(roles: list[RoleLedger]) -> str:
    """The ledger by cause per role: one horizontal stacked bar per role (its wall time as 100 %),
    each cause a rectangle with its seconds in a tooltip."""
    width, bar, gap, label = 720, 26, 14, 120
    parts = [f'<svg role="img" aria-labelledby="ledger-caption" width="100%" style="max-width:{width * 1.5}px" '
             f'viewBox="0 0 {width} {len(roles) * (bar + gap) + gap}">']
    for i, r in enumerate(roles):
        y = gap + i * (bar + gap)
        parts.append(f'<text x="0" y="{y + bar * 0.7:.1f}" font-size="13">{html.escape(r.role)}</text>')
        x, wall = float(label), r.wall_s
        for cause in CAUSES:
            share = r.seconds[cause] / wall if wall > 0 else 0.0
            if share <= 0:
                continue
            w = share * (width - label)
            parts.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{bar}" '
                         f'fill="{words.CAUSE_COLOURS[cause]}"><title>{html.escape(r.role)} {cause}: '
                         f'{r.seconds[cause]:.1f} s ({share:.1%}), {r.joules[cause]:.0f} J</title></rect>')
            x += w
    parts.append("</svg>")
    return "".join(parts)


def _figure(fid: str, title: str, summary: str, body: str = "") -> str:
    return (f'<figure id="{html.escape(fid)}"><h2>{html.escape(title)}</h2><div class="fig">'
            f'<div class="chart" role="img" aria-label="{html.escape(title)}: {html.escape(summary)}">{body}</div>'
            f'<figcaption id="{html.escape(fid)}-caption">{html.escape(summary)}</figcaption></div></figure>')


def _figures(run: str, view: RunLedgerView, timeline: RunTimeline | None, data: dict[str, Any]) -> list[str]:
    out = []
    if timeline is not None:
        out.append(_figure("band", "The verdict over time", words.band_summary(timeline)))
        out.append(_figure("gpu", "GPU busy (left, %) and power (right, W)", words.gpu_summary(timeline, data["gpus"])))
        for chart in data["charts"]:
            if chart.startswith("step|"):
                role = chart.split("|", 1)[1]
                out.append(_figure(f"step-{role}", f"Step time of {role} by phase (ms per step)",
                                   words.step_summary(timeline, role, list(data["phases"]))))
        if "rate" in data["charts"]:
            out.append(_figure("rate", "Step rate (steps/s) and queue fill (%)",
                               words.rate_summary(timeline, data["roles"])))
        out.append(_figure("events", "Markers: sender starts (S), ends (E), daemon restarts (D), drops (red ticks)",
                           words.events_summary(timeline.events, timeline.events_dropped)
                           + " " + words.drops_summary(timeline)))
    roles = list(view.run(run))
    out.append(_figure("ledger", "Where the time went, per role (run ledger)", words.ledger_summary(roles),
                       ledger_svg(roles) + _legend(roles)))
    return out


def _legend(roles: list[RoleLedger]) -> str:
    used = [c for c in CAUSES if any(r.seconds[c] > 0 for r in roles)]
    return '<p class="legend">' + " ".join(
        f'<span><i style="background:{words.CAUSE_COLOURS[c]}"></i>{c}</span>' for c in used) + "</p>"


def render(run: str, view: RunLedgerView, timeline: RunTimeline | None, problem: str | None = None) -> str:
    """The page of ``run`` (which ``view`` holds) with its ``timeline`` (None: none kept,
    ``problem`` says why: ``sidecar.core.timeline_state.read``)."""
    data = page_data(run, view, timeline)
    verdict, evidence, check = words.headline(view.verdicts_of(run))
    roles = list(view.run(run))
    lines = [f"{r.role}: wall {words.seconds(r.wall_s)}, goodput "
             f"{'-' if r.goodput_ratio is None else format(r.goodput_ratio, '.0%')}, steps {r.steps}" for r in roles]
    notes = words.lacking(timeline, problem, data.get("gpus", []) + data.get("power", []))
    head = (f'<header><p class="run">Run {html.escape(run)}</p><h1 id="verdict">{html.escape(verdict)}</h1>'
            f'<p><b>Evidence:</b> {html.escape(evidence)}</p><p><b>Next to check:</b> {html.escape(check)}</p>'
            f'<p>{html.escape(" · ".join(lines))}</p>'
            + "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
            + '<p class="help">Hover a chart for values; drag across it to zoom in on time (every chart follows); '
              'double-click to zoom out.</p></header>')
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{html.escape(run)}: {html.escape(verdict)}</title>'
            f'<style>{_asset("uPlot.min.css")}\n{_asset("report.css")}</style></head><body>{head}<main>'
            + "".join(_figures(run, view, timeline, data))
            + f'</main><footer><details><summary>Charts drawn with {LIBRARY} (MIT License), inlined</summary>'
              f'<pre>{html.escape(_asset("uPlot.LICENSE"))}</pre></details></footer>'
              f'<script type="application/json" id="dflash-data">{_json_safe(json.dumps(data, allow_nan=False))}'
              f'</script>{_script(_asset("uPlot.iife.min.js"))}{_script(_asset("report.js"))}</body></html>')
