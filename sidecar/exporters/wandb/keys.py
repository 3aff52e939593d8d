"""Every W&B key the sidecar logs, as patterns: the table docs/METRICS.md shows (generated from
here by ``key_scheme_markdown``; a test keeps it current and checks the patterns against the keys
a real daemon logs).

A pattern is a key with placeholders in angle brackets (``trainer/<role>/<worker>/<name>/p50_ms``);
each placeholder stands for one or more path segments. Every pattern lives under
``sidecar/<host>/`` (``KEY_PREFIX`` and the daemon's host name: in a run shared by several nodes
each node's sidecar writes its own keys), except the x-axis ``sidecar/trainer_step``. The rows are
built in ``rows``, ``gpu_rows``, ``insight_row`` and ``ledger_row`` from the same constants this
module reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sidecar.exporters.wandb.capture_row import FIGURES as FIGURES_CAPTURE
from sidecar.exporters.wandb.capture_row import GPU_FIGURES as GPU_FIGURES_CAPTURE
from sidecar.exporters.wandb.gpu_rows import GROUP_VALUES
from sidecar.exporters.wandb.join import KEY_PREFIX, STEP_KEY
from sidecar.exporters.wandb.ledger_row import FIGURES
from sidecar.exporters.wandb.picture import PICTURE_KEY
from sidecar.exporters.wandb.rows import ALLOCATOR_VALUES, GAUGE_STATS, TIMING_STATS
from sidecar.model.ends import HOWS
from sidecar.model.gpu import GPU_METRICS, XID_METRICS
from sidecar.model.insight import INSIGHT_VALUES
from sidecar.model.meanings import REPORTED

HOST_PREFIX = KEY_PREFIX + "<host>/"
"""What every key of ``KEY_SCHEME`` is logged under."""


@dataclass(frozen=True)
class KeyPattern:
    """One kind of W&B key: ``pattern`` (under ``HOST_PREFIX``), its unit, and what it is."""

    pattern: str
    unit: str
    what: str


def _trainer() -> list[KeyPattern]:
    series = "trainer/<role>/<worker>/<name>"
    out = [KeyPattern(f"{series}/{stat}_ms", "ms", f"a timing's {stat} over the window, as the trainer sent it")
           for stat in TIMING_STATS]
    out += [KeyPattern(f"{series}/count", "count", "a timing's occurrences in the window"),
            KeyPattern(f"{series}/rate", "per s", "a counter's rate over the window"),
            KeyPattern(f"{series}/total", "as sent", "a counter's total since the sender started"),
            KeyPattern(series, "as sent", "a gauge's (or scalar's) last value")]
    out += [KeyPattern(f"{series}/{stat}", "as sent", f"a gauge's (or scalar's) {stat} over the window")
            for stat in GAUGE_STATS]
    out.append(KeyPattern(f"{series}/entropy_bits", "bits", "a category's Shannon entropy over the window"))
    out += [KeyPattern(f"trainer/<role>/<worker>/cuda<device>/{key}", "bytes",
                       f"CUDA caching allocator: {key.removesuffix('_bytes').replace('_', ' ')}")
            for key in ALLOCATOR_VALUES]
    return out


def _self() -> list[KeyPattern]:
    return [KeyPattern("self/records_per_s", "records/s", "records accepted in the window, per second"),
            KeyPattern("self/senders", "count", "live senders"),
            KeyPattern("self/series", "count", "series held"),
            KeyPattern("self/records_accepted", "records", "records accepted since start, all senders"),
            KeyPattern("self/records_dropped/<reason>", "records", "records dropped since start, by reason"),
            KeyPattern("self/messages_dropped/<reason>", "messages", "messages dropped since start, by reason")]


def _pipeline() -> list[KeyPattern]:
    p = "pipeline/"
    out = [KeyPattern(p + "verdict_code", "code", "the bottleneck verdict's code"),
           KeyPattern(p + "verdict_confidence", "0-1", "the verdict's confidence"),
           KeyPattern(p + "bottleneck/<verdict>", "0 or 1", "one-hot: 1 for the window's verdict"),
           KeyPattern(p + "evidence/<name>", "as named", "the figures the verdict rests on"),
           KeyPattern(p + "throttled_gpus", "count", "GPUs throttled in the window")]
    out += [KeyPattern(p + item.wandb_key, "as Prometheus", f"`dflash_pipeline_{item.name}`: {item.help}")
            for item in INSIGHT_VALUES]
    out += [KeyPattern(p + "tokens_per_s/<role>", "tokens/s", "a role's token rate"),
            KeyPattern(p + "batches_per_s/<role>", "batches/s", "a role's batch rate"),
            KeyPattern(p + "rate_cv/<role>", "ratio", "spread of a role's per-worker rates (coefficient of variation)"),
            KeyPattern(p + "time_share/<role>/<phase>", "0-1", "share of a role's wall time in a phase"),
            KeyPattern(p + "worker/<role>/<worker>/batches_per_s", "batches/s", "one worker's batch rate"),
            KeyPattern(p + "worker/<role>/<worker>/tokens_per_s", "tokens/s", "one worker's token rate"),
            KeyPattern(p + "worker/<role>/<worker>/score", "ratio", "one worker's rate against its role's"),
            KeyPattern(p + "worker/<role>/<worker>/straggler", "0 or 1", "1 when the worker is a straggler"),
            KeyPattern(p + "gpu_idle/<group>/<reason>", "0-1",
                       "a GPU group's idle share (`<reason>` = `idle`) and its part by cause")]
    out += [KeyPattern(f"{p}reported/{fig.wandb_key}/<role>", "as Prometheus",
                       f"`dflash_pipeline_reported_{fig.family}`: {fig.help}") for fig in REPORTED]
    return out


def _gpus() -> list[KeyPattern]:
    out = [KeyPattern("nvml/up", "0 or 1", "1 while NVML answers"),
           KeyPattern("nvml/data_age_seconds", "s", "age of the newest NVML poll"),
           KeyPattern("nvml/poll_duration_seconds", "s", "how long the last poll took"),
           KeyPattern("gpu/<i>/up", "0 or 1", "1 while the GPU answers")]
    out += [KeyPattern(f"gpu/<i>/{m.wandb_key}", "as Prometheus", f"`{m.name}`: {m.help}")
            for m in XID_METRICS + GPU_METRICS]
    out += [KeyPattern("gpu/<i>/clock_event/<reason>", "0 or 1", "1 while that clock-event (throttle) reason is on"),
            KeyPattern("gpu/<i>/ecc_corrected_errors", "count", "ECC corrected errors (volatile)"),
            KeyPattern("gpu/<i>/ecc_uncorrected_errors", "count", "ECC uncorrected errors (volatile)"),
            KeyPattern("gpu/<i>/profiling_available", "0 or 1", "1 while the GPM counters are read"),
            KeyPattern("gpu/<i>/profiling_busy", "0 or 1", "1 while another profiler holds the GPM counters"),
            KeyPattern("gpu/<i>/process/<role>/<worker>/memory_bytes", "bytes", "GPU memory of a trainer process")]
    out += [KeyPattern(f"group/<group>/{key}", "as Prometheus", f"the GPU group's `{attribute}`")
            for attribute, key in GROUP_VALUES]
    return out


def _ledger() -> list[KeyPattern]:
    p = "ledger/<role>/"
    out = [KeyPattern(p + "wall_s", "s", "the run's wall time so far, for the role"),
           KeyPattern(p + "seconds/<cause>", "s", "wall time by cause (productive and each badput)"),
           KeyPattern(p + "joules/<cause>", "J", "energy by cause")]
    out += [KeyPattern(p + key, "as Prometheus", f"the run's `{attribute}`") for key, attribute in FIGURES]
    return out


def _ends() -> list[KeyPattern]:
    p = "ends/<role>/"
    return [KeyPattern(p + "<how>", "count", f"processes of the role that ended so far, by how ({', '.join(HOWS)}); "
                       "in the windows with an end"),
            KeyPattern(p + "pid", "pid", "the last end's process id"),
            KeyPattern(p + "step", "step", "the last end's latest published step"),
            KeyPattern(p + "unknown_records", "records", "records the last end made after its last flush whose "
                       "fate is unknown, at most")]


def _cluster() -> list[KeyPattern]:
    """The cluster row (``cluster_row``), where ``wandb_cluster_prometheus`` is set: every 30 s."""
    return [KeyPattern("cluster/nodes", "count", "nodes of the run this node serves that report to Prometheus"),
            KeyPattern("cluster/held_back", "count", "nodes the run's other nodes wait for (the straggler rules)"),
            KeyPattern("cluster/<node>/excess_s", "s", "a named node's own work per step over the median node's"),
            KeyPattern("cluster/<node>/lost_gpu_hours_per_hour", "GPU-h/h",
                       "GPU-hours per hour the run's other nodes lose waiting for it")]


def _captures() -> list[KeyPattern]:
    p = "capture/<role>/<worker>/"
    out = [KeyPattern(p + "step_s", "s", "a newly kept profiler capture's mean step wall time (one row per capture)")]
    out += [KeyPattern(p + key, "0-1", f"its `{attribute}` as a share of the steps' wall time")
            for key, attribute in FIGURES_CAPTURE]
    out += [KeyPattern(p + key, "0-1", f"with device activity only: its `{attribute}` as a share of the wall time")
            for key, attribute in GPU_FIGURES_CAPTURE]
    return out


KEY_SCHEME: tuple[KeyPattern, ...] = tuple(_trainer() + _self() + _pipeline() + _gpus() + _ledger() + _ends()
                                           + _cluster() + _captures()) + (
    KeyPattern(PICTURE_KEY, "HTML", "the run's picture (`report --html`'s page) as an HTML panel: when the run's "
               "last senders end, and when the exporter leaves the run (the daemon stops, or the trainer announces "
               "another run) if the run went on since"),)
"""Every key of a window's row (and of a capture's row), under ``HOST_PREFIX``, and the run's picture."""


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A regex for the keys ``pattern`` stands for (a placeholder: one or more segments)."""
    parts = re.split(r"(<[a-z]+>)", pattern)
    return re.compile("".join(".+" if p.startswith("<") else re.escape(p) for p in parts) + r"\Z")


_REGEXES = [(p, pattern_regex(p.pattern), len(re.sub(r"<[a-z]+>", "", p.pattern))) for p in KEY_SCHEME]


def pattern_of(key: str) -> KeyPattern | None:
    """The pattern of ``KEY_SCHEME`` a logged key (``sidecar/<host>/...``, host included) is an
    instance of: of those it fits, the most specific (most literal characters; the bare
    ``trainer/<role>/<worker>/<name>`` fits every trainer key). None for the x-axis
    ``STEP_KEY``, for keys outside the prefix and for keys no pattern describes."""
    if not key.startswith(KEY_PREFIX) or key == STEP_KEY:
        return None
    rest = key[len(KEY_PREFIX):].partition("/")[2]
    fits = [(literal, p) for p, regex, literal in _REGEXES if regex.match(rest)]
    return max(fits, key=lambda f: f[0])[1] if fits else None


def key_scheme_markdown() -> str:
    """The key table of docs/METRICS.md (``python -m sidecar.exporters.wandb.keys`` prints it)."""
    lines = [f"Every key is `{HOST_PREFIX}` + one of these, plotted against `{STEP_KEY}` (the trainer's "
             "step). A placeholder in angle brackets stands for a name (it may contain `/`); a value "
             "that is not available is left out of the row, never logged as 0.", "",
             "| key | unit | what |", "| --- | --- | --- |"]
    lines += [f"| `{p.pattern}` | {p.unit} | {p.what} |" for p in KEY_SCHEME]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(key_scheme_markdown(), end="")
