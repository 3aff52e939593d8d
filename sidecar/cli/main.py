"""Command line: ``dflash-sidecar [run] [options]`` and the ``check``, ``demo`` and ``top`` subcommands."""

from __future__ import annotations

import argparse
import difflib
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

from sidecar import __version__
from sidecar.cli.exit_status import FAILURE, OK, USAGE
from sidecar.core import config as config_mod
from sidecar.core.config import ConfigError

SUBCOMMANDS = ("run", "check", "demo", "top", "explain", "report", "cluster", "trace", "sample-config")


class DefaultsHelp(argparse.HelpFormatter):
    """``--help`` that shows each option's default, except where there is none to show (None,
    off, a setting's flag, whose help already says it) or the help says it in words."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text.lower():
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-sidecar", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Host-side telemetry daemon for DFlash training: receives the trainer shim's "
                    "records, polls NVML, exports to Prometheus and W&B.",
        epilog=config_mod.summary_help())
    parser.add_argument("--version", action="version", version=f"dflash-sidecar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    add = functools.partial(sub.add_parser, formatter_class=DefaultsHelp)
    run = add("run", help="run the daemon (the default)")
    config_mod.add_arguments(run)
    check = add("check", help="verify endpoint, port, NVML and W&B before deployment")
    config_mod.add_arguments(check)
    demo = add("demo", help="the daemon plus a simulated DFlash pipeline (no GPU needed)",
               description="The daemon plus a simulated trainer; a progress line meanwhile, a summary at the end. "
                           "Its run ledger goes to --state-dir when given, else to the default state folder's demo/ "
                           "(apart from real runs'): the summary says which, for dflash-sidecar report.")
    config_mod.add_arguments(demo)
    from sidecar.cli.demo import add_demo_arguments, positive_seconds

    add_demo_arguments(demo)
    addr_help = f"the daemon's HOST:PORT (default: {config_mod.BY_NAME['prometheus_addr'].default})"
    top = add("top", help="terminal view of a running daemon, redrawn as it runs")
    top.add_argument("--url", default=None, help="metrics URL (default: from --prometheus-addr or --config)")
    top.add_argument("--prometheus-addr", default=None, help=addr_help)
    top.add_argument("--config", dest="config_file", metavar="FILE", default=None,
                     help="the daemon's TOML config file: top reads its prometheus_addr (and TLS)")
    top.add_argument("--refresh", type=positive_seconds, default=2.0, help="seconds between refreshes (> 0)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    explain = add("explain", help="what a running daemon mapped each series to, and what each verdict lacks")
    explain.add_argument("--prometheus-addr", default=None, help=addr_help)
    explain.add_argument("--config", dest="config_file", metavar="FILE", default=None,
                         help="the daemon's TOML config file: explain reads its prometheus_addr")
    explain.add_argument("--json", action="store_true", help="print the raw JSON")
    explain.add_argument("--run", default=None,
                         help="a run's verdicts as the run ledger kept them (its share of the run's time and windows, "
                              "the dominant one's evidence): works after the run ended and without a daemon")
    explain.add_argument("--state-dir", default=None, help="the daemon's state folder: --run's ledger, kept captures "
                                                           "(default: as the daemon)")
    report = add("report", help="the run ledger: where each run's time and energy went")
    report.add_argument("--run", default=None, help="only this run (a W&B run id, or host:NAME)")
    report.add_argument("--json", action="store_true", help="print JSON")
    report.add_argument("--html", metavar="FILE", default=None,
                        help="write one run (--run, default the most recent) as one self-contained HTML page to "
                             "FILE: its verdict, GPUs and step time over time, and its ledger; it fetches nothing")
    report.add_argument("--state-dir", default=None, help="the daemon's state folder (default: as the daemon)")
    report.add_argument("--config", dest="config_file", metavar="FILE", default=None,
                        help="the daemon's TOML config file: report reads its state_dir and flops_per_token")
    cluster = _add_cluster(add, report)
    from sidecar.cli.trace import add_trace_arguments

    trace = add_trace_arguments(add("trace", help="N steps of torch.profiler from a live trainer, and where their "
                                                  "time went"))
    sample = add("sample-config", help="print a config file listing every setting and its default")
    for name, p in (("run", run), ("check", check), ("demo", demo), ("top", top), ("explain", explain),
                    ("report", report), ("cluster", cluster), ("trace", trace), ("sample-config", sample)):
        p.set_defaults(subparser=p, command=name)
    return parser


def _add_cluster(add: Callable[..., argparse.ArgumentParser],
                 report: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``report --prometheus`` and the ``cluster`` command's parser."""
    report.add_argument("--prometheus", default=None, metavar="URL",
                        help="a Prometheus base URL: say which node held each run back most (its straggler rules)")
    cluster = add("cluster", help="the cluster's verdict from Prometheus: which node the others wait for, and why")
    cluster.add_argument("--prometheus", required=True, metavar="URL",
                         help="the Prometheus (or Thanos/Mimir query) base URL, e.g. http://prometheus:9090")
    cluster.add_argument("--run", default=None, help="the run to show (needed when several report)")
    cluster.add_argument("--json", action="store_true", help="print JSON")
    return cluster


def _trace(ns: argparse.Namespace) -> int:
    """``trace``: ask, wait, keep, print (``sidecar.cli.trace``)."""
    from sidecar.cli.trace import run_trace
    from sidecar.core.ledger_state import state_dir

    try:
        given: dict[str, object] = {"config_file": ns.config_file} if ns.config_file else {}
        if ns.endpoint:
            given["endpoint"] = list(ns.endpoint)
        cfg = config_mod.load(given)
    except ConfigError as exc:
        ns.subparser.exit(USAGE, f"dflash-sidecar trace: error: {exc}\n")
    if not ns.wait > 0:
        ns.subparser.exit(USAGE, "dflash-sidecar trace: error: --wait must be > 0\n")
    return run_trace(tuple(cfg.endpoint), state_dir(ns.state_dir or cfg.state_dir), ns.steps, ns.role, ns.worker,
                     ns.pid, ns.wait)


def _unknown_arguments(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """The error for arguments ``parser`` does not take, with the closest option it does take."""
    first = next((a for a in extra if a.startswith("-")), extra[0])
    if not first.startswith("-"):
        return f"unexpected argument {first!r}"
    flag = first.split("=", 1)[0]
    options = [o for action in parser._actions for o in action.option_strings]
    close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f"; see {parser.prog} --help"
    return f"unknown option {flag}{hint}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (``sidecar.cli.exit_status``: 2 for invalid options).
    Output cut short by its reader (``dflash-sidecar report | head``) ends quietly with the status a
    shell gives a process SIGPIPE killed (128 + SIGPIPE), as ``cat`` does, not with a traceback."""
    try:
        return _dispatch(argv)
    except BrokenPipeError:
        # Python's own advice: point stdout at /dev/null, so the flush at exit cannot fail again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 128 + signal.SIGPIPE


def _dispatch(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if args and not args[0].startswith("-") and args[0] not in SUBCOMMANDS:
        close = difflib.get_close_matches(args[0], SUBCOMMANDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        parser.exit(USAGE, f"dflash-sidecar: error: unknown command {args[0]!r}; {hint}"
                       f"commands: {', '.join(SUBCOMMANDS)} (none: run)\n")
    if not args or args[0] not in SUBCOMMANDS + ("-h", "--help", "--version"):
        args.insert(0, "run")
    ns, extra = parser.parse_known_args(args)
    if extra:
        ns.subparser.exit(USAGE, f"{ns.subparser.prog}: error: {_unknown_arguments(ns.subparser, extra)}\n")
    if ns.command == "sample-config":
        print(config_mod.sample_toml())
        return OK
    if ns.command == "top":
        from sidecar.cli.top_screen import run_top, top_url

        try:
            url = top_url(ns.url, ns.prometheus_addr, ns.config_file)
        except ConfigError as exc:
            ns.subparser.exit(USAGE, f"dflash-sidecar top: error: {exc}\n")
        return run_top(url, ns.refresh, ns.once)
    if ns.command == "explain":
        return _explain(ns)
    if ns.command == "cluster":
        from sidecar.cli.cluster import run_cluster

        return run_cluster(ns.prometheus, ns.run, ns.json)
    if ns.command == "trace":
        return _trace(ns)
    if ns.command == "report":
        return _report(ns)
    given = config_mod.given(vars(ns))
    try:
        cfg = config_mod.load(given)
    except ConfigError as exc:
        parser.exit(USAGE, f"dflash-sidecar: error: {exc}\n")
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if ns.command == "check":
        from sidecar.cli.check import run_check

        return run_check(cfg)
    if ns.command == "demo":
        from sidecar.cli.demo import run_demo

        return run_demo(cfg, ns)
    return run_daemon(cfg, given)


def _report(ns: argparse.Namespace) -> int:
    """``report``: the run ledger as text or JSON, or the run's page (``--html``)."""
    from sidecar.cli.report import run_report

    try:
        cfg = config_mod.load({"config_file": ns.config_file} if ns.config_file else {})
    except ConfigError as exc:
        ns.subparser.exit(USAGE, f"dflash-sidecar report: error: {exc}\n")
    if ns.html is not None:
        from sidecar.cli.report_html import run_report_html

        return run_report_html(ns.state_dir or cfg.state_dir, ns.run, ns.html, cfg.flops_per_token)
    status = run_report(ns.state_dir or cfg.state_dir, ns.run, ns.json, cfg.flops_per_token,
                        prometheus=ns.prometheus)
    return _with_captures(status, ns, cfg, last=False)


def _explain(ns: argparse.Namespace) -> int:
    """``explain``: the running daemon's report, or with ``--run`` a run's kept verdicts (state file)."""
    from sidecar.cli.explain import run_explain
    from sidecar.cli.top_screen import top_url

    try:
        url = top_url(None, ns.prometheus_addr, ns.config_file)
        cfg = config_mod.load({"config_file": ns.config_file} if ns.config_file else {})
    except ConfigError as exc:
        ns.subparser.exit(USAGE, f"dflash-sidecar explain: error: {exc}\n")
    if ns.run is not None:
        from sidecar.cli.report import run_verdicts

        return _with_captures(run_verdicts(ns.state_dir or cfg.state_dir, ns.run), ns, cfg, last=False)
    return _with_captures(run_explain(url.removesuffix("/metrics") + "/explain", ns.json), ns, cfg, last=True)


def _with_captures(status: int, ns: argparse.Namespace, cfg: config_mod.Config, last: bool) -> int:
    """``status``, after printing the kept captures (``sidecar.cli.trace_view.print_captures``) where
    the command succeeded in text mode."""
    if status == OK and not ns.json:
        from sidecar.cli.trace_view import print_captures

        print_captures(ns.state_dir or cfg.state_dir, ns.run, last)
    return status


def run_daemon(cfg: config_mod.Config, cli_overrides: dict[str, object]) -> int:
    from sidecar.core.daemon import Daemon
    from sidecar.sources.receiver import EndpointError
    from sidecar.sources.settings import remote_endpoints

    for endpoint in remote_endpoints(cfg.endpoint):  # only there with --endpoint-allow-remote
        logging.getLogger("sidecar").warning(
            "dflash-sidecar: %s binds beyond loopback (--endpoint-allow-remote): any host that can reach it may "
            "send records; keep it behind a firewall", endpoint)
    daemon = Daemon(cfg, cli_overrides=cli_overrides)
    try:
        daemon.start()
    except (EndpointError, OSError) as exc:
        logging.getLogger("sidecar").error("dflash-sidecar: %s", exc)
        return FAILURE
    return daemon.run()
