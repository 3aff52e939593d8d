"""The kind -> family table (``model.names.TRAINER_FAMILIES``) is what the page renders, and the
family lists generated from it (docs/METRICS.md, deploy/metric_names.txt) are current."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec

from sidecar.cli import family_docs
from sidecar.core.ingest import IngestLoop
from sidecar.core.pipeline import OnWindow, Pipeline
from sidecar.exporters.prometheus.exposition import render_trainer
from sidecar.model.names import TRAINER_FAMILIES
from sidecar.model.window import IngestReport
from tests.daemon_harness import NoSocket
from trainer_shim import wire
from trainer_shim.wire import RecordKind

ROOT = Path(__file__).resolve().parent.parent


def test_the_generated_family_lists_are_current() -> None:
    for path, text in family_docs.generated(ROOT).items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run `python -m sidecar.cli.family_docs`"


def test_refresh_rewrites_a_stale_list_and_only_its_generated_part(tmp_path: Path) -> None:
    for rel in ("docs/METRICS.md", "deploy/metric_names.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    family_docs.refresh(tmp_path)  # current, whatever the checkout's state
    names = tmp_path / "deploy/metric_names.txt"
    before = names.read_text()
    names.write_text(before.replace("dflash_trainer_step                                 gauge    daemon\n", ""))
    assert family_docs.refresh(tmp_path) == [names]
    assert names.read_text() == before
    assert family_docs.refresh(tmp_path) == []


def test_every_record_kind_has_families_and_a_row() -> None:
    assert set(TRAINER_FAMILIES) == {int(k) for k in RecordKind} == set(family_docs.KIND_DOCS)


def _report_of_every_kind() -> IngestReport:
    reports: list[IngestReport] = []
    loop = IngestLoop(NoSocket(), 1.0, Pipeline(listeners=[OnWindow(reports.append)]))  # type: ignore[arg-type]
    records = [[RecordKind.TIMING, "t_ms", 1.0], [RecordKind.COUNT, "c", 2], [RecordKind.GAUGE, "g", 3.0],
               [RecordKind.SCALAR, "s", 4.0], [RecordKind.CATEGORY, "k", "a"], [RecordKind.PROFILE, 9, {}],
               [RecordKind.ALLOCATOR, 0, [1, 2, 3]]]
    loop.handle_frame(wire.encode_batch(msgspec.msgpack.Encoder(), 1, 0, "r", "0", 9, len(records), {}, records))
    loop._roll(0.0, 1.0)
    return reports[-1]


def test_the_page_renders_the_tables_families() -> None:
    page = render_trainer(_report_of_every_kind(), "h")
    tokens = {RecordKind.TIMING: "t", RecordKind.COUNT: "c", RecordKind.GAUGE: "g", RecordKind.SCALAR: "s",
              RecordKind.CATEGORY: "k", RecordKind.PROFILE: "", RecordKind.ALLOCATOR: ""}
    expected = sorted(f"# HELP {f.exposed(tokens[kind])} {f.help.format(tokens[kind])}\n"
                      f"# TYPE {f.exposed(tokens[kind])} {f.type}"
                      for kind, families in TRAINER_FAMILIES.items() for f in families)
    headers = page.splitlines()
    rendered = sorted(f"{line}\n{headers[i + 1]}" for i, line in enumerate(headers) if line.startswith("# HELP"))
    assert rendered == expected
