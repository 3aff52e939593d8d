"""deploy/systemd: the units verify without a single message, score OK in `systemd-analyze security`,
keep the daemon away from the trainer, and give the trainer's user (only) the socket."""

from __future__ import annotations

import os
import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from tests.deploy_support import DEPLOY, UNITS, require_tool, run, verify
from trainer_shim.endpoint import SOCKET_NAME, SYSTEM_RUNTIME_DIR

SYSTEMD = DEPLOY / "systemd"
EXEC = "/opt/dflash-sidecar/venv/bin/dflash-sidecar"
MAX_EXPOSURE = 4.0


def parse_unit(text: str) -> dict[str, list[str]]:
    """{"Section.Key": [values in order]}, comments dropped."""
    settings: dict[str, list[str]] = defaultdict(list)
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings[f"{section}.{key}"].append(value)
    return settings


def staged_units(tmp_path: Path) -> Path:
    """The units in a scratch directory with ExecStart pointing at an executable that exists there
    (verify checks it), plus the example drop-in as dflash-sidecar.service.d/50-resources.conf."""
    exe = tmp_path / "root" / EXEC.lstrip("/")
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for name in UNITS:
        (units / name).write_text((SYSTEMD / name).read_text().replace(EXEC, str(exe)))
    dropin = units / "dflash-sidecar.service.d"
    dropin.mkdir()
    shutil.copy(SYSTEMD / "resources.conf.example", dropin / "50-resources.conf")
    return units


@pytest.mark.parametrize("unit", UNITS)
def test_systemd_analyze_verify_says_nothing(unit: str, tmp_path: Path) -> None:
    """`verify` reports most mistakes as warnings with exit 0: any output at all is a failure.
    The drop-in example sits next to the plain unit, so it is verified with it."""
    systemd_analyze = require_tool("systemd-analyze", "systemd")
    units = staged_units(tmp_path)
    assert verify(systemd_analyze, units / unit) == ""


def test_verify_catches_a_typo(tmp_path: Path) -> None:
    """The check above is not blind: one misspelt key makes verify talk."""
    systemd_analyze = require_tool("systemd-analyze", "systemd")
    units = staged_units(tmp_path)
    path = units / "dflash-sidecar.service"
    path.write_text(path.read_text().replace("ProtectHome=yes", "ProtectHomes=yes"))
    assert "ProtectHomes" in verify(systemd_analyze, path)


@pytest.mark.parametrize("unit", UNITS)
def test_security_exposure_is_ok(unit: str, tmp_path: Path) -> None:
    systemd_analyze = require_tool("systemd-analyze", "systemd")
    units = staged_units(tmp_path)
    result = run([systemd_analyze, "security", "--offline=true", str(units / unit)], cwd=units)
    if result.returncode != 0 and "offline" in result.stderr:
        pytest.skip(f"this systemd cannot analyze unit files offline: {result.stderr.strip()}")
    output = result.stdout + result.stderr
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", output)
    assert m, output
    assert float(m.group(1)) <= MAX_EXPOSURE and m.group(2) == "OK", output
    # what NVML forbids stays off, and is the price paid
    assert re.search(r"✗ PrivateDevices=", output), output


@pytest.mark.parametrize("unit", UNITS)
def test_unit_settings(unit: str) -> None:
    s = parse_unit((SYSTEMD / unit).read_text())
    run_arg = "%i" if "@" in unit else "auto"
    assert s["Service.Type"] == ["notify"]
    assert s["Service.ExecStart"] == [f"{EXEC} run --config /etc/dflash-sidecar/config.toml --wandb-run {run_arg}"]
    assert s["Service.ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert s["Service.Restart"] == ["on-failure"]
    # away from the trainer
    assert s["Service.CPUSchedulingPolicy"] == ["idle"] and s["Service.IOSchedulingClass"] == ["idle"]
    assert s["Service.Nice"] == ["19"]
    assert {"Service.CPUQuota", "Service.MemoryMax", "Service.MemoryHigh"} <= s.keys()
    assert "Service.CPUAffinity" not in s, "affinity is box-specific: it belongs in a drop-in"
    # the socket: /run/dflash-sidecar, group-only, where the shim looks for it
    assert "/run/" + s["Service.RuntimeDirectory"][0] == SYSTEM_RUNTIME_DIR
    assert s["Service.RuntimeDirectoryMode"] == ["0750"]
    assert s["Service.User"] == s["Service.Group"] == ["dflash-sidecar"]
    # NVML: device access allowed, no private /dev, no /proc subset
    assert s["Service.DevicePolicy"] == ["closed"]
    allowed = {v.split()[0] for v in s["Service.DeviceAllow"]}
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "char-nvidia-frontend"} <= allowed
    assert s.get("Service.PrivateDevices", ["no"]) == ["no"]
    assert "Service.ProcSubset" not in s
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelTunables", "RestrictSUIDSGID"):
        assert s[f"Service.{key}"] == ["yes"], key
    assert s["Service.ProtectSystem"] == ["strict"]
    # secrets only in the EnvironmentFile
    assert s["Service.EnvironmentFile"] == ["-/etc/dflash-sidecar/env"]
    assert not any("WANDB_API_KEY" in v or "KEY=" in v for v in s["Service.Environment"])


def test_units_differ_only_where_they_must() -> None:
    def lines(name: str) -> list[str]:
        return [line for line in (SYSTEMD / name).read_text().splitlines() if line and not line.startswith("#")]

    plain, template = lines(UNITS[0]), lines(UNITS[1])
    differ = {line.partition("=")[0] for line in set(plain) ^ set(template)}
    assert differ == {"Description", "ExecStart", "Conflicts", "After"}, differ
    assert "Conflicts=dflash-sidecar.service" in template


def test_switching_units_stops_the_old_daemon_before_starting_the_new_one() -> None:
    """Conflicts= alone queues the conflicting unit's stop beside the new unit's start, so the new
    daemon starts while the old one still holds the socket and the port. systemd orders the stop
    before the start only when the two units are ordered (After= or Before=, either way): each
    unit a sidecar unit conflicts with is also one it is ordered against. The real switch, both
    ways, runs under systemd in test_deploy_nspawn.py."""
    for name in UNITS:
        s = parse_unit((SYSTEMD / name).read_text())
        conflicts = {u for v in s.get("Unit.Conflicts", []) for u in v.split()}
        ordered = {u for key in ("Unit.After", "Unit.Before") for v in s.get(key, []) for u in v.split()}
        assert conflicts <= ordered, f"{name}: Conflicts= without ordering on {sorted(conflicts - ordered)}"
    template = parse_unit((SYSTEMD / UNITS[1]).read_text())
    assert "dflash-sidecar.service" in " ".join(template["Unit.Conflicts"])


def test_sysusers_and_tmpfiles_match_the_units() -> None:
    s = parse_unit((SYSTEMD / UNITS[0]).read_text())
    sysusers = [line.split() for line in (SYSTEMD / "dflash-sidecar.sysusers").read_text().splitlines()
                if line and not line.startswith("#")]
    assert [(f[0], f[1]) for f in sysusers] == [("u", "dflash-sidecar")]
    assert sysusers[0][-2:] == ["/var/lib/dflash-sidecar", "/usr/sbin/nologin"]
    assert s["Service.WorkingDirectory"] == ["%S/dflash-sidecar"] and s["Service.StateDirectory"] == ["dflash-sidecar"]
    tmpfiles = [line.split() for line in (SYSTEMD / "dflash-sidecar.tmpfiles").read_text().splitlines()
                if line and not line.startswith("#")]
    assert tmpfiles == [["d", SYSTEM_RUNTIME_DIR, s["Service.RuntimeDirectoryMode"][0], "dflash-sidecar",
                         "dflash-sidecar", "-"]]
    assert SOCKET_NAME == "sidecar.sock"


@pytest.mark.skipif(os.geteuid() != 0, reason="creating the socket directory's owner needs root")
def test_sysusers_and_tmpfiles_apply(tmp_path: Path) -> None:
    """systemd's own tools accept the files: the user is created, then the socket directory with
    mode 0750 owned by it (all inside a scratch root)."""
    sysusers = require_tool("systemd-sysusers", "systemd")
    tmpfiles = require_tool("systemd-tmpfiles", "systemd")
    (tmp_path / "etc").mkdir()
    result = run([sysusers, f"--root={tmp_path}", str(SYSTEMD / "dflash-sidecar.sysusers")])
    assert result.returncode == 0, result.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text()
    m = re.search(r"^dflash-sidecar:x:(\d+):(\d+):", passwd, re.MULTILINE)
    assert m, passwd
    result = run([tmpfiles, f"--root={tmp_path}", "--create", str(SYSTEMD / "dflash-sidecar.tmpfiles")])
    assert result.returncode == 0, result.stderr
    st = (tmp_path / SYSTEM_RUNTIME_DIR.lstrip("/")).stat()
    assert (oct(st.st_mode & 0o7777), st.st_uid, st.st_gid) == ("0o750", int(m.group(1)), int(m.group(2)))


def test_install_script_passes_shellcheck() -> None:
    """The installer, and the script that boots the real-systemd test's container."""
    shellcheck = require_tool("shellcheck", "shellcheck")
    result = run([shellcheck, "--severity=style", str(DEPLOY / "install.sh"),
                  str(Path(__file__).with_name("nspawn_boot.sh"))])
    assert result.returncode == 0, result.stdout + result.stderr
