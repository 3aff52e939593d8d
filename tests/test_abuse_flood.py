"""Abuse: floods on the trainer socket (needs the trainer's group). Several processes pushing
frames at the size limit as fast as ZeroMQ takes them cannot make the daemon's memory exceed its
stated ceiling; the backlog drains and an honest trainer is counted exactly afterwards; SIGTERM
in the middle of a backlog still writes the final window and removes the socket and lock files.
A profile whose keys are beyond ``--max-series`` costs one resolution per key per batch. A flood
of frames that are expensive to handle (1 MiB of new profile keys each) from several processes
neither slows an honest trainer publishing meanwhile (every one of its records is counted,
nothing lost on the way) nor takes the daemon past its memory ceiling: each peer has its share of
the ingest thread's CPU, and frames beyond it are dropped unread and counted (``cpu_share``)."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from sidecar.aggregation.aggregator import PROFILE, Aggregator
from sidecar.aggregation.parts import settle
from sidecar.core.pipeline import ingest_records
from sidecar.model.mapped import READ, Mapped
from sidecar.model.window import TIMING, SeriesView
from sidecar.processing.mapping import Mapper
from sidecar.sources.receiver import QUEUE_CEILING_BYTES
from tests.daemon_harness import DaemonProc, publish, wait_for
from tests.soak.floods import flood_process, frames_received
from tests.soak.procs import PublisherProc, Sampler, label_accounting
from trainer_shim import wire

MiB = 1024 * 1024
FLOODERS = 4
BYTES_PER_FLOODER = 200 * MiB
RSS_TARGET = 600 * MiB
"""SPEC §7: peak RSS under any flood."""

@pytest.mark.timeout(300)
def test_a_flood_from_several_processes_stays_under_the_memory_ceiling(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path)
    try:
        before = frames_received(d)
        sampler = Sampler(d.proc.pid, period_s=0.02)
        n = BYTES_PER_FLOODER // wire.MAX_MESSAGE_BYTES
        flooders = [flood_process(d.endpoint, "bloated", n) for _ in range(FLOODERS)]
        for p in flooders:
            p.wait(240)
        wait_for(lambda: frames_received(d) >= before + FLOODERS * n, timeout_s=120, what="the backlog drained")
        peak = max(rss for _, rss, _ in sampler.stop())
        assert d.proc.poll() is None, d.log()
        # the design bound: ZeroMQ's queue per connection, plus the daemon's own few hundred MB at most
        assert FLOODERS * QUEUE_CEILING_BYTES < RSS_TARGET - 200 * MiB
        assert peak <= RSS_TARGET, f"peak RSS {peak / MiB:.0f} MiB under {FLOODERS} flooders"
        res = publish(d.endpoint, "honest", "0", 300)
        wait_for(lambda: d.value("dflash_sidecar_records_accepted_total", role="honest") == res["records_total"],
                 what="the honest trainer's records")
        dropped = d.value("dflash_sidecar_records_dropped_total", role="honest") or 0
        assert dropped == sum(res["dropped"].values()) + (
            d.value("dflash_sidecar_records_dropped_total", role="honest", reason="before_join") or 0)
    finally:
        d.stop()


def test_sigterm_during_a_backlog_writes_the_final_window_and_removes_its_files(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, "--max-series", "10")
    sock_path = d.endpoint[len("ipc://"):]
    assert os.path.exists(sock_path) and os.path.exists(sock_path + ".lock")
    flooder = flood_process(d.endpoint, "profiles", 400)
    try:
        wait_for(lambda: frames_received(d) >= 5, timeout_s=60, what="the flood reaching the daemon")
    finally:
        took = d.stop(timeout_s=15)
        flooder.kill()
        flooder.wait()
    log = d.log()
    assert d.proc.returncode == 0, log
    assert "final window written" in log, log[-3000:]
    assert "did not stop" not in log, log[-3000:]
    assert not os.path.exists(sock_path) and not os.path.exists(sock_path + ".lock"), (took, os.listdir(tmp_path))


def test_profile_keys_beyond_the_budget_are_resolved_once_per_batch() -> None:
    agg = Aggregator(max_series=10)
    calls = []
    resolve = agg._resolve

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args[1])
        return resolve(*args, **kwargs)  # type: ignore[arg-type]

    agg._resolve = counted  # type: ignore[method-assign]
    mapped = []

    class CountingMapper(Mapper):
        def resolve(self, kind: int, raw: str, role: str, worker: str) -> Mapped:
            mapped.append(raw)
            return super().resolve(kind, raw, role, worker)

    profile = {f"key_{k}": 1.0 for k in range(500)}
    ingest_records(agg, "r", "0", [[PROFILE, step, profile] for step in range(100)], CountingMapper())
    assert agg.profile_entries_rejected["r", "0", "cardinality"] == 100 * 490
    assert len(mapped) == 500, f"{len(mapped)} mappings for 500 distinct keys"
    assert len(calls) == 500, f"{len(calls)} resolutions for 500 distinct keys"


class _OverBudget(Exception):
    pass


def _lines_run(fn: Callable[[], object], path: str, budget: int) -> int:
    """Lines of the module at ``path`` that calling ``fn`` runs (``sys.settrace``), stopping with
    ``_OverBudget`` past ``budget``: a count of the work done, not a time."""
    ran = [0]

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            ran[0] += 1
            if ran[0] > budget:
                raise _OverBudget(f"more than {budget} lines run")
        return local

    def call(frame: FrameType, event: str, arg: object) -> Any:
        return local if frame.f_code.co_filename == path else None

    sys.settrace(call)
    try:
        fn()
    finally:
        sys.settrace(None)
    return ran[0]


def _phase_names(n: int) -> tuple[SeriesView, ...]:
    """``n`` distinct names read as one phase under one label (``m/part17/forward_ms``)."""
    return tuple(_view(f"m_part{i}_forward", "forward") for i in range(n))


def _spellings_of_one_sibling(n: int) -> tuple[SeriesView, ...]:
    """``n`` spellings of a DeepSpeed-style ``x_elapsed_time_ms_step`` (one stem, the optimizer as its
    sibling) beside a forward and a backward of its prefix."""
    return (_view("x_forward", "forward"), _view("x_backward", "backward"),
            *(_view("x_step", "step", sibling="optimizer") for _ in range(n - 2)))


def _renders_of_one_word(n: int) -> tuple[SeriesView, ...]:
    """Renders of one word (``timing/render``; four of its spellings are read) and distinct
    ``r17_render`` names, beside as many backwards: each render looks at the names of its prefix."""
    return (*(_view("render", "", sibling="forward") for _ in range(n // 4)),
            *(_view(f"r{i}_render", "", sibling="forward") for i in range(n // 4)),
            *(_view(f"r{i}_backward", "backward") for i in range(n // 2)))


def _nested_siblings(n: int) -> tuple[SeriesView, ...]:
    """A review's attack: renders at 55 nested prefixes (``x_render``, ``x_x_render``, ..., a name's
    128 bytes allow that many), four spellings each, beside backwards under the deepest prefix:
    each render's prefix holds nearly every name, so a pass over its prefix was about 1,100 n."""
    renders = [_view("x_" * k + "render", "", sibling="forward") for k in range(1, 56) for _ in range(4)]
    return (*renders, *(_view("x_" * 55 + f"b{i}_backward", "backward") for i in range(n - len(renders))))


def _spellings_of_one_container(n: int) -> tuple[SeriesView, ...]:
    """``n`` / 2 spellings of ``x_backward`` beside as many of ``x_backward_inner`` and an all-reduce."""
    return (*(_view("x_backward", "backward") for _ in range(n // 2)),
            *(_view("x_backward_inner", "backward") for _ in range(n // 2 - 1)),
            _view("x_backward_allreduce", "comm_wait"))


def _interleaved_halves(n: int) -> tuple[SeriesView, ...]:
    """Distinct names, a backward split by its part, then a ``forward_backward``, over and over."""
    return tuple(v for w in range(n // 3) for v in (_view(f"c{w}_backward", "backward"),
                                                     _view(f"c{w}_backward_inner", "backward"),
                                                     _view(f"f{w}_fwd_bwd", "forward_backward")))


_SERIAL = itertools.count()


def _view(stem: str, meaning: str, sibling: str = "") -> SeriesView:
    """A timing of ``stem`` read as ``meaning`` under one label, its name its own (a spelling)."""
    name = f"{stem}#{next(_SERIAL)}"
    return SeriesView(TIMING, name, "trainer", "0", {"mean": 1.0}, {}, meaning=meaning, stem=stem, rule=READ,
                      raw=name, sibling=sibling)


@pytest.mark.parametrize("flood", [_phase_names, _spellings_of_one_sibling, _renders_of_one_word, _nested_siblings,
                                   _spellings_of_one_container, _interleaved_halves])
def test_a_flood_of_phase_names_under_one_label_costs_each_window_about_n(
        flood: Callable[[int], tuple[SeriesView, ...]]) -> None:
    """A client publishing thousands of names read as phases under one label (within the series
    budget): the window's rules for a phase timed with its parts and a name read from its siblings
    (``parts.settle``) compared each name with every other, n² a window. 10,000 distinct phase names
    took a roll 15.5 s of every 10 s window; 10,000 spellings of one sibling name 23 s; interleaved
    backwards, their parts and ``forward_backward`` names 5 s (bench/RESULTS_SOAK.md §11). Counted,
    not timed: the lines of parts.py run for 2,000 names, at most 100 a name."""
    import sidecar.aggregation.parts as parts

    views = flood(2000)
    assert _lines_run(lambda: settle(views), parts.__file__, 100 * len(views)) > 0


CPU_FLOODERS = 4
CPU_FLOOD_FRAMES = 40
"""Per flooder: 1 MiB frames of about 60,000 new profile keys each (the report's 280 frames took
the daemon 100 s, and an honest trainer publishing meanwhile had 8,980 of 55,000 records counted)."""


@pytest.mark.timeout(300)
def test_an_honest_trainer_is_counted_exactly_during_a_flood_of_expensive_frames(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path)
    honest = PublisherProc(tmp_path, {"endpoint": d.endpoint, "role": "honest", "name": "t", "threads": 1,
                                      "rate": 5000, "flush_interval_s": 0.1})
    flooders = []
    try:
        sampler = Sampler(d.proc.pid, period_s=0.02)
        before = frames_received(d)
        flooders = [flood_process(d.endpoint, "keys", CPU_FLOOD_FRAMES) for _ in range(CPU_FLOODERS)]
        for p in flooders:
            p.wait(240)
        wait_for(lambda: frames_received(d) >= before + CPU_FLOODERS * CPU_FLOOD_FRAMES, timeout_s=120,
                 what="the flood taken in")
        channel = honest.stop()["channels"]["t-0"]
        peak = max(rss for _, rss, _ in sampler.stop())
        assert d.proc.poll() is None, d.log()
        made = channel["records_total"]

        def counted() -> dict[str, object]:
            return label_accounting(d.samples()).get(("honest", "t-0"), {"accepted": 0, "dropped": {}})

        # the flood's last frames may still be in the daemon's hands when it has taken them in: on a
        # loaded box that can take longer than the honest records do
        try:
            wait_for(lambda: counted()["accepted"] == made, timeout_s=90, what="the honest trainer counted")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {made} records made, counted {counted()}") from None
        assert made > 0 and counted()["dropped"] == {}, (made, counted())  # nothing lost, nothing refused
        assert sum(channel["dropped"].values()) == 0, channel  # and nothing dropped in the shim
        assert peak <= RSS_TARGET, f"peak RSS {peak / MiB:.0f} MiB"
    finally:
        for p in flooders:
            p.kill()
            p.wait()
        honest.kill()
        d.stop()


def test_the_fair_queue_serves_a_light_peer_first_and_bounds_what_waits() -> None:
    from sidecar.sources.receiver import PENDING_MAX_BYTES, FairQueue

    fair = FairQueue()
    clock = [100.0]
    fair.clock = lambda: clock[0]
    big = b"x" * (1024 * 1024)
    for _ in range(200):  # 200 MiB from a flooder: only PENDING_MAX_BYTES of it may wait
        fair.push(1111, big)  # type: ignore[arg-type]
    assert fair.pending_bytes <= PENDING_MAX_BYTES and fair.dropped == 200 - PENDING_MAX_BYTES // len(big)
    for _ in range(5):
        fair.push(2222, b"y" * 10_000)  # type: ignore[arg-type]
    for frame, peer in fair.round(1000, 8 * 1024 * 1024):
        fair.charge(peer, 0.2 if peer == 1111 else 0.001, len(frame))  # the flooder's frames are dear
    for _ in range(5):
        fair.push(2222, b"y" * 10_000)  # type: ignore[arg-type]
    clock[0] += 0.1
    order = [peer for _, peer in fair.round(1000, 8 * 1024 * 1024)]
    assert order[:5] == [2222] * 5, order  # the trainer's frames first, all of them
    assert order.count(1111) == 0, order  # the flooder is in debt: its frames wait their turn
    rounds = 0
    while 1111 not in [p for _, p in fair.round(1000, 8 * 1024 * 1024)]:
        rounds += 1
    assert rounds >= 10, rounds  # 0.2 s of debt at 5 ms a round


def test_a_pull_of_a_full_connection_is_a_backlog_so_a_fast_sender_is_not_held_to_a_coalescing_wait(
        tmp_path: Path) -> None:
    # A sender faster than the coalescing wait (a blocking flood, a busy shim) fills its
    # connection's RECV_HWM; treating that pull as "queue emptied" held it to RECV_HWM frames per
    # wait (80 frames/s: 20,000 small frames took 185 s instead of 7).
    import time

    import zmq

    from sidecar.sources.receiver import BACKLOG_PULL, RECV_HWM, Receiver
    endpoint = f"ipc://{tmp_path}/s.sock"
    receiver = Receiver([endpoint])
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    try:
        pub.connect(endpoint)
        deadline = time.monotonic() + 10
        got = 0
        while time.monotonic() < deadline and got == 0:  # the subscription reaches the publisher
            pub.send(b"probe")
            got = len(receiver.poll(50))
        for _ in range(4 * RECV_HWM):
            pub.send(b"x" * 100)
        time.sleep(0.3)
        frames = receiver.poll(0)
        assert len(frames) >= BACKLOG_PULL and receiver.backlog
    finally:
        pub.close(0)
        ctx.term()
        receiver.close()
