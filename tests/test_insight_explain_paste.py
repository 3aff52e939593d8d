"""``explain`` writes a config that works when pasted: a real daemon and a real plain loop (a
subprocess publishing every occurrence through the shim) whose data wait and optimizer step are
timed under names no preset knows (``fetch_ms``, ``t_optim_ms``). The first daemon reads their
phases from the names and says so in the verdict (input-bound, "read from the name"); its explain
output lists each read as a block to check. The user overrules one read in the pasted config
(``fetch_ms`` is no phase of theirs): a second daemon on the same endpoint then names it
unattributed and never decides by it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProc, env, explain, wait_for

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
        phase("t_optim_ms", 4)    # the optimizer step, under a name of its own
        telemetry.count("batches")
    telemetry.flush(); telemetry.close()
""")


def explain_json(d: DaemonProc) -> dict[str, object]:
    return json.loads(explain(d, "--json"))


def _stop(stop: Path, loop: subprocess.Popen[bytes], *daemons: DaemonProc | None) -> None:
    """The loop told to stop (killed if it does not within 15 s), then each daemon stopped."""
    stop.touch()
    try:
        loop.wait(15)
    except subprocess.TimeoutExpired:
        loop.kill()
        loop.wait()
    for d in daemons:
        if d is not None:
            d.stop()


@pytest.mark.timeout(90)
def test_pasting_explains_config_pins_or_overrules_the_reads(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    first = DaemonProc(tmp_path)
    loop = subprocess.Popen([sys.executable, "-c", LOOP, first.endpoint, str(stop)], env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    second = None
    try:
        def ready() -> dict[str, object] | None:
            d = explain_json(first)
            return d if "fetch_ms" in str(d.get("config")) and str(d.get("verdict")).startswith("input-bound") else None

        data = wait_for(ready, timeout_s=30, what="explain's config and an input-bound verdict")
        rows = {r["name"]: r for r in data["series"]}  # type: ignore[attr-defined]
        assert rows["fetch_ms"]["meaning"] == "data_wait" and "read from the name" in rows["fetch_ms"]["rule"], rows
        assert rows["t_optim_ms"]["meaning"] == "optimizer", rows
        config = str(data["config"])
        assert '[[mapping]]\nmatch = "fetch_ms"\nphase = "data_wait"  # timing() of role trainer: read from the name' \
            in config, config
        assert '[[mapping]]\nmatch = "t_optim_ms"\nphase = "optimizer"' in config, config
        assert "DFlash" not in json.dumps(data["missing"])  # a single-role loop gets no DFlash lines
        path = tmp_path / "sidecar.toml"
        path.write_text(config.replace('match = "fetch_ms"\nphase = "data_wait"', 'match = "fetch_ms"\nphase = "none"'))
        first.stop()
        second = DaemonProc(tmp_path, "--config", str(path), endpoint=first.endpoint)

        def overruled() -> tuple[str, dict[str, float]] | None:
            # the verdict and the shares of a window past the reconnect (its first may hold no step)
            text = str(explain_json(second).get("verdict"))
            samples = second.samples().get("dflash_pipeline_time_share_ratio", [])
            shares = {lab["phase"]: v for lab, v in samples}
            return (text, shares) if "unattributed" in text and shares.get("optimizer", 0.0) > 0 else None

        text, shares = wait_for(overruled, timeout_s=30, what="fetch_ms named unattributed after the overrule")
        assert not text.startswith("input-bound") and "fetch_ms" in text, text  # named, never decides
        assert "data_wait" not in shares and shares["unattributed"] >= 0.25, shares
    finally:
        _stop(stop, loop, first, second)


PROFILER_LOOP = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from trainer_shim import telemetry
    endpoint, stop = sys.argv[1], Path(sys.argv[2])
    telemetry.configure(endpoint=endpoint, role="trainer", worker="0", flush_interval_s=0.05)

    def nap(s):
        t0 = time.perf_counter(); time.sleep(s); return time.perf_counter() - t0

    step = 0
    while not stop.exists():  # a Lightning SimpleProfiler's last durations, in seconds, as it holds them
        dn = nap(0.030)
        t0 = time.perf_counter(); ts = nap(0.006); bw = nap(0.008); nap(0.002)
        telemetry.publish(step, {"[_TrainingEpochLoop].train_dataloader_next": dn,
                                 "run_training_batch": time.perf_counter() - t0,
                                 "[Strategy]SingleDeviceStrategy.training_step": ts,
                                 "[Strategy]SingleDeviceStrategy.backward": bw})
        step += 1
    telemetry.flush(); telemetry.close()
""")


@pytest.mark.timeout(90)
def test_explain_offers_a_unit_for_durations_whose_names_say_none(tmp_path: Path) -> None:
    """A new user's probe: a loop publishing its Lightning profiler's action durations (seconds,
    no unit or duration word in the names) read ``unexplained-idle`` 10 of 10, every key a gauge,
    and ``explain`` said nothing of them. It offers each gauge whose words name a phase as a
    commented block with ``unit = "s"`` (not a name of the step: a gauge named so is most often a
    step counter); pasted, a second daemon reads the loop input-bound (its loader 65 % of the step,
    read as about 79 % of the loader's and the backward's time, the step's name left to the user)."""
    stop = tmp_path / "stop"
    first = DaemonProc(tmp_path)
    loop = subprocess.Popen([sys.executable, "-c", PROFILER_LOOP, first.endpoint, str(stop)], env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    second = None
    try:
        def offered() -> str | None:
            config = str(explain_json(first).get("config"))
            return config if "train_dataloader_next" in config else None

        config = wait_for(offered, timeout_s=30, what="explain's block for the loader's gauge")
        block = ('# [[mapping]]\n# match = "[_TrainingEpochLoop].train_dataloader_next"\n# phase = "data_wait"  '
                 '# a gauge of role trainer whose words name data_wait: if it is a duration,\n# unit = "s"')
        assert block in config, config
        assert '# match = "[Strategy]SingleDeviceStrategy.backward"\n# phase = "backward"' in config, config
        path = tmp_path / "sidecar.toml"
        keys = ("# [[mapping]]", "# match = ", "# phase = ", "# unit = ")
        path.write_text("\n".join(line[2:] if line.startswith(keys) else line for line in config.splitlines()) + "\n")
        first.stop()
        second = DaemonProc(tmp_path, "--config", str(path), endpoint=first.endpoint)

        def verdict() -> str | None:
            text = str(explain_json(second).get("verdict"))
            return text if text.startswith("input-bound") else None

        wait_for(verdict, timeout_s=30, what="input-bound once the pasted rules give the units")
        shares = {lab["phase"]: v for lab, v in second.samples()["dflash_pipeline_time_share_ratio"]}
        assert 0.5 <= shares["data_wait"] <= 0.9, shares
        assert "run_training_batch" not in config, config
    finally:
        _stop(stop, loop, first, second)
