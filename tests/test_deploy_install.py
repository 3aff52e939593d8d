"""deploy/install.sh into a scratch root: what it installs, with which modes, and that a second run
(the upgrade path) changes nothing and restarts nothing but the sidecar units."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from tests.deploy_support import DEPLOY, UNITS, build_project_wheel, in_ci, require_tool, run, verify

INSTALL = DEPLOY / "install.sh"
SYSTEM_TOOLS = ("systemctl", "systemd-sysusers", "systemd-tmpfiles", "useradd", "usermod")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_project_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def fake_system(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    """An environment whose systemctl, useradd, ... only log their arguments: a scratch install
    must not call any of them."""
    tmp = tmp_path_factory.mktemp("fakebin")
    log = tmp / "calls.log"
    for tool in SYSTEM_TOOLS:
        path = tmp / tool
        path.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
        path.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp}{os.pathsep}{os.environ['PATH']}")
    return env, log


def install(root: Path, wheel: Path, env: dict[str, str], *extra: str) -> str:
    """Run the installer into ``root`` (dependencies left out: the test checks the install, not
    PyPI). Returns its output; fails the test on a non-zero exit."""
    result = run(["bash", str(INSTALL), "--root", str(root), "--wheel", str(wheel), "--python", sys.executable,
                  "--pip-arg=--no-deps", "--pip-arg=--no-index", *extra], timeout=180, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def snapshot(root: Path) -> dict[str, tuple[int, str, int]]:
    """{path: (mode, sha256, mtime_ns)} of every file outside the virtual environment."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("opt/dflash-sidecar/venv") or not path.is_file():
            continue
        st = path.stat()
        files[rel] = (stat.S_IMODE(st.st_mode), hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns)
    return files


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, wheel: Path,
              fake_system: tuple[dict[str, str], Path]) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("root")
    env, _ = fake_system
    return root, install(root, wheel, env)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def expected_config(root: Path) -> str:
    shipped = DEPLOY / "config.toml"
    if shipped.exists():
        return shipped.read_text()
    result = run([str(root / "opt/dflash-sidecar/venv/bin/dflash-sidecar"), "sample-config"])
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_installs_units_config_env_and_venv(installed: tuple[Path, str]) -> None:
    root, output = installed
    for unit in UNITS:
        path = root / "etc/systemd/system" / unit
        assert path.read_text() == (DEPLOY / "systemd" / unit).read_text()
        assert mode(path) == 0o644
    assert (root / "etc/sysusers.d/dflash-sidecar.conf").read_text() == \
        (DEPLOY / "systemd/dflash-sidecar.sysusers").read_text()
    assert (root / "etc/tmpfiles.d/dflash-sidecar.conf").read_text() == \
        (DEPLOY / "systemd/dflash-sidecar.tmpfiles").read_text()
    etc = root / "etc/dflash-sidecar"
    assert mode(etc) == 0o755
    assert (etc / "config.toml").read_text() == expected_config(root) and mode(etc / "config.toml") == 0o644
    env_file = etc / "env"
    assert mode(env_file) == 0o600
    assert "WANDB_API_KEY=" in env_file.read_text().splitlines()
    exe = root / "opt/dflash-sidecar/venv/bin/dflash-sidecar"
    assert os.access(exe, os.X_OK)
    version = run([str(exe), "--version"])
    assert version.returncode == 0 and version.stdout.startswith("dflash-sidecar "), version.stderr
    # the package's data travels with it
    table = list((root / "opt/dflash-sidecar/venv").rglob("site-packages/sidecar/processing/frameworks.toml"))
    assert [t.read_text() for t in table] == [(DEPLOY.parent / "sidecar/processing/frameworks.toml").read_text()], table
    assets = DEPLOY.parent / "sidecar/exporters/html/assets"  # report --html's page: uPlot, its license, script
    for asset in sorted(assets.iterdir()):
        [got] = list((root / "opt/dflash-sidecar/venv").rglob(f"site-packages/sidecar/exporters/html/assets/"
                                                             f"{asset.name}"))
        assert got.read_bytes() == asset.read_bytes(), asset.name
    share = root / "opt/dflash-sidecar/share"
    assert (share / "systemd/resources.conf.example").is_file()
    assert (share / "prometheus/rules/dflash-alerts.yml").read_text() == \
        (DEPLOY / "prometheus/rules/dflash-alerts.yml").read_text()
    assert (share / "grafana/dflash-sidecar.json").is_file()
    assert (share / "doc/metric_names.txt").is_file() and (share / "doc/DEPLOY.md").is_file()
    assert not list(root.rglob("*.dist")), "a fresh install has nothing to compare"
    assert "skipped creating user dflash-sidecar, systemd-tmpfiles --create, systemctl daemon-reload" in output


def test_installed_units_verify(installed: tuple[Path, str], tmp_path: Path) -> None:
    """The units as installed verify cleanly against the installed daemon (ExecStart pointed into
    the scratch root, where the venv really is)."""
    systemd_analyze = require_tool("systemd-analyze", "systemd")
    root, _ = installed
    for unit in UNITS:
        text = (root / "etc/systemd/system" / unit).read_text()
        (tmp_path / unit).write_text(text.replace("/opt/dflash-sidecar/venv", f"{root}/opt/dflash-sidecar/venv"))
        assert verify(systemd_analyze, tmp_path / unit) == ""


def test_second_run_changes_nothing_and_restarts_only_the_sidecar(
        installed: tuple[Path, str], wheel: Path, fake_system: tuple[dict[str, str], Path]) -> None:
    root, _ = installed
    env, calls = fake_system
    before = snapshot(root)
    output = install(root, wheel, env, "--upgrade")
    assert snapshot(root) == before, "the second run rewrote files"
    assert "installed " not in output, output
    assert "using the virtual environment /opt/dflash-sidecar/venv" in output
    assert "systemctl try-restart dflash-sidecar.service dflash-sidecar@*.service" in output
    assert not calls.exists(), f"a scratch install ran {calls.read_text()}"


def test_user_edits_survive(installed: tuple[Path, str], wheel: Path, fake_system: tuple[dict[str, str], Path],
                            tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(installed[0], root, symlinks=True)
    env, _ = fake_system
    etc = root / "etc/dflash-sidecar"
    (etc / "env").write_text("WANDB_API_KEY=secret\n")
    (etc / "env").chmod(0o644)
    (etc / "config.toml").write_text('interval = 5.0\n')
    output = install(root, wheel, env, "--upgrade")
    assert (etc / "env").read_text() == "WANDB_API_KEY=secret\n"
    assert mode(etc / "env") == 0o600, "a secrets file readable by others is fixed"
    assert (etc / "config.toml").read_text() == 'interval = 5.0\n'
    assert (etc / "config.toml.dist").read_text() == expected_config(installed[0])
    assert "kept your /etc/dflash-sidecar/config.toml" in output


def test_prefix(wheel: Path, fake_system: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, _ = fake_system
    install(tmp_path, wheel, env, "--prefix", "/srv/dflash")
    for unit in UNITS:
        text = (tmp_path / "etc/systemd/system" / unit).read_text()
        assert "ExecStart=/srv/dflash/venv/bin/dflash-sidecar run " in text
        assert "/opt/dflash-sidecar" not in text
    assert os.access(tmp_path / "srv/dflash/venv/bin/dflash-sidecar", os.X_OK)


@pytest.mark.parametrize(("args", "status", "message"), [
    (["--frobnicate"], 2, "unknown option: --frobnicate"),
    (["--root"], 2, "--root needs a value"),
    (["--root", "/"], 2, "--root / is the live system"),
    (["--prefix", "relative/dir"], 2, "--prefix must be an absolute directory"),
    (["--source", "/nonexistent", "--wheel", "x.whl"], 2, "give --source or --wheel, not both"),
    (["--source", "/nonexistent"], 1, "not a source tree"),
    (["--wheel", "/nonexistent.whl"], 1, "no such wheel file"),
    (["--python", "no-such-python3"], 1, "--python no-such-python3: not found"),
])
def test_usage_errors(args: list[str], status: int, message: str, tmp_path: Path) -> None:
    extra = [] if "--root" in args else ["--root", str(tmp_path)]
    result = run(["bash", str(INSTALL), *extra, *args])
    assert result.returncode == status, result.stdout + result.stderr
    assert message in result.stderr
    assert not (tmp_path / "etc").exists(), "nothing is installed after a usage error"


def test_help() -> None:
    result = run(["bash", str(INSTALL), "--help"])
    assert result.returncode == 0
    assert "Usage: deploy/install.sh" in result.stdout and "--upgrade" in result.stdout


def test_live_install_in_a_private_mount_namespace(wheel: Path, tmp_path: Path) -> None:
    """The live path (no --root) in a mount namespace where /etc is a copy and /opt, /run are
    scratch directories, with systemctl & co. logging their calls: it creates the user and the
    socket directory, adds the trainer's user to the group, reloads systemd and, with --upgrade,
    restarts the sidecar units and nothing else. The host is not touched."""
    if os.geteuid() != 0:
        pytest.skip("the live path needs root (CI runs the tests as root)")
    unshare = require_tool("unshare", "util-linux")
    etc, opt, run_dir, fake = tmp_path / "etc", tmp_path / "opt", tmp_path / "run", tmp_path / "fake"
    shutil.copytree("/etc", etc, symlinks=True)
    with open(etc / "passwd", "a") as f:
        f.write("dflash-trainer-test:x:4242:4242::/nonexistent:/usr/sbin/nologin\n")
    (run_dir / "systemd" / "system").mkdir(parents=True)   # "systemd is running"
    opt.mkdir()
    fake.mkdir()
    calls = tmp_path / "calls.log"
    for tool in SYSTEM_TOOLS:
        (fake / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\n')
        (fake / tool).chmod(0o755)
    script = (f"set -e; mount --bind {etc} /etc; mount --bind {opt} /opt; mount --bind {run_dir} /run; "
              f"PATH={fake}:$PATH exec bash {INSTALL} --wheel {wheel} --python {sys.executable} "
              "--pip-arg=--no-deps --pip-arg=--no-index --trainer-user dflash-trainer-test --upgrade")
    result = run([unshare, "--mount", "--propagation", "private", "bash", "-c", script], timeout=180)
    if result.returncode != 0 and "unshare failed" in result.stderr and not in_ci():
        pytest.skip(f"no mount namespaces here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls.read_text().splitlines() == [
        "systemd-sysusers /etc/sysusers.d/dflash-sidecar.conf",
        "usermod -a -G dflash-sidecar dflash-trainer-test",
        "systemd-tmpfiles --create /etc/tmpfiles.d/dflash-sidecar.conf",
        "systemctl daemon-reload",
        "systemctl try-restart dflash-sidecar.service dflash-sidecar@*.service",
    ]
    assert mode(etc / "dflash-sidecar/env") == 0o600
    assert (etc / "systemd/system/dflash-sidecar@.service").is_file()
    assert os.access(opt / "dflash-sidecar/venv/bin/dflash-sidecar", os.X_OK)
