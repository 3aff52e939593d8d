"""Trainers' own names end to end: a real daemon process and a real shim publisher process.

The publisher plays the reference DFlash trainer's monitor thread: one profile dict of per-batch
means (``target.model_forward_ms``, ``drafter.queue_get_ms``, ...) every 0.2 s, its values read
from a scenario file the test rewrites, so the injected bottleneck changes while both run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc, env, explain, verdict, wait_for
from tests.fake_nvml.control import FakeNvml
from tests.fake_nvml.helpers import library_or_skip

MONITOR = textwrap.dedent("""
    import json, sys, time
    from trainer_shim import telemetry
    scenario, endpoint = sys.argv[1], sys.argv[2]
    telemetry.configure(endpoint=endpoint, role="monitor", worker="0", flush_interval_s=0.05)
    step = 0
    while True:
        try:
            profile = json.loads(open(scenario).read())
        except (OSError, ValueError):
            profile = {}
        if profile.get("stop"):
            break
        step += 10
        telemetry.publish(step, profile)
        time.sleep(0.2)
    telemetry.flush(); telemetry.close()
""")

# Per-batch means (ms) as the reference trainer's profile snapshot has them.
SEED = {
    "balanced": {"target.model_forward_ms": 60, "target.pack_hidden_ms": 6, "target.queue_put_ms": 2,
                 "drafter.queue_get_ms": 1, "drafter.forward_ms": 16, "drafter.backward_ms": 26},
    "target-bound": {"target.model_forward_ms": 160, "target.pack_hidden_ms": 6, "target.queue_put_ms": 0.5,
                     "drafter.queue_get_ms": 60, "drafter.forward_ms": 16, "drafter.backward_ms": 26},
    "drafter-bound": {"target.model_forward_ms": 60, "target.pack_hidden_ms": 6, "target.queue_put_ms": 80,
                      "drafter.queue_get_ms": 0.5, "drafter.forward_ms": 40, "drafter.backward_ms": 80},
    "queue-starved": {"target.model_forward_ms": 60, "target.pack_hidden_ms": 90, "target.queue_put_ms": 1,
                      "drafter.queue_get_ms": 50, "drafter.forward_ms": 16, "drafter.backward_ms": 26},
    "input-bound": {"target.data_wait_ms": 120, "target.model_forward_ms": 60, "target.pack_hidden_ms": 6,
                   "target.queue_put_ms": 0.5, "drafter.queue_get_ms": 60, "drafter.forward_ms": 16,
                   "drafter.backward_ms": 26},
}


class Monitor:
    """The publisher subprocess and its scenario file."""

    def __init__(self, tmp: Path, endpoint: str, profile: dict[str, float]) -> None:
        self.path = tmp / "scenario.json"
        self.set(profile)
        self.proc = subprocess.Popen([sys.executable, "-c", MONITOR, str(self.path), endpoint], env=env(),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def set(self, profile: dict[str, object]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(profile))
        tmp.replace(self.path)

    def stop(self) -> None:
        self.set({"stop": True})
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_seed_profile_dict_from_one_monitor_thread_gets_real_verdicts(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path)
    mon = Monitor(tmp_path, d.endpoint, SEED["balanced"])
    try:
        for expected in ("balanced", "target-bound", "drafter-bound", "queue-starved", "input-bound", "balanced"):
            mon.set(SEED[expected])
            wait_for(lambda expected=expected: verdict(d) == expected, timeout_s=20, what=f"verdict {expected}")
        # the roles came from the keys, the channel's role (monitor) carries none of the timings
        shares = {(lab["role"], lab["phase"]): v for lab, v in d.samples()["dflash_pipeline_time_share_ratio"]}
        assert shares["drafter", "queue_wait"] == pytest.approx(1 / 43, abs=0.02)
        assert shares["target", "forward"] == pytest.approx(60 / 68, abs=0.02)
        assert not any(role == "monitor" for role, _ in shares)
        assert d.value("dflash_trainer_model_forward_seconds_count", role="target", worker="0") > 0
    finally:
        mon.stop()
        d.stop()
    assert "verdict unknown" not in "".join(d.log().splitlines()[4:-3])  # no window without a verdict


def test_explain_lists_series_mappings_and_what_each_verdict_lacks(tmp_path: Path) -> None:
    cfg = tmp_path / "sidecar.toml"
    cfg.write_text('[[mapping]]\nmatch = "loader.*.fetch_ms"\nworker = "$1"\nphase = "data_wait"\n'
                   '[[mapping]]\nmatch = "never.*.seen_ms"\nworker = "$1"\nphase = "comm_wait"\n')
    d = DaemonProc(tmp_path, "--config", str(cfg))
    mon = Monitor(tmp_path, d.endpoint, {"loader.3.fetch_ms": 5.0, "drafter.forward_ms": 16, "mystery_ms": 1.0})
    try:
        wait_for(lambda: "mystery" in explain(d), what="the series to show in explain")
        text = explain(d)
        assert "monitor/3 timing 'loader.3.fetch_ms' -> data_wait [mapping[1]; snapshot]" in text
        assert "drafter/0 timing 'forward_ms' -> forward [key grammar + preset dflash; snapshot]" in text
        assert "monitor/0 timing 'mystery_ms' -> unmapped [-; snapshot]" in text
        # in the form this trainer publishes: a key of its profile dict
        assert 'drafter queue_wait: "drafter.queue_wait_ms": <ms> in the dict you publish(step, {...})' in text
        assert 'a [[mapping]] block in the config with match = "<your name>", role = "drafter", phase = "queue_wait"' \
            in text
        assert '# [[mapping]]\n# match = "mystery_ms"\n# phase = "<one of:' in text  # no guess: commented out
        assert "mapping rules that matched no series yet:\n  match = 'never.*.seen_ms' -> comm_wait" in text
        data = json.loads(explain(d, "--json"))
        assert {"verdict", "series", "missing", "unused_rules"} <= set(data)
    finally:
        mon.stop()
        d.stop()


def test_unknown_says_why_once_and_names_explain(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path)
    mon = Monitor(tmp_path, d.endpoint, {"mystery_ms": 3.0})
    try:
        wait_for(lambda: d.log().count("verdict unknown") >= 3, what="three unknown windows")
    finally:
        mon.stop()
        d.stop()
    log = d.log()
    lines = [line for line in log.splitlines() if "verdict unknown" in line and "too short" not in line]
    assert lines and all("no phase timings from role(s) monitor" in line or "no series mapped" in line
                         for line in lines), lines
    assert log.count("dflash-sidecar explain") == 1


def test_bad_mapping_file_is_refused_at_start_and_a_good_one_reloads_on_sighup(tmp_path: Path) -> None:
    cfg = tmp_path / "sidecar.toml"
    cfg.write_text('[[mapping]]\nmatch = "fetch_ms"\nphase = "dataload"\n')
    out = subprocess.run([sys.executable, "-m", "sidecar", "run", "--config", str(cfg), "--no-gpu-metrics"],
                         env=env(), capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.returncode == 2
    assert "invalid [[mapping]]" in out.stderr and "unknown phase/meaning 'dataload'" in out.stderr
    cfg.write_text('[[mapping]]\nmatch = "fetch_ms"\nphase = "data_wait"\n')
    d = DaemonProc(tmp_path, "--config", str(cfg))
    mon = Monitor(tmp_path, d.endpoint, {"fetch_ms": 5.0, "forward_ms": 5.0})
    try:
        wait_for(lambda: "'fetch_ms' -> data_wait [mapping[1]" in explain(d), what="the first mapping")
        cfg.write_text('[[mapping]]\nregex = "fetch_ms"\nphase = "comm_wait"\n')
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "'fetch_ms' -> comm_wait [mapping[1]" in explain(d), what="the reloaded mapping")
        wait_for(lambda: verdict(d) == "communication-bound", what="the verdict from the new meaning")
        cfg.write_text('[[mapping]]\nmatch = "x.*_ms"\nphase = "comm_wait"\n')  # unused capture
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload rejected" in d.log(), what="the bad reload to be rejected")
        assert "capture $1 is not used" in d.log()
        assert "'fetch_ms' -> comm_wait" in explain(d) and d.proc.poll() is None
    finally:
        mon.stop()
        d.stop()


def test_idle_attribution_follows_fake_nvml_utilization_per_gpu(tmp_path: Path) -> None:
    library = library_or_skip("full")
    fake = FakeNvml(tmp_path / "nvml-control.txt", library, {"devices": 2})
    fake.gpu("*", clock_reasons=0, utilization_gpu=100)
    fake.gpu(0, utilization_gpu=30, gpm_supported=0)  # the targets' GPU, no GPM: NVML utilization, idle 0.7
    fake.gpu(1, gpm_supported=1, gpm_sm_util=60, utilization_gpu=100)  # drafters': GPM says idle 0.4
    d = DaemonProc(tmp_path, "--nvml-interval", "0.2", "--gpu-group", "target=0", "--gpu-group", "drafter=1", gpu=True,
                   extra_env={"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(fake.path)})
    mon = Monitor(tmp_path, d.endpoint, SEED["input-bound"])

    def idle() -> dict[str, dict[str, float]]:
        samples = d.samples()
        out: dict[str, dict[str, float]] = {}
        for lab, v in samples.get("dflash_pipeline_gpu_idle_ratio", []):
            out.setdefault(lab["group"], {})["idle"] = v
        for lab, v in samples.get("dflash_pipeline_gpu_idle_reason_ratio", []):
            out.setdefault(lab["group"], {})[lab["reason"]] = v
        return out

    try:
        # (windows before the first profile dict arrives have idle GPUs and nothing to explain it)
        got = wait_for(lambda: (i := idle()) and i.get("target", {}).get("idle") == pytest.approx(0.7)
                       and i.get("drafter", {}).get("idle") == pytest.approx(0.4)
                       and i["target"].get("data", 0.0) > 0 and i, what="idle shares with the profile's waits")
        for parts in got.values():  # the split sums to the idle share
            assert sum(v for k, v in parts.items() if k != "idle") == pytest.approx(parts["idle"])
        # targets wait on data for 120 of 186.5 ms: 0.64 of the 0.7 idle is data, the rest unexplained
        assert got["target"]["data"] == pytest.approx(120 / 186.5, abs=0.01)
        assert got["target"]["unexplained"] == pytest.approx(0.7 - 120 / 186.5, abs=0.01)
        # drafters wait on the queue for 60 of 102 ms (0.59), more than the 0.4 idle: all of it is queue
        assert got["drafter"]["queue"] == pytest.approx(0.4) and got["drafter"]["unexplained"] == 0.0
        fake.gpu(0, utilization_gpu=100)  # scripted while the daemon runs
        got = wait_for(lambda: (i := idle()) and i["target"]["idle"] == 0.0 and i, what="GPU 0 busy")
        assert got["target"]["data"] == 0.0 and got["target"]["unexplained"] == 0.0
    finally:
        mon.stop()
        d.stop()
    assert "gpu idle" in d.log()
