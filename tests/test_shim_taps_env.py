"""Taps with no code (``DFLASH_SIDECAR_TAP``) in real installs: the wheel installed with pip into a
fresh virtual environment, and ``pip install -e`` of a copy of this checkout into another. Both
see this interpreter's packages (wandb, torch, mlflow) and nothing of this checkout: the scripts
run with no ``PYTHONPATH``, from a folder of their own.

The end-to-end check: a loop that only calls its logger (``wandb.log(..., step=i)`` offline,
``SummaryWriter.add_scalar``, ``mlflow.log_metrics``), with the variable set and not one line of
the sidecar in it, reads ``input-bound`` at a real daemon when waiting for data dominates its step.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import site
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy_support import build_project_wheel, copy_project
from tests.launcher import DaemonProc
from tests.waiting import wait_until

TAP_PTH = "dflash_sidecar_tap.pth"


def make_venv(where: Path, *install: str) -> Path:
    """A virtual environment at ``where`` with ``pip install --no-deps <install>``; its python.
    It sees this interpreter's packages (wandb, torch, mlflow) through a path file listing their
    folders: plain path entries, so their .pth files (this checkout's own editable install among
    them) are not run there. No pip or setuptools of its own: this interpreter's pip installs
    into it, and a build uses this interpreter's setuptools when it can build wheels offline
    (>= 70.1, or with ``wheel``), else pip's isolated build."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    py = where / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    paths = sysconfig.get_paths()
    parent = dict.fromkeys([*site.getsitepackages(), paths["purelib"], paths["platlib"]])
    (Path(purelib) / "_parent_packages.pth").write_text("".join(f"{p}\n" for p in parent if os.path.isdir(p)))
    offline = ["--no-index", "--no-build-isolation"] if builds_wheels_offline() else []
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps",
                           "--disable-pip-version-check", *offline, *install],
                          timeout=300, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return py


def builds_wheels_offline() -> bool:
    """This interpreter's setuptools can build a wheel with no download."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(x) for x in setuptools.__version__.split(".")[:2] if x.isdigit())
    return version >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def wheel_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("tap-wheel")
    return make_venv(tmp / "venv", str(build_project_wheel(tmp)))


def run_py(py: Path, code: str, cwd: Path, timeout_s: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in ``py`` from ``cwd``, with this environment less ``PYTHONPATH`` and the sidecar's
    variables, plus ``env``."""
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("DFLASH_", "WANDB_"))}
    full.update(WANDB_SILENT="true", WANDB_DIR=str(cwd), MLFLOW_ALLOW_FILE_STORE="true", **env)
    script = cwd / "script.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.run([str(py), str(script)], env=full, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return proc


WHO = """
    import json, sys
    before = sorted(m for m in sys.modules if m.startswith("trainer_shim"))
    import wandb
    import trainer_shim
    from trainer_shim.integrations import taps
    print(json.dumps({"before": before, "tapped": taps.tapped(), "shim": trainer_shim.__file__}))
"""


def test_the_wheel_installs_the_pth_and_it_costs_an_import_only_when_set(wheel_python: Path, tmp_path: Path) -> None:
    purelib = run_py(wheel_python, "import sysconfig; print(sysconfig.get_paths()['purelib'])", tmp_path).stdout
    purelib_dir = Path(purelib.strip())
    assert (purelib_dir / TAP_PTH).read_text() == (Path(__file__).parents[1] / TAP_PTH).read_text()
    unset = json.loads(run_py(wheel_python, WHO, tmp_path).stdout.splitlines()[-1])
    assert unset["before"] == [] and unset["tapped"] == [] and unset["shim"].startswith(str(purelib_dir))
    on = json.loads(run_py(wheel_python, WHO, tmp_path, DFLASH_SIDECAR_TAP="wandb").stdout.splitlines()[-1])
    assert on["before"] == ["trainer_shim", "trainer_shim.integrations", "trainer_shim.integrations.post_import",
                            "trainer_shim.integrations.tap_import"]
    assert on["tapped"] == ["wandb"]


def test_an_editable_install_taps_too(tmp_path: Path) -> None:
    src = copy_project(tmp_path / "src")
    py = make_venv(tmp_path / "venv", "-e", str(src))
    on = json.loads(run_py(py, WHO, tmp_path, DFLASH_SIDECAR_TAP="all").stdout.splitlines()[-1])
    assert on["tapped"] == ["wandb"] and on["shim"].startswith(str(src))


def test_an_unknown_library_is_said_and_nothing_breaks(wheel_python: Path, tmp_path: Path) -> None:
    proc = run_py(wheel_python, WHO, tmp_path, DFLASH_SIDECAR_TAP="wandb,comet")
    assert json.loads(proc.stdout.splitlines()[-1])["tapped"] == ["wandb"]
    assert "DFLASH_SIDECAR_TAP: unknown comet" in proc.stderr


LOOP = """
    import sys, time
    from pathlib import Path
    lib = sys.argv[1] if len(sys.argv) > 1 else "{lib}"
    if lib == "wandb":
        import wandb
        wandb.init(mode="offline", project="taps")
        def log(row, i):
            wandb.log(row, step=i)
    elif lib == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter("tb")
        def log(row, i):
            for key, value in row.items():
                writer.add_scalar(key, value, i)
    else:
        import mlflow
        mlflow.set_tracking_uri("file:" + str(Path("mlruns").resolve()))
        def log(row, i):
            mlflow.log_metrics(row, step=i)
    i, deadline = 0, time.monotonic() + 100
    while not Path("stop").exists() and time.monotonic() < deadline:
        t0 = time.perf_counter()
        time.sleep(0.03)  # the data loader
        t1 = time.perf_counter()
        sum(range(20_000))  # the step's work
        t2 = time.perf_counter()
        log({{"data_time_ms": (t1 - t0) * 1e3, "step_ms": (t2 - t0) * 1e3, "loss": 1.0 / (i + 1)}}, i)
        i += 1
    print(i)
"""


def verdict(d: DaemonProc) -> str | None:
    on = [lab["verdict"] for lab, v in d.samples().get("dflash_pipeline_bottleneck", []) if v == 1.0]
    return on[0] if len(on) == 1 else None


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path)
    yield d
    d.stop()


@pytest.mark.parametrize("lib", ["wandb", "tensorboard", "mlflow"])
def test_a_loop_that_only_calls_its_logger_reads_input_bound(
        lib: str, wheel_python: Path, daemon: DaemonProc, tmp_path: Path) -> None:
    work = tmp_path / "trainer"
    work.mkdir()
    (work / "script.py").write_text(textwrap.dedent(LOOP.format(lib=lib)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("DFLASH_", "WANDB_"))}
    env.update(DFLASH_SIDECAR_TAP=lib, DFLASH_SIDECAR_ENDPOINT=daemon.endpoint, WANDB_SILENT="true",
               WANDB_DIR=str(work), MLFLOW_ALLOW_FILE_STORE="true")
    trainer = subprocess.Popen([str(wheel_python), "script.py"], cwd=work, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with contextlib.suppress(AssertionError):  # the verdicts seen are in the assertion below
            wait_until(lambda: verdict(daemon) == "input-bound" or trainer.poll() is not None, timeout_s=90,
                       interval_s=0.5)
        seen = verdict(daemon)
    finally:
        (work / "stop").touch()
        out, err = trainer.communicate(timeout=60)
    assert trainer.returncode == 0 and "Traceback" not in err, err[-4000:]
    assert seen == "input-bound", (out, err[-2000:], daemon.log()[-3000:])
