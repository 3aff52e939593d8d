"""A capture on request on a GPU: its breakdown's shares against the daemon's verdict.

    python bench/gpu_check_trace.py [--json FILE] [--steps 5] [--settle 20] [--dry-run]

Two training loops, each a child process publishing through the shim under a real daemon (NVML on):

- **gpu-bound**: a bf16 MLP (4096 wide, batch 8192) on the first CUDA device, data already on the
  device; the GPU never waits.
- **input-bound**: a small MLP fed by a DataLoader (2 workers) whose ``__getitem__`` sleeps,
  so the GPU waits for every batch.

For each: the loop runs ``--settle`` seconds (the verdict settles), then ``dflash-sidecar trace
--steps N --role R`` asks it for a capture; the kept breakdown's shares (GPU busy, idle by cause:
host wait, kernel wait, other; the DataLoader's wait) are printed beside the verdict the daemon
gives at that moment (``/explain``). Expected: gpu-bound: GPU busy >= 80 % and the verdict
``compute-bound``; input-bound: GPU busy < 50 %, host wait the largest idle cause, the data
wait >= 50 % of the wall, and the verdict ``input-bound``. Exit status 0 when both hold.

``--dry-run`` (or no CUDA): the same loops on the CPU, with ``--no-gpu-metrics``; the breakdown
then says there is no GPU activity; only the capture itself is checked (this is how the script
is tried on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_common import http_get, start_daemon, write_json  # noqa: E402

LOOP = r"""
import os, sys, time, torch
from trainer_shim import telemetry
kind, device = sys.argv[1], sys.argv[2]
if kind == "gpu-bound":
    width, batch = (4096, 8192) if device == "cuda" else (256, 256)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).to(device)
    x = torch.randn(batch, width, device=device)
    loader = None
else:
    class Slow(torch.utils.data.Dataset):
        def __len__(self): return 10**6
        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.randn(64)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
    loader = iter(torch.utils.data.DataLoader(Slow(), batch_size=32, num_workers=2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
step = 0
while True:
    t0 = time.perf_counter()
    if loader is not None:
        t = time.perf_counter(); x = next(loader).to(device, non_blocking=True)
        telemetry.timing("data_wait_ms", (time.perf_counter() - t) * 1e3)
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = model(x).float().pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    telemetry.count("batches")
    telemetry.publish(step, {"step_ms": (time.perf_counter() - t0) * 1e3})
    step += 1
"""


def verdict(port: int) -> str | None:
    try:
        return json.loads(http_get(f"http://127.0.0.1:{port}/explain")).get("verdict")
    except (OSError, ValueError):
        return None


def shares(b: dict[str, Any]) -> dict[str, float]:
    wall = sum(s["wall_s"] for s in b["steps"]) or 1.0
    keys = ("gpu_busy_s", "idle_host_wait_s", "idle_kernel_wait_s", "idle_other_s", "data_wait_s", "host_busy_s",
            "communication_s", "memcpy_s")
    return {k.removesuffix("_s"): round(sum(s[k] for s in b["steps"]) / wall, 3) for k in keys}


def one(kind: str, device: str, work: Path, env: dict[str, str], daemon: Any,
        args: argparse.Namespace) -> dict[str, Any]:
    """Run one loop, ask it for a capture, return the breakdown's shares beside the verdict."""
    loop = subprocess.Popen([sys.executable, "-c", LOOP, kind, device], env={**env, "DFLASH_ROLE": kind})
    try:
        time.sleep(args.settle)
        before = verdict(daemon.port)
        deadline = time.monotonic() + 60  # a slow start (torch's import, CUDA's) has no tally yet
        while True:
            out = subprocess.run([sys.executable, "-m", "sidecar", "trace", "--endpoint", daemon.endpoint,
                                  "--state-dir", str(work / "state"), "--steps", str(args.steps), "--role", kind,
                                  "--wait", "120"], env=env, capture_output=True, text=True, timeout=300)
            if out.returncode == 0 or "no live trainer" not in out.stderr or time.monotonic() > deadline:
                break
            time.sleep(2)
        print(out.stdout + out.stderr)
        kept = sorted((work / "state" / "traces").glob("*.capture.json"))
        if out.returncode != 0 or not kept:
            return {"kind": kind, "ok": False, "error": out.stderr.strip()}
        b = json.loads(kept[-1].read_text())["breakdown"]
        return {"kind": kind, "verdict": before, "verdict_after": verdict(daemon.port), "has_gpu": b["has_gpu"],
                "steps": len(b["steps"]), "shares": shares(b), "ok": True}
    finally:
        loop.kill()
        loop.wait()


def judge(r: dict[str, Any], gpu: bool) -> bool:
    """Whether the capture's shares and the verdict agree with what the loop is (module docstring)."""
    if not r.get("ok"):
        return False
    if not gpu:
        return r["steps"] > 0 and not r["has_gpu"]
    s = r["shares"]
    said = str(r["verdict"] or "").split(" ")[0]  # the verdict's word, before its evidence
    if r["kind"] == "gpu-bound":
        return s["gpu_busy"] >= 0.8 and said == "compute-bound"
    idle = {k: s[k] for k in ("idle_host_wait", "idle_kernel_wait", "idle_other")}
    return (s["gpu_busy"] < 0.5 and max(idle, key=idle.__getitem__) == "idle_host_wait" and s["data_wait"] >= 0.5
            and said == "input-bound")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.is_available() and not args.dry_run
    device = "cuda" if gpu else "cpu"
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if gpu else "cpu (dry run)", "loops": []}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("gpu-bound", "input-bound"):  # a daemon each: one loop's verdict, not both roles'
            work = Path(tmp) / kind
            work.mkdir()
            daemon = start_daemon(work, gpu_metrics=gpu)
            try:
                r = one(kind, device, work, {**os.environ, "DFLASH_SIDECAR_ENDPOINT": daemon.endpoint}, daemon, args)
            finally:
                daemon.stop()
            r["pass"] = judge(r, gpu)
            results["loops"].append(r)
            print(json.dumps(r))
    write_json(args.json, results)
    return 0 if all(r["pass"] for r in results["loops"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
