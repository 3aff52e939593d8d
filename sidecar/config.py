"""Settings: one declaration per option feeds the CLI, the TOML config file and the sample config.

Precedence: built-in default < config file (``--config``) < command-line flag. Everything is
validated at start-up (and on SIGHUP reload); ``ConfigError`` says what to fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import ipaddress
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sidecar.aggregation.gpu_groups import GpuGroups
from sidecar.aggregation.verdict import DEFAULT_THROTTLE_REASONS, INSIGHT_DEFAULTS
from sidecar.model.address import parse_host_port
from trainer_shim.endpoint import daemon_endpoint

if TYPE_CHECKING:  # the mapping stage loads the wire format; `--version` must work without it
    from sidecar.processing.mapping import Rule


class ConfigError(ValueError):
    """An invalid option or config file; the message names the option and what to fix."""


@dataclass(frozen=True)
class Setting:
    name: str
    """Key in the TOML file and field of ``Config``; the flag is ``--`` + name with dashes."""
    help: str
    kind: str = "value"
    """``value``, ``list`` (flag repeatable, TOML array), ``switch`` (``--no-<name>`` turns it off;
    ``--<name>`` turns on one whose default is off)
    or ``tables`` (TOML array of tables only, no flag: ``[[mapping]]``)."""
    type: Callable[[str], Any] = str
    default: Any = None
    example: str | None = None
    """Shown in the sample config instead of the default, marked as an example (for settings whose
    default is computed or empty); ``default_note`` then says what the default is."""
    default_note: str | None = None
    bounds: tuple[float, float] | None = None
    """Inclusive (lowest, highest) a numeric setting accepts, checked after ``type``; stated in the
    help (and so in the sample config and ``--help``) from this one declaration."""
    unit: str = ""
    """What the bounds count (``seconds``), for messages."""

    def check_bounds(self, value: Any) -> Any:
        """``value`` if within ``bounds``. Raises ``ValueError`` naming the range otherwise."""
        if self.bounds is not None:
            low, high = self.bounds
            if not low <= value <= high:  # also refuses NaN
                unit = f" {self.unit}" if self.unit else ""
                raise ValueError(f"{self.name} must be between {_num(low)} and {_num(high)}{unit}")
        return value

    @property
    def full_help(self) -> str:
        """``help`` plus the accepted range, if any."""
        if self.bounds is None:
            return self.help
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.help} Range: {_num(self.bounds[0])} to {_num(self.bounds[1])}{unit}."


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _flops(raw: Any) -> float:
    value = float(raw)
    if not 1.0 <= value <= 1e18:  # NaN fails too
        raise ValueError("flops_per_token must be between 1 and 1e18")
    return value


def _addr(raw: Any) -> str:
    parse_host_port(str(raw))
    return str(raw)


def _endpoint(raw: Any) -> str:
    value = str(raw)
    if value.startswith("ipc://") and len(value) > len("ipc://"):
        return value
    if value.startswith("tcp://"):
        parse_host_port(value[len("tcp://"):], example="tcp://127.0.0.1:5557")
        return value
    raise ValueError("expected ipc:///path/to/socket or tcp://HOST:PORT, e.g. tcp://127.0.0.1:5557")


def _level(raw: Any) -> str:
    value = str(raw).lower()
    if value not in {"debug", "info", "warning", "error"}:
        raise ValueError("expected one of debug, info, warning, error")
    return value


def _ratio(what: str) -> Callable[[Any], float]:
    def check(raw: Any) -> float:
        value = float(raw)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{what} must be a ratio between 0 and 1")
        return value
    return check


SETTINGS: tuple[Setting, ...] = (
    Setting("wandb_run", "W&B run id to join (shared mode), or 'auto' to follow the run the trainer's "
            "shim announces. Unset: no W&B export."),
    Setting("wandb_project", "W&B project (default: $WANDB_PROJECT)."),
    Setting("wandb_entity", "W&B entity (default: $WANDB_ENTITY)."),
    Setting("endpoint", "ZeroMQ endpoint to bind for shims (repeatable): ipc:///path or tcp://127.0.0.1:PORT.",
            kind="list", type=_endpoint, default=None, example="ipc:///run/dflash-sidecar/sidecar.sock",
            default_note="sidecar.sock in $RUNTIME_DIRECTORY under systemd, else in the per-user directory"),
    Setting("prometheus_addr", "Listen address of the Prometheus endpoint (HOST:PORT). Loopback by default.",
            type=_addr, default="127.0.0.1:9478"),
    Setting("prometheus_tls_cert", "PEM certificate: serve /metrics over TLS (needs prometheus_tls_key)."),
    Setting("prometheus_tls_key", "PEM private key for prometheus_tls_cert."),
    Setting("endpoint_allow_remote", "Allow a tcp:// endpoint on an address other than loopback (anyone who can "
            "reach it may then send records; a warning is logged). Off: tcp is loopback-only.", kind="switch",
            default=False),
    # Bounds: a window under 0.1 s spent a whole core rolling windows (13,500/s at 1e-06); over an
    # hour no window ever closes in practice.
    Setting("interval", "Aggregation window (seconds).", type=float, default=10.0, bounds=(0.1, 3600.0),
            unit="seconds"),
    Setting("nvml_interval", "NVML polling period (seconds). Sub-second polling has cost throughput elsewhere.",
            type=float, default=1.0, bounds=(0.1, 3600.0), unit="seconds"),
    Setting("gpu_metrics", "Poll GPUs through NVML (--no-gpu-metrics turns it off).", kind="switch", default=True),
    Setting("dcgm_compat", "Also export dcgm-exporter's names, units and labels (DCGM_FI_*) for what NVML "
            "can feed, so dashboards and alerts written for it work unchanged (docs/METRICS.md).",
            kind="switch", default=False),
    Setting("gpu_group", "Role to GPUs mapping NAME=IDS (repeatable), e.g. target=0-5, drafter=6,7. "
            "Unset: discovered from the trainers' processes.", kind="list", default=[], example="target=0-5",
            default_note="none, roles are discovered from the trainers' processes"),
    # 100,000 timing series hold about 540 MB (10,000: 54 MB), the daemon's whole memory target.
    Setting("max_series", "Cardinality budget: most distinct trainer series held.",
            type=int, default=10_000, bounds=(1, 100_000), unit="series"),
    Setting("wandb_queue", "Rows the W&B exporter may queue before dropping (counted).",
            type=int, default=256, bounds=(1, 100_000), unit="rows"),
    Setting("log_level", "debug, info, warning or error.", type=_level, default="info"),
    # Pipeline insight (docs/METRICS.md): role names and bottleneck-verdict thresholds (ratios 0-1).
    Setting("insight_target_role", "Role name of the target workers (those that fill the hidden-state queue).",
            default=INSIGHT_DEFAULTS["target_role"]),
    Setting("insight_drafter_role", "Role name of the drafter workers (those that drain the hidden-state queue).",
            default=INSIGHT_DEFAULTS["drafter_role"]),
    Setting("insight_starved_ratio", "Verdict: drafters starve (the supply side limits) when they spend at least "
            "this share of wall time waiting on an empty queue (the ready deficit).",
            type=_ratio("insight_starved_ratio"), default=INSIGHT_DEFAULTS["starved_ratio"]),
    Setting("insight_backpressure_ratio", "Verdict: drafters limit (drafter-bound) when targets spend at least "
            "this share of wall time blocked on a full queue.", type=_ratio("insight_backpressure_ratio"),
            default=INSIGHT_DEFAULTS["backpressure_ratio"]),
    Setting("insight_queue_full_ratio", "Verdict: drafter-bound when the queue is at least this full and targets "
            "publish no queue_put_wait timing.", type=_ratio("insight_queue_full_ratio"),
            default=INSIGHT_DEFAULTS["queue_full_ratio"]),
    Setting("insight_host_wait_ratio", "Verdict: input-bound when the limiting role waits on the host data loader "
            "(data_wait) for at least this share of wall time.", type=_ratio("insight_host_wait_ratio"),
            default=INSIGHT_DEFAULTS["host_wait_ratio"]),
    Setting("insight_handoff_ratio", "Verdict: queue-starved when drafters starve and targets spend at least this "
            "share of wall time packing hidden states (pack).", type=_ratio("insight_handoff_ratio"),
            default=INSIGHT_DEFAULTS["handoff_ratio"]),
    Setting("insight_straggler_score", "Verdict: a worker whose score (best median busy time per batch of its "
            "role / its own) is below this is a straggler.", type=_ratio("insight_straggler_score"),
            default=INSIGHT_DEFAULTS["straggler_score"]),
    Setting("insight_comm_wait_ratio", "Verdict (single-role loops): communication-bound when the role spends at "
            "least this share of wall time in collective waits (comm_wait).", type=_ratio("insight_comm_wait_ratio"),
            default=INSIGHT_DEFAULTS["comm_wait_ratio"]),
    Setting("insight_host_overhead_ratio", "Verdict (single-role loops): host-bound when at least this share of "
            "the role's wall time is measured host time between its timed phases (inside its step).",
            type=_ratio("insight_host_overhead_ratio"), default=INSIGHT_DEFAULTS["host_overhead_ratio"]),
    Setting("insight_compute_busy_ratio", "Verdict (single-role loops): compute-bound when the role's GPUs are at "
            "least this busy (GPM SM activity, else NVML utilization), whatever the host-side shares say.",
            type=_ratio("insight_compute_busy_ratio"), default=INSIGHT_DEFAULTS["compute_busy_ratio"]),
    Setting("mapping", "Your own series names -> role, worker and phase (docs/SHIM.md, 'Your own names'): "
            "[[mapping]] tables, each with a glob (match) or a regex (regex) and what it gives: phase (or meaning), "
            "role, worker, name (captures as $1, ${name}). Checked at start-up; reloaded on SIGHUP.", kind="tables",
            default=[]),
    Setting("insight_throttle_reasons", "Verdict: NVML clock-event reasons that count as throttling (repeatable).",
            kind="list", default=list(DEFAULT_THROTTLE_REASONS)),
    # Run ledger (docs/METRICS.md, "Run ledger").
    Setting("state_dir", "Folder of the run ledger's state file (kept across daemon restarts). Under systemd "
            "$STATE_DIRECTORY wins over this.", example="/var/lib/dflash-sidecar",
            default_note="$STATE_DIRECTORY under systemd, else $XDG_STATE_HOME/dflash-sidecar "
            "(~/.local/state/dflash-sidecar)"),
    Setting("flops_per_token", "Model FLOPs per trained token (forward and backward, e.g. 6 x parameters): "
            "enables the run ledger's MFU for trainers whose shim states none (DFLASH_FLOPS_PER_TOKEN or "
            "configure(flops_per_token=...) win over this). Unset: MFU only where a trainer states it.", type=_flops,
            example="4.2e10", default_note="unset, MFU only where a trainer states it"),
    Setting("run_gap_s", "Run ledger: a host's trainers with neither a W&B run nor a run label start a new run "
            "when no sender of the host's current run sent for longer than this (seconds); within it, a new "
            "trainer is a restart of the same run.", type=float, default=300.0, bounds=(1.0, 7 * 86400.0),
            unit="seconds"),
)


def _default(name: str) -> Any:
    """The declared default of setting ``name`` (lists as tuples: ``Config`` is immutable)."""
    default = next(s.default for s in SETTINGS if s.name == name)
    return tuple(default) if isinstance(default, list) else default


@dataclass(frozen=True)
class Config:
    """Validated settings (see ``SETTINGS`` for each field's meaning and default)."""

    wandb_run: str | None = _default("wandb_run")
    wandb_project: str | None = _default("wandb_project")
    wandb_entity: str | None = _default("wandb_entity")
    endpoint: tuple[str, ...] = field(default_factory=lambda: (daemon_endpoint(),))
    prometheus_addr: str = _default("prometheus_addr")
    prometheus_tls_cert: str | None = _default("prometheus_tls_cert")
    prometheus_tls_key: str | None = _default("prometheus_tls_key")
    interval: float = _default("interval")
    nvml_interval: float = _default("nvml_interval")
    gpu_metrics: bool = _default("gpu_metrics")
    endpoint_allow_remote: bool = _default("endpoint_allow_remote")
    dcgm_compat: bool = _default("dcgm_compat")
    gpu_group: tuple[str, ...] = _default("gpu_group")
    max_series: int = _default("max_series")
    wandb_queue: int = _default("wandb_queue")
    log_level: str = _default("log_level")
    config_file: str | None = None
    insight_target_role: str = _default("insight_target_role")
    insight_drafter_role: str = _default("insight_drafter_role")
    insight_starved_ratio: float = _default("insight_starved_ratio")
    insight_backpressure_ratio: float = _default("insight_backpressure_ratio")
    insight_queue_full_ratio: float = _default("insight_queue_full_ratio")
    insight_host_wait_ratio: float = _default("insight_host_wait_ratio")
    insight_handoff_ratio: float = _default("insight_handoff_ratio")
    insight_straggler_score: float = _default("insight_straggler_score")
    insight_throttle_reasons: tuple[str, ...] = _default("insight_throttle_reasons")
    insight_comm_wait_ratio: float = _default("insight_comm_wait_ratio")
    insight_host_overhead_ratio: float = _default("insight_host_overhead_ratio")
    insight_compute_busy_ratio: float = _default("insight_compute_busy_ratio")
    mapping: tuple[Rule, ...] = ()
    state_dir: str | None = _default("state_dir")
    flops_per_token: float | None = _default("flops_per_token")
    run_gap_s: float = _default("run_gap_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every setting as a flag. Defaults are suppressed so ``load`` can tell what was given."""
    parser.add_argument("--config", dest="config_file", metavar="FILE", default=argparse.SUPPRESS,
                        help="TOML config file; flags override it.")
    for s in SETTINGS:
        flag = "--" + s.name.replace("_", "-")
        if s.kind == "tables":
            continue
        if s.kind == "switch" and s.default is False:
            parser.add_argument(flag, dest=s.name, action="store_true", default=argparse.SUPPRESS, help=s.help)
        elif s.kind == "switch":
            parser.add_argument("--no-" + s.name.replace("_", "-"), dest=s.name, action="store_false",
                                default=argparse.SUPPRESS, help=s.help)
        elif s.kind == "list":
            parser.add_argument(flag, dest=s.name, action="append", default=argparse.SUPPRESS, help=s.full_help)
        else:
            parser.add_argument(flag, dest=s.name, default=argparse.SUPPRESS, help=s.full_help)


def load(cli: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Config:
    """Build a validated ``Config`` from parsed flags (and the config file they name).
    Raises ``ConfigError``."""
    values: dict[str, Any] = {}
    path = cli.get("config_file")
    if path:
        values.update(read_file(path))
    values.update({k: v for k, v in cli.items() if k != "config_file"})
    return _validate(values, path)


def read_file(path: str) -> dict[str, Any]:
    """The settings in a TOML file. Raises ``ConfigError`` for an unreadable file, bad TOML or
    an unknown key."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    known = [s.name for s in SETTINGS]
    unknown = sorted(set(data) - set(known))
    if unknown:
        described = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=1)
            described.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(described)}; "
                          f"known: {', '.join(sorted(known))}")
    return data


def _validate(values: Mapping[str, Any], path: str | None) -> Config:
    out: dict[str, Any] = {"config_file": path}
    for s in SETTINGS:
        if s.name not in values:
            continue
        raw = values[s.name]
        where = f"--{s.name.replace('_', '-')}" + (f" (or '{s.name}' in {path})" if path else "")
        if s.kind == "tables":
            from sidecar.processing.mapping import MappingError, parse_rules

            try:
                out[s.name] = parse_rules(raw if isinstance(raw, list) else [raw])
            except MappingError as exc:
                raise ConfigError(f"invalid [[{s.name}]] in {path}: {exc}") from None
            continue
        try:
            if s.kind == "list":
                items = raw if isinstance(raw, list) else [raw]
                checked = []
                for item in items:
                    try:
                        checked.append(s.type(item))
                    except (TypeError, ValueError) as exc:
                        raise ConfigError(f"invalid {where}: {item!r}: {exc}") from None
                out[s.name] = tuple(checked)
            elif s.kind == "switch":
                if not isinstance(raw, bool):
                    raise ValueError("expected true or false")
                out[s.name] = raw
            elif raw is None or (raw == "" and s.default is None):
                out[s.name] = None  # TOML has no null: "" leaves an optional setting unset
            else:
                if isinstance(raw, bool) and s.bounds is not None:
                    raise ValueError("expected a number")  # TOML true would read as 1
                out[s.name] = s.check_bounds(s.type(raw))
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid {where}: {raw!r}: {exc}") from None
    config = Config(**out)
    if bool(config.prometheus_tls_cert) != bool(config.prometheus_tls_key):
        raise ConfigError("--prometheus-tls-cert and --prometheus-tls-key must be given together")
    for f in (config.prometheus_tls_cert, config.prometheus_tls_key):
        if f and not os.access(f, os.R_OK):
            raise ConfigError(f"cannot read TLS file {f}")
    try:
        GpuGroups.parse(config.gpu_group)
    except ValueError as exc:
        raise ConfigError(f"invalid --gpu-group: {exc}") from None
    if config.wandb_run is not None:
        run = config.wandb_run
        if not run.strip() or any(c in run for c in "/ \t"):
            raise ConfigError(f"invalid --wandb-run: {run!r}: expected a W&B run id or 'auto'")
    if not config.endpoint:
        config = dataclasses.replace(config, endpoint=(daemon_endpoint(),))
    remote = remote_endpoints(config.endpoint)
    if remote and not config.endpoint_allow_remote:
        raise ConfigError(f"endpoint {remote[0]} is not on loopback: anyone who can reach that address could send "
                          "records to the daemon. Bind tcp://127.0.0.1:PORT (shims connect from the same host), or "
                          "pass --endpoint-allow-remote (endpoint_allow_remote = true) behind a firewall")
    return config


def remote_endpoints(endpoints: tuple[str, ...]) -> list[str]:
    """The tcp endpoints that bind an address other than loopback (``*``, ``0.0.0.0``, a NIC's address)."""
    out = []
    for endpoint in endpoints:
        if endpoint.startswith("tcp://"):
            host = endpoint[len("tcp://"):].rpartition(":")[0].strip("[]")
            if host != "localhost":
                try:
                    loopback = ipaddress.ip_address(host).is_loopback
                except ValueError:
                    loopback = False
                if not loopback:
                    out.append(endpoint)
    return out


def sample_toml() -> str:
    """A config file listing every setting with its help, commented out: each line carries the
    default (marked ``# default``) or an example to adapt (marked ``# example; default: ...``).
    Uncommented as it is, every line is valid (``""`` leaves an optional setting unset)."""
    lines = ["# dflash-sidecar configuration: every setting; flags override this file.",
             "# Each line shows the default ('# default') or, where the default is computed or empty,",
             "# an example to adapt ('# example'). Every line is valid uncommented as it is.", ""]
    for s in SETTINGS:
        lines.append(f"# {s.full_help}")
        if s.kind == "tables":
            lines += [f"# {s.name} = []  # default: none", "## e.g.:", "## [[mapping]]",
                      '## match = "loader.*.fetch_ms"', '## worker = "$1"', '## phase = "data_wait"', ""]
            continue
        if s.example is not None:
            mark = f"example; default: {s.default_note}"
            value = s.example
        else:
            mark = "default: unset" if s.default is None else "default"
            value = s.default
        lines.append(f"# {s.name} = {_toml_value(value, s)}  # {mark}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any, s: Setting) -> str:
    if s.kind == "list":
        items = [value] if isinstance(value, str) else list(value or [])
        return "[" + ", ".join(f'"{v}"' for v in items) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return '""'
    if isinstance(value, (int, float)):
        return repr(value)
    return f'"{value}"'
