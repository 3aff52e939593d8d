"""The exit statuses of ``dflash-sidecar``, declared once: the commands return these, the README's
table is generated from ``STATUSES`` (``python -m sidecar.cli.options_doc``), and
``tests/test_exit_status.py`` runs a command for each. An uncaught exception (a bug) also exits 1,
with a traceback; a signal other than SIGTERM/SIGINT kills the process with the shell's 128+N."""

from __future__ import annotations

OK = 0
FAILURE = 1
USAGE = 2
NO_DAEMON_DEPENDENCIES = 3

STATUSES: tuple[tuple[int, str, str], ...] = (
    (OK, "done", "the daemon or demo stopped on SIGTERM, Ctrl-C or its --duration; `check` found nothing to fail; "
                 "`report`, `explain`, `top --once`, `cluster`, `sample-config` printed what was asked; `trace` kept a "
                 "capture"),
    (FAILURE, "runtime failure (a log line or a message on stderr says what)",
     "the daemon or demo could not start (endpoint, port, TLS files); `check` failed a check; `report` or "
     "`explain --run` found no ledger or no such run; `explain` or `top --once` could not reach the daemon; "
     "`cluster` could not reach Prometheus or found no run with two nodes; `trace` found no live trainer or got "
     "no capture (it says why)"),
    (USAGE, "wrong invocation (`dflash-sidecar: error: ...` on stderr, with what to type instead)",
     "an unknown command or option, a bad value, an invalid config file (unknown key, bad TOML, out of range)"),
    (NO_DAEMON_DEPENDENCIES, "the daemon's packages are missing",
     "an environment with the trainer shim only (`pip install dflash-sidecar`): install `dflash-sidecar[daemon]`"),
)
"""(status, what it means, when it happens), in order of status."""
