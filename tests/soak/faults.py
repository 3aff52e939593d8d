"""Faults the soak injects into the daemon's other stages while ingest is under load.

- W&B: the exporter runs in offline mode (``WANDB_MODE=offline``) with a 4-row queue; in the
  stall life its ``wandb-core`` service process is SIGSTOPped and stays stopped until the daemon
  is gone, so the stall spans the life's accounting check and its SIGTERM (or SIGKILL).
- NVML: every life polls the fake NVML driver (8 GPUs, ``tests/fake_nvml``) every 0.5 s; in the
  stall life ``nvmlDeviceGetUtilizationRates`` sleeps for ``NVML_HANG_MS`` on every call, from the
  start of the stall until the life's accounting check is done (so the SIGTERM comes right after
  the hang is lifted, while the poller may still be inside a sleeping call).

Every process stopped here is one this test started (a child of a daemon it started), and is
killed by pid at the end.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.daemon_harness import ROOT, DaemonProc

WANDB_QUEUE = 4
"""Rows the daemon's W&B exporter may queue: small, so that a stall shows counted drops soon."""
NVML_HANG_MS = 5000
"""How long each hanging NVML call sleeps."""
GIB = 2**30


def wandb_available() -> bool:
    return (ROOT / "sidecar" / "exporters" / "wandb" / "exporter.py").exists()


def nvml_available() -> bool:
    return (ROOT / "sidecar" / "sources" / "nvml.py").exists() and (ROOT / "tests" / "fake_nvml").is_dir()


def _wandb_children(pid: int) -> list[int]:
    from sidecar.exporters.wandb.exporter import wandb_core_children

    return wandb_core_children(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Faults:
    def __init__(self, tmp: Path, wandb: bool, nvml: bool) -> None:
        self.tmp = tmp
        self.wandb = wandb and wandb_available()
        self.nvml_unavailable = None if nvml_available() else "not in this build"
        self.fake = None
        if nvml and self.nvml_unavailable is None:
            from tests.fake_nvml.build import FakeNvmlUnavailable, build_fake_nvml
            from tests.fake_nvml.control import FakeNvml

            try:
                library = build_fake_nvml("full")
            except FakeNvmlUnavailable as exc:
                self.nvml_unavailable = f"fake NVML driver cannot be built: {exc}"
            else:
                self.fake = FakeNvml(tmp / "nvml-control.txt", library, {"devices": 8})
                self.fake.gpu("*", utilization_gpu=90, memory_total=80 * GIB, memory_used=60 * GIB,
                              power_mw=500_000, clock_reasons=0)
        self.stopped: set[int] = set()
        self.children: set[int] = set()

    def daemon_kwargs(self, life_dir: Path) -> dict[str, Any]:
        """Arguments for ``DaemonProc`` beyond endpoint, port and interval."""
        args: list[str] = []
        extra: dict[str, str] = {}
        if self.wandb:
            args += ["--wandb-run", "soak-trainer-run", "--wandb-queue", str(WANDB_QUEUE)]
            extra.update(WANDB_MODE="offline", WANDB_DIR=str(life_dir), WANDB_SILENT="true")
        if self.fake is not None:
            args += ["--nvml-interval", "0.5"]
            extra.update(LD_LIBRARY_PATH=str(self.fake.library.parent), FAKE_NVML_CONTROL=str(self.fake.path))
        return {"args": args, "extra_env": extra, "gpu": self.fake is not None}

    def stall(self, daemon: DaemonProc, load_s: float, min_stall_s: float) -> dict[str, Any]:
        """Run ``load_s`` seconds of load (at least ``min_stall_s`` of them stalled)."""
        start = time.monotonic()
        out: dict[str, Any] = {"wandb": "off" if wandb_available() else "not in this build",
                               "nvml": self.nvml_unavailable or "off"}
        pids: list[int] = []
        if self.wandb:
            logged = _wait_value(daemon, "dflash_sidecar_wandb_rows_logged_total", lambda v: v >= 1, 30)
            pids = _wandb_children(daemon.proc.pid)
            self.children.update(pids)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
                self.stopped.add(pid)
            out["wandb"] = {"service_pids": pids, "rows_logged_before_stall": logged}
        if self.fake is not None:
            _wait_value(daemon, "dflash_gpu_utilization_ratio", lambda v: v > 0, 30)
            self.fake.sleep("nvmlDeviceGetUtilizationRates", NVML_HANG_MS)
            out["nvml"] = {"hang_ms_per_call": NVML_HANG_MS}
        stalled_at = time.monotonic()
        scrape_ms, accepted, nvml_stalled, gpu_series, gpu_up = [], [], [], [], []
        while time.monotonic() < max(start + load_s, stalled_at + min_stall_s):
            t0 = time.perf_counter()
            samples = daemon.samples()
            scrape_ms.append((time.perf_counter() - t0) * 1000)
            accepted.append(sum(v for _, v in samples.get("dflash_sidecar_records_accepted_total", [])))
            nvml_stalled.append(sum(v for _, v in samples.get("dflash_nvml_stalled", [])))
            gpu_series.append(len(samples.get("dflash_gpu_utilization_ratio", [])))
            gpu_up.append([v for _, v in samples.get("dflash_gpu_up", [])])
            time.sleep(0.25)
        common = {"stalled_s_before_check": round(time.monotonic() - stalled_at, 2),
                  "scrapes_during_stall": len(scrape_ms), "max_scrape_ms_during_stall": round(max(scrape_ms), 1),
                  "accepted_grew_during_stall": accepted[-1] > accepted[0]}
        for name in ("wandb", "nvml"):
            if isinstance(out[name], dict):
                out[name].update(common)
                if not common["accepted_grew_during_stall"]:
                    out[name]["failure"] = "ingest stopped during the stall"
                if common["max_scrape_ms_during_stall"] > 2000:
                    out[name]["failure"] = "a scrape took over 2 s during the stall"
        if isinstance(out["nvml"], dict):
            out["nvml"]["stall_reported"] = max(nvml_stalled) >= 1
            # The GPU whose NVML call hangs shows up 0 and its value series are left out (stale,
            # never frozen at the last reading); the others keep their last values with their age,
            # and `up` itself is served for all 8 throughout.
            out["nvml"]["gpu_up_served_throughout"] = min(len(u) for u in gpu_up) == 8
            out["nvml"]["hung_gpu_shown_down"] = any(0.0 in u for u in gpu_up) and all(
                n == sum(1 for v in u if v == 1.0) for n, u in zip(gpu_series, gpu_up))
            if not (out["nvml"]["stall_reported"] and out["nvml"]["gpu_up_served_throughout"]
                    and out["nvml"]["hung_gpu_shown_down"]):
                out["nvml"]["failure"] = "the hang was not reported, or the hung GPUs were not shown down"
        return out

    def during_stall_checked(self, daemon: DaemonProc) -> dict[str, Any]:
        """Figures read after the life's accounting check, the W&B service still stopped; then
        the NVML hang is lifted."""
        if self.fake is not None:
            self.fake.unset("sleep_ms.nvmlDeviceGetUtilizationRates")
        if not self.wandb:
            return {}
        s = daemon.samples()
        dropped = {lab["reason"]: int(v) for lab, v in s.get("dflash_sidecar_wandb_dropped_total", [])}
        state = [lab["state"] for lab, v in s.get("dflash_sidecar_wandb_state", []) if v == 1.0]
        depth = daemon.value("dflash_sidecar_wandb_queue_depth")
        # The service's socket buffer absorbs rows for a while before wandb.log blocks, so
        # queue_full drops appear only in longer stalls (the long form); they are reported here.
        return {"wandb_after_check": {"rows_dropped": dropped, "queue_depth": depth, "state": state}}

    def note_children(self, daemon: DaemonProc) -> None:
        """Remember the daemon's wandb-core children (to check or reap them once it is gone)."""
        if self.wandb:
            self.children.update(_wandb_children(daemon.proc.pid))

    def after_kill(self) -> None:
        """A SIGKILLed daemon cannot stop its wandb-core: do it (only those we saw it start)."""
        self._reap()

    def after_term(self) -> dict[str, Any]:
        """After SIGTERM the daemon must have stopped its own wandb-core, stalled or not."""
        if not self.wandb:
            return {}
        deadline = time.monotonic() + 2.0
        while any(_alive(pid) for pid in self.children) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = sorted(pid for pid in self.children if _alive(pid))
        self._reap()
        out: dict[str, Any] = {"left_running": left}
        if left:
            out["failure"] = f"wandb-core {left} still running 2 s after the daemon exited"
        return {"wandb_after_sigterm": out}

    def _reap(self) -> None:
        for pid in list(self.children):
            if _alive(pid):
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            self.children.discard(pid)
            self.stopped.discard(pid)

    def cleanup(self) -> None:
        self._reap()


def _wait_value(daemon: DaemonProc, name: str, ok, timeout_s: float) -> float | None:
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = daemon.value(name)
        if value is not None and ok(value):
            return value
        time.sleep(0.2)
    return value
