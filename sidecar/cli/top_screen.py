"""``dflash-sidecar top``, interactive: a full-screen view that scrolls, quits on ``q``, and waits
for the daemon (retrying) instead of exiting when it is not up yet.

Keys: ``q`` quit (Ctrl-C too); up/down or ``k``/``j`` one line; PgUp/PgDn or space a page;
Home/End or ``g``/``G`` top and bottom. Without a terminal on stdin the view only refreshes.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.segment import Segment
from rich.text import Text

from sidecar.cli.top import render, scrape
from sidecar.core import config as config_mod
from sidecar.model.address import parse_host_port
from sidecar.model.backoff import Backoff

DEFAULT_ADDR: str = config_mod.BY_NAME["prometheus_addr"].default
"""The daemon's default listen address (its ``prometheus_addr`` setting)."""

_KEYS = {b"q": "quit", b"Q": "quit", b"\x1b[A": "up", b"k": "up", b"\x1b[B": "down", b"j": "down",
         b"\x1b[5~": "page_up", b"b": "page_up", b"\x1b[6~": "page_down", b" ": "page_down",
         b"\x1b[H": "home", b"\x1b[1~": "home", b"g": "home", b"\x1b[F": "end", b"\x1b[4~": "end", b"G": "end"}


def _actions(data: bytes) -> list[str]:
    """The actions of the keys in one read: a terminal may deliver several keys, or a key with
    bytes that are no key (a terminal's own reports), in one chunk; unknown bytes are skipped."""
    actions, i = [], 0
    while i < len(data):
        for size in (4, 3, 1):  # escape sequences first, then single keys
            action = _KEYS.get(data[i:i + size])
            if action is not None:
                actions.append(action)
                i += size
                break
        else:
            i += 1
    return actions


def top_url(url: str | None, prometheus_addr: str | None, config_file: str | None) -> str:
    """The metrics URL: ``--url``, else ``--prometheus-addr``, else the config file's
    ``prometheus_addr`` (https when it sets TLS), else the default. A wildcard listen address is
    reached on loopback. Raises ``config.ConfigError`` for a bad config file or address."""
    if url:
        return url
    scheme = "http"
    addr = prometheus_addr
    if addr is None and config_file:
        cfg = config_mod.load({"config_file": config_file})
        addr = cfg.prometheus_addr
        scheme = "https" if cfg.prometheus_tls_cert else "http"
    try:
        host, port = parse_host_port(addr or DEFAULT_ADDR)
    except ValueError as exc:
        raise config_mod.ConfigError(f"invalid --prometheus-addr: {addr!r}: {exc}") from None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/metrics"


class Screen:
    """What ``Live`` shows: the frame, cut to the terminal's height at the scroll offset, and a
    status line (where the view is, what the keys do)."""

    def __init__(self, body: RenderableType, status: str = "") -> None:
        self.body = body
        self.status = status
        self.offset = 0
        self.lines = 0
        self.page = 1

    def key(self, action: str) -> None:
        """Scroll for ``action`` (see ``_KEYS``); clamped at the next render."""
        step = {"up": -1, "down": 1, "page_up": -self.page, "page_down": self.page,
                "home": -10**9, "end": 10**9}.get(action, 0)
        self.offset = max(0, min(self.offset + step, max(0, self.lines - self.page)))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        height = options.height or console.size.height
        lines = console.render_lines(self.body, options.reset_height(), pad=False)
        self.lines, self.page = len(lines), max(1, height - 1)
        self.offset = max(0, min(self.offset, self.lines - self.page))
        for line in lines[self.offset:self.offset + self.page]:
            yield from line
            yield Segment.line()
        shown = f"lines {self.offset + 1}-{min(self.lines, self.offset + self.page)} of {self.lines}"
        more = " · ↑↓ PgUp PgDn scroll" if self.lines > self.page else ""
        yield Text(f"{self.status} · {shown} · q quit{more}", style="reverse", no_wrap=True, overflow="ellipsis")


def waiting_text(url: str, exc: Exception) -> str:
    """What top says while the daemon at ``url`` cannot be read (``exc`` says why)."""
    reason = getattr(exc, "reason", None) or exc
    return (f"waiting for the daemon at {url}: {reason}\n\nStart it (dflash-sidecar, or the systemd unit) or point "
            "top at it with --url, --prometheus-addr or --config.")


def frame(url: str) -> tuple[RenderableType, str, bool]:
    """(body, status, reachable) for one refresh. Never raises: an unreachable daemon gives a
    waiting frame."""
    try:
        samples = scrape(url)
    except (OSError, ValueError) as exc:
        return (Text(waiting_text(url, exc), style="yellow"), f"{time.strftime('%H:%M:%S')} not reachable, retrying",
                False)
    senders = sum(v for _, v in samples.get("dflash_sidecar_senders", []))
    steps = [int(v) for _, v in samples.get("dflash_trainer_step", [])]
    step = "" if not steps else f" · step {min(steps)}" if min(steps) == max(steps) else \
        f" · steps {min(steps)}-{max(steps)}"
    return render(samples), f"{url} · {time.strftime('%H:%M:%S')} · {senders:.0f} live senders{step}", True


@contextmanager
def _keys() -> Iterator[int | None]:
    """stdin's descriptor in cbreak mode (keys one at a time, Ctrl-C still interrupts), restored
    on exit; None when stdin is not a terminal."""
    if not sys.stdin.isatty():
        yield None
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run_top(url: str, refresh_s: float, once: bool) -> int:
    """Show the view until ``q`` or Ctrl-C; with ``once``, print one frame (1 if the daemon
    cannot be reached)."""
    console = Console()
    if once:
        try:
            console.print(render(scrape(url)))
        except (OSError, ValueError) as exc:
            console.print(f"dflash-sidecar top: cannot read {url}: {exc}. Is the daemon running?")
            return 1
        return 0
    retry = Backoff(min(refresh_s, 1.0), max(refresh_s, 5.0))
    if not console.is_terminal:
        return _run_plain(console, url, refresh_s, retry)
    body, status, _ = frame(url)
    screen = Screen(body, status)
    try:
        with _keys() as fd, Live(screen, console=console, screen=True, auto_refresh=False) as live:
            next_scrape = time.monotonic() + refresh_s
            while True:
                wait = max(0.0, next_scrape - time.monotonic())
                if fd is None:
                    time.sleep(wait)
                elif select.select([fd], [], [], wait)[0]:
                    actions = _actions(os.read(fd, 64))
                    if "quit" in actions:
                        return 0
                    for action in actions:
                        screen.key(action)
                    if actions:
                        live.refresh()
                    continue
                screen.body, screen.status, reachable = frame(url)
                if reachable:
                    retry.reset()
                next_scrape = time.monotonic() + (refresh_s if reachable else retry.failed())
                live.refresh()
    except KeyboardInterrupt:
        return 0


def _run_plain(console: Console, url: str, refresh_s: float, retry: Backoff) -> int:
    """Without a terminal (a pipe, a log): says once that it waits for the daemon (again when the
    reason changes or after the daemon was reached), then prints one frame per refresh; Ctrl-C stops."""
    said: str | None = None
    try:
        while True:
            try:
                samples = scrape(url)
            except (OSError, ValueError) as exc:
                text = waiting_text(url, exc)
                if text != said:
                    console.print(f"{text} Retrying (Ctrl-C to stop).")
                    console.file.flush()
                    said = text
                time.sleep(retry.failed())
                continue
            said = None
            retry.reset()
            console.print(render(samples))
            console.file.flush()
            time.sleep(refresh_s)
    except KeyboardInterrupt:
        return 0
