"""A real headless Chromium driven over the DevTools protocol, with the network off: open a page,
collect its console errors, uncaught exceptions and every request it made, evaluate script in it,
take a screenshot. Standard library only (a minimal WebSocket client).

``Chromium`` looks for Debian's ``/usr/bin/chromium`` (``chromium`` on PATH otherwise); tests skip
without it (``.ci/run`` installs it). The network is off: every connection goes through a proxy
that does not exist and every host name fails to resolve, so a page that tried to fetch anything
would show the request (``Page.requests``) and fail.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
         "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND", "--remote-debugging-port=0")


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or (
        "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


def chromium_or_skip() -> str:
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium (Debian's chromium package; .ci/run installs it)")
    return path


class _Socket:
    """A WebSocket client connection (RFC 6455: masked text frames out, any frames in)."""

    def __init__(self, url: str) -> None:
        rest = url.split("://", 1)[1]
        hostport, path = rest.split("/", 1)
        host, port = hostport.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("DevTools closed the WebSocket handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"DevTools refused the WebSocket: {head[:200]!r}")

    def _exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("DevTools closed the WebSocket")
            out += chunk
        return bytes(out)

    def send(self, text: str) -> None:
        payload = text.encode()
        n = len(payload)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
                                if n < 65536 else bytes([0x80 | 127]) + struct.pack(">Q", n))
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)
            if b0 & 0x0F in (0x8, 0x9, 0xA):  # close, ping, pong: none expected mid-session
                continue
            message += payload
            if b0 & 0x80:
                return message.decode()


@dataclass
class Page:
    """One page's session: what it logged and requested since ``open``."""

    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


class Chromium:
    """``with Chromium() as c: page = c.open(path); c.evaluate("...")``."""

    def __init__(self, width: int = 1280, height: int = 900) -> None:
        self.binary = chromium_or_skip()
        self.width, self.height = width, height
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.ws: _Socket | None = None
        self.next_id = 0
        self.page = Page()
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Chromium:
        self.proc = subprocess.Popen([self.binary, *FLAGS, f"--user-data-dir={self.profile}",
                                      f"--window-size={self.width},{self.height}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/json/list")
        targets = json.loads(conn.getresponse().read())
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = _Socket(page["webSocketDebuggerUrl"])
        for method in ("Runtime.enable", "Log.enable", "Network.enable", "Page.enable"):
            self.call(method)
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def _event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method", ""), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            self.page.errors.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.page.errors.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                           for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.page.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        elif method == "Network.requestWillBeSent":
            self.page.requests.append(params["request"]["url"])
        self.events.append(msg)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result. Raises ``RuntimeError`` with the protocol's error."""
        assert self.ws is not None
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))
            self._event(msg)

    def wait_event(self, method: str, timeout_s: float = 60.0) -> dict[str, Any]:
        assert self.ws is not None
        for msg in self.events:
            if msg.get("method") == method:
                return msg
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            self._event(msg)
            if msg.get("method") == method:
                return msg
        raise TimeoutError(method)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able; promises awaited)."""
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"evaluate: {out['exceptionDetails']}")
        return out["result"].get("value")

    def open(self, path: Path, ready: str = "true", timeout_s: float = 60.0) -> Page:
        """Load the file ``path`` and wait until ``ready`` (a JavaScript expression) is true."""
        self.page, self.events = Page(), []
        self.call("Page.navigate", url=path.resolve().as_uri())
        self.wait_event("Page.loadEventFired", timeout_s)
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(f"!!({ready})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never got {ready}")
            time.sleep(0.05)
        return self.page

    def screenshot(self, path: Path) -> None:
        """A PNG of the whole page."""
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
