"""A real Prometheus server, started by hand (not by systemd), scraping one target every second."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

from tests.launcher import free_port, http_get


class Prometheus:
    def __init__(self, binary: str, tmp: Path, target_port: int) -> None:
        self.port = free_port()
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs:\n  - job_name: sidecar\n    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n")
        self._log = open(tmp / "prometheus.log", "wb")
        self.proc = subprocess.Popen([binary, f"--config.file={tmp}/prometheus.yml",
                                      f"--storage.tsdb.path={tmp}/prom-data",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=self._log)

    def api(self, path: str, **params: Any) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        body = json.loads(http_get(url, timeout_s=10))
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; [] while Prometheus is not up yet."""
        try:
            return self.api("query", query=expr, **({"time": at} if at is not None else {}))["result"]
        except OSError:
            return []

    def samples(self, selector: str, window: str, at: float) -> list[tuple[float, float]]:
        """The raw samples of one series over ``window`` ending at ``at``."""
        result = self.query(f"{selector}[{window}]", at)
        if len(result) != 1:
            raise AssertionError(f"{selector}: expected one series, got {result}")
        return [(float(t), float(v)) for t, v in result[0]["values"]]

    def range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[tuple[float, float]]:
        result = self.api("query_range", query=expr, start=start, end=end, step=step)["result"]
        return [(float(t), float(v)) for series in result for t, v in series["values"]]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def scalar(result: list[dict[str, Any]]) -> float | None:
    return float(result[0]["value"][1]) if result else None


def wait_samples(prom: Prometheus, selector: str, value: float, count: int, timeout_s: float = 40.0) -> None:
    """Wait until Prometheus holds ``count`` samples of ``selector`` equal to ``value``."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        result = prom.query(f"{selector}[2m]")
        seen = sum(1 for s in result for _, v in s["values"] if float(v) == value)
        if seen >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus has {seen} samples of {selector} == {value}, wanted {count}")
