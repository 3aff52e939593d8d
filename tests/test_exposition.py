"""The served /metrics page is, byte for byte, what prometheus_client renders for the collector."""

from __future__ import annotations

import gzip
import math
import random
import threading
import urllib.request
from types import SimpleNamespace

import msgspec
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from sidecar.core.ingest import IngestLoop
from sidecar.core.pipeline import OnWindow, Pipeline
from sidecar.core.scrape_state import ScrapeState
from sidecar.exporters.prometheus import exposition
from sidecar.exporters.prometheus.collector import ExportState, SidecarCollector
from sidecar.exporters.prometheus.page import MetricsPage
from sidecar.exporters.prometheus.server import serve
from sidecar.model.gpu import GpuView, NvmlState, NvmlStatus
from sidecar.model.window import IngestReport
from tests.daemon_harness import NoSocket, free_port
from trainer_shim import wire

enc = msgspec.msgpack.Encoder()


def _report(windows: list[list[tuple[str, str, list]]]) -> IngestReport:
    """Ingest each window's batches ((role, worker, records)) and roll; the last report."""
    reports: list[IngestReport] = []
    loop = IngestLoop(NoSocket(), 1.0, Pipeline(listeners=[OnWindow(reports.append)]))  # type: ignore[arg-type]
    senders: dict[tuple[str, str], list[int]] = {}
    for batches in windows:
        for role, worker, records in batches:
            sender, seq, total = senders.setdefault((role, worker), [len(senders) + 1, 0, 0])
            senders[role, worker] = [sender, seq + 1, total + len(records)]
            loop.handle_frame(wire.encode_batch(enc, sender, seq, role, worker, None, total + len(records), {},
                                                records))
        loop._roll(0.0, 1.0)
    return reports[-1]


def _every_kind(rng: random.Random) -> list:
    return ([[1, "forward_ms", rng.uniform(0, 50)] for _ in range(20)]
            + [[1, "huge_ms", 3.0e9], [2, "tokens", 4096], [2, "x_total_total", 1], [2, "x", 2], [2, "big", 1.5e7],
               [3, "queue_fill", -0.25], [3, "nan_only", math.nan], [3, "small", 1e-9], [5, "loss", 2.5],
               [4, "bucket", 3], [4, "bucket", 'quo"te\\d'], [4, "empty_cat", ""],
               [6, 12, {"step_ms": 41.0, "grad_norm": 0.9}], [7, 0, [10, 2**33, 2**40]]])


def _page_and_reference(report: IngestReport, gpus: GpuView | None = None) -> tuple[bytes, bytes]:
    state = ExportState(host='h"o\\st', started_unix_s=1.5e9, report=report)
    if gpus is not None:
        state.scrape_state = ScrapeState(gpus=SimpleNamespace(view=lambda: gpus))
    collector = SidecarCollector(state)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return MetricsPage(collector).render(), generate_latest(registry)


def test_page_equals_generate_latest_for_every_kind_and_edge_case() -> None:
    rng = random.Random(5)
    first = [("target", "0", _every_kind(rng)), ('dr"af\\ter', "w\n1", _every_kind(rng))]
    second = [("target", "0", [[2, "tokens", 1], [1, "forward_ms", 1.0]])]  # others: no window data
    gpus = GpuView(None, NvmlStatus(NvmlState.AVAILABLE, polls_total=3))  # no snapshot: no clock-dependent age
    for report in (_report([first]), _report([first, second])):
        page, reference = _page_and_reference(report, gpus)
        assert page == reference and b"dflash_nvml_polls_total{" in page
        assert b"dflash_trainer_forward_seconds_count" in page and b"dflash_cuda_allocator_reserved_bytes" in page


def test_page_equals_generate_latest_with_many_series() -> None:
    rng = random.Random(9)
    batches = [(("target", "drafter")[w % 2], f"w{w}",
                [[k, f"m{i}" + ("_ms" if k == 1 else ""), rng.randint(0, 3) if k == 4 else rng.uniform(0, 2e6)]
                 for i, k in enumerate([1, 2, 3, 4, 5] * 8) for _ in range(3)]) for w in range(12)]
    page, reference = _page_and_reference(_report([batches]))
    assert page == reference


def test_report_text_is_rendered_once_per_window() -> None:
    report = _report([[("target", "0", _every_kind(random.Random(1)))]])
    collector = SidecarCollector(ExportState(host="h", started_unix_s=0.0, report=report))
    page = MetricsPage(collector)
    first = page.render()
    cached = page._cached[1]
    assert page.render() == first and page._cached[1] is cached


def test_a_failing_source_is_omitted_not_the_scrape() -> None:
    def broken() -> list:
        raise RuntimeError("boom")

    state = ExportState(host="h", started_unix_s=0.0, report=_report([[("t", "0", [[2, "tokens", 1]])]]))
    state.scrape_state = ScrapeState(gpus=SimpleNamespace(view=broken))
    page = MetricsPage(SidecarCollector(state)).render()
    assert b"dflash_trainer_tokens_total" in page and b"dflash_sidecar_start_time_seconds" in page


@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, 999999.5, 1e6, 123456789.0, 2.0**53, 1e22, -1e22, 1e-300,
                                   math.inf, -math.inf, math.nan, 7, 2**40])
def test_go_float_matches_prometheus_client(value: float) -> None:
    assert exposition.go_float(value) == floatToGoString(value)


def test_served_page_plain_and_gzip(tmp_path) -> None:  # noqa: ANN001
    report = _report([[("target", "0", _every_kind(random.Random(2)))]])
    state = ExportState(host="h", started_unix_s=0.0, report=report)
    port = free_port()
    server, _ = serve(state, f"127.0.0.1:{port}")
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            plain = resp.read()
            assert resp.headers["Content-Type"] == exposition.CONTENT_TYPE
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Encoding"] == "gzip"
            zipped = gzip.decompress(resp.read())

        def stable(page: bytes) -> list[bytes]:  # the server's own connection counters moved on
            return [line for line in page.splitlines() if b"dflash_sidecar_http_" not in line]

        assert stable(zipped) == stable(plain)
        assert b"dflash_trainer_forward_seconds_count" in plain
        query = "?name[]=dflash_trainer_tokens_total&name[]=dflash_sidecar_start_time_seconds"
        with urllib.request.urlopen(url + query, timeout=10) as resp:
            filtered = resp.read().decode()  # answered by prometheus_client's restricted registry
        families = {f.name: f for f in text_string_to_metric_families(filtered)}
        assert set(families) == {"dflash_trainer_tokens", "dflash_sidecar_start_time_seconds"}, filtered
        whole = {f.name: f for f in text_string_to_metric_families(plain.decode())}
        assert families["dflash_trainer_tokens"].samples == whole["dflash_trainer_tokens"].samples
        assert families["dflash_trainer_tokens"].samples  # not two empty pages
    finally:
        server.shutdown()
        server.server_close()


def test_a_new_window_is_prepared_only_while_something_scrapes() -> None:
    now = [1000.0]
    first = _report([[("target", "0", [[2, "tokens", 1]])]])
    state = ExportState(host="h", started_unix_s=0.0, report=first)
    page = MetricsPage(SidecarCollector(state), clock=lambda: now[0])
    page.prepare()
    assert page._cached[0] is None  # never scraped: nothing rendered
    page.render()
    second = _report([[("target", "0", [[2, "tokens", 2]])]])
    state.report = second
    now[0] += 30.0
    page.prepare()
    assert page._cached[0] is second
    state.report = first
    now[0] += 3600.0  # nobody scraped for an hour
    page.prepare()
    assert page._cached[0] is second


def test_page_in_many_blocks_equals_generate_latest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer part is kept and served in blocks (``exposition.BLOCK_PIECES``): cut small,
    the page is still byte for byte the reference, and the server sends the same bytes."""
    monkeypatch.setattr(exposition, "BLOCK_PIECES", 2)
    rng = random.Random(7)
    batches = [(("target", "drafter")[w % 2], f"w{w}", _every_kind(rng)) for w in range(6)]
    report = _report([batches])
    page, reference = _page_and_reference(report)
    assert page == reference
    assert len(exposition.render_trainer_blocks(report, "h")) > 10
    assert b"".join(exposition.render_trainer_blocks(report, "h")) == exposition.render_trainer(report, "h").encode()
    state = ExportState(host="h", started_unix_s=0.0, report=report)
    port = free_port()
    server, _ = serve(state, f"127.0.0.1:{port}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            served = resp.read()
            assert int(resp.headers["Content-Length"]) == len(served)
    finally:
        server.shutdown()
        server.server_close()
    def trainer(text: bytes) -> list[bytes]:
        return [line for line in text.splitlines() if line.startswith((b"dflash_trainer_", b"dflash_cuda_"))]

    assert trainer(served) and trainer(served) == trainer(MetricsPage(SidecarCollector(state)).render())


def test_a_scrape_of_the_window_just_replaced_gets_the_new_one_rendered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scrape that read the report just before the next window was published asks for its text
    (``_text_of``, as ``render_parts`` does) while ``prepare`` renders the new window: it waits for
    that render (the old window's text is dropped first: two pages are never held at once) and is
    served the new window's text; each window is rendered once. A review found the first form of
    the render lock rendering the old window again, dropping the new one's text, and the next
    scrape rendering the new window a second time."""
    first = _report([[("target", "0", [[2, "tokens", 1]])]])
    second = _report([[("target", "0", [[2, "tokens", 2]])]])
    state = ExportState(host="h", started_unix_s=0.0, report=first)
    page = MetricsPage(SidecarCollector(state), clock=lambda: 0.0)
    page.render()
    cached_first = page._cached[1]
    rendered: list[IngestReport] = []
    started, go = threading.Event(), threading.Event()
    real = page._report_text

    def report_text(report: IngestReport, host: str) -> object:
        rendered.append(report)
        if report is second:
            started.set()
            go.wait(10.0)
        return real(report, host)

    monkeypatch.setattr(page, "_report_text", report_text)
    state.report = second
    preparing = threading.Thread(target=page.prepare)
    preparing.start()
    assert started.wait(10.0)
    got: list[object] = []
    straggler = threading.Thread(target=lambda: got.append(page._text_of(first)))
    straggler.start()
    straggler.join(2.0)
    go.set()
    preparing.join(10.0)
    straggler.join(10.0)
    page.render()  # the next scrape, of the new window
    assert got == [page._cached[1]] and page._cached[0] is second and got != [cached_first]
    assert rendered == [second]


def test_a_non_float_number_in_a_window_renders_as_the_reference() -> None:
    """The renderer's fast path prints a plain float as its ``repr``; a number of another class (a
    numpy scalar: none reaches a window today, every value goes through ``float()`` in the sketch)
    goes through ``go_float``, as the reference prints it, in every field, the quantiles included."""
    import dataclasses

    import numpy as np

    report = _report([[("target", "0", [[1, "forward_ms", 12.5]])]])
    views = tuple(dataclasses.replace(v, window={k: np.float64(x) for k, x in v.window.items()},
                                      cumulative={k: np.float64(x) for k, x in v.cumulative.items()})
                  if v.window is not None and "p50" in v.window else v for v in report.window.series)
    report = dataclasses.replace(report, window=dataclasses.replace(report.window, series=views))
    page, reference = _page_and_reference(report)
    assert b"np.float64" not in page and page == reference
