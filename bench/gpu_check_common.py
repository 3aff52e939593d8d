"""Shared plumbing of the GPU check's parts: a real daemon process (through the tests' one
launcher, ``tests.launcher``, which needs no pytest), its CPU from /proc, JSON results.

Nothing here touches CUDA or NVML; the parts (``gpu_check_shim.py``, ``gpu_check_parity.py``,
``gpu_check_nvml.py``) import it, and ``gpu_check.py`` runs them one after the other.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: the ``sidecar`` under test stays the one imported

from tests.launcher import DaemonProc, cpu_seconds, http_get  # noqa: E402 - the one launcher, pytest-free

__all__ = ["DaemonProc", "cpu_seconds", "http_get"]  # the launcher's, re-exported for the parts


def export_sys_path() -> str:
    """Append this interpreter's ``sys.path`` to ``PYTHONPATH`` (what was there stays first), so
    that every child the check starts (parts, receivers, daemons, fresh probes) imports what this
    process imports, wherever its packages come from: a folder of unpacked wheels, a user site, a
    ``.pth`` file. Returns the new value."""
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*current, *paths]))
    return os.environ["PYTHONPATH"]


export_sys_path()  # every part imports this module first: its children see what it sees


def write_json(path: Path | None, results: dict[str, Any]) -> None:
    """Write one part's results (``None``: nowhere). Non-finite floats become null."""
    if path is not None:
        path.write_text(json.dumps(_finite(results), indent=1) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def start_daemon(workdir: Path, gpu_metrics: bool, nvml_interval_s: float = 1.0, extra: tuple[str, ...] = (),
                 start_timeout_s: float = 30.0) -> DaemonProc:
    """A real ``dflash-sidecar run`` through the one launcher (``tests.launcher.DaemonProc``) on
    a fresh ipc endpoint in ``workdir``, logging warnings only, with the daemon's default window.

    ``gpu_metrics``: NVML polling every ``nvml_interval_s`` (GPM wherever the GPU supports it,
    the daemon's default) or ``--no-gpu-metrics``; ``extra``: more ``run`` options. The
    environment is this process's, so a fake NVML driver set up through ``LD_LIBRARY_PATH`` and
    ``FAKE_NVML_CONTROL`` reaches it. Raises ``AssertionError`` (with the daemon's log) when it
    does not serve /metrics within ``start_timeout_s``."""
    nvml = ("--nvml-interval", str(nvml_interval_s)) if gpu_metrics else ()
    daemon = DaemonProc(workdir, "--log-level", "warning", *nvml, *extra, interval=None, gpu=gpu_metrics, wait=False)
    daemon.wait_ready(start_timeout_s)
    return daemon


def gpus_up(daemon: DaemonProc) -> int:
    """How many GPUs the daemon's NVML source reports up (``dflash_gpu_up`` = 1); -1 if unreadable."""
    try:
        text = daemon.text()
    except OSError:
        return -1
    return sum(1 for line in text.splitlines() if line.startswith("dflash_gpu_up{") and line.endswith(" 1.0"))


def cpu_share(pid: int, seconds: float) -> float:
    """Share of one core ``pid`` used over ``seconds`` of wall time (0.01 = 1 %)."""
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
