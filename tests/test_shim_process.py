"""Process life: fork, interpreter exit, the environment, import weight, the GPU check dry run.

Every test runs the shim in a fresh interpreter (``python -c``) that prints its final stats as
JSON, with ``shim_helpers.py receive`` as the daemon. Exit bounds are generous liveness limits for
a shared machine: what they catch is a hang, not slowness.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from tests.shim_helpers import ROOT, books_of, wait_until

EXIT_BOUND_S = 30.0
"""A shim process must be gone well within this even with the receiver stalled or absent."""

PRELUDE = """
import json, os, sys, threading, time
from trainer_shim import telemetry
def dump(label="stats"):
    stats = {"/".join(k): v for k, v in telemetry.stats().items()}
    print(json.dumps({label: stats, "pid": os.getpid()}), flush=True)
"""

pytest_plugins = ["tests.shim_fixtures"]


def run_shim(code: str, endpoint: str, env: dict[str, str] | None = None,
             timeout_s: float = EXIT_BOUND_S) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_")}
    full_env.update(PYTHONPATH=str(ROOT), DFLASH_SIDECAR_ENDPOINT=endpoint, DFLASH_ROLE="trainer",
                    RANK="0", **(env or {}))
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout_s)


def lines(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_last_batch_goes_out_at_exit(ep: str, receivers) -> None:  # type: ignore[no-untyped-def]
    """A short run that publishes and simply ends: the atexit flush delivers everything."""
    rx = receivers(ep)
    proc = run_shim("""
        for i in range(1000):
            telemetry.timing("step_ms", float(i))
        telemetry.publish(1000, {"loss": 0.5})
    """, ep)
    assert proc.returncode == 0, proc.stderr
    wait_until(lambda: sum(b.received for b in books_of(rx.messages()).values()) >= 1001)
    rx.stop()
    (book,) = books_of(rx.messages()).values()
    assert book.received == book.last_total == 1001 and book.baseline == 0 and book.consistent()
    assert [6, 1000] in [r[:2] for r in book.records] and book.hellos[0]["worker"] == "0"
    # its last message, after the last batch, is the hello that says the sender ends (a clean exit)
    last = rx.messages()[-1]
    assert last.info is not None and last.info["closing"] is True
    assert not any(m.info and m.info["closing"] for m in rx.messages()[:-1])


@pytest.mark.parametrize("state", ["absent", "stalled", "stops_reading"])
def test_exit_never_hangs(state: str, ep: str, receivers) -> None:  # type: ignore[no-untyped-def]
    """With the receiver absent, bound but never read, or hung after subscribing, with a full
    queue and a thread still publishing, the process exits with status 0 within the bound."""
    rx = None
    if state == "stalled":
        rx = receivers(ep, stalled=True)
    elif state == "stops_reading":
        rx = receivers(ep)
    code = """
        from trainer_shim import wire
        telemetry.configure(max_pending=50_000)
        telemetry.count("hello")
        assert telemetry.flush(wait_s=20)
        print("subscribed", flush=True)
        sys.stdin.readline()  # the test stalls the receiver meanwhile
        wire.MAX_RECORDS_PER_BATCH = 1  # one message per record: overflow every ZeroMQ queue
        def spam():
            while True:
                telemetry.gauge("g", 1.0)
        threading.Thread(target=spam, daemon=True).start()
        for i in range(200_000):
            telemetry.gauge("g", float(i))
        dump()
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DFLASH_SIDECAR_ENDPOINT": ep, "RANK": "0"}
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "subscribed"
    if state == "stops_reading":
        assert rx is not None
        rx.stall()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=EXIT_BOUND_S)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    (stats,) = json.loads(out.splitlines()[-1])["stats"].values()
    # A snapshot taken while the flusher and a thread still run: records in the flusher's hands
    # are in neither column yet, so only check that the overload really happened.
    assert stats["pending"] + sum(stats["dropped"].values()) > 0


def test_forked_child_is_a_new_sender(ep: str, receivers) -> None:  # type: ignore[no-untyped-def]
    """The child gets a new sender id and socket, none of the parent's queued records, and the
    parent carries on unaffected; both are accounted exactly."""
    rx = receivers(ep)
    proc = run_shim("""
        telemetry.configure(flush_interval_s=3600)  # keep records queued across the fork
        for i in range(100):
            telemetry.gauge("parent_before_fork", float(i))
        telemetry.flush(wait_s=20)
        for i in range(50):
            telemetry.gauge("parent_queued_at_fork", float(i))
        parent_sender = telemetry.channel().sender
        pid = os.fork()
        if pid == 0:
            assert telemetry.channel().sender != parent_sender
            assert telemetry.stats()[("trainer", "0")]["pending"] == 0
            for i in range(30):
                telemetry.count("child", 1)
            telemetry.close()  # sends, and lingers until ZeroMQ has written it
            dump("child")
            os._exit(0)  # like a multiprocessing worker: no atexit
        _, status = os.waitpid(pid, 0)
        for i in range(20):
            telemetry.gauge("parent_after_fork", float(i))
        telemetry.close()
        dump("parent")
        print(json.dumps({"child_status": status}))
    """, ep)
    assert proc.returncode == 0, proc.stderr
    out = {k: v for d in lines(proc) for k, v in d.items() if k != "pid"}
    pids = [d["pid"] for d in lines(proc) if "pid" in d]
    assert out["child_status"] == 0
    child, parent = out["child"]["trainer/0"], out["parent"]["trainer/0"]
    assert child["sender"] != parent["sender"]
    assert child["records_total"] == 30 and child["dropped"] == {} and child["pending"] == 0
    assert parent["records_total"] == 170 and parent["dropped"] == {}
    wait_until(lambda: sum(b.received for b in books_of(rx.messages()).values()) >= 200)
    rx.stop()
    books = books_of(rx.messages())
    cb, pb = books[child["sender"]], books[parent["sender"]]
    assert {r[1] for r in cb.records} == {"child"} and cb.received == 30 and cb.consistent()
    assert cb.hellos[0]["pid"] == pids[0] != pb.hellos[0]["pid"]
    assert pb.received == 170 and pb.consistent() and pb.seq_gaps == 0
    assert [r[1] for r in pb.records].count("parent_queued_at_fork") == 50


def test_strict_mode_from_environment_raises_at_call_site(ep: str) -> None:
    proc = run_shim("""
        for call in (lambda: telemetry.gauge("g", float("nan")),
                     lambda: telemetry.timing(None, 1.0),
                     lambda: telemetry.publish(1, [1, 2])):
            try:
                call()
            except (TypeError, ValueError) as exc:
                print("raised", type(exc).__name__, exc, flush=True)
        telemetry.gauge("g", 1.0)
        dump()
    """, ep, env={"DFLASH_TELEMETRY_STRICT": "1"})
    assert proc.returncode == 0, proc.stderr
    raised = [line for line in proc.stdout.splitlines() if line.startswith("raised")]
    assert [line.split()[1] for line in raised] == ["ValueError", "TypeError", "TypeError"]
    (stats,) = lines(proc)[-1]["stats"].values()
    assert stats["pending"] + stats["records_total"] + sum(stats["dropped"].values()) == 1


def test_production_mode_never_raises_and_logs_once(ep: str, receivers) -> None:  # type: ignore[no-untyped-def]
    receivers(ep)  # values are only looked at when they are encoded for a subscribed receiver
    proc = run_shim("""
        import logging
        logging.basicConfig(level=logging.WARNING)
        class Odd:
            pass
        for i in range(3):
            telemetry.gauge("g", Odd())
            telemetry.gauge("g", float("nan"))
            telemetry.publish(i, None)
            telemetry.scalar("s", "text")
        telemetry.flush(wait_s=20)
        dump()
    """, ep)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("Odd is not a number") == 1  # logged once, not per call
    (stats,) = lines(proc)[-1]["stats"].values()
    assert stats["dropped"] == {"bad_argument": 3} and stats["records_total"] == 9


def test_import_is_light_and_starts_one_thread(ep: str, receivers) -> None:  # type: ignore[no-untyped-def]
    receivers(ep)
    proc = run_shim("""
        telemetry.publish(1, {"a_ms": 1.0})
        telemetry.timing("t", 1.0); telemetry.count("c"); telemetry.gauge("g", 1.0)
        telemetry.category("k", 1); telemetry.scalar("s", 1.0)
        with telemetry.timer("x"):
            pass
        for i in range(20_000):  # frames over 64 KiB: pyzmq's zero-copy path has its own thread
            telemetry.gauge("hidden_state_queue_depth", float(i))
        telemetry.flush(wait_s=20)
        heavy = sorted(m for m in ("torch", "wandb", "numpy", "sidecar", "trainer_shim.cuda_scalar")
                       if m in sys.modules)
        threads = sorted(t.name for t in threading.enumerate())
        print(json.dumps({"heavy": heavy, "threads": threads}))
    """, ep)
    assert proc.returncode == 0, proc.stderr
    assert lines(proc)[0]["heavy"] == []
    assert lines(proc)[0]["threads"] == ["MainThread", "trainer-shim-flusher"]



def test_gpu_check_dry_run_on_cpu() -> None:
    """``bench/gpu_check_shim.py`` without CUDA: the same loop on CPU, every shim call, exit 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check_shim.py"), "--steps", "6",
                           "--dim", "64"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CPU dry run" in proc.stdout
    assert "scalar values match" in proc.stdout


def test_a_fork_child_does_not_wait_at_exit_for_a_daemon_its_parent_never_had(ep: str) -> None:
    """A DataLoader joins its workers on the training thread at every epoch end: a worker whose
    parent saw no daemon must not spend its exit waiting ``linger_ms`` for one. Its records are
    counted (``no_receiver``), not waited for."""
    proc = run_shim("""
        from trainer_shim import transport
        telemetry.gauge("parent", 1.0)
        telemetry.flush(wait_s=20)  # the parent's socket exists and has no subscriber
        time.sleep(0.6)  # past the connect grace (0.5 s) in which a subscription may still come
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            def waited(self, timeout_ms):
                os.write(write, b"waited")
                return False
            transport.Transport.wait_for_subscriber = waited
            telemetry.count("child", 1)
            telemetry.close()
            dump("child")
            os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"child_status": status, "child_waited": os.read(read, 64).decode()}))
    """, ep)
    assert proc.returncode == 0, proc.stderr
    out = {k: v for d in lines(proc) for k, v in d.items() if k != "pid"}
    assert out["child_status"] == 0 and out["child_waited"] == ""
    child = out["child"]["trainer/0"]
    assert child["pending"] == 0 and child["records_total"] + sum(child["dropped"].values()) == 1
