"""The sources' settings (``sidecar.model.settings``): the receiver's endpoints and the NVML poller.

Kept apart from the sources themselves so that reading a config loads neither ZeroMQ nor NVML."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from sidecar.model.address import parse_host_port
from sidecar.model.liveness import GONE_AFTER_S
from sidecar.model.settings import declared, one_of, setting
from sidecar.sources.nvml_cadence import COST_AWARE, MODES
from trainer_shim.endpoint import daemon_endpoint


def endpoint(raw: Any) -> str:
    """An ``ipc://`` or ``tcp://HOST:PORT`` endpoint. Raises ``ValueError`` saying what is expected."""
    value = str(raw)
    if value.startswith("ipc://") and len(value) > len("ipc://"):
        return value
    if value.startswith("tcp://"):
        parse_host_port(value[len("tcp://"):], example="tcp://127.0.0.1:5557")
        return value
    raise ValueError("expected ipc:///path/to/socket or tcp://HOST:PORT, e.g. tcp://127.0.0.1:5557")


def remote_endpoints(endpoints: tuple[str, ...]) -> list[str]:
    """The tcp endpoints that bind an address other than loopback (``*``, ``0.0.0.0``, a NIC's address)."""
    out = []
    for candidate in endpoints:
        if candidate.startswith("tcp://"):
            host = candidate[len("tcp://"):].rpartition(":")[0].strip("[]")
            if host != "localhost":
                try:
                    loopback = ipaddress.ip_address(host).is_loopback
                except ValueError:
                    loopback = False
                if not loopback:
                    out.append(candidate)
    return out


@dataclass(frozen=True)
class ReceiverSettings:
    """Where the daemon listens for shims."""

    TITLE: ClassVar[str] = "receiver"
    """The options' group in ``--help`` and the docs."""

    endpoint: tuple[str, ...] = setting(
        default_factory=lambda: (daemon_endpoint(),), kind="list", check=endpoint, metavar="URL",
        example="ipc:///run/dflash-sidecar/sidecar.sock",
        default_note="sidecar.sock in $RUNTIME_DIRECTORY under systemd, else in the per-user directory",
        help="ZeroMQ endpoint to bind for shims (repeatable): ipc:///path or tcp://127.0.0.1:PORT.",
        summary="ZeroMQ endpoint to bind, repeatable (default: an ipc:// socket in /run/dflash-sidecar/ under "
                "systemd, a private per-user directory otherwise; docs/DEPLOY.md section 3)")
    endpoint_allow_remote: bool = setting(False, kind="switch", help=(
        "Allow a tcp:// endpoint on an address other than loopback (anyone who can reach it may then send "
        "records; a warning is logged). Off: tcp is loopback-only."))

    sender_gone_after: float = setting(
        GONE_AFTER_S, check=float, bounds=(1.0, 600.0), unit="seconds", metavar="S",
        help="A sender's process gone (or its publisher closed) has its tally reconciled, and how it ended "
             "told, once its senders have been silent this long (seconds): its last frames still on the way are "
             "counted as received first.")

    def check_settings(self) -> Mapping[str, Any]:
        """No endpoint given: the default one. Raises ``ValueError`` for a tcp endpoint beyond
        loopback without ``endpoint_allow_remote``."""
        fixed = {} if self.endpoint else {"endpoint": (daemon_endpoint(),)}
        remote = remote_endpoints(self.endpoint)
        if remote and not self.endpoint_allow_remote:
            raise ValueError(f"endpoint {remote[0]} is not on loopback: anyone who can reach that address could send "
                             "records to the daemon. Bind tcp://127.0.0.1:PORT (shims connect from the same host), or "
                             "pass --endpoint-allow-remote (endpoint_allow_remote = true) behind a firewall")
        return fixed


@dataclass(frozen=True)
class NvmlSettings:
    """The NVML poller."""

    TITLE: ClassVar[str] = "NVML"
    """The options' group in ``--help`` and the docs."""

    nvml_interval: float = setting(1.0, check=float, bounds=(0.1, 3600.0), unit="seconds", metavar="S", help=(
        "NVML polling period (seconds). Sub-second polling has cost throughput elsewhere."),
        summary="GPU polling period, default 1 s")
    gpu_metrics: bool = setting(True, kind="switch", help="Poll the GPUs through NVML (false: no GPU metrics, for "
                                "a box without GPUs).", off_help="Do not poll the GPUs through NVML (a box without "
                                "GPUs).", summary="turn NVML off (a box without GPUs)")
    nvml_cpu_budget: float = setting(0.01, check=float, bounds=(0.001, 1.0), unit="of one core", metavar="SHARE",
                                     help=(
        "Share of one core the NVML poller may use (0.01: one percent). Utilization, power, memory, clocks and "
        "clock-event reasons are read every poll whatever it costs; the slow values (energy counter, PCIe, ECC "
        "and throttle counters, power limit, memory temperature, GPM) are read less often when needed to keep "
        "it (docs/NVML.md, cadences)."))
    nvml_cadence: str = setting(COST_AWARE, check=one_of(*MODES), metavar="MODE", help=(
        "cost-aware: each value at its own cadence, within nvml_cpu_budget; every-poll: every value every "
        "poll, as before the cadences (costs milliseconds per GPU and poll on some drivers; for comparison)."))


NVML_INTERVAL, _, NVML_CPU_BUDGET, _ = declared(NvmlSettings)
"""The poll period's and the CPU budget's declarations (``NvmlSource``'s defaults are theirs)."""
