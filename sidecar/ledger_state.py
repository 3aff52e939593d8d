"""The run ledger's state file: where it lives, and reading and writing it safely.

One JSON file, ``run-ledger.json``, in the state folder: ``$STATE_DIRECTORY`` (its first entry)
when systemd sets it, else the ``state_dir`` setting, else ``$XDG_STATE_HOME/dflash-sidecar``
(``~/.local/state/dflash-sidecar``). Written atomically (a temporary file in the same folder,
fsync, rename), with a version (``STATE_VERSION``): a file of a newer version, or one that does
not parse, is moved aside (``.v<N>`` / ``.corrupt``) and the ledger starts empty, so a downgrade or
a torn disk never stops the daemon and never overwrites what a newer daemon wrote.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from sidecar.aggregation.ledger import STATE_VERSION

log = logging.getLogger("sidecar")

FILE_NAME = "run-ledger.json"
MAX_STATE_BYTES = 16 * 2**20
"""A state file larger than this is not read (the ledger is bounded far below it)."""


def state_dir(configured: str | None = None) -> Path:
    """The state folder by the rule of the module docstring (not created here)."""
    systemd_dir = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd_dir:
        return Path(systemd_dir)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "dflash-sidecar"


def load(path: Path, move_aside: bool = True) -> tuple[dict[str, Any] | None, str | None]:
    """``(state, problem)``: the state of ``path`` (None when absent or unusable) and, when it was
    unusable, why (``corrupt``, ``newer_version``, ``unreadable``); an unusable file is moved aside
    when ``move_aside`` (the daemon's load; a reader such as ``report`` leaves it)."""
    try:
        if path.stat().st_size > MAX_STATE_BYTES:
            return _aside(path, "corrupt", "larger than the ledger can be", move_aside)
        state = json.loads(path.read_text(), parse_constant=_no_constant)
    except FileNotFoundError:
        return None, None
    except (ValueError, UnicodeDecodeError) as exc:
        return _aside(path, "corrupt", str(exc), move_aside)
    except OSError as exc:
        log.error("sidecar: run ledger state %s cannot be read (%s); starting an empty ledger", path, exc)
        return None, "unreadable"
    version = state.get("version") if isinstance(state, dict) else None
    if not isinstance(version, int) or not _valid(state):
        return _aside(path, "corrupt", "not a run ledger state", move_aside)
    if version > STATE_VERSION:
        return _aside(path, "newer_version", f"version {version}, this daemon reads up to {STATE_VERSION}",
                      move_aside)
    return state, None


def save(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` atomically (readers see the old file or the new one, never a mix).
    Raises ``OSError`` when the folder cannot be created or written."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = json.dumps(state, separators=(",", ":"), allow_nan=False).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a ledger holds")


def _valid(state: dict[str, Any]) -> bool:
    """The shape ``RunLedger`` reads: runs -> roles -> totals with finite numbers."""
    runs = state.get("runs", {})
    if not isinstance(runs, dict):
        return False
    for roles in runs.values():
        if not isinstance(roles, dict):
            return False
        for r in roles.values():
            if not isinstance(r, dict) or not isinstance(r.get("senders"), dict):
                return False
            numbers = [*r.get("seconds", {}).values(), *r.get("joules", {}).values(), r.get("tokens"), r.get("steps")]
            if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in numbers):
                return False
    return True


def _aside(path: Path, why: str, detail: str, move: bool) -> tuple[None, str]:
    if not move:
        return None, why
    suffix = ".corrupt" if why == "corrupt" else ".newer"
    try:
        os.replace(path, path.with_name(path.name + suffix))
    except OSError:
        pass
    log.error("sidecar: run ledger state %s is unusable (%s); moved aside to %s, starting an empty ledger",
              path, detail, path.name + suffix)
    return None, why
