"""The daemon with GPU telemetry end to end: the real pynvml in a real daemon process, loading
the fake NVML driver by name through LD_LIBRARY_PATH, scripted while the daemon runs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc, publish, wait_for
from tests.fake_nvml.control import FakeNvml
from tests.fake_nvml.helpers import library_or_skip

GIB = 2**30


@pytest.fixture
def fake(tmp_path: Path) -> FakeNvml:
    library = library_or_skip("full")
    control = FakeNvml(tmp_path / "nvml-control.txt", library, {"devices": 2})
    control.gpu("*", utilization_gpu=90, memory_total=80 * GIB, memory_used=60 * GIB, power_mw=500_000,
                clock_reasons=0)
    return control


def _gpu_env(fake: FakeNvml) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": str(fake.library.parent), "FAKE_NVML_CONTROL": str(fake.path)}


def test_gpu_series_keep_answering_while_an_nvml_call_hangs(tmp_path: Path, fake: FakeNvml) -> None:
    d = DaemonProc(tmp_path, "--nvml-interval", "0.2", "--gpu-group", "target=0", "--gpu-group", "drafter=1",
                   gpu=True, extra_env=_gpu_env(fake))
    try:
        wait_for(lambda: d.value("dflash_gpu_utilization_ratio", gpu="1") == 0.9, what="GPU readings")
        assert d.value("dflash_group_power_watts", group="target") == 500.0
        assert d.value("dflash_gpu_memory_used_bytes", gpu="0") == 60 * GIB
        fake.sleep("nvmlDeviceGetUtilizationRates", 4000)
        fake.gpu(1, utilization_gpu=10)
        wait_for(lambda: d.value("dflash_nvml_stalled") == 1.0, what="the stall to be reported")
        for _ in range(5):  # scrapes are served promptly with the last good values and their age
            start = time.monotonic()
            samples = d.samples()
            assert time.monotonic() - start < 1.0
            assert [v for lab, v in samples["dflash_gpu_utilization_ratio"] if lab["gpu"] == "1"] == [0.9]
            time.sleep(0.2)
        assert d.value("dflash_nvml_data_age_seconds") > 0.5
        res = publish(d.endpoint, "drafter", "0", 200)  # ingest is unaffected by the hang
        wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", worker="0") == res["records_total"],
                 what="ingest during the hang")
        fake.unset("sleep_ms.nvmlDeviceGetUtilizationRates")
        wait_for(lambda: d.value("dflash_gpu_utilization_ratio", gpu="1") == 0.1, timeout_s=20, what="recovery")
        wait_for(lambda: d.value("dflash_nvml_stalled") == 0.0, what="the stall to clear")
    finally:
        d.stop()
