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

import math
from collections.abc import Iterable
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
    """Families in the order ``trainer_families`` creates them, each a header and sample lines."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.families: dict[str, tuple[str, list[str]]] = {}
        """Keyed by family name as ``trainer_families`` keys them: (exposed name, lines)."""
        self._of_series: dict[tuple[int, str, int], tuple[str, list[str]]] = {}
        self._labels: dict[tuple[str, str], _Labels] = {}

    def family(self, family: TrainerFamily, token: str = "") -> tuple[str, list[str]]:
        """The page's entry for ``family`` (of the series ``token``): its exposed name and lines."""
        name = family.name.format(token)
        fam = self.families.get(name)
        if fam is None:
            shown = family.exposed(token)
            fam = self.families[name] = (shown, [_header(shown, family.type, family.help.format(token))])
        return fam

    def series_family(self, kind: int, token: str, which: int = 0) -> tuple[str, list[str]]:
        """The family of a trainer series (``which``: its place in ``TRAINER_FAMILIES[kind]``), memoized."""
        fam = self._of_series.get((kind, token, which))
        if fam is None:
            fam = self._of_series[kind, token, which] = self.family(TRAINER_FAMILIES[kind][which], token)
        return fam

    def add(self, view: SeriesView) -> None:
        lab = self._labels.get((view.role, view.worker))
        if lab is None:
            lab = self._labels[view.role, view.worker] = _Labels(self.host, view.role, view.worker)
        kind, cumulative, window = view.kind, view.cumulative, view.window
        if kind == TIMING:
            name, lines = self.series_family(kind, view.name)
            lines.append(f"{name}_count{lab.base} {go_float(cumulative['count'])}\n"
                         f"{name}_sum{lab.base} {go_float(cumulative['sum_s'])}\n")
            if window:
                lines.append(f"{name}{lab.q50} {go_float(window['p50'] / 1000.0)}\n"
                             f"{name}{lab.q95} {go_float(window['p95'] / 1000.0)}\n"
                             f"{name}{lab.q1} {go_float(window['max'] / 1000.0)}\n")
        elif kind == COUNT:
            name, lines = self.series_family(kind, view.name)
            lines.append(f"{name}{lab.base} {go_float(cumulative['total'])}\n")
        elif kind == GAUGE or kind == SCALAR:
            last = cumulative["last"]
            if isinstance(last, float) and math.isnan(last):
                return  # no sample, and no family unless another series has a value
            name, lines = self.series_family(kind, view.name)
            lines.append(f"{name}{lab.base} {go_float(last)}\n")
        elif kind == CATEGORY:
            name, lines = self.series_family(kind, view.name)
            for key, count in cumulative["totals"].items():
                lines.append(f"{name}{lab.key(key)} {go_float(count)}\n")
            if window:
                name, lines = self.series_family(kind, view.name, 1)
                lines.append(f"{name}{lab.base} {go_float(window['entropy_bits'])}\n")

    def add_steps(self, steps: dict[tuple[str, str], int]) -> None:
        name, lines = self.family(TRAINER_FAMILIES[PROFILE][0])
        for (role, worker), step in steps.items():
            lines.append(f'{name}{{host="{self.host}",role="{escape(role)}",'
                         f'worker="{escape(worker)}"}} {go_float(step)}\n')

    def add_allocator(self, allocator: dict[tuple[str, str, int], tuple[int, int, int]]) -> None:
        families = [self.family(family) for family in TRAINER_FAMILIES[ALLOCATOR]]
        for (role, worker, device), values in allocator.items():
            labels = (f'{{gpu="{escape(str(device))}",host="{self.host}",role="{escape(role)}",'
                      f'worker="{escape(worker)}"}}')
            for (name, lines), value in zip(families, values):
                lines.append(f"{name}{labels} {go_float(value)}\n")

    def text(self) -> str:
        return "".join("".join(lines) for _, lines in self.families.values())


def render_trainer(report: IngestReport, host: str) -> str:
    """The trainer's families (timings, counters, gauges, GPU scalars, categories, steps, CUDA
    allocator) in the text format, identical to ``generate_latest`` of ``trainer_families``."""
    page = _TrainerPage(escape(host))
    for view in report.window.series:
        page.add(view)
    page.add_steps(report.window.steps)
    page.add_allocator(report.window.allocator)
    return page.text()
