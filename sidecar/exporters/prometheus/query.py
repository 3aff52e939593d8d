"""A small client of Prometheus's HTTP API (``/api/v1/query``, ``/api/v1/query_range``), stdlib
only: how ``dflash-sidecar cluster`` and ``report --prometheus`` read the straggler rules back, and
the W&B exporter's cluster row (``sidecar.exporters.wandb.cluster_row``). Works against anything
that serves that API: Prometheus, Thanos Query, Mimir/Cortex (with their path prefix in the base
URL)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

Vector = list[tuple[dict[str, str], float]]
"""An instant vector: (labels, value) per series."""


class PrometheusError(Exception):
    """Prometheus could not answer: the message says what to fix."""


class PrometheusApi:
    """Queries one server. ``base_url``: e.g. ``http://prometheus:9090`` (no ``/api/v1``)."""

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        parsed = urllib.parse.urlparse(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"--prometheus must be an http(s) URL such as http://prometheus:9090, not "
                                  f"{base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def query(self, promql: str, at_s: float | None = None) -> Vector:
        """The instant vector of ``promql`` now (or at ``at_s``, unix s). Raises ``PrometheusError``."""
        data = self._get("query", {"query": promql} | ({"time": f"{at_s:.3f}"} if at_s is not None else {}))
        return [(r.get("metric", {}), float(r["value"][1])) for r in data.get("result", [])]

    def query_range(self, promql: str, start_s: float, end_s: float, step_s: float) -> list[tuple[dict[str, str],
                                                                                                   list[float]]]:
        """Per series of ``promql``: its labels and the times (unix s) it had a value between
        ``start_s`` and ``end_s`` at ``step_s``. Raises ``PrometheusError``."""
        data = self._get("query_range", {"query": promql, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                                         "step": f"{step_s:g}"})
        return [(r.get("metric", {}), [float(t) for t, _ in r.get("values", [])]) for r in data.get("result", [])]

    def _get(self, endpoint: str, params: dict[str, str]) -> dict[str, Any]:
        url = f"{self.base_url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:  # noqa: S310 - operator-given URL
                body = resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
            message = _error_of(body) or exc.reason
            raise PrometheusError(f"Prometheus at {self.base_url} answered HTTP {exc.code}: {message}"
                                  + ("; is --prometheus the server's base URL (without /api/v1)?"
                                     if exc.code == 404 else "")) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(f"cannot reach Prometheus at {self.base_url}: {reason}; check --prometheus "
                                  "(host, port, http or https) and that the server runs") from None
        try:
            doc = json.loads(body)
        except ValueError:
            raise PrometheusError(f"{self.base_url} did not answer as Prometheus's HTTP API does (no JSON at "
                                  f"/api/v1/{endpoint}): is it the Prometheus server, not a daemon's /metrics?"
                                  ) from None
        if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(doc.get("data"), dict):
            raise PrometheusError(f"Prometheus at {self.base_url} refused the query: "
                                  f"{_error_of(body) or 'no data in its answer'}")
        return doc["data"]


def _error_of(body: bytes) -> str:
    """The ``error`` of a Prometheus API answer, or ''."""
    try:
        doc = json.loads(body)
    except ValueError:
        return ""
    return str(doc.get("error", "")) if isinstance(doc, dict) else ""
