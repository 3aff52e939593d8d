"""``top``'s run ledger pane: per run and role, wall time, goodput and the largest badput causes,
from a scrape of the ``dflash_ledger_*`` families (docs/METRICS.md, "Run ledger")."""

from __future__ import annotations

from collections import defaultdict

from rich.table import Table

Samples = dict[str, list[tuple[dict[str, str], float]]]


def ledger_table(samples: Samples) -> Table | None:
    """The pane, or None when the daemon exports no run ledger yet."""
    seconds: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for labels, value in samples.get("dflash_ledger_seconds_total", []):
        seconds[labels.get("run", ""), labels.get("role", "")][labels.get("cause", "")] = value
    if not seconds:
        return None
    extra: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for name, column in (("dflash_ledger_tokens_per_gpu_per_second", "tok"), ("dflash_ledger_mfu_ratio", "mfu"),
                         ("dflash_ledger_joules_per_token", "jpt")):
        for labels, value in samples.get(name, []):
            extra[labels.get("run", ""), labels.get("role", "")][column] = value
    table = Table(title="run ledger (since the run's first sender started)", expand=True)
    for col in ("run", "role", "wall s", "goodput", "top badput", "tok/s/GPU", "MFU", "J/token"):
        table.add_column(col)
    for (run, role), causes in sorted(seconds.items()):
        wall = sum(causes.values())
        good = causes.get("productive", 0.0)
        bad = sorted(((v, c) for c, v in causes.items() if c != "productive" and v > 0), reverse=True)[:3]
        e = extra[run, role]
        table.add_row(run, role, f"{wall:.0f}", f"{good / wall:.0%}" if wall > 0 else "-",
                      ", ".join(f"{c} {v / wall:.0%}" for v, c in bad) if wall > 0 else "-",
                      f"{e['tok']:.0f}" if "tok" in e else "-", f"{e['mfu']:.1%}" if "mfu" in e else "-",
                      f"{e['jpt']:.3g}" if "jpt" in e else "-")
    return table
