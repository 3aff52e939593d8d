"""How the sidecar joins a trainer's W&B run: pure decisions, no ``wandb`` import.

Everything here is plain data in, plain data out, so it is unit-tested without W&B:

- ``clean_environ``: which inherited ``WANDB_*`` variables the daemon must not pass on to
  ``wandb`` (the library reads ``os.environ`` itself and hands it to the service it spawns).
- ``decide``: given what the daemon was asked for and what the trainer announced, join the
  trainer's run in shared mode, log to the daemon's own offline run, refuse, or wait.
- ``shared_join_settings`` / ``offline_run_settings``: the exact ``wandb.Settings`` fields and
  ``wandb.init`` arguments for the two ways of logging.
- ``credential_source``: where the API key would come from, without ever reading it out.

Why shared mode, and why the refusal: W&B lets a second process write into a run only when the
run is in shared mode (the trainer is the primary, the sidecar a secondary that never updates the
run's finish state). Joining a run that did not opt in has overwritten the trainer's history rows
(wandb issue #12269), and ``resume="allow"`` writes at the trainer's next offsets and marks the
run finished. Shared mode needs the W&B server, so an air-gapped daemon logs to its own offline
run instead, grouped with the trainer's run id.
"""

from __future__ import annotations

import enum
import netrc
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlparse

STEP_KEY: Final = "sidecar/trainer_step"
"""The sidecar's x-axis: the trainer's step, taken from the shim's messages."""

KEY_PREFIX: Final = "sidecar/"
"""Every key the sidecar logs lives under this prefix, away from the trainer's keys."""

OFFLINE_PROJECT: Final = "dflash-sidecar"
"""The project of the daemon's own offline run when neither the trainer's hello nor the daemon's
settings (``--wandb-project``, ``WANDB_PROJECT``) name one (wandb would otherwise name it after
the program's folder, e.g. ``proj-.venv_bin`` for the installed console script)."""

TRAINER_ENV_HINT: Final = "WANDB_MODE=shared WANDB_X_PRIMARY=true"
"""What the trainer's environment needs so that the sidecar may join its run."""

KEEP_ENV: Final = frozenset({
    # credentials and where the server is
    "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_APP_URL", "WANDB_IDENTITY_TOKEN_FILE",
    "WANDB_CREDENTIALS_FILE", "WANDB_INSECURE_DISABLE_SSL", "WANDB_HTTP_TIMEOUT",
    "WANDB_FILE_PUSHER_TIMEOUT", "WANDB_INIT_TIMEOUT",
    # where the run lives
    "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_ORGANIZATION",
    # local directories
    "WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR",
    # verbosity and diagnostics of the library itself
    "WANDB_SILENT", "WANDB_QUIET", "WANDB_DEBUG", "WANDB_CORE_DEBUG", "WANDB_ERROR_REPORTING",
})
"""``WANDB_*`` variables the daemon keeps. Every other one is about the trainer's own run or its
service (``WANDB_SERVICE`` makes the daemon talk to the trainer's wandb-core and breaks the
join; ``WANDB_RUN_ID``, ``WANDB_RESUME``, ``WANDB_X_PRIMARY``, ``WANDB_RUN_GROUP``,
``WANDB_CONFIG_PATHS``, ``WANDB_TAGS``... would make the daemon resume, claim the primary role,
or write config into the trainer's run) and is removed. ``WANDB_MODE`` is read by ``decide``
first, then removed: the exporter sets the mode itself."""


class PlanKind(enum.Enum):
    """What the exporter should do about the run it was asked to follow."""

    SHARED = "shared"
    """Join the trainer's run as a shared-mode secondary."""
    OFFLINE = "offline"
    """Log to the daemon's own offline run, grouped with the trainer's run id."""
    REFUSE = "refuse"
    """Do not log: joining would corrupt the trainer's run, or there is nothing to join."""
    WAIT = "wait"
    """Not enough is known yet (no hello, or no mode in the hello)."""
    DISABLED = "disabled"
    """W&B export is off."""


@dataclass(frozen=True)
class Plan:
    """A decision of ``decide``; ``reason`` is a full sentence meant for the log and for stats."""

    kind: PlanKind
    run_id: str | None = None
    """The trainer's run id: the run joined (SHARED) or the group of the own run (OFFLINE)."""
    project: str | None = None
    entity: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class TrainerRun:
    """What a shim hello says about the trainer's W&B run (every field may be unknown)."""

    run_id: str | None
    project: str | None = None
    entity: str | None = None
    mode: str | None = None
    primary: bool | None = None


_OFFLINE_MODES: Final = frozenset({"offline", "dryrun"})


def clean_environ(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Return ``(kept, removed_names)``: ``environ`` without the ``WANDB_*`` variables that are
    not in ``KEEP_ENV``, and the sorted names removed (names only: values may be secrets)."""
    removed = sorted(k for k in environ if k.startswith("WANDB_") and k not in KEEP_ENV)
    kept = {k: v for k, v in environ.items() if k not in removed}
    return kept, removed


def daemon_mode(environ: Mapping[str, str], force_offline: bool = False) -> str:
    """The daemon's own W&B mode: ``"offline"``, ``"disabled"`` or ``"online"``, from
    ``force_offline`` and the daemon's ``WANDB_MODE`` (``shared`` there is read as ``online``:
    it was meant for the trainer)."""
    mode = (environ.get("WANDB_MODE") or "").strip().lower()
    if mode == "disabled":
        return "disabled"
    if force_offline or mode in _OFFLINE_MODES:
        return "offline"
    return "online"


def decide(requested: str | None, trainer: TrainerRun | None, *, mode: str,
           project: str | None = None, entity: str | None = None) -> Plan:
    """Decide how to log for the run ``requested`` (a run id, ``"auto"`` or ``None``).

    ``trainer`` is the latest hello about the run to follow (``None`` when none arrived yet; in
    auto mode the caller passes the newest announced run). ``mode`` is ``daemon_mode(...)``.
    ``project``/``entity`` are the daemon's configured fallbacks; the trainer's announced values
    win, since they say where the run actually lives. The daemon's own offline run without
    either lands in ``OFFLINE_PROJECT``.
    """
    if requested is None:
        return Plan(PlanKind.DISABLED, reason="W&B export is off (no --wandb-run)")
    if mode == "disabled":
        return Plan(PlanKind.DISABLED, reason="W&B export is off (WANDB_MODE=disabled)")
    run_id = requested if requested != "auto" else (trainer.run_id if trainer else None)
    if trainer is not None and trainer.run_id != run_id:
        trainer = None  # a hello about another run says nothing about this one
    if run_id is None:
        return Plan(PlanKind.WAIT, reason="waiting for a trainer hello announcing a W&B run id")
    where = dict(run_id=run_id, project=(trainer and trainer.project) or project,
                 entity=(trainer and trainer.entity) or entity)
    offline = dict(where, project=where["project"] or OFFLINE_PROJECT)
    if mode == "offline":
        return Plan(PlanKind.OFFLINE, **offline, reason=(
            f"air-gapped (WANDB_MODE=offline): logging to the sidecar's own offline run "
            f"grouped with {run_id}; upload it later with `wandb sync`"))
    trainer_mode = (trainer.mode or "").strip().lower() if trainer else ""
    if trainer_mode == "shared":
        return Plan(PlanKind.SHARED, **where, reason=f"joining run {run_id} in shared mode")
    if trainer_mode in _OFFLINE_MODES:
        return Plan(PlanKind.OFFLINE, **offline, reason=(
            f"the trainer's run {run_id} is offline (mode={trainer_mode}): logging to the "
            f"sidecar's own offline run grouped with it; upload both later with `wandb sync`"))
    if trainer_mode == "disabled":
        return Plan(PlanKind.REFUSE, **where, reason=(
            f"the trainer's W&B is disabled (mode=disabled): there is no run {run_id} to join"))
    if trainer_mode:
        return Plan(PlanKind.REFUSE, **where, reason=(
            f"refusing to write into W&B run {run_id}: the trainer runs it in mode "
            f"{trainer_mode!r}, not shared mode, and a second writer would overwrite the "
            f"trainer's history. Start the trainer with {TRAINER_ENV_HINT} in its environment "
            f"so that the sidecar can join"))
    return Plan(PlanKind.WAIT, **where, reason=(
        f"waiting for a trainer hello that states the W&B mode of run {run_id} (the sidecar "
        f"joins only a shared-mode run: start the trainer with {TRAINER_ENV_HINT})"))


def _quiet_settings(host: str) -> dict[str, Any]:
    """Settings common to both ways of logging: no console capture, no system metrics, no
    code, git, requirements or machine metadata (that is the trainer's to report)."""
    return dict(
        x_label=f"{host}/sidecar",
        x_disable_stats=True,
        x_disable_meta=True,
        x_disable_machine_info=True,
        x_save_requirements=False,
        console="off",
        save_code=False,
        disable_code=True,
        disable_git=True,
        silent=True,
    )


def shared_join_settings(host: str) -> dict[str, Any]:
    """Keyword arguments for ``wandb.Settings`` to join a trainer's run as a secondary writer.

    ``x_primary=False``: the trainer stays the primary (owns files, config, metadata);
    ``x_update_finish_state=False``: finishing the sidecar's writer never marks the run finished.
    """
    return dict(mode="shared", x_primary=False, x_update_finish_state=False,
                **_quiet_settings(host))


def offline_run_settings(host: str) -> dict[str, Any]:
    """Keyword arguments for ``wandb.Settings`` of the daemon's own offline run."""
    return dict(mode="offline", **_quiet_settings(host))


def init_kwargs(plan: Plan, host: str, wandb_dir: str | None) -> dict[str, Any]:
    """Keyword arguments for ``wandb.init`` (without ``settings``) carrying out ``plan``.

    Raises ``ValueError`` for a plan that does not log (WAIT, REFUSE, DISABLED).
    """
    common: dict[str, Any] = dict(project=plan.project, entity=plan.entity,
                                  reinit="create_new", dir=wandb_dir)
    if plan.kind is PlanKind.SHARED:
        return dict(id=plan.run_id, **common)
    if plan.kind is PlanKind.OFFLINE:
        return dict(group=plan.run_id, job_type="sidecar", name=f"sidecar {host}",
                    tags=["dflash-sidecar"], config={"sidecar": {"host": host,
                                                                 "trainer_run_id": plan.run_id}},
                    **common)
    raise ValueError(f"plan {plan.kind.value} does not log")


def prefixed(row: Mapping[str, object], trainer_step: int | None) -> tuple[dict[str, float], int]:
    """Return ``(row under KEY_PREFIX with STEP_KEY added when known, values skipped)``.

    Values that are not real numbers (``float()`` fails, e.g. strings or ``None``) are skipped;
    keys already under the prefix are not prefixed twice."""
    out: dict[str, float] = {}
    skipped = 0
    for key, value in row.items():
        if isinstance(value, (str, bytes)) or value is None:
            skipped += 1
            continue
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            skipped += 1
            continue
        name = str(key)
        out[name if name.startswith(KEY_PREFIX) else KEY_PREFIX + name] = number
    if trainer_step is not None:
        out[STEP_KEY] = int(trainer_step)
    return out, skipped


NO_CREDENTIALS = ("no W&B credentials: set WANDB_API_KEY in the EnvironmentFile or run `wandb login` "
                  "(or WANDB_MODE=offline for a local run to `wandb sync` later)")
"""The one advice for a daemon told to join a W&B run without credentials (``dflash-sidecar
check`` fails with it, the daemon warns with it at start)."""


def credential_source(environ: Mapping[str, str], home: str | None = None) -> str | None:
    """Say where W&B credentials would come from, never reading the key out: ``"WANDB_API_KEY"``,
    ``"WANDB_IDENTITY_TOKEN_FILE"``, ``"netrc"`` (an entry for the API host in ``$NETRC`` or
    ``~/.netrc``), or ``None`` when none is found. The key is never taken from a flag."""
    if environ.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    if environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return "WANDB_IDENTITY_TOKEN_FILE"
    path = environ.get("NETRC") or os.path.join(home or os.path.expanduser("~"), ".netrc")
    host = urlparse(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return "netrc" if entry and entry[2] else None


def redact(text: str, environ: Mapping[str, str]) -> str:
    """``text`` with the API key (if set in ``environ``) and anything shaped like a W&B key
    (40 hex digits, or a ``local-``/``v1-`` prefixed key) replaced by ``***``."""
    key = environ.get("WANDB_API_KEY")
    if key:
        text = text.replace(key, "***")
    return _KEY_SHAPE.sub("***", text)


_KEY_SHAPE: Final = re.compile(r"\b(?:local-|v1-)?[0-9a-f]{40}\b")
