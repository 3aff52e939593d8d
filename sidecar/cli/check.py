"""``dflash-sidecar check``: what would stop a deployment, reported before it happens.

Each check prints ``ok``/``FAIL``/``warn`` and a line saying what it found; the exit status is 1
if any check failed. Secrets are never printed (only whether a W&B key is configured).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from sidecar.cli.exit_status import FAILURE, OK
from sidecar.core.config import Config
from sidecar.exporters.wandb.join import NO_CREDENTIALS, credential_source
from sidecar.model.address import parse_host_port
from sidecar.sources.receiver import EndpointError, Receiver
from trainer_shim.endpoint import daemon_endpoint, shim_would_miss

Result = tuple[str, str]


def check_endpoints(cfg: Config) -> Result:
    """Bind every endpoint as the daemon would, then undo it: socket files, lock files and any
    socket directory this check had to create are removed again."""
    created: list[str] = []
    try:
        for endpoint in cfg.endpoint:
            if endpoint.startswith("ipc://"):
                created += _make_missing_dirs(os.path.dirname(endpoint[len("ipc://"):]) or ".")
        Receiver(list(cfg.endpoint)).close()
    except EndpointError as exc:
        return "FAIL", str(exc)
    finally:
        for directory in reversed(created):
            try:
                os.rmdir(directory)
            except OSError:
                pass
    note = f" (would create {', '.join(created)})" if created else ""
    missed = shim_would_miss(cfg.endpoint[0]) if cfg.endpoint == (daemon_endpoint(),) else None
    if missed:
        return "warn", (f"can bind {cfg.endpoint[0]}{note}, but trainers of this user without "
                        f"DFLASH_SIDECAR_ENDPOINT connect to {missed} (a deployed daemon's socket directory)")
    return "ok", "can bind " + ", ".join(cfg.endpoint) + note


def _make_missing_dirs(directory: str) -> list[str]:
    """Create ``directory`` and its missing parents (0700); returns those created, outermost first.
    Raises ``EndpointError``."""
    missing: list[str] = []
    d = os.path.abspath(directory)
    while not os.path.lexists(d):
        missing.append(d)
        d = os.path.dirname(d)
    missing.reverse()
    made: list[str] = []
    for d in missing:
        try:
            os.mkdir(d, 0o700)
        except OSError as exc:
            for m in reversed(made):
                os.rmdir(m)
            raise EndpointError(f"cannot create the socket directory {d}: {exc.strerror}") from None
        made.append(d)
    return made


def check_port(cfg: Config) -> Result:
    host, port = parse_host_port(cfg.prometheus_addr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            return "FAIL", f"cannot listen on {cfg.prometheus_addr}: {exc.strerror}"
    exposure = "" if host in ("127.0.0.1", "::1", "localhost") else " (not loopback: reachable from the network)"
    return ("ok" if not exposure else "warn"), f"can listen on {cfg.prometheus_addr}{exposure}"


def check_nvml(cfg: Config) -> Result:
    if not cfg.gpu_metrics:
        return "ok", "GPU metrics disabled (--no-gpu-metrics)"
    try:
        from sidecar.sources.nvml import probe_nvml
    except ImportError:
        return "warn", "NVML source not available in this build"
    ok, message = probe_nvml()
    return ("ok" if ok else "warn"), message


def check_wandb(cfg: Config) -> Result:
    if not cfg.wandb_run:
        return "ok", "W&B export disabled (no --wandb-run)"
    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("offline", "disabled"):
        return "ok", f"WANDB_MODE={mode}: logging to a local offline run for a later `wandb sync`"
    source = credential_source(os.environ)
    if source is None:
        return "FAIL", NO_CREDENTIALS
    return "ok", f"W&B credentials from {source}; will join run {cfg.wandb_run!r} in shared mode"


CHECKS: tuple[tuple[str, Callable[[Config], Result]], ...] = (
    ("endpoint", check_endpoints), ("prometheus", check_port), ("nvml", check_nvml), ("wandb", check_wandb),
)


def run_check(cfg: Config) -> int:
    """Run every check, print one line each; 1 if any failed."""
    failed = False
    for name, fn in CHECKS:
        try:
            status, message = fn(cfg)
        except Exception as exc:  # noqa: BLE001 - a check that crashes is a failed check
            status, message = "FAIL", f"check crashed: {exc!r}"
        failed |= status == "FAIL"
        print(f"{status:>4}  {name:<10} {message}")
    return FAILURE if failed else OK
