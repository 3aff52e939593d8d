"""The text exposition format (0.0.4), rendered fast for the bulk of a scrape: the trainer series.

``prometheus_client.generate_latest`` validates and escapes every label of every sample and
formats every value in Python (about 7 µs a sample here); with 10,000 trainer series (about
24,000 samples) a scrape took about 200 ms, and 400 ms in OpenMetrics with gzip level 9.
``render_trainer`` writes the same text straight from the window report instead: the label
string of each (role, worker) is built and escaped once, metric names are already sanitized
tokens, and values take a fast path of ``floatToGoString``. The output is byte for byte what
``generate_latest`` gives for ``prometheus.trainer_families`` (the reference, which the
collector still serves to registries; a test holds the two together).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from sidecar.model.names import TRAINER_FAMILIES, TrainerFamily
from sidecar.model.window import ALLOCATOR, CATEGORY, COUNT, GAUGE, PROFILE, SCALAR, TIMING

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from sidecar.model.window import IngestReport, SeriesView

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_INF = math.inf


def go_float(value: float) -> str:
    """``prometheus_client.utils.floatToGoString``, with a fast path for the common case: a
    finite value below 1e6 (at most six digits before the point) prints as Python's ``repr``."""
    d = float(value)
    if -_INF < d < 1e6:
        return repr(d)
    if 1e6 <= d < _INF:  # floatToGoString's own rule for these, without its checks for Inf and NaN
        s = repr(d)
        dot = s.find(".")
        if dot > 6:
            return f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.") + f"e+{dot - 1:02d}"
        return s
    return floatToGoString(d)


def escape(value: str) -> str:
    """A label value escaped as the text format requires (backslash, newline, double quote)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _header(name: str, kind: str, doc: str) -> str:
    doc = doc.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


class _Families(Collector):
    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def render_metrics(metrics: Iterable[Metric]) -> str:
    """Any prometheus_client families, rendered by prometheus_client itself (for the small,
    changing families: accounting, self-telemetry, GPUs, W&B)."""
    return generate_latest(_Families(metrics)).decode()


def render_metrics_bytes(metrics: Iterable[Metric]) -> bytes:
    """``render_metrics`` as the UTF-8 bytes served (prometheus_client's own output, not decoded)."""
    return generate_latest(_Families(metrics))


class _Labels:
    """The label strings of one (role, worker), built once per scrape. Label names sort
    alphabetically, as ``generate_latest`` writes them: gpu, host, key, quantile, role, worker."""

    __slots__ = ("host", "rw", "base", "q50", "q95", "q1")

    def __init__(self, host: str, role: str, worker: str) -> None:
        self.host = f'host="{host}"'
        self.rw = f'role="{escape(role)}",worker="{escape(worker)}"'
        self.base = f"{{{self.host},{self.rw}}}"
        self.q50, self.q95, self.q1 = (f'{{{self.host},quantile="{q}",{self.rw}}}' for q in ("0.5", "0.95", "1"))

    def key(self, key: str) -> str:
        return f'{{{self.host},key="{escape(key)}",{self.rw}}}'


class _TrainerPage:
    """Families in the order ``trainer_families`` creates them, each a header and sample lines.

    Built in two passes, for memory: ``add`` and the others only note, per family, what its
    lines are made of (the series' views, already held by the report); ``data`` writes each family
    in turn, its lines made, joined and encoded, then dropped. A page of 10,000 series holds
    tens of thousands of lines, and making them all first (as strings in per-family lists, joined
    at the end) was most of the RSS peak of the 10,000-timing flood (tests/test_abuse_memory.py:
    about 15 MiB of the daemon's peak went with rendering, measured with the page served empty)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.families: dict[str, tuple[TrainerFamily, str, list[object]]] = {}
        """Keyed by family name as ``trainer_families`` keys them: (declared family, token, what
        its lines are made of: a flat list of (emitter, item, labels) triples)."""
        self._of_series: dict[tuple[int, str, int], list[object]] = {}
        self._labels: dict[tuple[str, str], _Labels] = {}

    def family(self, family: TrainerFamily, token: str = "") -> list[object]:
        """The page's entry for ``family`` (of the series ``token``): the list its line triples go to."""
        name = family.name.format(token)
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = (family, token, [])
        return fam[2]

    def series_family(self, kind: int, token: str, which: int = 0) -> list[object]:
        """The family of a trainer series (``which``: its place in ``TRAINER_FAMILIES[kind]``), memoized."""
        fam = self._of_series.get((kind, token, which))
        if fam is None:
            fam = self._of_series[kind, token, which] = self.family(TRAINER_FAMILIES[kind][which], token)
        return fam

    def add(self, view: SeriesView) -> None:
        lab = self._labels.get((view.role, view.worker))
        if lab is None:
            lab = self._labels[view.role, view.worker] = _Labels(self.host, view.role, view.worker)
        kind = view.kind
        if kind == TIMING:
            self.series_family(kind, view.name).extend((_timing_lines, view, lab))
        elif kind == COUNT:
            self.series_family(kind, view.name).extend((_count_line, view, lab))
        elif kind == GAUGE or kind == SCALAR:
            last = view.cumulative["last"]
            if isinstance(last, float) and math.isnan(last):
                return  # no sample, and no family unless another series has a value
            self.series_family(kind, view.name).extend((_gauge_line, view, lab))
        elif kind == CATEGORY:
            self.series_family(kind, view.name).extend((_category_lines, view, lab))
            if view.window:
                self.series_family(kind, view.name, 1).extend((_entropy_line, view, lab))

    def add_steps(self, steps: dict[tuple[str, str], int]) -> None:
        items = self.family(TRAINER_FAMILIES[PROFILE][0])
        for (role, worker), step in steps.items():
            items.extend((_step_line, step, f'{{host="{self.host}",role="{escape(role)}",worker="{escape(worker)}"}}'))

    def add_allocator(self, allocator: dict[tuple[str, str, int], tuple[int, int, int]]) -> None:
        families = [self.family(family) for family in TRAINER_FAMILIES[ALLOCATOR]]
        for (role, worker, device), values in allocator.items():
            labels = (f'{{gpu="{escape(str(device))}",host="{self.host}",role="{escape(role)}",'
                      f'worker="{escape(worker)}"}}')
            for items, value in zip(families, values):
                items.extend((_step_line, value, labels))

    def write(self, write: Callable[[str], object]) -> None:
        """Each family's text in turn to ``write`` (one call a family); the page is spent (each
        family's triples are released once written)."""
        out: list[str] = []
        for family, token, items in self.families.values():
            name = family.exposed(token)
            out.append(_header(name, family.type, family.help.format(token)))
            for i in range(0, len(items), 3):
                items[i](out, name, items[i + 1], items[i + 2])  # type: ignore[operator]
            items.clear()
            write("".join(out))
            out.clear()

    def text(self) -> str:
        """The page (spent, as by ``write``)."""
        out: list[str] = []
        self.write(out.append)
        return "".join(out)

    def data(self) -> bytes:
        """The page as UTF-8 bytes (``text().encode()``), one buffer with each family encoded
        into it as it is made (spent, as by ``write``): the whole page is never held twice."""
        buffer = io.BytesIO()
        write = buffer.write
        self.write(lambda text: write(text.encode()))
        return buffer.getvalue()


def _timing_lines(out: list[str], name: str, view: SeriesView, lab: _Labels) -> None:
    cumulative, window = view.cumulative, view.window
    out.append(f"{name}_count{lab.base} {go_float(cumulative['count'])}\n"
               f"{name}_sum{lab.base} {go_float(cumulative['sum_s'])}\n")
    if window:
        out.append(f"{name}{lab.q50} {go_float(window['p50'] / 1000.0)}\n"
                   f"{name}{lab.q95} {go_float(window['p95'] / 1000.0)}\n"
                   f"{name}{lab.q1} {go_float(window['max'] / 1000.0)}\n")


def _count_line(out: list[str], name: str, view: SeriesView, lab: _Labels) -> None:
    out.append(f"{name}{lab.base} {go_float(view.cumulative['total'])}\n")


def _gauge_line(out: list[str], name: str, view: SeriesView, lab: _Labels) -> None:
    out.append(f"{name}{lab.base} {go_float(view.cumulative['last'])}\n")


def _category_lines(out: list[str], name: str, view: SeriesView, lab: _Labels) -> None:
    for key, count in view.cumulative["totals"].items():
        out.append(f"{name}{lab.key(key)} {go_float(count)}\n")


def _entropy_line(out: list[str], name: str, view: SeriesView, lab: _Labels) -> None:
    out.append(f"{name}{lab.base} {go_float(view.window['entropy_bits'])}\n")  # type: ignore[index]


def _step_line(out: list[str], name: str, value: float, labels: str) -> None:
    """A sample whose label string is made already (a step's, an allocator field's)."""
    out.append(f"{name}{labels} {go_float(value)}\n")


def _trainer_page(report: IngestReport, host: str) -> _TrainerPage:
    page = _TrainerPage(escape(host))
    for view in report.window.series:
        page.add(view)
    page.add_steps(report.window.steps)
    page.add_allocator(report.window.allocator)
    return page


def render_trainer(report: IngestReport, host: str) -> str:
    """The trainer's families (timings, counters, gauges, GPU scalars, categories, steps, CUDA
    allocator) in the text format, identical to ``generate_latest`` of ``trainer_families``."""
    return _trainer_page(report, host).text()


def render_trainer_bytes(report: IngestReport, host: str) -> bytes:
    """``render_trainer(report, host).encode()``, with one copy of the page held at a time
    (``_TrainerPage.data``): what the served page caches."""
    return _trainer_page(report, host).data()
