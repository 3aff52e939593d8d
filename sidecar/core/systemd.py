"""systemd readiness notification (``sd_notify``): a datagram to ``$NOTIFY_SOCKET``.

A no-op when the variable is unset (not under systemd ``Type=notify``). Never raises.
"""

from __future__ import annotations

import os
import socket


def notify(state: str, environ: dict[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``READY=1``, ``RELOADING=1``, ``STOPPING=1``, ``STATUS=...``).
    Returns True if a message was sent."""
    address = (environ if environ is not None else os.environ).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError:
        return False
