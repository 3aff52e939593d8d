"""The shim installs light: the wheel's unconditional requirements are the shim's own (pyzmq,
msgspec), the daemon's are the ``daemon`` extra, and in an environment with the shim only the
daemon's console script says what to install instead of failing with an ImportError."""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sidecar.cli.exit_status import NO_DAEMON_DEPENDENCIES
from tests.deploy_support import build_project_wheel

SHIM_REQUIREMENTS = {"pyzmq", "msgspec"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_project_wheel(tmp_path_factory.mktemp("wheel"))


def requires_dist(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        [name] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    return meta.get_all("Requires-Dist") or []


def dist_name(req: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
    assert match is not None, req
    return match.group(0).lower()


def test_wheel_requires_only_what_the_shim_imports(wheel: Path) -> None:
    reqs = requires_dist(wheel)
    unconditional = {dist_name(r) for r in reqs if "extra ==" not in r}
    daemon = {dist_name(r) for r in reqs if re.search(r"""extra\s*==\s*["']daemon["']""", r)}
    assert unconditional == SHIM_REQUIREMENTS
    assert {"wandb", "prometheus-client", "nvidia-ml-py"} <= daemon


def test_shim_only_environment_gets_a_clear_message(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv with the wheel and no dependencies at all (no network is used): the shim's
    modules are there, the console script names the missing daemon packages and the fix."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--disable-pip-version-check", str(wheel)], check=True, timeout=120)
    out = subprocess.run([str(venv / "bin" / "dflash-sidecar"), "check"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == NO_DAEMON_DEPENDENCIES, out.stderr
    assert "pip install 'dflash-sidecar[daemon]'" in out.stderr and "wandb" in out.stderr
    assert "Traceback" not in out.stderr
    version = subprocess.run([str(venv / "bin" / "dflash-sidecar"), "--version"], capture_output=True,
                             text=True, timeout=60, check=False)
    assert version.returncode == 0 and version.stdout.startswith("dflash-sidecar "), version.stderr
    files = subprocess.run([str(py), "-c", "import importlib.util as u; "
                            "print(u.find_spec('trainer_shim.telemetry') is not None)"],
                           capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert files.stdout.strip() == "True", files.stderr
