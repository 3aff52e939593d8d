"""A real systemd for the deploy tests: systemd as PID 1 of a ``systemd-nspawn`` container whose
root is an overlay of this machine's ``/`` (writes go to a tmpfs), with loopback-only networking.

- ``systemd-nspawn`` comes from Debian's ``systemd-container`` package at exactly the installed
  systemd's version (it links systemd's private shared library): ``apt-get download`` and
  ``dpkg-deb -x`` into a cache directory, never installed.
- The container has no network, so the daemon is installed from a wheelhouse built beforehand
  on the host (the project's wheel plus its dependencies), bound read-only into the container.
- Commands run inside through ``nsenter`` into the namespaces of the container's PID 1.
- Nothing is left behind: the mounts live in a private mount namespace (``unshare``), the cgroups
  below one cgroup of the container's own that ``nspawn_boot.sh`` removes, and the boot script
  halts the container when this process dies (``setpriv --pdeathsig``), is interrupted, or
  ``Container.stop`` asks.

The cache (``$DFLASH_TEST_CACHE``, else ``$XDG_CACHE_HOME/dflash-sidecar-tests``, else
``~/.cache/dflash-sidecar-tests``) keeps the unpacked nspawn per systemd version and the
dependency wheels per dependency list and Python version.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from tests.deploy_support import REPO, in_ci, run
from tests.waiting import wait_until

BOOT_SCRIPT = Path(__file__).with_name("nspawn_boot.sh")
TOOLS = {"apt-get": "apt", "dpkg-deb": "dpkg", "dpkg-query": "dpkg", "unshare": "util-linux",
         "nsenter": "util-linux", "setpriv": "util-linux", "systemctl": "systemd"}
"""Host tools the harness needs, with their Debian packages."""
SRC = "/run/host-src"
"""Where the checkout is bound (read-only) inside the container."""
WHEELS = "/run/host-wheels"
"""Where the wheelhouse is bound (read-only) inside the container."""
SYSTEM_PYTHON = "/usr/bin/python3"
"""The interpreter the installer makes the venv with inside the container (outside /root and
/home, which ProtectHome= hides from the daemon)."""
MACHINE = "dflash-sidecar-test"
"""The container's name (its hostname)."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Unavailable(Exception):
    """This machine cannot run the container (a missing tool, not root, ...): the reason."""


def cache_dir() -> Path:
    explicit = os.environ.get("DFLASH_TEST_CACHE")
    if explicit:
        base = Path(explicit)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dflash-sidecar-tests"
    base.mkdir(parents=True, exist_ok=True)
    return base


def check_host() -> None:
    """Raises ``Unavailable`` with the reason when this machine cannot boot the container."""
    if os.geteuid() != 0:
        raise Unavailable("booting a systemd-nspawn container needs root")
    missing = [f"{tool} (Debian package {package})" for tool, package in TOOLS.items() if not shutil.which(tool)]
    if missing:
        raise Unavailable("missing " + ", ".join(missing))
    if not Path("/usr/lib/systemd/systemd").exists() and not Path("/lib/systemd/systemd").exists():
        raise Unavailable("systemd is not installed (Debian package systemd)")
    if not Path(SYSTEM_PYTHON).exists():
        raise Unavailable(f"{SYSTEM_PYTHON} is missing: the installer's venv needs a system Python >= 3.11")
    version = run([SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
    if version != f"{sys.version_info[0]}.{sys.version_info[1]}":
        raise Unavailable(f"{SYSTEM_PYTHON} is Python {version} but the tests run on {sys.version.split()[0]}: "
                          "the wheelhouse built here would not fit the installer's venv")


def systemd_version() -> str:
    """The installed systemd's Debian version, e.g. ``252.38-1~deb12u1``."""
    result = run(["dpkg-query", "-W", "-f=${Version}", "systemd"])
    if result.returncode != 0 or not result.stdout:
        raise Unavailable(f"cannot tell the installed systemd's version: {result.stderr.strip()}")
    return result.stdout.strip()


def nspawn_binary(cache: Path) -> Path:
    """``systemd-nspawn`` of the installed systemd's version, unpacked into the cache once."""
    version = systemd_version()
    home = cache / f"systemd-container_{version}"
    binary = home / "usr/bin/systemd-nspawn"
    if not binary.exists():
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            got = run(["apt-get", "download", f"systemd-container={version}"], cwd=tmp, timeout=300)
            debs = list(Path(tmp).glob("systemd-container_*.deb"))
            if got.returncode != 0 or not debs:
                raise Unavailable(f"apt-get download systemd-container={version} failed (run apt-get update "
                                  f"first): {got.stderr.strip()}")
            unpacked = Path(tmp) / "x"
            result = run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], timeout=120)
            assert result.returncode == 0, result.stderr
            if not home.exists():   # another run may have unpacked it meanwhile
                os.replace(unpacked, home)
    result = run([str(binary), "--version"])
    upstream = version.split("-")[0]
    assert result.returncode == 0 and f"({upstream}" in result.stdout, result.stdout + result.stderr
    return binary


INSTALLED_EXTRA = "daemon"
"""The extra deploy/install.sh installs the project with (``pip install WHEEL[daemon]``)."""


def project_requirements() -> list[str]:
    """What installing the project with ``INSTALLED_EXTRA`` requires, from pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project.get("optional-dependencies", {}).get(INSTALLED_EXTRA, [])]


def wheelhouse(cache: Path, project_wheel: Path, house: Path) -> Path:
    """``house`` filled with the project's wheel and wheels of all its dependencies. The dependency
    wheels are built once per dependency list and Python version (pip's own cache makes a rebuild
    cheap); the project's wheel is this checkout's, every time."""
    requirements = project_requirements()
    key = hashlib.sha256(json.dumps([requirements, sys.version_info[:2]]).encode()).hexdigest()[:16]
    deps = cache / f"wheels-{key}"
    if not (deps / ".complete").exists():
        shutil.rmtree(deps, ignore_errors=True)
        result = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(deps), *requirements],
                     timeout=900)
        if result.returncode != 0:
            raise Unavailable(f"pip wheel of the dependencies failed (no package index?):\n"
                              f"{result.stdout}{result.stderr}")
        (deps / ".complete").write_text("\n".join(requirements) + "\n")
    house.mkdir(parents=True, exist_ok=True)
    for wheel in [*deps.glob("*.whl"), project_wheel]:
        shutil.copy(wheel, house)
    return house


def _dirs_named(root: Path, name: str) -> list[Path]:
    """The directories named ``name`` under ``root``. A cgroup the container's teardown removes
    while the walk runs is gone, not an error (``Path.rglob`` raised FileNotFoundError on one in CI;
    ``os.walk`` skips a directory it can no longer list)."""
    return [Path(top) / d for top, dirs, _ in os.walk(root) for d in dirs if d == name]


def leftovers(work: Path, cgroup: str) -> list[str]:
    """What a stopped container (booted with ``work`` and ``cgroup``) still has on this machine:
    its cgroups, processes (each holding the private mount namespace, so its mounts), its work
    directory, entries under /run named after it. Empty when it is all gone."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] in ("cgroup", "cgroup2"):
            found += [f"cgroup {p}" for p in _dirs_named(Path(fields[1]), cgroup)]
        if str(work) in fields[1]:
            found.append(f"mount {fields[1]}")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue   # exited: holds no mount or cgroup, only a pid its parent has yet to reap
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            in_cgroup = cgroup in (proc / "cgroup").read_text()
        except OSError:
            continue
        if str(work) in cmdline or in_cgroup:
            found.append(f"process {proc.name}: {cmdline.strip()}")
    if work.exists():
        found.append(f"directory {work}")
    for path in (Path("/run/systemd/nspawn/propagate") / MACHINE, Path("/run/systemd/machines") / MACHINE):
        if path.exists():
            found.append(f"runtime entry {path}")
    return found


class Container:
    """One booted container. ``sh`` runs a shell command inside it as root; ``stop`` halts it."""

    def __init__(self, nspawn: Path, binds: dict[Path, str], log: Path) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="dflash-nspawn-"))
        self.cgroup = f"dflash-nspawn-{os.getpid()}-{self.work.name.rsplit('-', 1)[-1]}"
        self.log_path = log
        args = [f"--bind-ro={host}:{inside}" for host, inside in binds.items()]
        args += ["--private-network", f"--machine={MACHINE}"]
        self._log = open(log, "wb")  # noqa: SIM115 - the container's console, open while it runs
        self.proc = subprocess.Popen(
            ["setpriv", "--pdeathsig", "TERM", "--", "unshare", "--mount", "--propagation", "private", "--",
             "bash", str(BOOT_SCRIPT), str(nspawn), str(self.work), self.cgroup, *args,
             # the smallest boot that has the journal, sockets and sysusers/tmpfiles, and none of
             # this machine's own services or timers (the container sees its /etc)
             "systemd.unit=basic.target", "systemd.mask=timers.target"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid1 = 0

    # -- life cycle --------------------------------------------------------------------------

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _children(self, pid: int) -> list[int]:
        try:
            return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            return []

    def _find_pid1(self) -> int:
        if self.proc.poll() is not None:
            raise AssertionError(f"the container exited with {self.proc.returncode}:\n{self.log()}")
        for nspawn in self._children(self.proc.pid):
            for child in self._children(nspawn):
                if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                    return child
        return 0

    def wait_booted(self, timeout_s: float = 120.0) -> None:
        """Until systemd in the container reports it has finished booting."""
        self.pid1 = wait_until(self._find_pid1, timeout_s, 0.1, "the container's systemd to start")

        def booted() -> str:
            self._find_pid1()  # raises if the container died
            state = self.sh("systemctl is-system-running", check=False).stdout.strip()
            return state if state in ("running", "degraded") else ""

        # "degraded" (a unit of this machine's that fails in a container) is no reason to stop:
        # the tests check the units they start
        wait_until(booted, timeout_s, 0.2, "the container's systemd to finish booting")

    def stop(self, timeout_s: float = 60.0) -> None:
        """Halt the container and wait until the boot script has cleaned up after it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                if self.pid1:   # killing a PID namespace's init kills everything in it
                    os.kill(self.pid1, signal.SIGKILL)
                self.proc.wait(30)
        self._log.close()
        shutil.rmtree(self.work, ignore_errors=True)

    # -- commands inside ---------------------------------------------------------------------

    def command(self, argv: list[str], user: str | None = None) -> list[str]:
        """``argv`` as run inside the container (as root, or as ``user`` with that user's groups),
        with a clean environment."""
        enter = ["nsenter", f"--target={self.pid1}", "--mount", "--uts", "--ipc", "--net", "--pid", "--"]
        as_user = [] if user is None else ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
        return [*enter, *as_user, "env", "-i", f"PATH={PATH}", "LANG=C.UTF-8", *argv]

    def sh(self, script: str, user: str | None = None, check: bool = True, timeout: float = 120,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``bash -c script`` inside the container; with ``check`` a non-zero exit fails the test."""
        result = subprocess.run(self.command(["bash", "-c", script], user), capture_output=True, text=True,
                                timeout=timeout, input=input, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"in the container, {script!r} exited with {result.returncode}:\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        """``systemctl show`` properties of ``unit``."""
        out = self.sh(f"systemctl show {shlex.quote(unit)} " + " ".join(f"-p {p}" for p in properties)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def main_pid(self, unit: str) -> int:
        return int(self.show(unit, "MainPID")["MainPID"])


def skip_or_fail(reason: str) -> None:
    """Skip on a developer's box, fail under CI=true."""
    import pytest

    if in_ci():
        pytest.fail(f"the real-systemd test cannot run: {reason}; CI must provide it")
    pytest.skip(reason)

