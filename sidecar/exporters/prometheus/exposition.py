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
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, cast

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
    if "\\" in doc or "\n" in doc:  # rare: a page of 10,000 families makes 10,000 headers
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

    __slots__ = ("role", "worker", "host", "rw", "base", "q50", "q95", "q1")

    def __init__(self, host: str, role: str, worker: str) -> None:
        self.role, self.worker = role, worker
        self.host = f'host="{host}"'
        self.rw = f'role="{escape(role)}",worker="{escape(worker)}"'
        self.base = f"{{{self.host},{self.rw}}}"
        self.q50, self.q95, self.q1 = (f'{{{self.host},quantile="{q}",{self.rw}}}' for q in ("0.5", "0.95", "1"))

    def key(self, key: str) -> str:
        return f'{{{self.host},key="{escape(key)}",{self.rw}}}'


class _TrainerPage:
    """Families in the order ``trainer_families`` creates them, each a header and sample lines.

    Built in two passes, for memory: ``add`` and the others only note, per family, what its
    lines are made of (the series' views, which the report holds anyway); ``write`` makes each
    family's text in turn, and drops it once written. A page of 10,000 series has tens of
    thousands of lines: making them all first (as strings in per-family lists, joined at the
    end) was most of what rendering added to the RSS peak of the 10,000-timing flood
    (tests/test_abuse_memory.py; bench/RESULTS_SOAK.md)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.families: dict[str, tuple[TrainerFamily, str, list[_Run]]] = {}
        """Keyed by family name as ``trainer_families`` keys them: (declared family, token, its
        runs of samples, in the order they were added)."""
        self._of_series: dict[tuple[int, int], dict[str, list[_Run]]] = {}
        """(kind, which) -> token -> the family's segments (``series_family``'s memo)."""
        self._labels: dict[tuple[str, str], _Labels] = {}
        self._last = _Labels(host, "", "")
        """The labels of the series added last (a look-up saved per series)."""

    def family(self, family: TrainerFamily, token: str = "") -> list[_Run]:
        """The page's entry for ``family`` (of the series ``token``): its runs."""
        name = family.name.format(token)
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = (family, token, [])
        return fam[2]

    def series_family(self, kind: int, token: str, which: int = 0) -> list[_Run]:
        """The family of a trainer series (``which``: its place in ``TRAINER_FAMILIES[kind]``), memoized."""
        memo = self._of_series.get((kind, which))
        if memo is None:
            memo = self._of_series[kind, which] = {}
        fam = memo.get(token)
        if fam is None:
            fam = memo[token] = self.family(TRAINER_FAMILIES[kind][which], token)
        return fam

    def add_series(self, views: Iterable[SeriesView]) -> None:
        """Note every series of ``views`` in its families. One loop, its look-ups local and the
        common case of ``_note`` inline: this pass comes on top of making the lines, and written
        plainly (a method call per series, ``_note`` each time) it made a cold page of 10,000
        series a tenth slower than the one pass before."""
        labels, lab = self._labels, self._last
        role, worker = lab.role, lab.worker
        of_kind: dict[int, dict[str, list[_Run]]] = {}  # kind -> series_family's memo for its first family
        emitters, gauge_lines, category_lines = _EMITTERS, _gauge_lines, _category_lines
        for view in views:
            if view.worker != worker or view.role != role:  # a window's series come by sender
                role, worker = view.role, view.worker
                found = labels.get((role, worker))
                if found is None:
                    found = labels[role, worker] = _Labels(self.host, role, worker)
                lab = found
            kind = view.kind
            emit = emitters.get(kind)
            if emit is None:
                continue
            if emit is gauge_lines:
                last = view.cumulative["last"]
                if isinstance(last, float) and math.isnan(last):
                    continue  # no sample, and no family unless another series has a value
            elif emit is category_lines and view.window:  # the entropy's family comes after the samples'
                self._note(kind, view.name, 0, emit, view, lab)
                self._note(kind, view.name, 1, _entropy_lines, view, lab)
                continue
            memo = of_kind.get(kind)
            runs = memo.get(view.name) if memo is not None else None
            if runs and (last_run := runs[-1]).emit is emit:
                last_run.append(view)
                last_run.append(lab)
            else:
                self._note(kind, view.name, 0, emit, view, lab)
                of_kind[kind] = self._of_series[kind, 0]
        self._last = lab

    def _note(self, kind: int, token: str, which: int, emit: Emitter, item: object, labels: object) -> None:
        """``item`` (with its ``labels``) to the family of a series (``which``: its place in
        ``TRAINER_FAMILIES[kind]``), to be written by ``emit``."""
        _note(self.series_family(kind, token, which), emit, item, labels)

    def add_steps(self, steps: dict[tuple[str, str], int]) -> None:
        runs = self.family(TRAINER_FAMILIES[PROFILE][0])
        for (role, worker), step in steps.items():
            _note(runs, _labelled_lines, step,
                  f'{{host="{self.host}",role="{escape(role)}",worker="{escape(worker)}"}}')

    def add_allocator(self, allocator: dict[tuple[str, str, int], tuple[int, int, int]]) -> None:
        families = [self.family(family) for family in TRAINER_FAMILIES[ALLOCATOR]]
        for (role, worker, device), values in allocator.items():
            labels = (f'{{gpu="{escape(str(device))}",host="{self.host}",role="{escape(role)}",'
                      f'worker="{escape(worker)}"}}')
            for runs, value in zip(families, values):
                _note(runs, _labelled_lines, value, labels)

    def write(self, out: list[str], full: Callable[[], object] = lambda: None) -> None:
        """Each family's text in turn onto ``out`` (its pieces), ``full()`` called between two
        families once ``out`` holds ``BLOCK_PIECES`` pieces or more (to take them away). The
        page is spent: each family's runs are released once written."""
        for family, token, runs in self.families.values():
            name = family.exposed(token)
            out.append(_header(name, family.type, family.help.format(token)))
            for run in runs:
                run.emit(out, name, run)
            runs.clear()
            if len(out) >= BLOCK_PIECES:
                full()

    def text(self) -> str:
        """The page (spent, as by ``write``)."""
        out: list[str] = []
        self.write(out)
        return "".join(out)

    def blocks(self) -> list[bytes]:
        """The page as UTF-8 (``text().encode()``) in blocks, each of at least ``BLOCK_PIECES``
        pieces (but the last) and of whole families (spent, as by ``write``). Never one buffer:
        a buffer of several MB grown as the page is made is copied at each growth, and its old
        sizes stay behind in the allocator's heap, where blocks of about one size are reused by
        the next window's page. The server writes them one after the other
        (``server.MetricsServer``)."""
        blocks: list[bytes] = []
        out: list[str] = []

        def full() -> None:
            blocks.append("".join(out).encode())
            out.clear()

        self.write(out, full)
        if out:
            full()
        return blocks


class _Run(list[object]):
    """A run of samples of one family that one emitter writes: ``[item, labels, item, labels,
    ...]`` (a series' view and its ``_Labels``; a value and its label string)."""

    __slots__ = ("emit",)  # set by ``_note``: an __init__ of its own costs a Python call a run
    emit: Emitter


Emitter = Callable[[list[str], str, _Run], None]
"""Writes a run's samples to a family's text (``_timing_lines`` and the others)."""


def _note(runs: list[_Run], emit: Emitter, item: object, labels: object) -> None:
    """``item`` (with its ``labels``) to the family of ``runs``, to be written by ``emit``."""
    if runs and runs[-1].emit is emit:
        runs[-1] += (item, labels)
    else:
        run = _Run((item, labels))
        run.emit = emit
        runs.append(run)


def _series(run: _Run) -> Iterator[tuple[SeriesView, _Labels]]:
    """A run's (series view, labels) pairs (a run a series' emitter writes)."""
    items = iter(run)
    return cast("Iterator[tuple[SeriesView, _Labels]]", zip(items, items))


def _timing_lines(out: list[str], name: str, run: _Run) -> None:
    # go_float's fast path (a float under 1e6 prints as its repr) is written out in the emitters
    # of the common kinds: a Python call per value is a good part of a cold page's time, and
    # it pays for most of the page's second pass (``_TrainerPage``).
    num, put = go_float, out.append  # locals: looked up once per family, not per line
    for view, lab in _series(run):
        cumulative, window = view.cumulative, view.window
        total = cumulative["sum_s"]
        put(f"{name}_count{lab.base} {num(cumulative['count'])}\n{name}_sum{lab.base} "
            f"{repr(total) if total.__class__ is float and -_INF < total < 1e6 else num(total)}\n")
        if window:
            p50, p95, high = window["p50"] / 1000.0, window["p95"] / 1000.0, window["max"] / 1000.0
            put(f"{name}{lab.q50} {repr(p50) if p50.__class__ is float and -_INF < p50 < 1e6 else num(p50)}\n"
                f"{name}{lab.q95} {repr(p95) if p95.__class__ is float and -_INF < p95 < 1e6 else num(p95)}\n"
                f"{name}{lab.q1} {repr(high) if high.__class__ is float and -_INF < high < 1e6 else num(high)}\n")


def _count_lines(out: list[str], name: str, run: _Run) -> None:
    num, put = go_float, out.append
    for view, lab in _series(run):
        total = view.cumulative["total"]
        put(f"{name}{lab.base} {repr(total) if total.__class__ is float and -_INF < total < 1e6 else num(total)}\n")


def _gauge_lines(out: list[str], name: str, run: _Run) -> None:
    num, put = go_float, out.append
    for view, lab in _series(run):
        last = view.cumulative["last"]
        put(f"{name}{lab.base} {repr(last) if last.__class__ is float and -_INF < last < 1e6 else num(last)}\n")


def _category_lines(out: list[str], name: str, run: _Run) -> None:
    num, put = go_float, out.append
    for view, lab in _series(run):
        for key, count in view.cumulative["totals"].items():
            put(f"{name}{lab.key(key)} {num(count)}\n")


def _entropy_lines(out: list[str], name: str, run: _Run) -> None:
    num, put = go_float, out.append
    for view, lab in _series(run):
        put(f"{name}{lab.base} {num(view.window['entropy_bits'])}\n")  # type: ignore[index]


def _labelled_lines(out: list[str], name: str, run: _Run) -> None:
    """Samples whose label strings are made already (the steps', the allocator fields')."""
    num, put = go_float, out.append
    items = iter(run)
    for value, labels in cast("Iterator[tuple[float, str]]", zip(items, items)):
        put(f"{name}{labels} {num(value)}\n")


_EMITTERS: dict[int, Emitter] = {TIMING: _timing_lines, COUNT: _count_lines, GAUGE: _gauge_lines,
                                 SCALAR: _gauge_lines, CATEGORY: _category_lines}
"""The emitter of a series' (first) family, by kind (``_TrainerPage.add_series``)."""

BLOCK_PIECES = 2048
"""Pieces (a header, a series' lines) a block of the trainer page as kept and served takes at
least, whole families (``_TrainerPage.blocks``): about 200 to 600 kB."""


def _trainer_page(report: IngestReport, host: str) -> _TrainerPage:
    page = _TrainerPage(escape(host))
    page.add_series(report.window.series)
    page.add_steps(report.window.steps)
    page.add_allocator(report.window.allocator)
    return page


def render_trainer(report: IngestReport, host: str) -> str:
    """The trainer's families (timings, counters, gauges, GPU scalars, categories, steps, CUDA
    allocator) in the text format, identical to ``generate_latest`` of ``trainer_families``."""
    return _trainer_page(report, host).text()


def render_trainer_blocks(report: IngestReport, host: str) -> list[bytes]:
    """``render_trainer(report, host).encode()`` in blocks (``BLOCK_PIECES``), made
    with no more than a block of the page held twice (``_TrainerPage.blocks``): what the served
    page keeps."""
    return _trainer_page(report, host).blocks()
