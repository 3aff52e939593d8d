"""``dflash-sidecar top``: a live terminal view of a running daemon, over its metrics endpoint.

Reads the Prometheus exposition (so it works wherever the endpoint is reachable, e.g. over SSH on
the box) and renders it with rich.
"""

from __future__ import annotations

import time
import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table


def scrape(url: str, timeout_s: float = 2.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name from ``url``. Raises ``OSError`` if the daemon cannot be reached."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - operator-given URL
        text = resp.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name].append((s.labels, s.value))
    return samples


def render(samples: dict[str, list[tuple[dict[str, str], float]]]) -> Group:
    """One frame: trainer timings per role/worker, GPUs, accounting."""
    timings = Table(title="trainer timings (last window, ms)", expand=True)
    for col in ("role", "worker", "timing", "p50", "p95", "max"):
        timings.add_column(col)
    rows: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for name, items in samples.items():
        if name.startswith("dflash_trainer_") and name.endswith("_seconds"):
            for labels, value in items:
                if "quantile" in labels:
                    key = (labels.get("role", ""), labels.get("worker", ""), name[len("dflash_trainer_"):-len("_seconds")])
                    rows[key][labels["quantile"]] = value * 1000
    for (role, worker, timing), q in sorted(rows.items()):
        timings.add_row(role, worker, timing, *(f"{q.get(k, float('nan')):.1f}" for k in ("0.5", "0.95", "1")))
    gpus = Table(title="GPUs", expand=True)
    for col in ("gpu", "util", "mem used GiB", "power W", "temp C"):
        gpus.add_column(col)
    by_gpu: dict[str, dict[str, float]] = defaultdict(dict)
    for metric, key in (("dflash_gpu_utilization_ratio", "util"), ("dflash_gpu_memory_used_bytes", "mem"),
                        ("dflash_gpu_power_watts", "power"), ("dflash_gpu_temperature_celsius", "temp")):
        for labels, value in samples.get(metric, []):
            by_gpu[labels.get("gpu", "?")][key] = value
    for gpu, v in sorted(by_gpu.items()):
        gpus.add_row(gpu, f"{v.get('util', float('nan')):.0%}", f"{v.get('mem', float('nan')) / 2**30:.1f}",
                     f"{v.get('power', float('nan')):.0f}", f"{v.get('temp', float('nan')):.0f}")
    acct = Table(title="accounting", expand=True)
    acct.add_column("what")
    acct.add_column("count", justify="right")
    for labels, value in samples.get("dflash_sidecar_records_accepted_total", []):
        acct.add_row(f"accepted {labels.get('role')}/{labels.get('worker')}", f"{value:,.0f}")
    for labels, value in samples.get("dflash_sidecar_records_dropped_total", []):
        acct.add_row(f"dropped {labels.get('role')}/{labels.get('worker')} {labels.get('reason')}", f"{value:,.0f}")
    parts = [timings, gpus, acct]
    verdict = [labels.get("verdict") for labels, v in samples.get("dflash_pipeline_bottleneck", []) if v == 1]
    if verdict:
        parts.insert(0, f"[bold]bottleneck: {verdict[0]}[/bold]")
    return Group(*parts)


def run_top(url: str, refresh_s: float, once: bool) -> int:
    """Show the view until Ctrl-C (or once). 1 if the daemon cannot be reached at start."""
    console = Console()
    try:
        frame = render(scrape(url))
    except OSError as exc:
        console.print(f"dflash-sidecar top: cannot read {url}: {exc}. Is the daemon running?")
        return 1
    if once:
        console.print(frame)
        return 0
    with Live(frame, console=console, refresh_per_second=4, screen=False) as live:
        try:
            while True:
                time.sleep(refresh_s)
                try:
                    live.update(render(scrape(url)))
                except OSError as exc:
                    live.update(f"cannot read {url}: {exc}")
        except KeyboardInterrupt:
            return 0
