"""A small real receiver for the shim tests and benchmark: a bound SUB socket in its own process.

Run as a script it binds ``ENDPOINT``, appends every frame it receives to ``OUT`` (a 4-byte
big-endian length, then the frame) and obeys one-line commands on stdin:

* ``stall``: stop touching the socket (a daemon that hangs; with libzmq 4.3.5 a bound SUB that is
  never polled does not even send its subscription to a newly connected publisher);
* ``resume``: poll and read again;
* ``quit``: close and exit.

It answers ``ready`` once bound (or, with ``--stalled``, once bound and not yet polled) and
``stalled``/``resumed`` after each command, so a test never guesses with a sleep. ``--discard``
keeps nothing (a benchmark drain). Nothing here imports pytest: the benchmark uses it too.

In the test process, ``decode``/``read_frames``/``SenderBook`` turn the frames back into messages
using ``trainer_shim.wire`` and do the per-sender loss accounting a daemon would do.
"""

from __future__ import annotations

import argparse
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from tests import waiting  # noqa: E402
from trainer_shim import wire  # noqa: E402

_HEADER = struct.Struct(">I")


# -- the receiving process ------------------------------------------------------------------------


def _serve(endpoint: str, out: str | None, stalled: bool) -> int:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
    sock.bind(endpoint)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sink = open(out, "ab", buffering=0) if out else None  # noqa: SIM115 - lives as long as we do
    stdin = sys.stdin.fileno()
    poller = zmq.Poller()
    poller.register(stdin, zmq.POLLIN)
    if not stalled:
        poller.register(sock, zmq.POLLIN)
    _say("ready")
    pending = b""
    while True:
        events = dict(poller.poll(50))
        if sock in events:
            chunks = []
            for _ in range(10_000):
                try:
                    frame = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                chunks.append(_HEADER.pack(len(frame)) + frame)
            if sink is not None and chunks:
                sink.write(b"".join(chunks))
        if stdin in events:
            data = os.read(stdin, 4096)
            if not data:
                break
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                cmd = line.strip().decode()
                if cmd == "quit":
                    if not stalled:  # what is already on its way is still received
                        _drain(sock, sink)
                    sock.close(0)
                    ctx.term()
                    return 0
                if cmd == "stall" and not stalled:
                    poller.unregister(sock)
                    stalled = True
                elif cmd == "resume" and stalled:
                    poller.register(sock, zmq.POLLIN)
                    stalled = False
                _say("stalled" if stalled else "resumed")
    sock.close(0)
    ctx.term()
    return 0


def _drain(sock: Any, sink: Any, quiet_ms: int = 100, limit_s: float = 2.0) -> None:
    """Read until nothing arrived for ``quiet_ms`` (at most ``limit_s``)."""
    import zmq

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and sock.poll(quiet_ms, zmq.POLLIN):
        frame = sock.recv()
        if sink is not None:
            sink.write(_HEADER.pack(len(frame)) + frame)


def _say(word: str) -> None:
    sys.stdout.write(word + "\n")
    sys.stdout.flush()


def _with_root(pythonpath: str | None) -> str:
    """``PYTHONPATH`` with this checkout first and whatever the parent had after it (the GPU
    check's packages may be reachable through it alone)."""
    return os.pathsep.join([str(ROOT), *([pythonpath] if pythonpath else [])])


class ReceiverProcess:
    """Starts and drives ``shim_helpers.py receive`` in a child process."""

    def __init__(self, endpoint: str, out: str | os.PathLike[str] | None, stalled: bool = False,
                 ready_timeout_s: float = 30.0) -> None:
        self.endpoint = endpoint
        self.out = Path(out) if out is not None else None
        cmd = [sys.executable, str(Path(__file__).resolve()), "receive", endpoint]
        cmd += ["--out", str(self.out)] if self.out is not None else ["--discard"]
        if stalled:
            cmd.append("--stalled")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "PYTHONPATH": _with_root(os.environ.get("PYTHONPATH"))})
        self._expect("ready", ready_timeout_s)

    def _expect(self, word: str, timeout_s: float) -> None:
        assert self.proc.stdout is not None
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sel.select(timeout=0.1):
                line = self.proc.stdout.readline().decode().strip()
                if line == word:
                    return
                if not line and self.proc.poll() is not None:
                    break
        raise RuntimeError(f"receiver did not say {word!r} (exit code {self.proc.poll()})")

    def command(self, cmd: str, expect: str, timeout_s: float = 30.0) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd.encode() + b"\n")
        self.proc.stdin.flush()
        self._expect(expect, timeout_s)

    def stall(self) -> None:
        self.command("stall", "stalled")

    def resume(self) -> None:
        self.command("resume", "resumed")

    def kill(self) -> None:
        """SIGKILL: the daemon dies without closing anything."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout_s)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()

    def messages(self) -> list[Message]:
        assert self.out is not None
        return [decode(frame) for frame in read_frames(self.out)]

    def __enter__(self) -> ReceiverProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- decoding and accounting ----------------------------------------------------------------------


@dataclass
class Message:
    """One decoded message. ``info`` for a HELLO; batch fields otherwise."""

    kind: int
    sender: int
    seq: int
    info: dict[str, Any] | None = None
    role: str = ""
    worker: str = ""
    step: int | None = None
    records_total: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    records: list[list[Any]] = field(default_factory=list)


def read_frames(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """The frames a receiver wrote, in arrival order (a torn last frame is ignored)."""
    data = Path(path).read_bytes() if Path(path).exists() else b""
    pos = 0
    while pos + 4 <= len(data):
        (size,) = _HEADER.unpack_from(data, pos)
        if pos + 4 + size > len(data):
            return
        yield data[pos + 4:pos + 4 + size]
        pos += 4 + size


def decode(frame: bytes) -> Message:
    """Decode one frame. Raises ``ValueError`` on anything that is not a v1 message."""
    obj = msgspec.msgpack.decode(frame)
    if not isinstance(obj, list) or len(obj) < 4 or obj[0] not in wire.KNOWN_VERSIONS:
        raise ValueError(f"not a dflash-sidecar message: {obj!r:.200}")
    kind = obj[1]
    if kind == wire.MessageKind.HELLO:
        _, _, sender, seq, info = obj
        return Message(kind, sender, seq, info=info)
    if kind == wire.MessageKind.BATCH:
        _, _, sender, seq, role, worker, step, total, dropped, records = obj
        return Message(kind, sender, seq, role=role, worker=worker, step=step,
                       records_total=total, dropped=dropped, records=records)
    raise ValueError(f"unknown message kind {kind!r}")


@dataclass
class SenderBook:
    """What one receiver can say about one sender, as the daemon would count it."""

    sender: int
    hellos: list[dict[str, Any]] = field(default_factory=list)
    batches: int = 0
    received: int = 0
    baseline: int | None = None  # records_total before the first batch this receiver saw
    last_total: int = 0
    missing: int = 0  # records proven lost from records_total gaps
    seq_gaps: int = 0
    last_seq: int | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    records: list[list[Any]] = field(default_factory=list)
    role: str = ""
    worker: str = ""

    def add(self, msg: Message) -> None:
        if self.last_seq is not None and msg.seq != self.last_seq + 1:
            self.seq_gaps += 1
        self.last_seq = msg.seq
        if msg.kind == wire.MessageKind.HELLO:
            assert msg.info is not None
            self.hellos.append(msg.info)
            return
        self.batches += 1
        n = len(msg.records)
        if self.baseline is None:
            self.baseline = msg.records_total - n
            self.last_total = self.baseline
        self.missing += msg.records_total - n - self.last_total
        self.last_total = msg.records_total
        self.received += n
        self.dropped = dict(msg.dropped)
        self.records.extend(msg.records)
        self.role, self.worker = msg.role, msg.worker

    def consistent(self) -> bool:
        """The accounting identity: every record up to ``last_total`` was received or proven lost."""
        return self.received == self.last_total - (self.baseline or 0) - self.missing


def books_of(messages: Iterable[Message]) -> dict[int, SenderBook]:
    """Per sender, in arrival order."""
    out: dict[int, SenderBook] = {}
    for msg in messages:
        out.setdefault(msg.sender, SenderBook(msg.sender)).add(msg)
    return out


def wait_until(predicate: Any, timeout_s: float = 30.0, interval_s: float = 0.02) -> Any:
    """``tests.waiting.wait_until`` with this module's defaults."""
    return waiting.wait_until(predicate, timeout_s, interval_s)


def only_book(rx: ReceiverProcess, done: Callable[[SenderBook], bool]) -> SenderBook:
    """The book of ``rx``'s one sender once ``done`` holds for it (within 60 s); stops ``rx`` and
    asserts the book's accounting identity."""
    def ready() -> SenderBook | None:
        books = list(books_of(rx.messages()).values())
        return books[0] if len(books) == 1 and done(books[0]) else None

    book = wait_until(ready, timeout_s=60)
    rx.stop()
    assert book.consistent()
    return book


EXIT_BOUND_S = 120.0
"""A liveness limit (a hang, not slowness): the DataLoader script imports torch on 2 busy cores."""

PRELUDE = """
import os, sys
from trainer_shim import telemetry
"""


def run_script(workdir: Path, code: str, endpoint: str,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as ``trainer.py`` in ``workdir`` with the shim pointed at ``endpoint``;
    fails the test on a non-zero exit or a traceback."""
    script = workdir / "trainer.py"
    script.write_text(PRELUDE + textwrap.dedent(code))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_")}
    full_env.update(PYTHONPATH=str(ROOT), DFLASH_SIDECAR_ENDPOINT=endpoint, RANK="0", **(env or {}))
    proc = subprocess.run([sys.executable, str(script)], env=full_env, capture_output=True, text=True,
                          timeout=EXIT_BOUND_S, check=False, cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("receive", help="bind a SUB and record or discard what arrives")
    rec.add_argument("endpoint")
    group = rec.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", help="append received frames to this file")
    group.add_argument("--discard", action="store_true", help="drain and keep nothing")
    rec.add_argument("--stalled", action="store_true", help="bind but never poll until 'resume'")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return _serve(args.endpoint, args.out, args.stalled)


if __name__ == "__main__":
    raise SystemExit(main())
