"""``HOST:PORT`` as the daemon's options give it (``--prometheus-addr``, ``tcp://`` endpoints)."""

from __future__ import annotations

import ipaddress

DEFAULT_HOST = "127.0.0.1"


def parse_host_port(text: str, example: str = "127.0.0.1:9478") -> tuple[str, int]:
    """``"127.0.0.1:9478"``, ``"[::1]:9478"``, ``"localhost:9478"`` or ``":9478"`` -> (host, port);
    brackets are removed, an empty host is ``DEFAULT_HOST``. Raises ``ValueError`` saying what to
    fix: no port, a port outside 1-65535, or a host that is neither ``localhost`` nor an IP address;
    it cites ``example``, which the caller picks to fit the option being parsed."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT with a port from 1 to 65535, e.g. {example}")
    host = host.strip("[]")
    if host not in ("", "localhost"):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IP address (use 127.0.0.1, 0.0.0.0 or ::1)") from None
    return host or DEFAULT_HOST, int(port)
