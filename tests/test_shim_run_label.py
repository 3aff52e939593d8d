"""The run label and FLOPs per token the shim's hello states (``trainer_shim.run_label``): the
launcher environments that name a run, and what ``configure()`` passes on to children."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from trainer_shim.run_label import check_flops, flops_from_env, run_label


def test_the_run_label_comes_from_the_first_launcher_that_names_the_run() -> None:
    assert run_label({}) is None
    assert run_label({"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "3"}) == "slurm:12.3"
    assert run_label({"SLURM_JOB_ID": "12"}) == "slurm:12"  # a batch script: a requeue keeps the run
    assert run_label({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "12"}) == "slurm:12"  # torchrun's default
    assert run_label({"TORCHELASTIC_RUN_ID": "a1b2", "SLURM_JOB_ID": "12"}) == "torchelastic:a1b2"
    assert run_label({"DFLASH_RUN_LABEL": " exp-7 ", "TORCHELASTIC_RUN_ID": "a1b2"}) == "exp-7"
    assert len(run_label({"DFLASH_RUN_LABEL": "x" * 1000}) or "") == 200


def test_flops_per_token_is_checked_where_given_and_warned_about_from_the_environment(
        caplog: pytest.LogCaptureFixture) -> None:
    assert check_flops(6e9) == 6e9
    for bad in (0.5, float("nan"), float("inf"), 2e18):
        with pytest.raises(ValueError, match="flops_per_token"):
            check_flops(bad)
    assert flops_from_env({"DFLASH_FLOPS_PER_TOKEN": "4.2e10"}) == 4.2e10 and flops_from_env({}) is None
    with caplog.at_level(logging.WARNING, logger="trainer_shim"):
        assert flops_from_env({"DFLASH_FLOPS_PER_TOKEN": "lots"}) is None
    assert "DFLASH_FLOPS_PER_TOKEN='lots'" in caplog.text


CHILD = r"""
import json, multiprocessing as mp, os, sys
from trainer_shim import telemetry

def child(q):
    from trainer_shim import telemetry
    telemetry.count("n")
    p = telemetry._publisher
    q.put([p.run_label, p.flops_per_token])

if __name__ == "__main__":
    telemetry.configure(sys.argv[1], run_label="exp-9", flops_per_token=1.5e9)
    try:
        telemetry.configure(sys.argv[1], flops_per_token=-1)
    except ValueError as exc:
        print("refused:", exc, file=sys.stderr)
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=child, args=(q,))
    p.start()
    print(json.dumps(q.get(timeout=60)))
    p.join(60)
"""


def test_configure_passes_the_label_and_flops_to_spawned_children(tmp_path: os.PathLike[str]) -> None:
    script = f"{tmp_path}/child.py"
    with open(script, "w") as f:
        f.write(CHILD)
    environ = {k: v for k, v in os.environ.items() if k not in ("DFLASH_RUN_LABEL", "DFLASH_FLOPS_PER_TOKEN")}
    environ["PYTHONPATH"] = os.pathsep.join([os.getcwd(), environ.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, script, f"ipc://{tmp_path}/none.sock"], capture_output=True, text=True,
                         env=environ, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == '["exp-9", 1500000000.0]'
    assert "refused: flops_per_token must be between 1" in out.stderr
