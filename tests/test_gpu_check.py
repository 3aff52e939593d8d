"""bench/gpu_check.py's dry run on a machine without a GPU: every part runs (CPU tensors, a real
receiver and real daemons, NVML from the fake driver, a stub nvidia-smi), the JSON brought back
holds each part's results, and a part that overruns its time limit is killed, not waited for."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

from sidecar.sources.nvml_gpm import METRICS
from tests.fake_nvml.helpers import REPO_ROOT, library_or_skip
from tests.fake_nvml.nvidia_smi_stub import STUB

SCRIPT = REPO_ROOT / "bench" / "gpu_check.py"


def _run(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FAKE_NVML_CONTROL", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s, check=False)


def test_dry_run_runs_every_part_and_writes_the_results(tmp_path: Path) -> None:
    library_or_skip("full")
    stub = tmp_path / "nvidia-smi"
    stub.write_text(f"#!{sys.executable}\n{STUB}")
    stub.chmod(0o755)
    out = tmp_path / "gpu_check.json"
    result = _run("--dry-run", "--fake-nvml", "1", "--nvidia-smi", str(stub), "--out", str(out))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads(out.read_text())
    parts = report["parts"]
    assert {name: (p["exit"], p["timed_out"]) for name, p in parts.items()} == {
        "shim": (0, False), "parity": (0, False), "nvml": (0, False)}

    shim = parts["shim"]["results"]
    assert shim["dry_run"] and shim["passed"] and shim["eager"] == {"steps": 3, "sync_error": None}
    assert shim["compiled"]["steps"] == 3 and shim["compiled"]["sync_error"] is None
    assert shim["compiled"]["graph_ops"] > 0  # the forward really ran compiled
    # Every scalar published came back with its value: eager 3 steps, compiled 2 warm-up + 3.
    assert shim["values"]["scalars_received"] == {"loss": 3, "grad_norm": 3, "compiled_loss": 5,
                                                  "compiled_grad_norm": 5}
    assert any("sync-debug mode" in s for s in shim["skipped"])

    assert set(shim["first_call"]) == {"configure, then CUDA init", "CUDA init, then configure",
                                       "configure, then import torch"}
    assert all(row["first_us"] > 0 for row in shim["first_call"].values())

    parity = parts["parity"]["results"]
    assert set(parity["setups"]) == {"baseline", "daemon(nvml 1s), no shim", "shim+daemon(no gpu metrics)",
                                     "shim+daemon(nvml 1s)", "scalar() x2 only", "scalar() x2 only, cf69852 resolver"}
    assert parity["setups"]["shim+daemon(nvml 1s)"]["daemon_gpus_up"] == [1]  # the fake GPU, polled
    assert parity["setups"]["daemon(nvml 1s), no shim"]["daemon_gpus_up"] == [1]
    assert parity["setups"]["shim+daemon(no gpu metrics)"]["daemon_gpus_up"] == [0]
    assert all(row["median_steps_per_s"] > 0 for row in parity["setups"].values())

    nvml = parts["nvml"]["results"]
    assert set(nvml["polls"]) == {"gpm on", "gpm off", "gpm on + process query"}
    assert nvml["polls"]["gpm on"]["profiling"] == ["active"]
    assert nvml["polls"]["gpm off"]["profiling"] == ["unsupported"]
    calls = {row["call"]: row["status"] for row in nvml["calls"]["per_gpu"]["0"]}
    assert calls["nvmlDeviceGetUtilizationRates"] == "ok"
    assert calls[f"nvmlGpmMetricsGet ({len(METRICS)} metrics)"] == "ok"
    assert calls["nvmlDeviceGetPcieThroughput (not polled: samples 20 ms)"] == "missing"  # not in the fake
    assert nvml["daemon_cpu"]["nvml_1s_gpus_up"] == 1 and nvml["daemon_cpu"]["no_gpu_metrics_gpus_up"] == 0
    # The stub's GPU 0 readings differ from the fake's in a few fields: counted, not a dry-run failure.
    assert nvml["mismatches"] > 0 and any("utilization.gpu" in line for line in nvml["readings"])
    assert "===== summary =====" in result.stdout and "readings vs nvidia-smi" in result.stdout


def test_dry_run_with_the_packages_on_pythonpath_only(tmp_path: Path) -> None:
    """As on the GPU machine, where the carried wheels are unpacked into a folder on
    ``PYTHONPATH``: an interpreter whose own ``sys.path`` has no site-packages (a venv without
    them) reaches every package through ``PYTHONPATH`` alone, and so must every child the check
    starts (the parts, the shim part's receiver, the daemons, the first-call probes). Failed
    before the fix: the receiver was started with ``PYTHONPATH`` set to the checkout alone."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("FAKE_NVML_CONTROL", "LD_LIBRARY_PATH", "PYTHONPATH")}
    bare = subprocess.run([python, "-c", "import msgspec"], env=env, cwd=tmp_path, capture_output=True, timeout=60)
    assert bare.returncode != 0  # the premise: without PYTHONPATH this interpreter lacks the packages
    packages = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *packages])
    out = tmp_path / "gpu_check.json"
    result = subprocess.run([python, str(SCRIPT), "--dry-run", "--parts", "shim,parity", "--out", str(out)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    parts = json.loads(out.read_text())["parts"]
    assert {name: p["exit"] for name, p in parts.items()} == {"shim": 0, "parity": 0}
    assert parts["shim"]["results"]["values"]["scalars_received"]["loss"] == 3  # the receiver ran


def test_a_part_over_its_time_limit_is_killed(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    result = _run("--dry-run", "--parts", "shim", "--budget", "0.2", "--out", str(out), timeout_s=60)
    assert result.returncode == 1, result.stdout + result.stderr
    shim = json.loads(out.read_text())["parts"]["shim"]
    assert shim["timed_out"] and shim["results"] == {}
    assert "===== shim: TIMED OUT" in result.stdout


def test_unknown_part_is_rejected() -> None:
    result = _run("--parts", "shim,gpu", timeout_s=60)
    assert result.returncode == 2 and "unknown part(s) ['gpu']" in result.stderr


def test_a_missing_module_stops_the_check_at_once(tmp_path: Path) -> None:
    """A wheel not installed on the GPU machine: said in seconds, before any part starts."""
    out = tmp_path / "gpu_check.json"
    code = ("import sys; sys.path.insert(0, 'bench'); import gpu_check; "
            "gpu_check.REQUIRED_MODULES += ('no_such_module_dfs',); "
            f"raise SystemExit(gpu_check.main(['--dry-run', '--out', {str(out)!r}]))")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "missing Python modules: no_such_module_dfs" in result.stderr
    report = json.loads(out.read_text())
    assert report["parts"] == {} and report["environment"]["msgspec"]
