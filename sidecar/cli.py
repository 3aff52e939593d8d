"""Command line: ``dflash-sidecar [run] [options]`` and the ``check``, ``demo`` and ``top`` subcommands."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from sidecar import __version__
from sidecar import config as config_mod
from sidecar.config import ConfigError

SUBCOMMANDS = ("run", "check", "demo", "top", "sample-config")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-sidecar",
        description="Host-side telemetry daemon for DFlash training: receives the trainer shim's "
                    "records, polls NVML, exports to Prometheus and W&B.")
    parser.add_argument("--version", action="version", version=f"dflash-sidecar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{run,check,demo,top,sample-config}")
    run = sub.add_parser("run", help="run the daemon (the default)")
    config_mod.add_arguments(run)
    check = sub.add_parser("check", help="verify endpoint, port, NVML and W&B before deployment")
    config_mod.add_arguments(check)
    demo = sub.add_parser("demo", help="the daemon plus a simulated DFlash pipeline (no GPU needed)")
    config_mod.add_arguments(demo)
    from sidecar.demo import add_demo_arguments

    add_demo_arguments(demo)
    top = sub.add_parser("top", help="live terminal view of a running daemon")
    top.add_argument("--url", default=None, help="metrics URL (default: from --prometheus-addr)")
    top.add_argument("--prometheus-addr", default="127.0.0.1:9478")
    top.add_argument("--refresh", type=float, default=2.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    sub.add_parser("sample-config", help="print a config file listing every setting and its default")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for invalid options)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in SUBCOMMANDS + ("-h", "--help", "--version"):
        args.insert(0, "run")
    parser = build_parser()
    ns = parser.parse_args(args)
    if ns.command == "sample-config":
        print(config_mod.sample_toml())
        return 0
    if ns.command == "top":
        from sidecar.top import run_top

        return run_top(ns.url or f"http://{ns.prometheus_addr}/metrics", ns.refresh, ns.once)
    given = {k: v for k, v in vars(ns).items() if k in config_mod.Config.__dataclass_fields__}
    try:
        cfg = config_mod.load(given)
    except ConfigError as exc:
        parser.exit(2, f"dflash-sidecar: error: {exc}\n")
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if ns.command == "check":
        from sidecar.check import run_check

        return run_check(cfg)
    if ns.command == "demo":
        from sidecar.demo import run_demo

        return run_demo(cfg, ns)
    return run_daemon(cfg, given)


def run_daemon(cfg: config_mod.Config, cli_overrides: dict[str, object]) -> int:
    from sidecar.daemon import Daemon
    from sidecar.sources.receiver import EndpointError

    daemon = Daemon(cfg, cli_overrides=cli_overrides)
    try:
        daemon.start()
    except (EndpointError, OSError) as exc:
        logging.getLogger("sidecar").error("dflash-sidecar: %s", exc)
        return 1
    return daemon.run()
