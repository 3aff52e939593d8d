"""Where the shim and the daemon meet: the default endpoint, one rule for both sides.

``DFLASH_SIDECAR_ENDPOINT`` (any ZeroMQ endpoint, e.g. ``tcp://127.0.0.1:5557``) wins on both
sides. Without it:

- **The daemon** binds in systemd's runtime directory when systemd prepared one for it
  (``RUNTIME_DIRECTORY``, set by the units' ``RuntimeDirectory=``: ``/run/dflash-sidecar``).
  That variable is the definition of "under systemd" here: it is exactly what the units provide,
  and nothing outside a unit sets it. Otherwise the daemon binds in the private per-user
  directory: ``$XDG_RUNTIME_DIR/dflash-sidecar``, or ``/tmp/dflash-sidecar-<uid>`` (mode 0700,
  created by the daemon).
- **The shim** cannot see the daemon's environment, so it decides from what is on disk. It
  connects to ``/run/dflash-sidecar/sidecar.sock`` when (a) that socket exists and this user may
  connect to it (a daemon serves it, or is restarting there), or (b) ``/run/dflash-sidecar`` is
  the deployment's directory, owned by the system user ``dflash-sidecar`` (created at boot by
  tmpfiles.d and by the units), and this user may enter it (a member of its group): the daemon
  is about to bind there. Otherwise it connects to the per-user directory.

A directory left under ``/run`` by anything else (a daemon run by hand with an explicit
``--endpoint``) reroutes nobody. The one case where the two sides still differ: a daemon run by
hand on a box where a deployed daemon's socket (or directory) is present. That daemon logs a
warning naming the variable to set (``shim_would_miss``).
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Mapping

SOCKET_NAME = "sidecar.sock"
SYSTEM_RUNTIME_DIR = "/run/dflash-sidecar"
SYSTEM_USER = "dflash-sidecar"
"""The deployment's system user (deploy/systemd/dflash-sidecar.sysusers)."""
ENDPOINT_ENV = "DFLASH_SIDECAR_ENDPOINT"


def user_runtime_dir(environ: Mapping[str, str] = os.environ) -> str:
    """The private per-user directory for the ipc socket (not created here)."""
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "dflash-sidecar")
    return f"/tmp/dflash-sidecar-{os.getuid()}"


def _ipc(directory: str) -> str:
    return "ipc://" + os.path.join(directory, SOCKET_NAME)


def daemon_endpoint(environ: Mapping[str, str] = os.environ) -> str:
    """The endpoint a daemon binds when none is configured."""
    explicit = environ.get(ENDPOINT_ENV)
    if explicit:
        return explicit
    systemd_dir = environ.get("RUNTIME_DIRECTORY")
    if systemd_dir:
        return _ipc(systemd_dir.split(":")[0])
    return _ipc(user_runtime_dir(environ))


def system_socket_reachable(system_dir: str = SYSTEM_RUNTIME_DIR, system_user: str = SYSTEM_USER) -> bool:
    """Whether the shim's default is the system socket: rule (a) or (b) of the module docstring."""
    sock = os.path.join(system_dir, SOCKET_NAME)
    try:
        if stat.S_ISSOCK(os.stat(sock).st_mode) and os.access(sock, os.W_OK):
            return True
    except OSError:
        pass
    try:
        st = os.lstat(system_dir)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or not os.access(system_dir, os.X_OK):
        return False
    try:
        return pwd.getpwuid(st.st_uid).pw_name == system_user
    except KeyError:
        return False


def shim_endpoint(environ: Mapping[str, str] = os.environ, system_dir: str = SYSTEM_RUNTIME_DIR,
                  system_user: str = SYSTEM_USER) -> str:
    """The endpoint a shim connects to when none is configured."""
    explicit = environ.get(ENDPOINT_ENV)
    if explicit:
        return explicit
    if system_socket_reachable(system_dir, system_user):
        return _ipc(system_dir)
    return _ipc(user_runtime_dir(environ))


def shim_would_miss(bound: str, environ: Mapping[str, str] = os.environ, system_dir: str = SYSTEM_RUNTIME_DIR,
                    system_user: str = SYSTEM_USER) -> str | None:
    """For a daemon that binds ``bound`` (its default): the endpoint this user's default shims
    would connect to instead, or None when they find this daemon."""
    expected = shim_endpoint(environ, system_dir, system_user)
    return None if expected == bound else expected


TALLY_DIR_SUFFIX = ".tallies"
"""The tally directory's suffix: ``<socket path>.tallies``."""
DEPRECATED_TALLY_DIR_SUFFIX = ".ledger"
"""The tally directory's name before this release (``<socket path>.ledger``). Deprecated: the daemon
still creates and reads it, for shims of the previous release, and drops it in the next one."""


def tally_dir(endpoint: str) -> str | None:
    """Where the senders of ``endpoint`` keep their tallies: ``<socket path>.tallies`` beside an
    ipc socket, created by the daemon that binds it (never by a shim). None for other transports
    (tcp has no runtime directory both sides are sure to share)."""
    if not endpoint.startswith("ipc://") or len(endpoint) <= len("ipc://"):
        return None
    return endpoint[len("ipc://"):] + TALLY_DIR_SUFFIX


def tally_dirs(endpoint: str) -> tuple[str, ...]:
    """The tally directories a daemon keeps beside ``endpoint``'s socket: ``tally_dir`` first, then
    the deprecated ``<socket path>.ledger`` its shims of the previous release write into. Empty for
    other transports."""
    directory = tally_dir(endpoint)
    if directory is None:
        return ()
    return directory, directory[: -len(TALLY_DIR_SUFFIX)] + DEPRECATED_TALLY_DIR_SUFFIX
