"""bench/gpu_check_nvml.py without a GPU: the no-NVML message, and the comparison against a stub
nvidia-smi on the fake driver (so the script is known to work before it meets real hardware)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.sources.nvml_gpm import METRICS
from tests.fake_nvml import FakeNvml
from tests.fake_nvml.helpers import REPO_ROOT, library_or_skip, real_nvml_present
from tests.fake_nvml.nvidia_smi_stub import STUB

SCRIPT = REPO_ROOT / "bench" / "gpu_check_nvml.py"
GIB = 1024**3



def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if k not in ("FAKE_NVML_CONTROL", "LD_LIBRARY_PATH")}
    child_env.update(env)
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO_ROOT, env=child_env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.skipif(real_nvml_present(), reason="this host has a real libnvidia-ml.so.1")
def test_without_a_gpu_it_says_so(tmp_path: Path) -> None:
    result = _run({"LD_LIBRARY_PATH": str(tmp_path)})
    assert result.returncode == 2
    assert "NVML unavailable" in result.stdout and "No usable NVIDIA GPU" in result.stderr


def test_compares_with_nvidia_smi_and_reports_the_cost(tmp_path: Path) -> None:
    library = library_or_skip("full")
    control = FakeNvml(tmp_path / "control.txt", library, {"devices": 2})
    control.gpu("*", clock_reasons=0x4, memory_total=80 * GIB, memory_used=10 * GIB, memory_reserved=GIB // 2)
    control.gpu(1, temperature_memory="unsupported")
    stub = tmp_path / "nvidia-smi"
    # This nvidia-smi knows no enforced.power.limit query field: shown, not compared, not counted.
    trimmed = STUB.replace('"enforced.power.limit"\n', "")
    assert trimmed != STUB
    stub.write_text(f"#!{sys.executable}\n{trimmed}")
    stub.chmod(0o755)
    result = _run({"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(control.path)},
                  "--seconds", "0.6", "--daemon-seconds", "0", "--reps", "3", "--nvidia-smi", str(stub))
    out = result.stdout
    assert result.returncode == 1, out + result.stderr  # GPU 1's power and PCIe tx differ
    assert "2 GPU(s)" in out and "GPU 0  NVIDIA H100" in out
    gpu0, gpu1 = out.split("GPU 1  ")[0], out.split("GPU 1  ")[1]
    for label in ("utilization.gpu", "memory.total", "memory.used", "power.draw", "clocks.sm", "clock event"):
        line = next(line for line in gpu0.splitlines() if label in line)
        assert " yes " in line, line
    assert "0x4" in next(line for line in gpu0.splitlines() if "clock event" in line)
    assert " NO " in next(line for line in gpu1.splitlines() if "power.draw" in line)
    assert " n/a " in next(line for line in gpu1.splitlines() if "temperature.memory" in line)
    assert " yes " in next(line for line in gpu0.splitlines() if "pcie tx" in line)  # dmon's column
    assert " NO " in next(line for line in gpu1.splitlines() if "pcie tx" in line)
    assert "NVML cost per poll, 2 GPU(s)" in out and "NVML calls per poll" in out
    assert "2 value(s) differ" in out
    assert " - " in next(line for line in gpu0.splitlines() if "enforced.power.limit" in line)
    # The call table: one row per call kind, the unsupported field named for GPU 1 only.
    memory_temp = next(line for line in out.splitlines() if "field memory_temp" in line)
    assert memory_temp.split("|")[0].split()[-1] == "ok" and "unsupported (not_supported)" in memory_temp.split("|")[1]
    assert "nvmlDeviceGetPcieThroughput" in out and "missing" in next(
        line for line in out.splitlines() if "nvmlDeviceGetPcieThroughput" in line)
    for scenario in ("gpm on ", "gpm off ", "gpm on + process query"):
        assert any(line.strip().startswith(scenario.strip()) and "NVML cost per poll" in line
                   for line in out.splitlines()), scenario
    assert "GPM unsupported/unsupported" in out and "GPM active/active" in out


def test_calls_a_sandboxed_driver_refuses_are_tabled_not_fatal(tmp_path: Path) -> None:
    """A driver that refuses some calls (as under a sandboxed kernel): each refusal is a row of
    the call table with its reason, and the rest of the part still runs and writes its JSON."""
    library = library_or_skip("full")
    control = FakeNvml(tmp_path / "control.txt", library, {"devices": 1})
    control.gpu("*", gpm_supported=1)
    control.fail("nvmlGpmSampleGet", 23)  # NVML_ERROR_INSUFFICIENT_RESOURCES
    control.fail("nvmlDeviceGetComputeRunningProcesses_v3", 3)  # NOT_SUPPORTED
    control.fail("nvmlDeviceGetTemperatureV", 4)  # NO_PERMISSION
    out = tmp_path / "nvml.json"
    result = _run({"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(control.path)},
                  "--dry-run", "--seconds", "0.4", "--daemon-seconds", "0", "--reps", "3",
                  "--nvidia-smi", str(tmp_path / "absent-nvidia-smi"), "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    calls = {row["call"]: row["status"] for row in report["calls"]["per_gpu"]["0"]}
    assert calls["nvmlGpmSampleGet"] == "error (insufficient_resources)"
    assert calls["nvmlDeviceGetComputeRunningProcesses_v3"] == "unsupported (not_supported)"
    assert calls["nvmlDeviceGetComputeRunningProcesses_v2"] == "ok"
    assert calls["nvmlDeviceGetTemperatureV"] == "error (no_permission)"
    assert calls["nvmlDeviceGetTemperature"] == "ok"
    assert f"nvmlGpmMetricsGet ({len(METRICS)} metrics)" not in calls  # no sample, no metrics to time
    assert set(report["polls"]) == {"gpm on", "gpm off", "gpm on + process query"}
    assert report["mismatches"] is None  # no nvidia-smi: nothing compared, nothing counted
