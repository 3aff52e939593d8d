"""deploy/metric_names.txt and the W&B key scheme (``sidecar.exporters.wandb.keys``) agree with
what the daemon really exports: a scrape of `dflash-sidecar demo`, and the rows of its offline
W&B run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sidecar.exporters.wandb.capture_row import FIGURES as CAPTURE_FIGURES
from sidecar.exporters.wandb.capture_row import GPU_FIGURES
from sidecar.model.meanings import REPORTED
from tests.deploy_support import env, exposition_families, free_port, http_get, load_metric_names, spawn_sidecar, stop
from tests.fake_nvml.control import FakeNvml
from tests.fake_nvml.helpers import library_or_skip

PRESENT_NOW = {"daemon", "trainer", "nvml", "insight", "wandb", "ledger"}
"""Sources whose families a demo scrape must show (NVML through the fake driver, W&B offline)."""

OCCASIONAL = {"dflash_nvml_errors_total", "dflash_ledger_state_errors_total", "dflash_ledger_mfu_ratio",
              *(f"dflash_pipeline_reported_{fig.family}" for fig in REPORTED)}
"""Families that only appear once something goes wrong (checked by the NVML and run ledger tests
instead), or with a setting the demo leaves unset (MFU needs flops_per_token), or with figures the
demo's trainers do not compute themselves (tests/test_reported_figures.py)."""


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The exposition of a running demo, with the fake NVML driver (GPM, ECC, XID, a throttle
    reason, the demo's own process on GPU 0) and W&B in offline mode (its own offline run, under
    the returned folder), once it shows every family listed as exported; the demo is stopped."""
    tmp = tmp_path_factory.mktemp("demo")
    library = library_or_skip("full")
    fake = FakeNvml(tmp / "nvml-control.txt", library, {"devices": 2})
    fake.gpu("*", gpm_supported=1, gpm_sm_util=50, clock_reasons=0x8, ecc_sbe_volatile=1, ecc_dbe_volatile=0)
    port = free_port()
    expected = {n for n, (_, source) in load_metric_names().items() if source in PRESENT_NOW} - OCCASIONAL
    # without --duration the demo runs until SIGTERM
    proc = spawn_sidecar(["demo", "--interval", "1", "--nvml-interval", "0.2",
                          "--wandb-run", "demo-run", "--endpoint", f"ipc://{tmp}/sidecar.sock",
                          "--prometheus-addr", f"127.0.0.1:{port}"], tmp / "demo.log",
                         env(LD_LIBRARY_PATH=str(library.parent), FAKE_NVML_CONTROL=str(fake.path),
                             WANDB_MODE="offline", WANDB_DIR=str(tmp), WANDB_SILENT="true"))
    fake.gpu(0, processes={proc.pid: 2**30})
    text = ""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                text = http_get(f"http://127.0.0.1:{port}/metrics")
            except OSError:  # not up yet
                text = ""
            if "dflash_gpu_up" in text and "gpu.0.xids" not in fake.path.read_text():
                fake.gpu(0, xids=[79])  # XIDs count once the source has registered for events
            if expected <= exposition_families(text).keys():
                break
            time.sleep(0.5)
    finally:
        stop([proc])
    assert text, f"the demo never answered; its log:\n{(tmp / 'demo.log').read_text()}"
    return text, tmp


@pytest.fixture(scope="module")
def demo_scrape(demo: tuple[str, Path]) -> str:
    return demo[0]


def test_demo_exports_every_family_listed_as_exported_today(demo_scrape: str) -> None:
    scraped = exposition_families(demo_scrape)
    for name, (kind, source) in load_metric_names().items():
        if source in PRESENT_NOW and name not in OCCASIONAL:
            assert name in scraped, f"{name} ({source}) is listed in deploy/metric_names.txt but not exported"
            assert scraped[name] == kind, f"{name}: listed as {kind}, exported as {scraped[name]}"


def test_every_exported_family_is_listed(demo_scrape: str) -> None:
    """A family the daemon adds (e.g. from the NVML, insight or W&B components) must be added to
    deploy/metric_names.txt with its type before dashboards and rules can use it."""
    listed = load_metric_names()
    for name, kind in exposition_families(demo_scrape).items():
        assert name in listed, f"{name} ({kind}) is exported but missing from deploy/metric_names.txt"
        assert listed[name][0] == kind, f"{name}: listed as {listed[name][0]}, exported as {kind}"


def test_every_sample_carries_host(demo_scrape: str) -> None:
    """Rules and the dashboard aggregate by host: every daemon sample must have the label."""
    for line in demo_scrape.splitlines():
        if line and not line.startswith("#"):
            assert 'host="' in line, line


NOT_IN_DEMO = {*(f"trainer/<role>/<worker>/cuda<device>/{v}" for v in ("allocated_bytes", "reserved_bytes",
                                                                        "max_reserved_bytes")),
               "ledger/<role>/mfu_ratio", "self/records_dropped/<reason>", "self/messages_dropped/<reason>",
               *(f"pipeline/reported/{fig.wandb_key}/<role>" for fig in REPORTED),
               "cluster/nodes", "cluster/held_back", "cluster/<node>/excess_s",
               "cluster/<node>/lost_gpu_hours_per_hour",
               *(f"capture/<role>/<worker>/{key}"
                 for key in ("step_s", *(k for k, _ in CAPTURE_FIGURES + GPU_FIGURES)))}
"""Key patterns the demo cannot show: the CUDA allocator sampler needs CUDA, MFU needs
flops_per_token, and the demo drops nothing (tests/test_wandb_keys.py builds rows with drops and
the allocator); the cluster row needs a Prometheus joining nodes (its keys are checked against the
scheme in tests/test_deploy_cluster_verdict.py), and the demo takes no profiler capture
(tests/test_trace_capture.py logs one)."""


def test_every_wandb_key_the_demo_logs_is_in_the_key_scheme(demo: tuple[str, Path]) -> None:
    """Each key of the demo's W&B rows is an instance of one pattern of the scheme docs/METRICS.md
    shows, and each pattern (but ``NOT_IN_DEMO``) is the best fit of a logged key: the documented
    scheme is the one the exporter writes."""
    from sidecar.exporters.wandb.join import STEP_KEY
    from sidecar.exporters.wandb.keys import KEY_SCHEME, pattern_of
    from tests.wandb_records import history_rows

    _, tmp = demo
    [path] = [p for p in tmp.rglob("run-*.wandb") if "latest-run" not in p.parts]
    keys = {k for row in history_rows(path) for k in row if not k.startswith("_")}
    assert STEP_KEY in keys
    host = next(iter(k for k in keys if k != STEP_KEY)).split("/")[1]
    assert all(k == STEP_KEY or k.startswith(f"sidecar/{host}/") for k in keys)
    fits = {k: pattern_of(k) for k in keys - {STEP_KEY}}
    assert [k for k, p in fits.items() if p is None] == []
    shown = {p.pattern for p in fits.values() if p is not None}
    assert sorted({p.pattern for p in KEY_SCHEME} - shown - NOT_IN_DEMO) == []
    assert NOT_IN_DEMO <= {p.pattern for p in KEY_SCHEME}
