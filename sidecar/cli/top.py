"""``dflash-sidecar top``: a terminal view of a running daemon, redrawn as it runs, over its metrics
endpoint.

Reads the Prometheus exposition (so it works wherever the endpoint is reachable, e.g. over SSH on
the box) and renders it with rich. The interactive screen (keys, scrolling, waiting for the
daemon) is ``sidecar.cli.top_screen``.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group, RenderableType
from rich.table import Table

from sidecar.cli.top_ends import ends_line
from sidecar.cli.top_ledger import ledger_table
from sidecar.model.meanings import REPORTED

Samples = dict[str, list[tuple[dict[str, str], float]]]
"""Sample name -> (labels, value) of each sample, as scraped."""

ABSENT = "-"
"""What a cell shows for a value the daemon does not export (never ``nan``)."""


def fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    """``value * scale`` formatted with ``spec``; ``ABSENT`` for a missing or NaN value."""
    if value is None or value != value:
        return ABSENT
    return format(value * scale, spec)


def scrape(url: str, timeout_s: float = 2.0) -> Samples:
    """Samples by name from ``url``. Raises ``OSError`` if the daemon cannot be reached."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - operator-given URL
        return samples_of(resp.read().decode())


def samples_of(text: str) -> Samples:
    """Samples by name (a name absent: no samples) from a Prometheus text page. Raises
    ``ValueError`` for text that is no exposition."""
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name].append((s.labels, s.value))
    return samples


def render(samples: Samples) -> Group:
    """One frame: pipeline insight, trainer timings per role/worker, GPUs, accounting."""
    timings = Table(title="trainer timings (last window, ms)", expand=True)
    for col in ("role", "worker", "timing", "p50", "p95", "max"):
        timings.add_column(col)
    rows: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for name, items in samples.items():
        if name.startswith("dflash_trainer_") and name.endswith("_seconds"):
            for labels, value in items:
                if "quantile" in labels:
                    timing = name[len("dflash_trainer_"):-len("_seconds")]
                    key = (labels.get("role", ""), labels.get("worker", ""), timing)
                    rows[key][labels["quantile"]] = value * 1000
    for (role, worker, timing), q in sorted(rows.items()):
        timings.add_row(role, worker, timing, *(fmt(q.get(k), ".1f") for k in ("0.5", "0.95", "1")))
    ledger = ledger_table(samples)
    ended = ends_line(samples)
    return Group(*pipeline_parts(samples), *([ended] if ended else []), timings, gpu_table(samples),
                 *([ledger] if ledger else []), accounting_table(samples))


def gpu_table(samples: Samples) -> Table:
    """One row per GPU; with none, the caption says why (NVML off, unavailable, stalled, no GPU)."""
    gpus = Table(title="GPUs", expand=True)
    for col in ("gpu", "util", "mem used GiB", "power W", "temp C"):
        gpus.add_column(col)
    by_gpu: dict[str, dict[str, float]] = defaultdict(dict)
    for metric, column in (("dflash_gpu_utilization_ratio", "util"), ("dflash_gpu_memory_used_bytes", "mem"),
                           ("dflash_gpu_power_watts", "power"), ("dflash_gpu_temperature_celsius", "temp")):
        for labels, value in samples.get(metric, []):
            by_gpu[labels.get("gpu", "?")][column] = value
    for gpu, v in sorted(by_gpu.items()):
        gpus.add_row(gpu, fmt(v.get("util"), ".0%"), fmt(v.get("mem"), ".1f", 2**-30), fmt(v.get("power"), ".0f"),
                     fmt(v.get("temp"), ".0f"))
    if not by_gpu:
        gpus.caption = no_gpu_reason(samples)
    return gpus


def no_gpu_reason(samples: Samples) -> str:
    """Why the daemon shows no GPU, from its NVML health gauges."""
    up = samples.get("dflash_nvml_up")
    if not up:
        return "no GPU data: GPU metrics are turned off on the daemon (--no-gpu-metrics)"
    if any(v == 1 for _, v in samples.get("dflash_nvml_stalled", [])):
        return "no GPU data: an NVML call is hanging (wedged driver?); see the daemon's log"
    if all(v == 0 for _, v in up):
        return ("no GPU data: NVML is unavailable on the daemon's host (no NVIDIA driver or library, or not "
                "initialized yet); the daemon's log says why")
    return "no GPU data: NVML answers but reports no GPU"


def accounting_table(samples: Samples) -> Table:
    """One row per role/worker: records accepted and dropped, the largest drop reasons first."""
    acct = Table(title="accounting (records since the daemon started)", expand=True)
    for col, justify in (("role/worker", "left"), ("accepted", "right"), ("dropped", "right"),
                         ("drops by reason", "left")):
        acct.add_column(col, justify=justify)  # type: ignore[arg-type]
    accepted: dict[tuple[str, str], float] = defaultdict(float)
    dropped: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for labels, value in samples.get("dflash_sidecar_records_accepted_total", []):
        accepted[labels.get("role", ""), labels.get("worker", "")] += value
    for labels, value in samples.get("dflash_sidecar_records_dropped_total", []):
        if value:
            dropped[labels.get("role", ""), labels.get("worker", "")][labels.get("reason", "?")] = value
    for key in sorted(accepted.keys() | dropped.keys()):
        reasons = sorted(dropped[key].items(), key=lambda kv: -kv[1])
        acct.add_row(f"{key[0]}/{key[1]}", f"{accepted.get(key, 0):,.0f}", f"{sum(dropped[key].values()):,.0f}",
                     " ".join(f"{reason} {n:,.0f}" for reason, n in reasons))
    messages = [(labels.get("reason", "?"), v) for labels, v in samples.get("dflash_sidecar_messages_dropped_total", [])
                if v]
    if messages:
        acct.caption = "whole messages dropped: " + " ".join(f"{r} {n:,.0f}" for r, n in sorted(messages))
    return acct


def _one(samples: Samples, name: str) -> float | None:
    items = samples.get("dflash_pipeline_" + name)
    return items[0][1] if items else None


QUEUE_PARTS = (("queue fill", "queue_fill_ratio", ".0%"), ("ready deficit", "ready_deficit_ratio", ".0%"),
               ("target:drafter batches", "target_drafter_batch_ratio", ".2f"),
               ("prefetch fill", "prefetch_fill_ratio", ".0%"), ("tokens/batch", "batch_tokens_mean", ",.0f"),
               ("loss tokens", "loss_token_ratio", ".0%"), ("bucket entropy (bits)", "bucket_entropy", ".2f"))
"""The optional window values ``top`` shows in one line, each only when the daemon exports it."""


_REPORTED_SHOWN = {"tokens_per_s": ("tok/s", ",.0f", 1.0), "samples_per_s": ("samples/s", ",.1f", 1.0),
                   "steps_per_s": ("steps/s", ".2f", 1.0), "flops_per_s": ("TFLOP/s", ",.1f", 1e-12),
                   "mfu": ("MFU", ".1%", 1.0)}
REPORTED_PARTS = tuple((label, fig.family, (spec, scale)) for fig in REPORTED
                       for label, spec, scale in [_REPORTED_SHOWN[fig.meaning]])
"""The trainer's own figures (``dflash_pipeline_reported_*``) in the roles table: label, family, format."""


def pipeline_parts(samples: Samples) -> list[RenderableType]:
    """The pipeline insight: verdict, queue health, roles (rates, time shares), workers. Empty
    before the daemon's first window; the confidence only for a verdict that has one, and only
    the values the trainer publishes (no ``nan``)."""
    verdict = [labels.get("verdict") for labels, v in samples.get("dflash_pipeline_bottleneck", []) if v == 1]
    if not verdict:
        return []
    quiet = verdict[0] in ("unknown", "idle")
    style = "green" if verdict[0] == "balanced" else "yellow" if quiet else "bold red"
    queue = " · ".join(f"{label} {fmt(value, spec)}" for label, name, spec in QUEUE_PARTS
                       if (value := _one(samples, name)) is not None)
    roles = Table(title="pipeline roles (last window)", expand=True)
    for col in ("role", "tokens/s", "batches/s", "rate CV", "time share", "trainer reports"):
        roles.add_column(col)
    by_role: dict[str, dict[str, float]] = defaultdict(dict)
    for key, name in (("tokens", "tokens_per_second"), ("batches", "batches_per_second"), ("cv", "rate_cv_ratio"),
                      *((label, "reported_" + family) for label, family, _ in REPORTED_PARTS)):
        for labels, value in samples.get("dflash_pipeline_" + name, []):
            by_role[labels.get("role", "")][key] = value
    shares: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for labels, value in samples.get("dflash_pipeline_time_share_ratio", []):
        shares[labels.get("role", "")].append((value, labels.get("phase", "")))
    for role, v in sorted(by_role.items()):
        top = " ".join(f"{phase} {share:.0%}" for share, phase in sorted(shares[role], reverse=True)[:4])
        own = " · ".join(f"{label} {fmt(v[label], spec, scale)}" for label, _, (spec, scale) in REPORTED_PARTS
                         if label in v)
        roles.add_row(role, fmt(v.get("tokens"), ",.0f"), fmt(v.get("batches"), ".1f"), fmt(v.get("cv"), ".2f"), top,
                      own or "-")
    workers = Table(title="pipeline workers", expand=True)
    for col in ("role", "worker", "batches/s", "score", "straggler"):
        workers.add_column(col)
    by_worker: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for key, name in (("rate", "worker_batches_per_second"), ("score", "worker_score_ratio"),
                      ("straggler", "straggler")):
        for labels, value in samples.get("dflash_pipeline_" + name, []):
            by_worker[labels.get("role", ""), labels.get("worker", "")][key] = value
    for (role, worker), v in sorted(by_worker.items()):
        workers.add_row(role, worker, fmt(v.get("rate"), ".1f"), fmt(v.get("score"), ".2f"),
                        "[bold red]yes[/bold red]" if v.get("straggler") == 1 else "")
    idle: dict[str, dict[str, float]] = defaultdict(dict)
    for labels, value in samples.get("dflash_pipeline_gpu_idle_ratio", []):
        idle[labels.get("group", "")]["idle"] = value
    for labels, value in samples.get("dflash_pipeline_gpu_idle_reason_ratio", []):
        idle[labels.get("group", "")][labels.get("reason", "")] = value
    idle_lines = [f"gpu idle {group}: {fmt(v.get('idle'), '.0%')} = "
                  + " + ".join(f"{reason} {share:.0%}" for reason, share in v.items() if reason != "idle")
                  for group, v in sorted(idle.items())]
    confidence = _one(samples, "verdict_confidence_ratio")
    head = f"[{style}]bottleneck: {verdict[0]}[/{style}]" + (
        f" (confidence {confidence:.2f})" if confidence is not None and not quiet else
        " (no live trainer)" if verdict[0] == "idle" else "")
    parts: list[RenderableType] = [head]
    if queue:
        parts.append(queue)
    return [*parts, *idle_lines, roles, workers]

