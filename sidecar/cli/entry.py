"""The ``dflash-sidecar`` console script: checks that the daemon's dependencies are installed
before loading the daemon, so a trainer's environment that holds only the shim
(``pip install dflash-sidecar``) gets a clear message instead of an ImportError."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections.abc import Sequence

from sidecar.cli.exit_status import NO_DAEMON_DEPENDENCIES, OK

DISTRIBUTION = "dflash-sidecar"
EXTRA = "daemon"


def missing_daemon_dependencies() -> list[str]:
    """The distributions of the ``daemon`` extra (read from this package's own metadata, where
    pyproject.toml declares them) that are not installed. Empty when the metadata is absent (a
    source checkout on ``PYTHONPATH``)."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    missing = []
    for req in requires:
        if not re.search(rf"""extra\s*==\s*["']{EXTRA}["']""", req):
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
        if match is None or match.group(0) == DISTRIBUTION:
            continue
        try:
            importlib.metadata.version(match.group(0))
        except importlib.metadata.PackageNotFoundError:
            missing.append(match.group(0))
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon's CLI; returns its exit status (``sidecar.cli.exit_status``), or 3 with a
    message on stderr when the daemon's dependencies are missing. ``--version`` alone is answered without importing
    anything that needs a dependency."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        # Answered here, before any import that needs a dependency: an install made without its
        # dependencies (or a broken one) still says which version it is.
        from sidecar import __version__

        print(f"{DISTRIBUTION} {__version__}")
        return OK
    missing = missing_daemon_dependencies()
    if missing:
        sys.stderr.write(
            f"dflash-sidecar: the daemon needs packages that are not installed: {', '.join(missing)}.\n"
            f"This environment has the trainer shim only (pip install {DISTRIBUTION}). Install the "
            f"daemon with: pip install '{DISTRIBUTION}[{EXTRA}]'\n")
        return NO_DAEMON_DEPENDENCIES
    from sidecar.cli.main import main as cli_main

    return cli_main(args)
