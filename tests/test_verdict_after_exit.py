"""The running daemon's verdict follows the trainer out: a real trainer process that exits cleanly (the shim's
``close`` at interpreter exit sends its closing hello after its last batch) is not live from the
first window after its last message, and that window reads ``idle`` in the console line,
``/metrics``, ``top``, ``/explain`` and the W&B rows. Real processes: the daemon, the trainer
(real ZeroMQ between them), the real wandb library offline."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console

from sidecar.aggregation.insight import compute_insight
from sidecar.aggregation.senders import SenderRegistry
from sidecar.aggregation.verdict import Hysteresis
from sidecar.cli.top import render
from sidecar.model.insight import VERDICT_CODES, Verdict
from sidecar.model.messages import HelloMessage
from tests import wandb_records
from tests.daemon_harness import DaemonProc, Samples, env, wait_for
from tests.insight_synth import report, sender, worker
from tests.launcher import http_get

TRAINER = textwrap.dedent("""
    import atexit, json, sys, time
    atexit.register(lambda: print(json.dumps({"gone": time.time()}), flush=True))  # runs after the shim's close
    from trainer_shim import telemetry
    ch = telemetry.configure(endpoint=sys.argv[1], role="trainer", worker="0", flush_interval_s=0.05,
                             wandb_run_id="exit-run")
    while ch.records_total == 0:  # until a record reached the running daemon
        ch.gauge("warmup", 1.0)
        telemetry.flush(wait_s=1.0)
    end = time.monotonic() + float(sys.argv[2])
    step = 0
    while time.monotonic() < end:  # input-bound: 30 of every 40 ms wait on data
        time.sleep(0.03); ch.timing("data_wait_ms", 30.0)
        time.sleep(0.01); ch.timing("forward_ms", 10.0)
        step += 1
        ch.publish(step, {})
    # no close(): the interpreter's exit closes the shim, as in most trainers
""")

WINDOW = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO sidecar: window ([\d.]+)s \|.*?"
                    r"\| verdict ([a-z-]+)", re.M)


def _windows(log: str) -> list[tuple[float, float, str]]:
    """(begin, end, verdict) of each window line of the daemon's console log (unix seconds: the
    line's local time, written when the window closed)."""
    out = []
    for stamp, duration, verdict in WINDOW.findall(log):
        end = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append((end - float(duration), end, verdict))
    return out


def _verdict(samples: Samples) -> str | None:
    return next((lab["verdict"] for lab, v in samples.get("dflash_pipeline_bottleneck", []) if v == 1), None)


def test_the_first_window_after_a_clean_exit_is_idle_everywhere(tmp_path: Path) -> None:
    wandb_dir = tmp_path / "daemon-wandb"
    wandb_dir.mkdir()
    d = DaemonProc(tmp_path, "--wandb-run", "auto", interval=1.0,
                   extra_env={"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_SILENT": "true"})
    scrapes: list[tuple[float, Samples, str]] = []
    try:
        trainer = subprocess.Popen([sys.executable, "-c", TRAINER, d.endpoint, "4"], stdout=subprocess.PIPE,
                                   text=True, env=env())
        wait_for(lambda: _verdict(d.samples()) == "input-bound", timeout_s=60, what="the trainer's verdict")
        while trainer.poll() is None:
            time.sleep(0.05)
        stop = time.time() + 3.5
        while time.time() < stop:  # (scrape time, /metrics, /explain) for at least three windows
            before = time.time()
            samples = d.samples()
            explained = json.loads(http_get(d.url.replace("/metrics", "/explain")))
            scrapes.append((before, samples, str(explained.get("verdict"))))
            time.sleep(0.1)
    finally:
        d.stop()
    out, _ = trainer.communicate(timeout=30)
    assert trainer.returncode == 0
    gone = json.loads(out.strip().splitlines()[-1])["gone"]
    windows = _windows(d.log())
    assert any(v == "input-bound" for _, end, v in windows if end < gone), windows
    # A line is written a little after its window closed, so its begin read back is a little late
    # too: 0.15 s of margin keeps the window the trainer ended in out of ``after``.
    after = [w for w in windows if w[0] >= gone + 0.15]
    assert len(after) >= 2, (gone, windows)
    first = after[0]
    # the console line of the first window that began after the trainer was gone
    assert first[2] == "idle", (gone, windows)
    # /metrics, top and /explain while that window is the latest (0.3 s after its line: every
    # listener has it; before the next one's line)
    during = [(s, e) for t, s, e in scrapes if first[1] + 0.3 <= t < after[1][1]]
    assert during, (first, after[1], [t for t, _, _ in scrapes])
    for samples, explained in during:
        assert _verdict(samples) == "idle" and explained.startswith("idle"), (_verdict(samples), explained)
        assert samples["dflash_sidecar_senders"][0][1] == 0.0
        console = Console(width=160, record=True)
        console.print(render(samples))
        assert "bottleneck: idle (no live trainer)" in console.export_text()
    # W&B: one row per window, in order, each with the console line's verdict
    files = list(wandb_dir.rglob("*.wandb"))
    assert len(files) == 1, files
    key = f"sidecar/{socket.gethostname()}/pipeline/verdict_code"
    codes = [row[key] for row in wandb_records.history_rows(files[0]) if key in row]
    logged = [VERDICT_CODES[v] for _, _, v in windows]
    if codes != logged[len(logged) - len(codes):]:  # the row of the last (partial) window may miss the exit
        logged, after = logged[:-1], after[:-1]
    assert codes == logged[len(logged) - len(codes):] and len(codes) >= len(after) + 1, (codes, logged)
    assert codes[len(codes) - len(after)] == VERDICT_CODES["idle"]


def test_a_closed_sender_is_live_only_in_the_window_its_last_message_arrived_in() -> None:
    phases = {"data_wait": 30, "forward": 10}
    closed = dataclasses.replace(sender("trainer", "0", last_seen_age_s=0.4), closed=True)
    rep = report(worker("trainer", "0", phases, 15), senders=(closed,))
    assert compute_insight(rep.window, None, None, rep.senders).verdict.name == "input-bound"
    assert len(rep.live_senders) == 1
    # the next window: its last message lies before the window's begin (1.4 s ago in a 1 s window)
    later = dataclasses.replace(sender("trainer", "0", last_seen_age_s=1.4), closed=True)
    rep = report(worker("trainer", "0", phases, 15), senders=(later,))
    v = compute_insight(rep.window, None, None, rep.senders).verdict
    assert v.name == "idle" and rep.live_senders == ()
    # a sender silent as long without closing may still be alive (a long step): not idle yet,
    # only nothing to tell from this window
    silent = dataclasses.replace(later, closed=False)
    assert compute_insight(rep.window, None, None, (silent,)).verdict.name == "unknown"


def test_hysteresis_never_holds_a_verdict_once_no_live_trainer_remains() -> None:
    h = Hysteresis()
    h.update(Verdict("input-bound", confidence=0.95))
    assert h.update(Verdict("balanced", confidence=0.6)).name == "input-bound"  # held: one window
    assert h.update(Verdict("idle", confidence=0.1)).name == "idle"  # at once, whatever its confidence


def test_the_closing_hello_ends_its_sender_in_the_registry() -> None:
    registry = SenderRegistry()
    hello = {"pid": 7, "host": "h", "role": "trainer", "worker": "0", "shim_version": "x"}
    registry.on_hello(HelloMessage(5, 0, hello), 100.0, 1e9 + 100.0)
    assert [s.sender for s in registry.live(100.5, 1.0)] == [5]
    registry.on_hello(HelloMessage(5, 1, hello | {"closing": True}), 101.0, 1e9 + 101.0)
    assert [s.sender for s in registry.live(101.5, 1.0)] == [5]  # its end lies in this window
    assert registry.live(102.5, 1.0) == []  # the next one: gone, 8.5 s before silence would say so
