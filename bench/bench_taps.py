"""What a tap adds to the trainer's own logger call (``trainer_shim.integrations.taps``), in one run.

    python bench/bench_shim.py --only taps        # or: python bench/bench_taps.py [--rounds 5]

Three figures per call shape, side by side:

* **the logger alone**: the library's call without the tap (W&B offline ``run.log`` of 20 keys,
  TensorBoard ``add_scalar`` and ``add_scalars`` of 20 keys with torch's writer, MLflow's file
  store ``log_metric`` and ``log_metrics`` of 20 keys);
* **the logger tapped**: the same call with the tap on, in rounds alternating with the first
  (plain, tapped, tapped, plain, ...), each round a median over its calls;
* **the tap alone**: the tap's own wrapper around a function that does nothing, forwarding the
  same arguments to the shim: what the tap adds, without the logger's noise (the difference of the
  first two is within that noise: loggers cost 10 us to milliseconds a call).

The tap publishes to the default channel with no daemon listening (records dropped as
``no_receiver`` on the flusher thread; the caller's cost is the same append). Last, the cost of the
``.pth`` file that every interpreter reads when ``DFLASH_SIDECAR_TAP`` is unset (``--pth-only``:
that alone).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer_shim import telemetry  # noqa: E402
from trainer_shim.integrations import tap_targets, taps  # noqa: E402
from trainer_shim.integrations.tap_values import TapSink  # noqa: E402

ROW = {f"stage{i}_ms" if i < 10 else f"value{i}": float(i) * 1.25 for i in range(20)}


def per_call_ns(fn: Callable[[int], Any], n: int) -> float:
    """Median ns of ``fn(i)`` over ``n`` calls, each timed alone (the clock pair subtracted)."""
    out, pc = [], time.perf_counter_ns
    empty = []
    for i in range(n):
        t0 = pc()
        t1 = pc()
        empty.append(t1 - t0)
        t0 = pc()
        fn(i)
        out.append(pc() - t0)
    return max(statistics.median(out) - statistics.median(empty), 0.0)


def shapes(workdir: str) -> dict[str, tuple[Callable[[int], Any], Callable[[], Any], int, str]]:
    """Per call shape: (the call, its clean-up, calls per round, tap-alone wrapper kind)."""
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow
    import wandb
    from torch.utils.tensorboard import SummaryWriter

    run = wandb.init(mode="offline", dir=workdir, project="dflash-bench",
                     settings=wandb.Settings(console="off", x_disable_stats=True))
    writer = SummaryWriter(os.path.join(workdir, "tb"))
    mlflow.set_tracking_uri("file:" + os.path.join(workdir, "mlruns"))
    mlflow.start_run()
    steps = itertools.count()  # W&B drops a row whose step goes back: one step counter for every round
    return {
        "wandb offline run.log(20 keys)": (lambda i: run.log(ROW, step=next(steps)), run.finish, 300, "wandb"),
        "tensorboard add_scalar": (lambda i: writer.add_scalar("step_ms", 1.5, i), writer.close, 3000, "add_scalar"),
        "tensorboard add_scalars(20 keys)": (lambda i: writer.add_scalars("t", ROW, i), writer.close, 300,
                                             "add_scalars"),
        "mlflow log_metric (file store)": (lambda i: mlflow.log_metric("step_ms", 1.5, step=i), mlflow.end_run,
                                           300, "log_metric"),
        "mlflow log_metrics(20 keys, file store)": (lambda i: mlflow.log_metrics(ROW, step=i), mlflow.end_run, 100,
                                                    "log_metrics"),
    }


def tap_alone(kind: str) -> Callable[[int], Any]:
    """The tap's wrapper of ``kind`` around a function that does nothing, forwarding to the
    default channel."""
    state = tap_targets.TapState(TapSink(telemetry))

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    if kind == "wandb":
        log = tap_targets._wandb_log(noop, state)
        owner = object.__new__(type("Run", (), {"_local_step": 0}))
        return lambda i: log(owner, ROW, step=i)
    forward = {"add_scalar": tap_targets._add_scalar, "add_scalars": tap_targets._add_scalars,
               "log_metric": tap_targets._log_metric, "log_metrics": tap_targets._log_metrics}[kind]
    wrapped = tap_targets._wrap(noop, state, forward)
    if kind == "add_scalar":
        return lambda i: wrapped(None, "step_ms", 1.5, i)
    if kind == "add_scalars":
        return lambda i: wrapped(None, "t", ROW, i)
    if kind == "log_metric":
        return lambda i: wrapped("step_ms", 1.5, step=i)
    return lambda i: wrapped(ROW, step=i)


def pth_file_us(n: int = 3000, repeats: int = 7) -> tuple[float, float]:
    """(µs per ``site.addpackage`` of the ``.pth`` file with ``DFLASH_SIDECAR_TAP`` unset, µs per
    ``site.addpackage`` of a ``.pth`` file holding one comment): what ``site`` does with each
    file at every interpreter start (open, read, and for the tap's line compile and exec it).
    Medians of ``repeats`` batches of ``n``."""
    import shutil
    import site

    saved = os.environ.pop("DFLASH_SIDECAR_TAP", None)
    try:
        with tempfile.TemporaryDirectory(prefix="dfs-pth-", dir="/tmp") as tmp:
            shutil.copy(ROOT / "dflash_sidecar_tap.pth", tmp)
            Path(tmp, "comment.pth").write_text("# one comment\n")
            out = []
            for name in ("dflash_sidecar_tap.pth", "comment.pth"):
                batches = []
                for _ in range(repeats):
                    t0 = time.perf_counter_ns()
                    for _ in range(n):
                        site.addpackage(tmp, name, set())
                    batches.append((time.perf_counter_ns() - t0) / n / 1e3)
                out.append(statistics.median(batches))
            return out[0], out[1]
    finally:
        if saved is not None:
            os.environ["DFLASH_SIDECAR_TAP"] = saved


def startup_ab(runs: int = 200) -> tuple[float, float]:
    """(median ms of ``python -c pass`` with the ``.pth`` file in a fresh virtual environment's
    site-packages, the same without it), ``DFLASH_SIDECAR_TAP`` unset, runs alternating."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="dfs-pth-", dir="/tmp") as tmp:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", f"{tmp}/venv"], check=True)
        py = f"{tmp}/venv/bin/python"
        purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        on, off = Path(purelib) / "dflash_sidecar_tap.pth", Path(purelib) / "dflash_sidecar_tap.pth.off"
        off.write_text((ROOT / "dflash_sidecar_tap.pth").read_text())
        env = {k: v for k, v in os.environ.items() if k != "DFLASH_SIDECAR_TAP"}
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(2 * runs):
            with_pth = (i % 4) in (0, 3)  # with, without, without, with, ...
            src, dst = (off, on) if with_pth else (on, off)
            if src.exists():
                src.rename(dst)
            t0 = time.perf_counter()
            subprocess.run([py, "-c", "pass"], env=env, check=True)
            times[with_pth].append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[True]), statistics.median(times[False])


def measure(rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per call shape and variant (``plain``, ``tapped``, ``tap alone``): the round medians, ns."""
    with tempfile.TemporaryDirectory(prefix="dfs-taps-", dir="/tmp") as workdir:
        telemetry.configure(endpoint=f"ipc://{workdir}/nobody.sock", role="bench", worker="0",
                            allocator_interval_s=0)
        calls = shapes(workdir)
        out: dict[str, dict[str, list[float]]] = {name: {"plain": [], "tapped": [], "tap alone": []}
                                                  for name in calls}
        for r in range(rounds):
            for name, (fn, _, n, kind) in calls.items():
                for variant in ("plain", "tapped") if r % 2 == 0 else ("tapped", "plain"):
                    if variant == "tapped":
                        taps.tap(name.split()[0])
                    out[name][variant].append(per_call_ns(fn, n))
                    taps.untap()
                    telemetry.flush(wait_s=5)
                out[name]["tap alone"].append(per_call_ns(tap_alone(kind), 5000))
                telemetry.flush(wait_s=5)
            print(f"round {r + 1}/{rounds} done, load {os.getloadavg()}", flush=True)
        for _, cleanup, _, _ in calls.values():
            cleanup()
        telemetry.close()
    return out


def fmt(ns: float) -> str:
    return f"{ns / 1e3:.2f} µs" if ns >= 1e3 else f"{ns:.0f} ns"


def table(results: dict[str, dict[str, list[float]]]) -> str:
    """Medians over rounds (the rounds' range in brackets) and the ratios."""
    lines = ["| call | the logger alone | the logger tapped | tapped ÷ alone | the tap alone | "
             "the tap ÷ the logger |", "| --- | --- | --- | --- | --- | --- |"]
    for name, by in results.items():
        med = {k: statistics.median(v) for k, v in by.items()}
        cells = [f"{fmt(med[k])} ({fmt(min(by[k]))}–{fmt(max(by[k]))})" for k in ("plain", "tapped", "tap alone")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {med['tapped'] / med['plain']:.3f} | {cells[2]} | "
                     f"{100 * med['tap alone'] / med['plain']:.2f} % |")
    return "\n".join(lines)


def pth_report() -> str:
    """The ``.pth`` file's cost with ``DFLASH_SIDECAR_TAP`` unset, as Markdown text."""
    start = os.getloadavg()
    tap_us, comment_us = pth_file_us()
    with_pth, without = startup_ab()
    return (f"The .pth file, DFLASH_SIDECAR_TAP unset (load {start[0]:.1f} to {os.getloadavg()[0]:.1f}): "
            f"site.addpackage {tap_us:.0f} µs, against {comment_us:.0f} µs for a .pth file of one comment "
            f"(once per interpreter start); `python -c pass` in a fresh venv, 200 runs each, alternating: "
            f"{with_pth:.1f} ms with the file, {without:.1f} ms without (medians)")


def run(rounds: int = 5) -> str:
    """The whole benchmark; returns its Markdown report."""
    start = os.getloadavg()
    results = measure(rounds)
    return (f"load average at start {start}, at end {os.getloadavg()}; {rounds} rounds, plain and tapped "
            f"alternating\n\n{table(results)}\n\n{pth_report()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--pth-only", action="store_true", help="only the .pth file's cost")
    args = parser.parse_args(argv)
    print(pth_report() if args.pth_only else run(args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
