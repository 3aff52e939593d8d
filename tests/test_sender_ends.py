"""Every sender's end is told (issue 33): real shim processes that end in each way the issue
lists, one real daemon (``--sender-gone-after 2``, so a case is counted about 3 s after its end), and
what the daemon exports for each case's role: one end, with the right ``how`` and signal, and the
loss accounting unchanged (made == accepted + dropped). The cases live in ``tests/soak/ends.py``.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from sidecar.cli.top import render, scrape
from tests import wandb_records
from tests.daemon_harness import DaemonProc, env, in_ci, wait_for
from tests.soak import ends

GONE_AFTER_S = 2.0

CASES = [
    # mode, how, signal label
    ("clean", "clean", ""),
    ("exit", "failed", ""),
    ("exception", "failed", ""),
    ("sigterm", "terminated", "SIGTERM"),
    ("sigint", "terminated", "SIGINT"),
    ("sigkill", "unclean", ""),
    ("abort", "crashed", "SIGABRT"),
    ("segfault", "crashed", "SIGSEGV"),
]
STATUS = {"clean": 0, "exit": 3, "exception": 1, "sigterm": -signal.SIGTERM, "sigint": -signal.SIGINT,
          "sigkill": -signal.SIGKILL, "abort": -signal.SIGABRT, "segfault": -signal.SIGSEGV}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path_factory.mktemp("ends"), "--sender-gone-after", str(GONE_AFTER_S))
    yield d
    d.stop()


def _told(d: DaemonProc, role: str) -> dict[str, int]:
    return wait_for(lambda: ends.ends_of(d, role), timeout_s=60, what=f"an end of {role}")


def test_each_end_is_told_once_with_its_how(daemon: DaemonProc) -> None:
    """All eight cases at once (each its own role): each end is counted once, with its how, signal,
    pid and step, and the loss accounting is exact (every case flushed before it ended)."""
    procs = {mode: ends.start(daemon, mode, f"end-{mode}") for mode, _, _ in CASES}
    done = {mode: ends.finish(p, f"end-{mode}", ends.SIGNALS.get(mode)) for mode, p in procs.items()}
    for mode, how, sig in CASES:
        role = f"end-{mode}"
        assert done[mode].status == STATUS[mode], (mode, done[mode])
        assert _told(daemon, role) == {how: 1}, mode
        last = ends.last_end(daemon, role)
        assert last is not None and last["how"] == how and last["signal"] == sig, (mode, last)
        assert last["pid"] == str(procs[mode].pid) and last["step"] == "7", (mode, last)
        total, dropped = ends.losses(daemon, role)
        assert total == done[mode].made, (mode, total, done[mode].made, dropped)
    time.sleep(GONE_AFTER_S + 2.5)  # two tally scans more: nothing is counted twice
    for mode, how, _ in CASES:
        assert ends.ends_of(daemon, f"end-{mode}") == {how: 1}, mode
    assert "sender ended: end-sigkill/0 pid" in daemon.log()


def test_a_terminated_pool_tells_each_worker(daemon: DaemonProc) -> None:
    """``Pool.terminate()`` SIGTERMs its workers: two ends, ``terminated`` by SIGTERM; exact."""
    r = ends.finish(ends.start(daemon, "pool", "end-pool", ends.POOL), "end-pool")
    assert r.status == 0
    wait_for(lambda: ends.ends_of(daemon, "end-pool").get("terminated") == 2, timeout_s=60, what="two ends")
    assert ends.ends_of(daemon, "end-pool") == {"terminated": 2}
    assert ends.last_end(daemon, "end-pool")["signal"] == "SIGTERM"  # type: ignore[index]
    assert ends.losses(daemon, "end-pool")[0] == r.made


def test_a_forked_child_sigkilled_mid_stream(daemon: DaemonProc) -> None:
    """The issue's case: a forked child counting at 4,000/s, SIGKILLed after 3 s. One ``unclean``
    end for its role; what it made after its last flush is unknown, within the stated bound, and
    everything up to that flush is counted."""
    r = ends.finish(ends.start(daemon, "", "end-forked", ends.FORKED_COUNTER), "end-forked")
    assert r.out["exitcode"] == -signal.SIGKILL
    assert _told(daemon, "end-forked") == {"unclean": 1}
    total, dropped = ends.losses(daemon, "end-forked")
    unknown = daemon.value("dflash_sidecar_sender_last_exit_unknown_records", role="end-forked")
    assert unknown is not None and unknown > 0
    assert total <= r.made <= total + unknown, (total, r.made, unknown, dropped)
    assert ends.last_end(daemon, "end-forked")["pid"] == str(r.out["pid"])  # type: ignore[index]


def test_an_oom_kill_in_a_memory_cgroup(daemon: DaemonProc) -> None:
    """A process that exhausts its memory cgroup is killed by the kernel's OOM killer: told as
    ``oom`` (the cgroup's ``oom_kill`` count rose). Skipped where no memory cgroup can be made."""
    made = ends.memory_cgroup(200 << 20)
    if isinstance(made, str):
        pytest.skip(f"no memory cgroup to run out of: {made}" + (" (CI)" if in_ci() else ""))
    group, enter = made
    try:
        r = ends.finish(ends.start(daemon, "oom", "end-oom", preexec=enter), "end-oom")
        assert r.status == -signal.SIGKILL, r
        assert _told(daemon, "end-oom") == {"oom": 1}
        assert ends.last_end(daemon, "end-oom")["signal"] == "SIGKILL"  # type: ignore[index]
        assert ends.losses(daemon, "end-oom")[0] == r.made
    finally:
        ends.remove_cgroup(group)


def test_nothing_is_told_twice_across_a_daemon_restart(tmp_path: Path) -> None:
    """A sender SIGKILLed while the daemon is down is told once by the next daemon, and not again
    by the one after it."""
    first = DaemonProc(tmp_path, "--sender-gone-after", str(GONE_AFTER_S))
    try:
        p = ends.start(first, "sigkill", "end-restart")
        assert p.stdout is not None
        p.stdout.readline()
    finally:
        first.stop(signal.SIGKILL)
    p.kill()
    p.communicate(timeout=30)
    for life in range(2):
        d = DaemonProc(tmp_path, "--sender-gone-after", str(GONE_AFTER_S))
        try:
            if life == 0:
                assert _told(d, "end-restart") == {"unclean": 1}
            else:
                time.sleep(GONE_AFTER_S + 3.5)
                assert ends.ends_of(d, "end-restart") == {}
        finally:
            d.stop()


def test_the_shims_signal_handling_keeps_the_trainers_behaviour(tmp_path: Path) -> None:
    """SIGINT over Python's own handler is left alone (``asyncio.run`` checks for it), and a
    trainer's own SIGINT handler still runs and decides the exit."""
    code = ("import signal, sys; from trainer_shim import telemetry\n"
            "own = lambda s, f: sys.exit(5)\n"
            "if sys.argv[2] == 'own': signal.signal(signal.SIGINT, own)\n"
            "telemetry.configure(endpoint=sys.argv[1], role='t', worker='0'); telemetry.count('n')\n"
            "h = signal.getsignal(signal.SIGINT)\n"
            "print(h is signal.default_int_handler, h is own, flush=True)\n"
            "signal.raise_signal(signal.SIGINT)\n")
    for mode, printed, status in (("python", "True False", -signal.SIGINT), ("own", "False False", 5)):
        out = subprocess.run([sys.executable, "-c", code, f"ipc://{tmp_path}/none.sock", mode], capture_output=True,
                             text=True, timeout=30, env=env())
        assert out.stdout.split("\n")[0] == printed, (mode, out.stdout, out.stderr)
        assert out.returncode == status, (mode, out.returncode, out.stderr)


def test_wandb_gets_an_event_row_and_a_rate_limited_alert(tmp_path: Path) -> None:
    """Into a real offline W&B run: the windows with an end carry ``ends/<role>/...``; two
    ``unclean`` ends of one role raise one alert (rate limited), a crash of another role its own,
    a clean end none."""
    wandb_dir = tmp_path / "wandb"
    wandb_dir.mkdir()
    d = DaemonProc(tmp_path, "--wandb-run", "ends-run", "--sender-gone-after", str(GONE_AFTER_S), interval=0.5,
                   extra_env={"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_SILENT": "true"})
    try:
        cases = [("sigkill", "wb"), ("sigkill", "wb"), ("segfault", "wb-crash"), ("clean", "wb-clean")]
        procs = [(ends.start(d, mode, role), mode, role) for mode, role in cases]
        for p, mode, role in procs:
            ends.finish(p, role, ends.SIGNALS.get(mode))
        wait_for(lambda: ends.ends_of(d, "wb") == {"unclean": 2} and ends.ends_of(d, "wb-crash")
                 and ends.ends_of(d, "wb-clean"), timeout_s=60, what="four ends")
        logged = d.value("dflash_sidecar_wandb_rows_logged_total") or 0
        wait_for(lambda: (d.value("dflash_sidecar_wandb_rows_logged_total") or 0) >= logged + 2, timeout_s=60,
                 what="the rows after the ends logged")
    finally:
        d.stop()
    (run_file,) = list(wandb_dir.rglob("*.wandb"))
    alerts = [(a.title, a.level) for a in wandb_records.of_type(run_file, "alert")]
    host = socket.gethostname()
    assert sorted(alerts) == sorted([(f"wb process ended unclean on {host}"[:63], "WARN"),
                                     (f"wb-crash process ended crashed on {host}"[:63], "WARN")]), alerts
    rows = [{k.replace(f"sidecar/{host}/", ""): v for k, v in row.items()}
            for row in wandb_records.history_rows(run_file)]
    assert max(r.get("ends/wb/unclean", 0) for r in rows) == 2
    assert any(r.get("ends/wb-crash/crashed") == 1 and r.get("ends/wb-crash/step") == 7 for r in rows)
    assert any(r.get("ends/wb-clean/clean") == 1 and r.get("ends/wb-clean/unknown_records") == 0 for r in rows)


def _open_gap(d: DaemonProc, role: str) -> float:
    """``dflash_ledger_open_gap_seconds`` of ``role``: above 0 once the run ledger counts all its senders gone."""
    return max((v for lab, v in d.samples().get("dflash_ledger_open_gap_seconds", []) if lab.get("role") == role),
               default=0.0)


def test_report_tells_the_ends_and_the_gap_after_an_unclean_one(tmp_path: Path) -> None:
    """A sender SIGKILLed, and its successor started once the end is told and the run ledger
    counts the role gone (a restart gap is the time from the role's last sender gone to its
    successor's start: a successor seen while the killed one still counts alive opens none, so
    the test waits for both): the run ledger books the restart gap under ``unclean``, and
    ``report`` shows the ends per role (and keeps them across the daemon's restart: they live in
    its state file). The other order, the successor's hello before the end is told, is
    ``tests/test_run_ledger.py``'s, with hand-built windows."""
    d = DaemonProc(tmp_path, "--sender-gone-after", str(GONE_AFTER_S))
    try:
        first = ends.start(d, "sigkill", "lr")
        ends.finish(first, "lr", signal.SIGKILL)
        wait_for(lambda: ends.ends_of(d, "lr") == {"unclean": 1}, timeout_s=60, what="the unclean end")
        wait_for(lambda: _open_gap(d, "lr") > 0, timeout_s=60, what="the role counted gone")
        second = ends.start(d, "sigterm", "lr")
        assert second.stdout is not None
        second.stdout.readline()
        time.sleep(1.5)  # windows with the successor alive
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=30)
        wait_for(lambda: ends.ends_of(d, "lr") == {"unclean": 1, "terminated": 1}, timeout_s=60, what="both ends")
        time.sleep(1.5)  # the window with the last end reaches the state file
    finally:
        d.stop()
    out = subprocess.run([sys.executable, "-m", "sidecar", "report", "--json", "--state-dir", str(tmp_path / "state")],
                         capture_output=True, text=True, env=env(), timeout=60, check=True)
    (role,) = [r for r in json.loads(out.stdout)["runs"] if r["role"] == "lr"]
    assert role["ends"] == {"unclean": 1, "terminated": 1}, role
    assert set(role["restart_gap_after"]) == {"unclean"} and role["restart_gap_after"]["unclean"] > 0, role
    table = subprocess.run([sys.executable, "-m", "sidecar", "report", "--state-dir", str(tmp_path / "state")],
                           capture_output=True, text=True, env=env(), timeout=60, check=True).stdout
    assert "sender ends" in table and "restart gap after" in table and "unclean " in table, table


def test_top_shows_each_roles_last_end(daemon: DaemonProc) -> None:
    """``top`` renders an event line with each role's last end, from a real scrape."""
    ends.finish(ends.start(daemon, "sigkill", "end-top"), "end-top", signal.SIGKILL)
    _told(daemon, "end-top")
    console = Console(width=400, record=True)
    console.print(render(scrape(daemon.url)))
    text = console.export_text()
    assert "ended: " in text and "end-top/0 pid" in text and "unclean at step 7" in text, text


FAULT_CHILD = """
import ctypes, faulthandler, os, sys, time
from trainer_shim import telemetry
if sys.argv[2] == "before":
    faulthandler.enable()
telemetry.configure(endpoint=sys.argv[1], role="t", worker="0")
telemetry.count("n")
telemetry.flush(wait_s=2)
time.sleep(0.3)  # the flusher wrote the tally (and armed its crash file) after the cycle
if sys.argv[2] == "after":
    faulthandler.enable()
ctypes.string_at(0)
"""


@pytest.mark.parametrize("trainer", ["none", "before", "after"])
def test_the_trainers_own_faulthandler_keeps_working(tmp_path: Path, trainer: str) -> None:
    """A segfault: where the trainer enabled faulthandler (before the shim started or after), its
    report still goes to the trainer's stderr and the shim's crash file stays empty; where it did
    not, stderr gets nothing (as without the shim) and the crash file names SIGSEGV."""
    (tmp_path / "s.sock.tallies").mkdir()  # as a daemon makes it: the shim never creates it
    out = subprocess.run([sys.executable, "-c", FAULT_CHILD, f"ipc://{tmp_path}/s.sock", trainer], capture_output=True,
                         text=True, timeout=60, env=env())
    assert out.returncode == -signal.SIGSEGV, out.stderr
    crash = [p.read_text() for p in (tmp_path / "s.sock.tallies").glob("*.crash")]
    in_stderr = "Fatal Python error: Segmentation fault" in out.stderr
    if trainer == "none":
        assert not in_stderr and len(crash) == 1 and crash[0].startswith("Fatal Python error: Segmentation fault")
    else:
        assert in_stderr and all(not text for text in crash), (out.stderr, crash)


CHAIN_AFTER_SHIM = """\
import os, signal, sys, time
from trainer_shim import telemetry
telemetry.configure(endpoint=sys.argv[1], role='t', worker='0'); telemetry.count('n')
seen = []
def mine(signum, frame):  # Lightning's _SignalConnector: its handlers, then the previous one if callable
    seen.append(signum)
    previous = handlers[signum]
    if callable(previous):
        previous(signum, frame)
handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
for s in handlers:
    signal.signal(s, mine)
os.kill(os.getpid(), getattr(signal, sys.argv[2]))
time.sleep(0.2)
print('went on after', seen, flush=True)
"""


@pytest.mark.parametrize("signame", ["SIGTERM"])
def test_a_handler_installed_after_the_shim_that_chains_to_it_keeps_the_process(tmp_path: Path,
                                                                                  signame: str) -> None:
    """A trainer (or Lightning's ``_SignalConnector``) that installs its handler after the shim's and
    calls the previous handler when it is callable decides the process's fate as without the shim:
    the shim's handler, called from another's, notes the signal but never kills the process (where
    it replaced ``SIG_DFL``, there was nothing to call)."""
    out = subprocess.run([sys.executable, "-c", CHAIN_AFTER_SHIM, f"ipc://{tmp_path}/none.sock", signame],
                         capture_output=True, text=True, timeout=30, env=env())
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert out.stdout.startswith(f"went on after [{int(getattr(signal, signame))}]"), out.stdout


QUIET_FORKS = """\
import os, sys, time
from trainer_shim import telemetry
telemetry.configure(endpoint=sys.argv[1], role=sys.argv[2], worker='0')
telemetry.publish(0, {'x': 1.0}); telemetry.flush(wait_s=5)
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:  # a raw fork that never publishes, and ends as such a child does
        time.sleep(0.5)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
"""


def test_a_forked_child_that_never_publishes_is_no_sender_that_ended(daemon: DaemonProc) -> None:
    """A child forked from a publishing process that makes no record (a raw ``os.fork`` ending with
    ``os._exit``, as forked helpers do) leaves no tally: the daemon never saw it, and telling its end
    as ``unclean`` (an alert, "100,000 records unknown") would be a false alarm per child. The
    parent's clean end is told, and nothing else."""
    out = subprocess.run([sys.executable, "-c", QUIET_FORKS, daemon.endpoint, "quietforks"], capture_output=True,
                         text=True, timeout=60, env=env())
    assert out.returncode == 0, out.stderr
    assert _told(daemon, "quietforks") == {"clean": 1}
    time.sleep(2 * GONE_AFTER_S + 2)  # the children's ends would be told by now
    assert ends.ends_of(daemon, "quietforks") == {"clean": 1}
