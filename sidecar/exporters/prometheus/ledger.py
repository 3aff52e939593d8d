"""Prometheus families of the run ledger (``dflash_ledger_*``), built at scrape time from the
window's ``RunLedgerView``. Only the runs with a live sender, and the most recent run, are
exported (the ledger keeps more, ``dflash-sidecar report`` shows them): a finished run's series
then end instead of accumulating. docs/METRICS.md ("Run ledger") lists every family.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sidecar.model.ledger import CAUSES, RoleLedger, RunLedgerView

P = "dflash_ledger_"


def shown_roles(view: RunLedgerView) -> list[RoleLedger]:
    """The roles of the most recent run and of every run with no open gap (a live sender)."""
    runs = view.runs
    latest = runs[-1] if runs else None
    return [r for r in view.roles if r.run == latest or r.open_gap_s == 0.0]


def ledger_families(view: RunLedgerView, host: str) -> list[Metric]:
    """Every ``dflash_ledger_*`` family."""
    labels = ["host", "run", "role"]
    seconds = CounterMetricFamily(P + "seconds", "Wall time of the run's role by cause, seconds since its first "
                                  "sender started; the causes sum to its wall time (docs/METRICS.md, Run ledger).",
                                  labels=labels + ["cause"])
    joules = CounterMetricFamily(P + "energy_joules", "GPU energy of the role's GPUs by cause (a window's energy "
                                 "split in proportion to its seconds), joules.", labels=labels + ["cause"])
    goodput = GaugeMetricFamily(P + "goodput_ratio", "Productive share of the role's wall time (0-1).", labels=labels)
    tokens = CounterMetricFamily(P + "tokens", "Tokens the role processed (the trainer's tokens counter, else "
                                 "the tokens/s it reports over its stepping time).", labels=labels)
    steps = CounterMetricFamily(P + "steps", "Steps the role advanced (its step numbers, else its step timings, "
                                "batches counter or phase timings).", labels=labels)
    per_gpu = GaugeMetricFamily(P + "tokens_per_gpu_per_second", "Tokens per second of wall time per GPU of the "
                                "role, over the run.", labels=labels)
    mfu = GaugeMetricFamily(P + "mfu_ratio", "Model FLOPs utilization over the run's wall time (0-1): the stated "
                            "FLOPs per token times tokens/s/GPU over the GPU's dense BF16 peak, else the trainer's "
                            "own MFU or FLOP/s over its stepping time.", labels=labels)
    per_token = GaugeMetricFamily(P + "joules_per_token", "GPU energy per token over the run, joules.",
                                  labels=labels)
    per_step = GaugeMetricFamily(P + "joules_per_step", "GPU energy per step over the run, joules.", labels=labels)
    gap = GaugeMetricFamily(P + "open_gap_seconds", "Seconds since the role's last sender went silent with no "
                            "successor yet (0 while one is alive).", labels=labels)
    for r in shown_roles(view):
        key = [host, r.run, r.role]
        for cause in CAUSES:
            seconds.add_metric(key + [cause], r.seconds[cause])
            joules.add_metric(key + [cause], r.joules[cause])
        tokens.add_metric(key, r.tokens)
        steps.add_metric(key, float(r.steps))
        gap.add_metric(key, r.open_gap_s)
        for fam, value in ((goodput, r.goodput_ratio), (per_gpu, r.tokens_per_s_per_gpu), (mfu, r.mfu_ratio),
                           (per_token, r.joules_per_token), (per_step, r.joules_per_step)):
            if value is not None:
                fam.add_metric(key, value)
    idle = CounterMetricFamily(P + "no_trainer_seconds", "Seconds the daemon ran with no live trainer, summed "
                               "across daemon restarts.", labels=["host"])
    idle.add_metric([host], view.no_trainer_s)
    idle_j = CounterMetricFamily(P + "no_trainer_energy_joules", "GPU energy while no trainer was live, joules.",
                                 labels=["host"])
    idle_j.add_metric([host], view.no_trainer_j)
    errors = CounterMetricFamily(P + "state_errors", "Failed loads, saves or updates of the run ledger by reason.",
                                 labels=["host", "reason"])
    for reason, n in sorted(view.state_errors.items()):
        errors.add_metric([host, reason], float(n))
    families: list[Metric] = [seconds, joules, goodput, tokens, steps, per_gpu, mfu, per_token, per_step, gap, idle,
                              idle_j, errors]
    return [f for f in families if f.samples or f.name.endswith("no_trainer_seconds")
            or f.name.endswith("no_trainer_energy_joules")]
