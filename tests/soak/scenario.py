"""The soak: load publishers and a garbage flood run throughout while the daemon is killed
(SIGKILL) and stopped (SIGTERM) and restarted several times, W&B's service is stalled and (when
this build has the NVML source) the GPU driver hangs. ``run_soak`` returns every figure;
``failures`` says which promise a run broke. The CI test and ``bench/soak.py`` both call them.

Each daemon life ends with a check: the publishers pause, each reports its own per-channel
counts once the shim's own identity holds, and the daemon's exported counters must then match
them exactly for every sender (``calls == accepted + sum(dropped by reason)``). A SIGKILL then
comes after a little more load; a SIGTERM comes while the publishers are still paused (its final
window flush is the daemon's last word). Across a SIGKILL, what died with the daemon is measured
per sender as ``before_join`` of the next life minus the records the killed daemon had exported
(``transport_total``) at a scrape right before the kill.
"""

from __future__ import annotations

import math
import random
import re
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sidecar.core.ingest import COALESCE_S
from tests.daemon_harness import DaemonProc, free_port
from tests.launcher import cpu_seconds
from tests.soak import faults
from tests.soak.procs import (
    GarbageProc,
    PublisherProc,
    Sampler,
    label_accounting,
    sender_drops,
    transport_total,
)
from tests.soak.publisher import BURST_S

ROLE = "drafter"


@dataclass
class SoakConfig:
    duration_s: float = 22.0
    """Load phase: seconds the publishers run (pauses for checks not included)."""
    publishers: int = 3
    threads: int = 8
    rate: float = 60_000.0
    """Records per second over all publishers."""
    bad_every: int = 997
    """Every n-th call is a bad argument (NaN, empty name, negative count) the daemon rejects."""
    garbage_rate: float = 1_000.0
    """Garbage frames per second on the daemon's socket."""
    idle_http_clients: int = 40
    """TCP connections to the metrics port that never send a byte, kept open (reopened when the
    daemon closes them) all along: every scrape of the checks must still answer."""
    interval_s: float = 0.5
    """The daemon's window."""
    flush_interval_s: float = 0.02
    """The shim's flush interval."""
    ends: tuple[str, ...] = ("sigkill", "sigterm", "sigkill", "sigkill")
    """How each daemon life but the last ends; the last one runs ``steady_fraction`` of the load
    phase (RSS flatness is read there) and ends with the final check and SIGTERM."""
    steady_fraction: float = 0.4
    down_s: float = 1.0
    """Seconds the daemon stays down at each restart (the publishers keep calling)."""
    wandb: bool = True
    """W&B exporter in offline mode; its service is SIGSTOPped in life ``stall_life``."""
    nvml: bool = True
    """The fake NVML driver (when this build has the NVML source); a call hangs in life ``stall_life``."""
    stall_life: int = 1
    stall_s: float = 4.0
    seed: int = 8

    def life_seconds(self) -> list[float]:
        steady = self.duration_s * self.steady_fraction
        early = (self.duration_s - steady) / max(1, len(self.ends))
        return [early] * len(self.ends) + [steady]


@dataclass
class Life:
    index: int
    end: str
    load_s: float
    pid: int = 0
    checked_calls: int = 0
    exact: bool = False
    mismatches: list[str] = field(default_factory=list)
    settle_s: float = 0.0
    losses: dict[str, int] = field(default_factory=dict)
    """Sum over the real senders of every loss reason the daemon exported in this life."""
    garbage_messages_dropped: dict[str, int] = field(default_factory=dict)
    rss_bytes: list[int] = field(default_factory=list)
    cpu_s: float = 0.0
    exit_s: float | None = None
    exit_code: int | None = None
    unflushed_s: float | None = None
    """SIGKILL: seconds between the killed daemon's last window roll and the kill."""
    gap_from_previous: dict[str, int] = field(default_factory=dict)
    """Per sender: this life's before_join minus what the previous life had exported."""
    faults: dict[str, Any] = field(default_factory=dict)


class IdleHttpClients:
    """Keeps ``n`` silent connections open to the metrics port from a thread (an attack on the
    endpoint beside the honest load)."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n, self.opened = port, n, 0
        self._socks: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._socks = [s for s in self._socks if _open(s)]
            while len(self._socks) < self.n and not self._stop.is_set():
                try:
                    self._socks.append(socket.create_connection(("127.0.0.1", self.port), timeout=1))
                    self.opened += 1
                except OSError:
                    break  # daemon down between lives

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        for s in self._socks:
            s.close()
        self._socks = []
        return self.opened


def _open(sock: socket.socket) -> bool:
    """False once the peer closed ``sock`` (then it is closed here too)."""
    try:
        sock.setblocking(False)
        data = sock.recv(1, socket.MSG_PEEK)
        alive = data != b""
    except BlockingIOError:
        alive = True
    except OSError:
        alive = False
    if not alive:
        sock.close()
    return alive


def run_soak(tmp: Path, cfg: SoakConfig, log=print) -> dict[str, Any]:
    """Run the whole soak in ``tmp``; returns the figures (see ``failures``)."""
    rng = random.Random(cfg.seed)
    endpoint = f"ipc://{tmp}/sidecar.sock"
    port = free_port()
    per_pub = cfg.rate / cfg.publishers
    pubs = [PublisherProc(tmp, {"endpoint": endpoint, "role": ROLE, "name": f"p{i}", "threads": cfg.threads,
                                "rate": per_pub, "bad_every": cfg.bad_every, "flush_interval_s": cfg.flush_interval_s,
                                "wandb_run_id": "soak-trainer-run"})
            for i in range(cfg.publishers)]
    garbage = GarbageProc(tmp, {"endpoint": endpoint, "rate": cfg.garbage_rate, "seed": cfg.seed})
    idle = IdleHttpClients(port, cfg.idle_http_clients)
    lives: list[Life] = []
    prekill: dict[str, int] = {}
    daemon: DaemonProc | None = None
    fault_ctl = faults.Faults(tmp, wandb=cfg.wandb, nvml=cfg.nvml)
    try:
        for index, load_s in enumerate(cfg.life_seconds()):
            end = cfg.ends[index] if index < len(cfg.ends) else "final"
            life = Life(index, end, load_s)
            lives.append(life)
            life_dir = tmp / f"life-{index}"
            life_dir.mkdir()
            kw = fault_ctl.daemon_kwargs(life_dir)
            daemon = DaemonProc(life_dir, *kw["args"], endpoint=endpoint, port=port, interval=cfg.interval_s,
                                extra_env=kw["extra_env"], gpu=kw["gpu"])
            life.pid = daemon.proc.pid
            sampler = Sampler(daemon.proc.pid)
            cpu0 = cpu_seconds(daemon.proc.pid)
            log(f"life {index}: daemon pid {daemon.proc.pid}, {load_s:.1f}s of load, ends with {end}")
            if index == cfg.stall_life:
                life.faults = fault_ctl.stall(daemon, load_s, cfg.stall_s)
            else:
                time.sleep(load_s)
            answers = [p.command("pause") for p in pubs]
            channels = {w: c for a in answers for w, c in a["channels"].items()}
            _check_life(daemon, life, channels, prekill)
            if index == cfg.stall_life:
                life.faults.update(fault_ctl.during_stall_checked(daemon))
            life.cpu_s = cpu_seconds(daemon.proc.pid) - cpu0
            if end == "sigkill":
                for p in pubs:
                    p.command("resume")
                time.sleep(rng.uniform(0.3, 1.0))
                snap, snap_window_s = _snapshot_at_a_window(daemon)
                prekill = {w: transport_total(e) for (role, w), e in snap.items() if role == ROLE}
                fault_ctl.note_children(daemon)
                killed_at = time.time()
                daemon.stop(signal.SIGKILL)
                life.exit_code = daemon.proc.returncode
                # From the window the snapshot holds, not the last one logged: a window that rolls
                # between the snapshot and the kill is exported, but not in ``prekill``.
                life.unflushed_s = killed_at - snap_window_s
                fault_ctl.after_kill()
            else:
                prekill = {w: transport_total(e) for (role, w), e in label_accounting(daemon.samples()).items()
                           if role == ROLE}
                if end == "final":
                    final = [p.stop() for p in pubs]
                fault_ctl.note_children(daemon)
                life.exit_s = daemon.stop(signal.SIGTERM, timeout_s=15)
                life.exit_code = daemon.proc.returncode
                life.faults.update(fault_ctl.after_term())
                if end == "sigterm":
                    for p in pubs:
                        p.command("resume")
            life.rss_bytes = [rss for _, rss, _ in sampler.stop()]
            daemon = None
            if end != "final":
                time.sleep(cfg.down_s)
        garbage_sent = garbage.stop()
        garbage_sent["idle_http_connections_opened"] = idle.stop()
    finally:
        idle.stop()
        if daemon is not None:
            daemon.stop(signal.SIGKILL)
        for p in pubs:
            p.kill()
        garbage.kill()
        fault_ctl.cleanup()
    return _summary(cfg, lives, final, garbage_sent)


def _snapshot_at_a_window(daemon: DaemonProc) -> tuple[dict[Any, Any], float]:
    """The daemon's accounting and the Unix time of the window it holds: a scrape with no window
    line logged around it (50 ms after, for a line written just after its window was served)."""
    for _ in range(20):
        before = last_window_unix_s(daemon.log())
        snap = label_accounting(daemon.samples())
        time.sleep(0.05)
        after = last_window_unix_s(daemon.log())
        if after == before or (math.isnan(after) and math.isnan(before)):
            return snap, before
    raise AssertionError("no scrape fell between two window lines in 20 tries")


def last_window_unix_s(log_text: str) -> float:
    """Unix time of the last window line (the console exporter's) in a daemon log."""
    stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO sidecar: window ", log_text, re.M)
    if not stamps:
        return math.nan
    day, ms = stamps[-1]
    return time.mktime(time.strptime(day, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000


def _check_life(daemon: DaemonProc, life: Life, channels: dict[str, dict[str, Any]], prekill: dict[str, int]) -> None:
    """Wait until the daemon's exported counts match every publisher channel exactly."""
    life.checked_calls = sum(c["calls"] for c in channels.values())
    start = time.monotonic()
    while True:
        samples = daemon.samples()
        acc = label_accounting(samples)
        mismatches = []
        for worker, ch in channels.items():
            entry = acc.get((ROLE, worker), {"accepted": 0, "dropped": {}})
            if not (transport_total(entry) == ch["records_total"] and sender_drops(entry) == sum(ch["dropped"].values())
                    and entry["accepted"] + sum(entry["dropped"].values()) == ch["calls"]):
                mismatches.append(f"{worker}: calls {ch['calls']} (records_total {ch['records_total']}, dropped "
                                  f"{ch['dropped']}) vs daemon {entry}")
        if not mismatches or time.monotonic() - start > 20:
            break
        time.sleep(0.2)
    life.settle_s = time.monotonic() - start
    life.exact = not mismatches
    life.mismatches = mismatches[:5]
    for (role, worker), entry in acc.items():
        if role == ROLE:
            for reason, n in entry["dropped"].items():
                life.losses[reason] = life.losses.get(reason, 0) + n
            if prekill:
                life.gap_from_previous[worker] = entry["dropped"].get("before_join", 0) - prekill.get(worker, 0)
    life.garbage_messages_dropped = {lab["reason"]: int(v) for lab, v in
                                     samples.get("dflash_sidecar_messages_dropped_total", [])}


def _summary(cfg: SoakConfig, lives: list[Life], final: list[dict[str, Any]],
             garbage: dict[str, Any]) -> dict[str, Any]:
    hist = [sum(f["call_ns_log2_hist"][k] for f in final) for k in range(64)]
    calls = sum(f["calls"] for f in final)
    active = max(f["active_s"] for f in final)
    per_channel_rate = cfg.rate / (cfg.publishers * cfg.threads)
    kills = []
    for prev, life in zip(lives, lives[1:]):
        if prev.end == "sigkill" and life.gap_from_previous:
            worst = max(life.gap_from_previous.values())
            # What the killed daemon had not flushed yet (received since its last window roll),
            # plus what waited in its socket queue (the ingest loop takes frames every
            # COALESCE_S when idle), one shim flush in flight and one publisher burst: the most
            # that may die.
            allowance = per_channel_rate * (prev.unflushed_s + COALESCE_S + cfg.flush_interval_s + BURST_S)
            kills.append({"life": prev.index, "died_max_records": worst,
                          "died_min_records": min(life.gap_from_previous.values()),
                          "died_max_windows": worst / (per_channel_rate * cfg.interval_s),
                          "unflushed_s": prev.unflushed_s, "allowance_records": allowance,
                          "died_over_allowance": worst / allowance})
    terms = [{"life": prev.index, "gap_max_records": max(life.gap_from_previous.values(), default=0),
              "exit_s": prev.exit_s} for prev, life in zip(lives, lives[1:]) if prev.end == "sigterm"]
    steady = lives[-1].rss_bytes
    third = max(1, len(steady) // 3)
    return {
        "config": asdict(cfg),
        "calls": calls,
        "active_s": active,
        "rate": calls / active if active else 0.0,
        "worst_call_ns": max(f["worst_call_ns"] for f in final),
        "calls_over_1ms": sum(hist[21:]),
        "calls_over_10ms": sum(hist[24:]),
        "call_ns_p999_upper": _quantile_upper(hist, 0.999),
        "lives": [asdict(life) for life in lives],
        "kills": kills,
        "terms": terms,
        "rss_steady": {"samples": len(steady), "first_third_max": max(steady[:third], default=0),
                       "rest_max": max(steady[third:], default=0), "max": max(steady, default=0)},
        "garbage_sent": garbage,
        "publishers": [{"channels": f["channels"], "worst_call_ns_by_worker": f["worst_call_ns_by_worker"]}
                       for f in final],
    }


def _quantile_upper(hist: list[int], q: float) -> int:
    """Upper bound (ns) of the bucket holding quantile ``q`` of a log2 histogram."""
    total = sum(hist)
    seen = 0
    for k, n in enumerate(hist):
        seen += n
        if seen >= q * total:
            return 2**k
    return 0


RSS_GROWTH_BOUND = 16 * 1024 * 1024
"""The daemon's RSS over the steady life may not exceed its first third's maximum by more."""
WORST_CALL_BOUND_NS = 500_000_000
"""A trainer-side call that took this long would have waited for the daemon (down for 1 s)."""


def failures(result: dict[str, Any]) -> list[str]:
    """The promises a soak result breaks (empty: all kept)."""
    out = []
    cfg = result["config"]
    for life in result["lives"]:
        if not life["exact"]:
            out.append(f"life {life['index']}: accounting not exact: {life['mismatches']}")
        if life["end"] in ("sigterm", "final") and (life["exit_code"] != 0 or (life["exit_s"] or 99) > 10):
            out.append(f"life {life['index']}: SIGTERM exit {life['exit_code']} after {life['exit_s']}s")
    for kill in result["kills"]:
        if kill["died_min_records"] < 0:
            out.append(f"after the SIGKILL of life {kill['life']} a sender's before_join is below what was exported")
        if kill["died_over_allowance"] > 1.25 or kill["died_max_windows"] > 2.0:
            out.append(f"SIGKILL of life {kill['life']}: {kill['died_max_records']} records of one sender died, "
                       f"more than its unflushed window ({kill['unflushed_s']:.2f} s) and one flush in flight "
                       f"({kill['allowance_records']:.0f} records)")
    for term in result["terms"]:
        per_flush = cfg["rate"] / (cfg["publishers"] * cfg["threads"]) * cfg["flush_interval_s"]
        if term["gap_max_records"] > 4 * per_flush + 10:
            out.append(f"SIGTERM of life {term['life']}: {term['gap_max_records']} records lost "
                       "between exit and restart")
    if result["worst_call_ns"] > WORST_CALL_BOUND_NS:
        out.append(f"a trainer-side call took {result['worst_call_ns'] / 1e6:.0f} ms")
    if result["rate"] < 50_000:
        out.append(f"load rate {result['rate']:.0f} records/s < 50,000")
    rss = result["rss_steady"]
    if rss["rest_max"] - rss["first_third_max"] > RSS_GROWTH_BOUND:
        out.append(f"RSS grew by {(rss['rest_max'] - rss['first_third_max']) / 2**20:.1f} MiB in the steady life")
    sent = (result.get("garbage_sent") or {}).get("sent", {})
    refused = {reason: sum(life["garbage_messages_dropped"].get(reason, 0) for life in result["lives"])
               for reason in ("impossible_count",)}
    if sent.get("impossible_count") and not refused["impossible_count"]:
        out.append("forged counts of 2**62 were sent but none was refused as impossible_count")
    for life in result["lives"]:
        for name, fault in life["faults"].items():
            if isinstance(fault, dict) and fault.get("failure"):
                out.append(f"life {life['index']} {name}: {fault['failure']}")
    return out
