"""Which node held a run back most, from Prometheus's history of the straggler rules
(``dflash-sidecar report --prometheus URL``): for each run of the ledger, over its time span, the
share of the run's evaluated time each node was named, its cause, its mean excess seconds per step
and the GPU-hours the run's other nodes lost waiting for it. The ledger names a run by its W&B run
id before the launcher's label, the cluster rules the other way round (docs/DEPLOY.md, "Many
nodes"): a run known to both under different names finds no history here."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sidecar.cli.cluster import HOSTS, LOST, NAMED, _selector
from sidecar.exporters.prometheus.query import PrometheusApi, PrometheusError
from sidecar.model.ledger import RunLedgerView


@dataclass(frozen=True, slots=True)
class HeldBack:
    """A node named over a run's span: the share of the run's evaluated time it was named (0-1),
    its cause, its mean excess seconds per step while named, GPU-hours the others lost."""

    run: str
    host: str
    cause: str
    named_share: float
    excess_s: float
    lost_gpu_hours: float


def held_back(api: PrometheusApi, run: str, start_s: float, end_s: float) -> list[HeldBack]:
    """The nodes named in ``run`` between ``start_s`` and ``end_s`` (unix s), most named first.
    Raises ``PrometheusError``."""
    span = max(1, int(end_s - start_s) + 1)
    sel, at = _selector(run), f"[{span}s]"
    evaluated = api.query(f"count_over_time({HOSTS}{sel}{at})", end_s)
    if not evaluated or evaluated[0][1] <= 0:
        return []
    total = evaluated[0][1]
    def by_node(promql: str) -> dict[tuple[str, str], float]:
        return {(lab["host"], lab.get("cause", "")): v for lab, v in api.query(promql, end_s)}

    counts = by_node(f"count_over_time({NAMED}{sel}{at})")
    excess = by_node(f"avg_over_time({NAMED}{sel}{at})")
    lost = by_node(f"avg_over_time({LOST}{sel}{at})")
    rows = [HeldBack(run, host, cause, n / total, excess.get((host, cause), 0.0),
                     lost.get((host, cause), 0.0) * (n / total) * span / 3600.0)
            for (host, cause), n in counts.items()]
    return sorted(rows, key=lambda r: (-r.named_share, r.host))


def report_lines(url: str, view: RunLedgerView, run: str | None) -> tuple[list[str], dict[str, Any]]:
    """The report's cluster section (text lines and JSON) for the ledger's runs (or ``run``);
    Prometheus's failure is said in the section, never raised."""
    try:
        api = PrometheusApi(url)
        out: dict[str, Any] = {}
        for name in ([run] if run else list(view.runs)):
            roles = view.run(name)
            if roles:
                start, end = min(r.first_unix_s for r in roles), max(r.last_unix_s for r in roles)
                out[name] = [asdict(h) for h in held_back(api, name, start, end)]
    except PrometheusError as exc:
        return [f"cluster: {exc}"], {"error": str(exc)}
    lines = [f"cluster (from {url}):"]
    for name, rows in out.items():
        if not rows:
            lines.append(f"  run {name}: no node held it back (or no cluster history under that name)")
            continue
        top = rows[0]
        lines.append(f"  run {name}: held back most by {top['host']} ({top['cause']}) for {top['named_share']:.0%} "
                     f"of its time, {top['excess_s']:.3f} s per step; the other nodes lost "
                     f"{top['lost_gpu_hours']:.3g} GPU-hours"
                     + (f" ({len(rows) - 1} other node(s) named)" if len(rows) > 1 else ""))
    return lines, out
