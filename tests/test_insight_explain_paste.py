"""``explain`` writes a config that works when pasted: a real daemon and a real plain loop (a
subprocess publishing every occurrence through the shim) whose data wait and optimizer step are
timed under names no preset knows. The first daemon names them unattributed (never a verdict by
them alone); its explain output, pasted whole into a config file, makes a second daemon on the
same endpoint give the injected verdict."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.daemon_harness import ROOT, DaemonProc, env, wait_for

LOOP = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from trainer_shim import telemetry
    endpoint, stop = sys.argv[1], Path(sys.argv[2])
    telemetry.configure(endpoint=endpoint, role="trainer", worker="0", flush_interval_s=0.05)

    def phase(name, ms):
        t0 = time.perf_counter()
        time.sleep(ms / 1000)
        telemetry.timing(name, (time.perf_counter() - t0) * 1000)

    while not stop.exists():  # every moment of the step timed, back to back
        phase("fetch_ms", 30)      # the data loader, under a name of the trainer's own
        phase("forward_ms", 6)
        phase("backward_ms", 10)
        phase("t_update_ms", 4)    # the optimizer step, under a name of its own
        telemetry.count("batches")
    telemetry.flush(); telemetry.close()
""")


def explain(d: DaemonProc) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "sidecar", "explain", "--prometheus-addr", f"127.0.0.1:{d.port}",
                          "--json"], env=env(), capture_output=True, text=True, timeout=30, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def verdict(d: DaemonProc) -> str | None:
    on = [lab["verdict"] for lab, v in d.samples().get("dflash_pipeline_bottleneck", []) if v == 1.0]
    return on[0] if on else None


@pytest.mark.timeout(90)
def test_pasting_explains_config_gives_the_verdict(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    first = DaemonProc(tmp_path)
    loop = subprocess.Popen([sys.executable, "-c", LOOP, first.endpoint, str(stop)], env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    second = None
    try:
        def ready() -> dict[str, object] | None:
            d = explain(first)
            return d if "fetch_ms" in str(d.get("config")) and "unattributed" in str(d.get("verdict")) else None

        data = wait_for(ready, timeout_s=30, what="explain's config")
        text = str(data["verdict"])
        assert text.startswith("balanced") and "unmapped: add a rule" in text, text  # named, never decides
        config = str(data["config"])
        assert '[[mapping]]\nmatch = "fetch_ms"\nphase = "data_wait"' in config, config
        assert '[[mapping]]\nmatch = "t_update_ms"\nphase = "optimizer"' in config, config
        assert "DFlash" not in json.dumps(data["missing"])  # a single-role loop gets no DFlash lines
        path = tmp_path / "sidecar.toml"
        path.write_text(config)  # pasted as it came
        first.stop()
        second = DaemonProc(tmp_path, "--config", str(path), endpoint=first.endpoint)
        wait_for(lambda: verdict(second) == "input-bound", timeout_s=30, what="input-bound after the paste")
        shares = {lab["phase"]: v for lab, v in second.samples()["dflash_pipeline_time_share_ratio"]}
        assert shares["data_wait"] >= 0.25 and shares["optimizer"] > 0 and "unattributed" not in shares
    finally:
        stop.touch()
        try:
            loop.wait(15)
        except subprocess.TimeoutExpired:
            loop.kill()
            loop.wait()
        first.stop()
        if second is not None:
            second.stop()
