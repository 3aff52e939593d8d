"""The Prometheus exporter's settings (``sidecar.model.settings``): where it listens, TLS, and the
dcgm-exporter names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from sidecar.model.address import parse_host_port
from sidecar.model.settings import setting


def listen_addr(raw: Any) -> str:
    """``HOST:PORT``. Raises ``ValueError`` saying what is expected (``parse_host_port``)."""
    parse_host_port(str(raw))
    return str(raw)


@dataclass(frozen=True)
class PrometheusSettings:
    """The ``/metrics`` endpoint."""

    TITLE: ClassVar[str] = "Prometheus"
    """The options' group in ``--help`` and the docs."""

    prometheus_addr: str = setting(
        "127.0.0.1:9478", check=listen_addr, metavar="HOST:PORT",
        help="Listen address of the Prometheus endpoint (HOST:PORT). Loopback by default.",
        summary="metrics endpoint, default 127.0.0.1:9478")
    prometheus_tls_cert: str | None = setting(
        None, metavar="FILE", help="PEM certificate: serve /metrics over TLS (needs prometheus_tls_key).",
        summary="serve /metrics over TLS, with --prometheus-tls-key")
    prometheus_tls_key: str | None = setting(None, metavar="FILE", help="PEM private key for prometheus_tls_cert.")
    dcgm_compat: bool = setting(
        False, kind="switch", reloadable=True,
        help="Also export dcgm-exporter's names, units and labels (DCGM_FI_*) for what NVML can feed, so "
             "dashboards and alerts written for it work unchanged (docs/METRICS.md).",
        summary="also export dcgm-exporter's names (docs/METRICS.md)")

    def check_settings(self) -> Mapping[str, Any]:
        """Raises ``ValueError`` unless the TLS files are given together and readable."""
        if bool(self.prometheus_tls_cert) != bool(self.prometheus_tls_key):
            raise ValueError("--prometheus-tls-cert and --prometheus-tls-key must be given together")
        for f in (self.prometheus_tls_cert, self.prometheus_tls_key):
            if f and not os.access(f, os.R_OK):
                raise ValueError(f"cannot read TLS file {f}")
        return {}
