"""Where the shim and the daemon meet: the default endpoint, computed the same way on both sides.

Order of precedence:

1. ``DFLASH_SIDECAR_ENDPOINT`` (any ZeroMQ endpoint, e.g. ``tcp://127.0.0.1:5557``).
2. Under systemd the daemon gets ``RUNTIME_DIRECTORY`` (``/run/dflash-sidecar``); a trainer on the
   same box finds that directory by its fixed path.
3. Otherwise a private per-user directory: ``$XDG_RUNTIME_DIR/dflash-sidecar`` or
   ``/tmp/dflash-sidecar-<uid>`` (mode 0700, created by the daemon).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SOCKET_NAME = "sidecar.sock"
SYSTEM_RUNTIME_DIR = "/run/dflash-sidecar"
ENDPOINT_ENV = "DFLASH_SIDECAR_ENDPOINT"


def user_runtime_dir(environ: Mapping[str, str] = os.environ) -> str:
    """The private per-user directory for the ipc socket (not created here)."""
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "dflash-sidecar")
    return f"/tmp/dflash-sidecar-{os.getuid()}"


def default_runtime_dir(environ: Mapping[str, str] = os.environ) -> str:
    """The runtime directory the daemon binds in: systemd's, the system one if present, else the
    per-user one."""
    systemd_dir = environ.get("RUNTIME_DIRECTORY")
    if systemd_dir:
        return systemd_dir.split(":")[0]
    if os.path.isdir(SYSTEM_RUNTIME_DIR):
        return SYSTEM_RUNTIME_DIR
    return user_runtime_dir(environ)


def default_endpoint(environ: Mapping[str, str] = os.environ) -> str:
    """The endpoint a shim connects to and a daemon binds when none is configured."""
    explicit = environ.get(ENDPOINT_ENV)
    if explicit:
        return explicit
    return "ipc://" + os.path.join(default_runtime_dir(environ), SOCKET_NAME)
