"""NVML source in fresh processes: no NVML at all, and an old driver loaded via LD_LIBRARY_PATH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fake_nvml import FakeNvml
from tests.fake_nvml.helpers import library_or_skip, real_nvml_present, run_child

GIB = 1024**3


def _sidecar_logs(report: dict) -> list[dict]:
    return [line for line in report["log"] if line["logger"].startswith("sidecar")]


@pytest.mark.skipif(real_nvml_present(), reason="this host has a real libnvidia-ml.so.1")
def test_no_nvml_library_one_log_line_and_nothing_else(tmp_path: Path) -> None:
    report = run_child({"LD_LIBRARY_PATH": str(tmp_path)})
    assert report["snapshot"] is None
    assert report["status"]["state"] == "unavailable"
    assert "not found" in report["status"]["reason"]
    logs = _sidecar_logs(report)
    assert len(logs) == 1 and "NVML unavailable" in logs[0]["message"], logs
    ok, message = report["probe"]
    assert not ok and "not found" in message


def test_old_driver_falls_back_and_logs_each_missing_function_once(tmp_path: Path) -> None:
    library = library_or_skip("old")
    control = FakeNvml(tmp_path / "control.txt", library, {"devices": 2})
    control.gpu(0, memory_total=80 * GIB, memory_used=20 * GIB, memory_reserved=1 * GIB, temperature_gpu=71,
                clock_reasons=0x4, power_mw=250_000, power_limit_mw=500_000, processes={4242: 3 * GIB},
                violation_thermal=0.5, violation_reliability="unsupported")
    report = run_child({"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(control.path)},
                       "--polls", "5", "--trainer", json.dumps({"4242": ["target", "0"]}))
    assert report["status"]["state"] == "available"
    gpu = report["snapshot"]["gpus"][0]
    assert gpu["up"] is True
    assert gpu["memory_used_bytes"] == 21 * GIB  # v1 counts the reserved memory as used
    assert gpu["memory_free_bytes"] == 59 * GIB
    assert gpu["temperature_celsius"] == 71.0  # nvmlDeviceGetTemperature (no ...V)
    assert gpu["clock_event_mask"] == 0x4  # ...ThrottleReasons (no ...EventReasons)
    assert gpu["power_watts"] == pytest.approx(250.0)  # nvmlDeviceGetPowerUsage: field 186 unknown
    assert gpu["power_limit_watts"] == pytest.approx(500.0)
    assert gpu["energy_joules"] is not None and gpu["ecc_corrected_total"] == 0  # older fields still batched
    assert gpu["processes"] == [{"pid": 4242, "role": "target", "worker": "0", "memory_bytes": 3 * GIB}]
    assert gpu["profiling"] == "unsupported" and gpu["sm_activity_ratio"] is None
    assert gpu["pcie_rx_bytes_per_second"] is None  # no counter field and no GPM on this driver
    # the violation fields are refused: nvmlDeviceGetViolationStatus per policy fills in
    shares = dict(gpu["violation_ratio"])
    assert shares["thermal"] == pytest.approx(0.5, abs=0.05) and shares["power"] == 0.0
    assert "reliability" not in dict(gpu["violation_seconds_total"])
    assert report["status"]["errors"] == []
    missing = [line["message"] for line in _sidecar_logs(report) if "not in this driver's library" in line["message"]]
    for function in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV",
                     "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses_v3",
                     "nvmlGpmQueryDeviceSupport"):
        assert sum(function + " " in m for m in missing) == 1, (function, missing)


def test_full_driver_by_name_through_ld_library_path(tmp_path: Path) -> None:
    library = library_or_skip("full")
    control = FakeNvml(tmp_path / "control.txt", library, {"devices": 3})
    report = run_child({"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(control.path)})
    assert report["probe"][0] is True and "3 GPU(s)" in report["probe"][1]
    assert [g["index"] for g in report["snapshot"]["gpus"]] == [0, 1, 2]
    assert not [line for line in _sidecar_logs(report) if "not in this driver's library" in line["message"]]
