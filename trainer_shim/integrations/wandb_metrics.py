"""The sidecar in the trainer's own W&B run, through W&B's open-metrics scraper. Two lines::

    from trainer_shim.integrations.wandb_metrics import open_metrics_settings
    run = wandb.init(project="...", settings=wandb.Settings(**open_metrics_settings()))

The trainer's wandb service then scrapes the daemon's ``/metrics/wandb`` page (every
``x_stats_sampling_interval`` seconds, 15 by default) into the run's system metrics, keys like
``openmetrics.sidecar.dflash_role_drafter_batches_per_second.0``. The daemon needs no W&B
credentials and no shared mode; the run keeps its own clock. Optionally::

    describe_run(run)   # names the verdict codes in the run's config (dflash_verdict_code)

The HF and Lightning callbacks do both when given ``wandb_open_metrics=True`` and the framework
starts the run (``enable_in_environment`` at construction, ``describe_run`` at train start).

Nothing here imports wandb: settings are plain dicts, the run is used through its ``config``.
Nothing raises into the trainer or blocks it: ``describe_run`` asks the daemon on a background
thread and logs once if it never answers. docs/WANDB.md compares this path with shared mode.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("trainer_shim")

DEFAULT_ADDR = "127.0.0.1:9478"
"""The daemon's default ``--prometheus-addr``."""
ENDPOINT_NAME = "sidecar"
"""The endpoint's name in W&B's keys: ``openmetrics.<name>.<family>.0``."""
PAGE_PATH = "/metrics/wandb"
ENDPOINTS_SETTING = "x_stats_open_metrics_endpoints"
FILTERS_SETTING = "x_stats_open_metrics_filters"
CONFIG_KEY = "dflash_verdict_code"
"""Run config key written by ``describe_run``: {code (text): verdict name}."""
DESCRIBE_TIMEOUT_S = 2.0
DESCRIBE_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits between ``describe_run``'s tries (the last repeats) until ``DESCRIBE_GIVE_UP_S``."""
DESCRIBE_GIVE_UP_S = 600.0


def page_url(addr: str = DEFAULT_ADDR) -> str:
    """The page's URL: ``addr`` is the daemon's ``HOST:PORT`` (``[::1]:9478`` for IPv6) or a
    base URL (``https://host:9478`` for a daemon serving TLS)."""
    base = addr.rstrip("/") if addr.startswith(("http://", "https://")) else f"http://{addr}"
    return base + PAGE_PATH


def open_metrics_settings(addr: str = DEFAULT_ADDR, name: str = ENDPOINT_NAME,
                          base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``wandb.Settings`` that add the sidecar's page as the open-metrics
    endpoint ``name``. ``base``: settings the trainer already uses (their endpoints are kept;
    their filters, which W&B applies to every endpoint, get one more pattern that lets this
    endpoint through). Returns only the two settings concerned."""
    base = base or {}
    endpoints = dict(_json_or_value(base.get(ENDPOINTS_SETTING)) or {})
    endpoints[name] = page_url(addr)
    out: dict[str, Any] = {ENDPOINTS_SETTING: endpoints}
    filters = _with_filter(_json_or_value(base.get(FILTERS_SETTING)), name)
    if filters is not None:
        out[FILTERS_SETTING] = filters
    return out


def enable_in_environment(addr: str = DEFAULT_ADDR, name: str = ENDPOINT_NAME,
                          environ: Any = os.environ) -> bool:
    """Set ``WANDB_X_STATS_OPEN_METRICS_ENDPOINTS`` (and extend ``..._FILTERS`` if set) in this
    process's environment, for a run that a framework starts later (wandb reads its environment
    when it first sets up). Returns False, with a warning, if wandb has set up already or a run
    is active: then the variables come too late and the trainer must pass
    ``open_metrics_settings()`` to ``wandb.init``."""
    current = {key: environ.get("WANDB_" + key.upper()) for key in (ENDPOINTS_SETTING, FILTERS_SETTING)}
    try:
        wanted = open_metrics_settings(addr, name, {k: v for k, v in current.items() if v})
    except (ValueError, TypeError) as exc:  # the variables already there are not what wandb takes
        log.warning("trainer_shim: W&B open-metrics not enabled: %s", exc)
        return False
    for key, value in wanted.items():
        environ["WANDB_" + key.upper()] = json.dumps(value)
    if _wandb_set_up():
        log.warning("trainer_shim: wandb is already set up in this process: the sidecar's open-metrics "
                    "endpoint reaches only a run started with wandb.init(settings=wandb.Settings("
                    "**open_metrics_settings()))")
        return False
    return True


def opt_in(option: bool | str) -> str | None:
    """The callbacks' ``wandb_open_metrics`` option: True (``DEFAULT_ADDR``) or the daemon's
    ``HOST:PORT`` has the W&B run that the framework starts later scrape the sidecar's
    ``/metrics/wandb`` page (``enable_in_environment`` now; the callback names the verdict codes
    in the run's config at train start with ``describe_run``). Returns the address, or None when
    the option is off (False, an empty string, anything else)."""
    addr = DEFAULT_ADDR if option is True else option if isinstance(option, str) and option else None
    if addr:
        enable_in_environment(addr)
    return addr


def describe_run(run: Any = None, addr: str = DEFAULT_ADDR) -> threading.Thread | None:
    """Write the verdict codes' names into ``run``'s config (``dflash_verdict_code``, e.g.
    ``{"8": "input-bound"}``), read from the daemon's ``/metrics/wandb/legend`` on a daemon
    thread that retries until the daemon answers (``DESCRIBE_GIVE_UP_S`` at most). ``run``:
    default the active ``wandb.run`` (if wandb is imported). Returns the thread, or None when
    there is no run. Never raises."""
    if run is None:
        run = getattr(sys.modules.get("wandb"), "run", None)
    if run is None or getattr(run, "config", None) is None:
        return None
    thread = threading.Thread(target=_describe, args=(run, page_url(addr) + "/legend"),
                              name="sidecar-wandb-describe", daemon=True)
    try:
        thread.start()
    except RuntimeError as exc:  # no thread to be had (a process at its limit)
        log.warning("trainer_shim: could not name the verdict codes in the W&B run: %s", exc)
        return None
    return thread


def _describe(run: Any, url: str) -> None:
    codes = _fetch_codes(url)
    if codes is None:
        return
    try:
        run.config.update({CONFIG_KEY: codes}, allow_val_change=True)
    except Exception as exc:  # noqa: BLE001 - a finished run, say; never into the trainer
        log.warning("trainer_shim: could not name the verdict codes in the W&B run: %s", exc)


def _fetch_codes(url: str) -> dict[str, str] | None:
    """The legend's verdict codes, asked until the daemon answers; None after
    ``DESCRIBE_GIVE_UP_S`` (logged once)."""
    deadline = time.monotonic() + DESCRIBE_GIVE_UP_S
    for attempt in itertools.count():
        try:
            with urllib.request.urlopen(url, timeout=DESCRIBE_TIMEOUT_S) as resp:
                codes = json.loads(resp.read())["verdict_codes"]
            return {str(k): str(v) for k, v in codes.items()}
        except Exception as exc:  # noqa: BLE001 - no daemon yet, an older one, a proxy's page
            wait = DESCRIBE_RETRY_S[min(attempt, len(DESCRIBE_RETRY_S) - 1)]
            if time.monotonic() + wait > deadline:
                log.warning("trainer_shim: could not name the verdict codes in the W&B run from %s: %s", url, exc)
                return None
            time.sleep(wait)
    return None  # unreachable: count() never ends


def _json_or_value(value: Any) -> Any:
    """A setting as wandb takes it: JSON text (from the environment) or the value itself.
    Raises ``ValueError`` for text that is not JSON."""
    return json.loads(value) if isinstance(value, str) else value


def _with_filter(filters: Any, name: str) -> Any:
    """``filters`` (W&B's sequence of metric regexes, or mapping regex -> label regexes, both
    matched against ``<endpoint>.<family>``) with one more entry admitting endpoint ``name``;
    None when there are none (W&B then takes every metric)."""
    if not filters:
        return None
    pattern = "^" + re.escape(name) + r"\."
    if isinstance(filters, Mapping):  # every sample of the page has a host label
        return {**filters, pattern: {"host": ".*"}}
    return [*filters, pattern] if pattern not in filters else list(filters)


def _wandb_set_up() -> bool:
    """wandb has loaded its settings in this process (or has a run): environment variables set
    now are ignored by it."""
    wandb = sys.modules.get("wandb")
    if wandb is None:
        return False
    if getattr(wandb, "run", None) is not None:
        return True
    setup = sys.modules.get("wandb.sdk.wandb_setup")
    singleton = getattr(setup, "_singleton", None)
    return getattr(singleton, "_settings", None) is not None
