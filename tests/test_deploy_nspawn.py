"""deploy/ under a real systemd: systemd 252 as PID 1 of a systemd-nspawn container whose root is
an overlay of this machine's / (tests/nspawn_harness.py), driven as an operator would drive it.

One container serves the whole module: ``install.sh --trainer-user trainer`` runs once (the
fixture), then each test checks one thing, bringing the unit into the state it needs. The tests
run in file order and later ones rely on the install, not on each other's leftovers."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecar.cli.top import samples_of
from tests import nspawn_harness as harness
from tests.daemon_harness import PUBLISHER
from tests.deploy_support import REPO, build_project_wheel
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(900)   # the first test pays for the boot and the install

PLAIN = "dflash-sidecar.service"
TEMPLATE_RUN = "dflash-sidecar@nspawn-run.service"
TRAINER_UNIT = "fake-trainer.service"
ENDPOINT = "ipc:///run/dflash-sidecar/sidecar.sock"
SOCKET = "/run/dflash-sidecar/sidecar.sock"
PORT = 9478
VENV_PY = "/opt/dflash-sidecar/venv/bin/python"
CONFIG = "/etc/dflash-sidecar/config.toml"
MAX_EXPOSURE = 4.0
INTERVAL = 1.0
"""The aggregation window set in the config file, in seconds."""
PATIENCE_S = 90.0
"""How long a wait for a condition may take before the test fails: a liveness bound for a loaded
2-core CI box (a start there pays for importing the daemon), not a performance threshold."""

TRAINER_LOOP = """
import sys, time
from trainer_shim import telemetry
ch = telemetry.configure(endpoint=sys.argv[1], role="trainer", worker="loop", flush_interval_s=0.05)
step = 0
while True:
    ch.count("tokens", 1)
    step += 1
    if step % 20 == 0:
        telemetry.publish(step, {"step_ms": 1.0})
    time.sleep(0.01)
"""
"""A trainer that never stops: the fake trainer unit the upgrade must not touch."""

LISTENERS = r"""
import os, sys
port = int(sys.argv[1])
inodes = {}
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as f:
        for line in list(f)[1:]:
            local, state, inode = line.split()[1], line.split()[3], line.split()[9]
            host, p = local.rsplit(":", 1)
            if state == "0A" and int(p, 16) == port:
                inodes[inode] = host
owners = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners[inodes[target[8:-1]]] = int(pid)
    except OSError:
        pass
print(" ".join(f"{host}={owners.get(host, 0)}" for host in inodes.values()))
"""
"""Inside the container: 'ADDRESS=PID' for every socket listening on the port (hex address as in
/proc/net/tcp: 0100007F is 127.0.0.1)."""


@dataclass
class Box:
    container: harness.Container
    install: str                  # install.sh's output
    install_cmd: str
    api_key: str                  # the fake WANDB_API_KEY in /etc/dflash-sidecar/env

    def sh(self, script: str, **kwargs) -> subprocess.CompletedProcess[str]:
        return self.container.sh(script, **kwargs)

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """The daemon's /metrics, read inside the container (it has only a loopback network)."""
        text = self.sh(f"python3 -c 'import urllib.request; print(urllib.request.urlopen("
                       f"\"http://127.0.0.1:{PORT}/metrics\", timeout=5).read().decode())'").stdout
        return samples_of(text)

    def accepted(self, worker: str) -> float:
        """Records the running daemon accepted from ``worker`` (0 when it has none, or no answer)."""
        try:
            samples = self.metrics()
        except AssertionError:
            return 0.0
        return sum(v for lab, v in samples.get("dflash_sidecar_records_accepted_total", [])
                   if lab.get("worker") == worker)

    def listeners(self) -> dict[str, int]:
        out = self.sh(f"python3 -c {shlex.quote(LISTENERS)} {PORT}").stdout.split()
        return {host: int(pid) for host, pid in (item.split("=") for item in out)}

    def state(self, unit: str) -> str:
        return self.sh(f"systemctl is-active {shlex.quote(unit)}", check=False).stdout.strip()

    def journal_cursor(self) -> str:
        out = self.sh("journalctl --no-pager -n 0 --show-cursor").stdout
        return out.split("-- cursor: ", 1)[1].strip()

    def journal(self, cursor: str, *units: str) -> str:
        """Journal entries after ``cursor`` (of ``units``, or of everything)."""
        flags = " ".join(f"-u {shlex.quote(u)}" for u in units)
        return self.sh(f"journalctl --no-pager -o cat --after-cursor={shlex.quote(cursor)} {flags}").stdout

    def start(self, unit: str) -> int:
        """Start ``unit`` (a no-op when it runs) and return its MainPID. The tests start, restart
        and kill the daemon more often in two minutes than StartLimitBurst= lets an operator, so
        the start-rate counter is reset first."""
        self.sh(f"systemctl reset-failed {shlex.quote(unit)} 2>/dev/null || true; systemctl start {shlex.quote(unit)}")
        return self.container.main_pid(unit)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    try:
        harness.check_host()
        cache = harness.cache_dir()
        nspawn = harness.nspawn_binary(cache)
        wheel = build_project_wheel(tmp_path_factory.mktemp("wheel"))
        house = harness.wheelhouse(cache, wheel, tmp_path_factory.mktemp("wheelhouse"))
    except harness.Unavailable as exc:
        harness.skip_or_fail(str(exc))
    log = tmp_path_factory.mktemp("nspawn") / "console.log"
    container = harness.Container(nspawn, {REPO: harness.SRC, house: harness.WHEELS}, log)
    try:
        container.wait_booted()
        container.sh("useradd --create-home trainer && useradd --create-home stranger")
        install_cmd = (f"bash {harness.SRC}/deploy/install.sh --python {harness.SYSTEM_PYTHON} "
                       f"--wheel {harness.WHEELS}/{wheel.name} --pip-arg=--no-index "
                       f"--pip-arg=--find-links={harness.WHEELS} --trainer-user trainer")
        # only the wheelhouse: pip's configuration on this machine must not reach the install
        result = container.sh(f"PIP_CONFIG_FILE=/dev/null {install_cmd}", timeout=600)
        # what an operator edits after the install: the key, and a short window (the counters the
        # tests read are published once per window)
        api_key = "fake-" + secrets.token_hex(20)
        container.sh(f"sed -i 's/^WANDB_API_KEY=.*/WANDB_API_KEY={api_key}/' /etc/dflash-sidecar/env && "
                     f"echo 'interval = {INTERVAL}' >> {CONFIG}")
        yield Box(container, result.stdout + result.stderr, install_cmd, api_key)
    finally:
        container.stop()
    wait_until(lambda: harness.leftovers(container.work, container.cgroup) == [], PATIENCE_S, 0.2,
               "the stopped container to leave nothing behind")


# -- install, start, metrics -----------------------------------------------------------------------

def test_install_creates_the_user_the_group_membership_and_the_socket_directory(box: Box) -> None:
    assert "added trainer to group dflash-sidecar" in box.install, box.install
    assert "systemctl enable --now dflash-sidecar.service" in box.install, "systemd is running: no 'skipped'"
    assert "dflash-sidecar" in box.sh("id -nG trainer").stdout.split()
    assert "dflash-sidecar" not in box.sh("id -nG stranger").stdout.split()
    assert box.sh("stat -c '%a %U %G' /run/dflash-sidecar").stdout.split() == ["750", "dflash-sidecar",
                                                                                "dflash-sidecar"]
    assert box.sh("stat -c '%a %U' /etc/dflash-sidecar/env").stdout.split() == ["600", "root"]
    loaded = box.container.show(PLAIN, "LoadState", "FragmentPath")
    assert loaded == {"LoadState": "loaded", "FragmentPath": f"/etc/systemd/system/{PLAIN}"}


def test_start_returns_once_the_daemon_is_ready(box: Box) -> None:
    """Type=notify: `systemctl start` returns after READY=1, which the daemon sends once its socket
    and port are bound, so the metrics answer at once (no waiting here)."""
    box.sh(f"systemctl stop {PLAIN} {TEMPLATE_RUN}")
    cursor = box.journal_cursor()
    box.start(PLAIN)
    shown = box.container.show(PLAIN, "Type", "ActiveState", "SubState", "StatusText")
    assert shown == {"Type": "notify", "ActiveState": "active", "SubState": "running", "StatusText": "serving"}
    assert "dflash_sidecar_start_time_seconds" in box.sh(
        f"python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:{PORT}/metrics\")"
        ".read().decode())'").stdout
    log = box.journal(cursor, PLAIN)
    assert "dflash-sidecar started: endpoints ipc:///run/dflash-sidecar/sidecar.sock" in log, log


def test_metrics_are_served_on_loopback_only(box: Box) -> None:
    pid = box.start(PLAIN)
    assert box.listeners() == {"0100007F": pid}, "one listener, 127.0.0.1, the daemon's"


# -- the socket ----------------------------------------------------------------------------------

def test_a_group_member_is_counted_exactly_and_a_stranger_is_refused(box: Box) -> None:
    box.start(PLAIN)
    assert box.sh(f"stat -c '%a %U %G' {SOCKET}").stdout.split() == ["660", "dflash-sidecar", "dflash-sidecar"]
    spec = json.dumps({"endpoint": ENDPOINT, "role": "trainer", "worker": "member", "n": 300})
    out = box.sh(f"{VENV_PY} -c {shlex.quote(PUBLISHER)} {shlex.quote(spec)}", user="trainer").stdout
    res = json.loads(out.strip().splitlines()[-1])
    assert res["records_total"] >= 4 * 300 and res["records_total"] + sum(res["dropped"].values()) == res["calls"], res
    wait_until(lambda: box.accepted("member") == res["records_total"], PATIENCE_S, 0.3,
               f"the daemon to count exactly the member's {res['records_total']} records")

    refused = box.sh(f"{VENV_PY} -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{SOCKET}\")'",
                     user="stranger", check=False)
    assert refused.returncode != 0 and "PermissionError" in refused.stderr, refused.stderr
    stranger = (f"from trainer_shim import telemetry; ch = telemetry.configure(endpoint='{ENDPOINT}', "
                "role='trainer', worker='stranger'); [ch.count('tokens', 1) for _ in range(50)]; "
                "telemetry.flush(wait_s=2.0); print(telemetry.stats()[('trainer', 'stranger')]['records_total'])")
    assert box.sh(f"{VENV_PY} -c {shlex.quote(stranger)}", user="stranger").stdout.split() == ["0"]
    assert box.accepted("stranger") == 0


# -- reload, restart, recovery -------------------------------------------------------------------

def test_reload_applies_the_change_in_the_same_process(box: Box) -> None:
    pid = box.start(PLAIN)
    original = box.sh(f"cat {CONFIG}").stdout
    longer = INTERVAL * 3
    cursor = box.journal_cursor()
    try:
        box.sh(f"sed -i 's/^interval = {INTERVAL}$/interval = {longer}/' {CONFIG} && systemctl reload {PLAIN}")
        wait_until(lambda: "config reloaded (interval)" in box.journal(cursor, PLAIN), PATIENCE_S, 0.2,
                   "the daemon to log the reloaded interval")
        assert box.container.main_pid(PLAIN) == pid
        assert box.state(PLAIN) == "active"

        def long_window() -> bool:   # the windows the console exporter logs grow to the new length
            after = box.journal(cursor, PLAIN).split("config reloaded (interval)", 1)[-1]
            return any(float(s) > (INTERVAL + longer) / 2 for s in re.findall(r"\bwindow (\d+\.\d)s \|", after))

        wait_until(long_window, PATIENCE_S, 0.3, f"a window of {longer} s")
    finally:
        box.sh(f"cat > {CONFIG} && systemctl reload {PLAIN}", input=original)



def test_a_wrong_config_fails_once_and_is_not_restarted(box: Box) -> None:
    """A config error exits with status 2 (wrong invocation) every time: RestartPreventExitStatus=
    keeps Restart= from retrying it, so the unit stays failed with its message in the journal."""
    box.start(PLAIN)
    original = box.sh(f"cat {CONFIG}").stdout
    cursor = box.journal_cursor()
    try:
        box.sh(f"echo 'no_such_setting = 1' >> {CONFIG}")
        box.sh(f"systemctl restart {PLAIN}", check=False)

        def failed() -> dict[str, str]:
            shown = box.container.show(PLAIN, "ActiveState", "ExecMainStatus", "NRestarts")
            return shown if shown["ActiveState"] == "failed" else {}

        shown = wait_until(failed, PATIENCE_S, 0.3, "the unit to fail on the wrong config")
        assert shown["ExecMainStatus"] == "2", shown
        assert "no_such_setting" in box.journal(cursor, PLAIN)
        restarts = shown["NRestarts"]
        box.sh("sleep 5")  # more than RestartSec=2s: Restart=on-failure would have tried by now
        again = box.container.show(PLAIN, "ActiveState", "NRestarts")
        assert again == {"ActiveState": "failed", "NRestarts": restarts}, again
    finally:
        box.sh(f"cat > {CONFIG}", input=original)
        box.start(PLAIN)


@pytest.fixture
def trainer(box: Box) -> Iterator[int]:
    """The fake trainer: a transient unit running as user trainer, publishing for ever.
    Returns its MainPID."""
    box.start(PLAIN)
    box.sh(f"systemctl stop {TRAINER_UNIT} 2>/dev/null; systemctl reset-failed {TRAINER_UNIT} 2>/dev/null; "
           f"systemd-run --quiet --unit={TRAINER_UNIT} --description='fake trainer' --uid=trainer --gid=trainer "
           f"{VENV_PY} -c {shlex.quote(TRAINER_LOOP)} {ENDPOINT}")
    wait_until(lambda: box.accepted("loop") > 0, PATIENCE_S, 0.3, "the fake trainer's records to arrive")
    try:
        yield box.container.main_pid(TRAINER_UNIT)
    finally:
        box.sh(f"systemctl stop {TRAINER_UNIT}", check=False)


def test_restart_and_the_shim_reconnects(box: Box, trainer: int) -> None:
    def ledger_s() -> float:
        try:
            samples = box.metrics()
        except AssertionError:
            return 0.0
        # a fresh ledger would also reach back to the trainer's start, but as unobserved time
        return sum(v for lab, v in samples.get("dflash_ledger_seconds_total", []) if lab["cause"] != "unobserved")

    # more watched time than the first window after a restart can hold on its own
    ledger_before = wait_until(lambda: (v := ledger_s()) > 4 * INTERVAL and v, PATIENCE_S, 0.3,
                               "the trainer's run in the run ledger")
    before = box.container.main_pid(PLAIN)
    box.sh(f"systemctl reset-failed {PLAIN} 2>/dev/null || true; systemctl restart {PLAIN}")
    after = box.container.main_pid(PLAIN)
    assert after not in (0, before)
    # the new daemon's counters start at zero: anything from the trainer means it reconnected
    wait_until(lambda: box.accepted("loop") > 0, PATIENCE_S, 0.3, "the trainer's shim to reconnect")
    assert box.container.main_pid(TRAINER_UNIT) == trainer
    # the run ledger continues from its state file in StateDirectory=, it does not start again
    assert wait_until(ledger_s, PATIENCE_S, 0.3, "the run ledger after the restart") >= ledger_before
    box.sh("test -s /var/lib/dflash-sidecar/run-ledger.json")


def test_kill_9_is_recovered_by_restart(box: Box, trainer: int) -> None:
    before = box.container.show(PLAIN, "MainPID", "NRestarts")
    box.sh(f"kill -9 {before['MainPID']}")

    def back() -> dict[str, str]:
        shown = box.container.show(PLAIN, "ActiveState", "MainPID", "NRestarts")
        return shown if shown["ActiveState"] == "active" and shown["MainPID"] != before["MainPID"] else {}

    restarted = wait_until(back, PATIENCE_S, 0.3, "Restart= to bring the daemon back")
    assert restarted["MainPID"] not in ("0", before["MainPID"])
    assert int(restarted["NRestarts"]) == int(before["NRestarts"]) + 1
    wait_until(lambda: box.accepted("loop") > 0, PATIENCE_S, 0.3, "the trainer's shim to reconnect")


# -- the sandbox, as the daemon sees it -------------------------------------------------------------

def test_the_sandbox_inside_the_daemons_namespace(box: Box) -> None:
    pid = box.start(PLAIN)
    status = dict(line.split(":\t", 1) for line in box.sh(f"cat /proc/{pid}/status").stdout.splitlines()
                  if ":\t" in line)
    uid = box.sh("id -u dflash-sidecar").stdout.strip()
    gid = box.sh("id -g dflash-sidecar").stdout.strip()
    assert status["Uid"].split() == [uid] * 4 and status["Gid"].split() == [gid] * 4
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2", "a seccomp filter (SystemCallFilter=)"
    assert "SCHED_IDLE" in box.sh(f"chrt -p {pid}").stdout
    assert box.sh(f"ionice -p {pid}").stdout.strip() == "idle"
    inside = f"nsenter --mount --target={pid} --"
    assert box.sh(f"{inside} test -w /usr", check=False).returncode != 0, "ProtectSystem=strict: /usr read-only"
    assert box.sh(f"{inside} test -w /etc", check=False).returncode != 0, "ProtectSystem=strict: /etc read-only"
    assert box.sh(f"{inside} test -w /var/lib/dflash-sidecar").returncode == 0, "its state directory is writable"
    assert box.sh(f"{inside} test -e /home/trainer", check=False).returncode != 0, "ProtectHome=yes"
    assert box.sh("test -e /home/trainer").returncode == 0


def test_systemd_analyze_security_of_the_loaded_unit(box: Box) -> None:
    box.start(PLAIN)
    out = box.sh(f"systemd-analyze security --no-pager {PLAIN}").stdout
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", out)
    assert m and float(m.group(1)) <= MAX_EXPOSURE, out


def test_cgroup_limits(box: Box) -> None:
    box.start(PLAIN)
    writable = box.sh("findmnt -n -o OPTIONS /sys/fs/cgroup/memory", check=False).stdout
    if writable and "ro" in writable.split(","):
        pytest.skip("cgroup limits cannot be enforced here: systemd-nspawn mounts the cgroup v1 controllers "
                    "read-only, so MemoryMax=/CPUQuota= have no cgroup to act on")
    cgroup = box.container.show(PLAIN, "ControlGroup")["ControlGroup"]
    assert box.sh(f"cat /sys/fs/cgroup{cgroup}/memory.max").stdout.strip() == str(1 << 30)


# -- switching units, upgrade, secrets ---------------------------------------------------------------

def test_switching_between_the_template_and_the_plain_unit(box: Box) -> None:
    """Each way, `systemctl start` of the other unit succeeds, the old daemon is stopped first, and
    the port is handed over to the new one."""
    plain = box.start(PLAIN)
    cursor = box.journal_cursor()
    instance = box.start(TEMPLATE_RUN)
    assert box.state(PLAIN) == "inactive" and box.state(TEMPLATE_RUN) == "active"
    assert box.listeners() == {"0100007F": instance} and instance != plain
    plain = box.start(PLAIN)
    assert box.state(TEMPLATE_RUN) == "inactive" and box.state(PLAIN) == "active"
    assert box.listeners() == {"0100007F": plain}
    log = box.journal(cursor)
    assert "Address already in use" not in log, log


def running_services(box: Box) -> dict[str, int]:
    """{unit: MainPID} of every running service in the container."""
    units = box.sh("systemctl list-units --type=service --state=running --no-legend --plain").stdout
    names = [f[0] for f in map(str.split, units.splitlines()) if f[1:4] == ["loaded", "active", "running"]]
    return {name: box.container.main_pid(name) for name in names}


def test_upgrade_restarts_only_the_sidecar(box: Box, trainer: int) -> None:
    box.sh(f"systemctl reset-failed {PLAIN} 2>/dev/null || true")
    before = running_services(box)
    assert {PLAIN, TRAINER_UNIT, "systemd-journald.service"} <= before.keys(), before
    out = box.sh(f"PIP_CONFIG_FILE=/dev/null {box.install_cmd} --upgrade", timeout=600).stdout
    assert "restarting the running sidecar units only" in out, out
    after = running_services(box)
    assert after.keys() == before.keys(), (before, after)
    assert {unit for unit in before if after[unit] != before[unit]} == {PLAIN}, (before, after)
    assert box.container.main_pid(TRAINER_UNIT) == trainer
    wait_until(lambda: box.accepted("loop") > 0, PATIENCE_S, 0.3, "the trainer's shim to reconnect after the upgrade")


def test_no_secret_in_the_journal_or_in_systemctl_show(box: Box) -> None:
    """The key from /etc/dflash-sidecar/env reaches both daemons (so the check below means
    something) but nothing systemd shows or logs. (No W&B login is attempted: the container has
    no network and no trainer announces a shared-mode run; tests/test_wandb_join.py covers the
    daemon's own redaction.)"""
    cursor = box.journal_cursor()
    for unit in (TEMPLATE_RUN, PLAIN):
        pid = box.start(unit)
        environ = box.sh(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
        assert f"WANDB_API_KEY={box.api_key}" in environ, unit
    log = box.journal(cursor, TEMPLATE_RUN)
    assert "run=nspawn-run mode=online credentials=WANDB_API_KEY" in log, log
    for what in ("journalctl --no-pager -o export", f"systemctl show {PLAIN}", f"systemctl show {TEMPLATE_RUN}",
                 f"systemctl status --no-pager -l {PLAIN} {TEMPLATE_RUN}"):
        out = box.sh(what, check=False).stdout
        assert out, what
        assert box.api_key not in out, f"the key is in `{what}`"


# -- nothing left behind -----------------------------------------------------------------------------

KILLED_HOLDER = """
import json, sys, time
from pathlib import Path
from tests import nspawn_harness as h
c = h.Container(Path(sys.argv[1]), {}, Path(sys.argv[2]))
c.wait_booted()
print(json.dumps({"work": str(c.work), "cgroup": c.cgroup, "pid1": c.pid1}), flush=True)
time.sleep(600)
"""


def test_a_killed_test_process_leaves_nothing_behind(box: Box, tmp_path: Path) -> None:
    """The process that booted a container dies by SIGKILL (no finally, no atexit): the boot script
    (its parent-death signal) halts the container and removes its mounts and cgroups."""
    nspawn = harness.nspawn_binary(harness.cache_dir())
    holder = subprocess.Popen([sys.executable, "-c", KILLED_HOLDER, str(nspawn), str(tmp_path / "console.log")],
                              stdout=subprocess.PIPE, text=True, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout is not None
        booted = json.loads(holder.stdout.readline() or "{}")
        assert booted, (tmp_path / "console.log").read_text(errors="replace")
        running = harness.leftovers(Path(booted["work"]), booted["cgroup"])
        assert any(item.startswith("cgroup ") for item in running) and \
            any(item.startswith("process ") for item in running), running   # the check sees a live one
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    wait_until(lambda: harness.leftovers(Path(booted["work"]), booted["cgroup"]) == [], PATIENCE_S, 0.2,
               "the killed test's container to be cleaned up")
