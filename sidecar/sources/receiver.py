"""The daemon's only contact with ZeroMQ: a bound SUB socket that trainers' shims connect to.

The stable side binds: the daemon binds, shims connect, either may start first. An ipc endpoint
is guarded by an exclusive ``flock`` on ``<socket path>.lock``: ZeroMQ would let a second daemon
bind the same path and silently steal the socket from the first, so a second daemon refuses to
start instead. A stale socket file left by a killed daemon is removed (the lock proves nobody
owns it). The daemon creates only its own directory, the private per-user one (0700); any other
socket directory must exist (systemd's ``RuntimeDirectory=`` makes its own, with its own mode). In
a directory other users may write to (sticky, like ``/tmp``) the lock file lives in that private
directory instead, where nobody else can create it first. The socket is born with its final mode
(0660): the umask is tightened around ``bind``, so there is no moment another user could connect.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import math
import os
import stat
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

import zmq

from sidecar.model.handoff import Received
from trainer_shim.endpoint import user_runtime_dir
from trainer_shim.wire import MAX_MESSAGE_BYTES

log = logging.getLogger("sidecar")

RECV_HWM = 16
"""Frames ZeroMQ may queue per connection for the daemon. ``poll`` takes everything ZeroMQ holds
into the fair queue (``FairQueue``, bounded in total) each time, so this queue only fills while
the ingest thread handles one frame; beyond it ZeroMQ stops reading that connection and the
publisher's own queue (1000 frames) takes the backlog, then drops (counted by the daemon as
``lost_in_transit``). With ``MAX_MESSAGE_BYTES`` (1 MiB) one connection can make ZeroMQ hold at
most ``QUEUE_CEILING_BYTES`` = 16 MiB (it was 64 MiB: 16 flooding connections peaked at 1.1 GiB)."""

QUEUE_CEILING_BYTES = RECV_HWM * MAX_MESSAGE_BYTES
"""Most that ZeroMQ's receive queue holds per connection (bytes)."""
BACKLOG_PULL = RECV_HWM // 2
"""A pull of this many frames or more from ZeroMQ counts as a backlog (no coalescing wait): a
connection may be at its mark (approximate: 15 of 16 seen), its sender blocked or dropping."""

MAX_FRAMES_PER_POLL = 1000
"""Frames one ``poll`` hands over at most (the ingest loop checks its window between frames)."""

SOCKET_UMASK = 0o117
"""The umask around an ipc ``bind``: the socket file is created 0660 (owner and group may connect)."""

POLL_MAX_BYTES = 8 * 1024 * 1024
"""``poll`` stops taking frames out of ZeroMQ's queue once it holds this many bytes: a flood of
large frames is then copied into the daemon a few at a time, not 1000 at a time."""


class EndpointError(Exception):
    """The endpoint cannot be used; the message says what to fix."""


QUANTUM_S = 0.005
"""CPU seconds each peer with frames waiting is handed per round (deficit round robin)."""
FIRST_COST_S_PER_BYTE = 20e-9
"""A new peer's assumed cost (CPU seconds per byte of frame: 20 ms a MiB) until one of its frames
is measured."""
PENDING_MAX_BYTES = 128 * 1024 * 1024
"""Most bytes of frames taken from ZeroMQ and waiting for their round, all peers together; past
it the oldest frame of the peer with the most waiting is dropped unread (``over_share``)."""
LIGHT_CPU_SHARE = 0.05
"""A peer whose handling used less than this share of a core lately (decayed over ``USAGE_TAU_S``)
is light: all its waiting frames pass at the start of every round. A trainer at 5,000 records/s
costs about 1-2 %; a flooder of expensive frames is over it within its first frames."""
USAGE_TAU_S = 2.0
"""Time constant (seconds) of the decayed CPU use behind ``LIGHT_CPU_SHARE``."""
MAX_PULL = 20_000
"""Frames ``poll`` takes from ZeroMQ at most before handing out a round."""


class FairQueue:
    """Frames waiting for the ingest thread, per peer (the process at the other end of an ipc
    connection; all tcp peers are one), handed out by deficit round robin on CPU time: each round
    every peer with frames waiting is credited ``QUANTUM_S`` and gets frames while its credit,
    less each frame's expected cost (its measured cost per byte times the frame's size), stays
    positive; the measured cost is charged afterwards (``charge``), so a peer whose frames are
    expensive (1 MiB of new profile keys took 370 ms) gets one frame every few rounds. Light peers
    (under ``LIGHT_CPU_SHARE`` of a core lately: trainers) go first each round with all they have,
    so a trainer is never left behind however little CPU the box leaves the daemon. Memory is
    bounded in total, whatever the number of connections: ``PENDING_MAX_BYTES`` (the heaviest peer
    loses its oldest frame), and
    ZeroMQ's own queue empties at every poll. Single-threaded (the ingest thread)."""

    def __init__(self) -> None:
        self.pending: dict[Hashable, deque[zmq.Frame]] = {}
        self.pending_bytes = 0
        self._bytes: dict[Hashable, int] = {}
        self._deficit: dict[Hashable, float] = {}
        self._per_byte: dict[Hashable, float] = {}
        self._usage: dict[Hashable, tuple[float, float]] = {}
        """Peer -> (decayed CPU seconds, when last updated), for ``LIGHT_CPU_SHARE``."""
        self.clock = time.monotonic
        self.dropped = 0
        """Frames dropped unread because the total was over ``PENDING_MAX_BYTES``."""

    def push(self, peer: Hashable, frame: zmq.Frame) -> None:
        queue = self.pending.get(peer)
        if queue is None:
            queue = self.pending[peer] = deque()
            self._bytes[peer] = 0
        n = len(frame)
        queue.append(frame)
        self._bytes[peer] += n
        self.pending_bytes += n
        while self.pending_bytes > PENDING_MAX_BYTES:
            heaviest = max(self._bytes, key=self._bytes.__getitem__)
            self._take(heaviest)
            self.dropped += 1

    def _take(self, peer: Hashable) -> zmq.Frame:
        queue = self.pending[peer]
        frame = queue.popleft()
        n = len(frame)
        self._bytes[peer] -= n
        self.pending_bytes -= n
        if not queue:
            del self.pending[peer], self._bytes[peer]
        return frame

    def round(self, max_frames: int, max_bytes: int) -> list[tuple[zmq.Frame, Hashable]]:
        """One round of frames in fair order (at most ``max_frames`` or about ``max_bytes``)."""
        out: list[tuple[zmq.Frame, Hashable]] = []
        nbytes = 0
        now = self.clock()
        light = [p for p in self.pending if self._rate(p, now) < LIGHT_CPU_SHARE]
        for peer in light:  # light peers (trainers) first, all they have
            while peer in self.pending and len(out) < max_frames and nbytes < max_bytes:
                frame = self._take(peer)
                out.append((frame, peer))
                nbytes += len(frame)
        for peer in [p for p in self.pending if p not in light]:
            deficit = self._deficit.get(peer, 0.0) + QUANTUM_S
            per_byte = self._per_byte.get(peer, FIRST_COST_S_PER_BYTE)
            while deficit > 0 and peer in self.pending and len(out) < max_frames and nbytes < max_bytes:
                frame = self._take(peer)
                deficit -= per_byte * len(frame)  # corrected by ``charge`` once measured
                out.append((frame, peer))
                nbytes += len(frame)
            # an emptied queue keeps its debt, not its credit (no banking while idle)
            self._deficit[peer] = min(deficit, 0.0) if peer not in self.pending else deficit
        for peer in [p for p, d in self._deficit.items() if d >= 0.0 and p not in self.pending]:
            del self._deficit[peer]
        if len(self._per_byte) > 4 * len(self.pending) + 64:  # forget the cost of peers gone
            for peer in [p for p in self._per_byte if p not in self.pending and p not in self._deficit]:
                del self._per_byte[peer]
                self._usage.pop(peer, None)
        return out

    def _rate(self, peer: Hashable, now: float) -> float:
        """The peer's recent CPU use, in cores (decayed with ``USAGE_TAU_S``)."""
        used, at = self._usage.get(peer, (0.0, now))
        return used * math.exp((at - now) / USAGE_TAU_S) / USAGE_TAU_S

    def charge(self, peer: Hashable, cpu_s: float, nbytes: int) -> None:
        """Charge a frame's measured cost: the difference from its expected cost moves the peer's
        deficit, and its cost per byte is learnt (a moving average)."""
        per_byte = self._per_byte.get(peer, FIRST_COST_S_PER_BYTE)
        self._deficit[peer] = self._deficit.get(peer, 0.0) - (cpu_s - per_byte * nbytes)
        now = self.clock()
        used, at = self._usage.get(peer, (0.0, now))
        self._usage[peer] = (used * math.exp((at - now) / USAGE_TAU_S) + cpu_s, now)
        if nbytes:
            self._per_byte[peer] = 0.7 * per_byte + 0.3 * cpu_s / nbytes


@dataclass
class ReceiverStats:
    """The receiver's counters since it started (mutable, the receiver's own)."""

    frames: int = 0
    bytes: int = 0
    disconnects: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    """Frames dropped unread, by reason (``over_share``)."""

    def part(self) -> Received:
        """A copy of the counters: the receiver's part of a window."""
        return Received(self.frames, self.bytes, self.disconnects, dict(self.refused))


class Receiver:
    """Binds every endpoint on one SUB socket. Use from one thread only (the ingest thread),
    except ``close`` which the same thread calls on its way out."""

    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = list(endpoints)
        self.stats = ReceiverStats()
        self.backlog = False
        """More frames are likely waiting: the last ``poll`` left frames in the fair queue, or took
        ``BACKLOG_PULL`` frames or more from ZeroMQ."""
        self._shares = FairQueue()
        """Frames waiting, per peer, and each peer's share of the ingest thread's CPU; the caller
        charges each frame's measured cost (``charge``)."""
        self._closed = False
        self._locks: list[int] = []
        self._ipc_paths: list[tuple[str, str]] = []
        """(socket path, its lock file) of each ipc endpoint we bound."""
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._sock.setsockopt(zmq.RCVHWM, RECV_HWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._poller = zmq.Poller()  # one poller for both sockets, kept: Socket.poll builds one a call
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        try:
            for endpoint in self.endpoints:
                self._bind(endpoint)
        except BaseException:
            self.close()
            raise

    def _bind(self, endpoint: str) -> None:
        ipc = endpoint.startswith("ipc://")
        if ipc:
            self._guard_ipc(endpoint[len("ipc://"):])
        # libzmq binds an ipc socket synchronously in this thread, with the mode the umask leaves:
        # 0660 from the start (a chmod after bind left it 0777 under umask 0 for a moment).
        old = os.umask(SOCKET_UMASK) if ipc else None
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError as exc:
            raise EndpointError(f"cannot bind {endpoint}: {_bind_hint(endpoint, exc)}") from None
        finally:
            if old is not None:
                os.umask(old)
        if ipc:
            os.chmod(endpoint[len("ipc://"):], 0o660)  # the final mode whatever libzmq did

    def _guard_ipc(self, path: str) -> None:
        directory = os.path.dirname(path) or "."
        _make_own_directory(directory)
        shared = _check_directory(directory)
        lock_path = path + ".lock"
        if shared:  # another user could create (and flock) <path>.lock first: lock where only we write
            own = user_runtime_dir()
            _make_own_directory(own)
            _check_directory(own)
            lock_path = os.path.join(own, "lock-" + os.path.abspath(path).replace("/", "%") + ".lock")
        try:
            # O_NOFOLLOW: a symlink planted at the lock path must not make us truncate its target.
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            if os.path.lexists(lock_path):  # something (a planted symlink) is in the way: name it
                raise EndpointError(f"cannot open {lock_path}, the lock file of ipc://{path}: {exc.strerror} "
                                    "(symbolic links are not followed); remove it") from None
            raise EndpointError(f"cannot create the socket ipc://{path}: {exc.strerror} in {directory} (the "
                                f"daemon writes the socket and its lock file {os.path.basename(lock_path)} "
                                "there); give --endpoint a path in a directory this user can write") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            holder = _read_pid(lock_path)
            raise EndpointError(
                f"another dflash-sidecar{f' (pid {holder})' if holder else ''} already serves "
                f"ipc://{path}; stop it first or give this one another --endpoint") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._locks.append(fd)
        if os.path.exists(path):
            os.unlink(path)  # stale: whoever bound it no longer holds the lock
        self._ipc_paths.append((path, lock_path))

    def poll(self, timeout_ms: int) -> list[tuple[bytes, int | None]]:
        """(frame, peer) pairs for the ingest thread, ``peer`` the pid of the process at the other
        end of its ipc connection (the kernel's ``SO_PEERCRED``, which ZeroMQ reads when the
        connection is accepted) or None (tcp): everything queued in ZeroMQ is taken (up to
        ``MAX_PULL`` frames, not copied) into the fair queue, then one round of it is handed out,
        at most ``MAX_FRAMES_PER_POLL`` frames or about ``POLL_MAX_BYTES``. Waits up to
        ``timeout_ms`` only when nothing is waiting. One wait covers the frames and the
        disconnect monitor. The caller ``charge``s each frame's cost once handled."""
        fair = self._shares
        ready = dict(self._poller.poll(0 if fair.pending else timeout_ms))
        taken = 0
        if self._sock in ready:
            recv = self._sock.recv
            try:
                for _ in range(MAX_PULL):
                    msg = recv(zmq.NOBLOCK, copy=False)
                    fair.push(peer_pid(msg), msg)
                    taken += 1
            except zmq.Again:
                pass
            self.stats.frames += taken
            if fair.dropped:
                self.stats.refused["over_share"] = self.stats.refused.get("over_share", 0) + fair.dropped
                fair.dropped = 0
        if self._monitor in ready:
            self._drain_monitor()
        picked = fair.round(MAX_FRAMES_PER_POLL, POLL_MAX_BYTES)
        frames: list[tuple[bytes, int | None]] = [(msg.bytes, peer) for msg, peer in picked]  # type: ignore[misc]
        self.stats.bytes += sum(len(f) for f, _ in frames)
        # A pull near a connection's high-water mark may have stopped a sender there: no coalescing
        # wait then, or a fast sender gets RECV_HWM frames a wait (ZeroMQ's mark is approximate).
        self.backlog = bool(fair.pending) or taken >= BACKLOG_PULL
        return frames

    def received(self) -> Received:
        """The counters as of now, copied: the receiver's part of a window."""
        return self.stats.part()

    def charge(self, peer: int | None, cpu_s: float, nbytes: int) -> None:
        """Charge a handled frame's measured cost (CPU seconds, its size) to its peer's share of the
        ingest thread (``FairQueue.charge``): what decides the peer's next rounds."""
        self._shares.charge(peer, cpu_s, nbytes)

    def _drain_monitor(self) -> None:
        while True:
            try:
                self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.stats.disconnects += 1

    def close(self) -> None:
        """Close the socket, remove ipc socket files we own and release their locks. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(linger=0)
        self._sock.close(linger=0)
        self._ctx.term()
        self.remove_files()

    def remove_files(self) -> None:
        """Remove the ipc socket files and lock files we own and release the locks. Safe from
        any thread (the daemon's last resort when ingest did not stop in time). Idempotent."""
        for paths in list(self._ipc_paths):
            for p in paths:
                try:
                    os.unlink(p)
                except OSError:
                    pass
        self._ipc_paths.clear()
        locks, self._locks = self._locks, []
        for fd in locks:
            os.close(fd)


def peer_pid(msg: zmq.Frame) -> int | None:
    """The pid in a frame's ``Peer-Address`` property, which libzmq sets for an ipc connection to
    ``host:uid:gid:pid`` from the kernel's peer credentials; None for tcp or when absent."""
    try:
        address = msg.get("Peer-Address")
    except zmq.ZMQError:
        return None
    if not isinstance(address, str):
        return None
    parts = address.rsplit(":", 3)
    if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit() and parts[3].isdigit():
        pid = int(parts[3])
        return pid if pid > 0 else None
    return None


def _make_own_directory(directory: str) -> None:
    """Create ``directory`` (0700) if it is the daemon's own per-user directory and missing; any
    other missing directory is an error (a typo in ``--endpoint`` must not create ``/typo/dir``).
    Raises ``EndpointError`` saying what to fix."""
    if os.path.isdir(directory):
        return
    if os.path.abspath(directory) != os.path.abspath(user_runtime_dir()):
        raise EndpointError(f"the socket directory {directory} does not exist: create it (mode 0700 or 0750, "
                            "owned by this user), or give --endpoint a path in an existing directory")
    old = os.umask(0o077)
    try:
        os.mkdir(directory, 0o700)  # the leaf only: its parent ($XDG_RUNTIME_DIR, /tmp) is the system's
    except FileExistsError:
        pass
    except OSError as exc:
        raise EndpointError(f"cannot create the socket directory {directory}: {exc.strerror}") from None
    finally:
        os.umask(old)


def _check_directory(directory: str) -> bool:
    """Refuse a socket directory another user controls. If someone else owns it (for example
    pre-created ``/tmp/dflash-sidecar-<uid>``), or may write to it without the sticky bit, they
    could replace the socket (and receive the trainers' telemetry) or plant symlinks the daemon
    would follow. Returns whether other users may create files in it (a sticky shared directory
    such as ``/tmp``). Raises ``EndpointError`` saying what to fix."""
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise EndpointError(f"cannot inspect the socket directory {directory}: {exc.strerror}") from None
    problem = None
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif st.st_uid not in (os.geteuid(), 0):
        problem = f"is owned by uid {st.st_uid}, not by this user ({os.geteuid()}) or root"
    elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        problem = f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}) without the sticky bit"
    if problem:
        raise EndpointError(f"refusing the socket directory {directory}: it {problem}, so another user could "
                            "replace the socket. Remove it (the daemon recreates it private) or give --endpoint "
                            "a path in a directory only this user can write")
    return bool(st.st_mode & 0o022)


def _bind_hint(endpoint: str, exc: zmq.ZMQError) -> str:
    """What went wrong binding ``endpoint`` and what to do about it."""
    if exc.errno == errno.EADDRINUSE:
        return (f"{exc.strerror}: another program (or another dflash-sidecar) listens there; stop it or "
                "choose another port with --endpoint, e.g. tcp://127.0.0.1:5557")
    if exc.errno == errno.EADDRNOTAVAIL and endpoint.startswith("tcp://"):
        host = endpoint[len("tcp://"):].rpartition(":")[0].strip("[]")
        return (f"{exc.strerror}: {host} is not an address of this machine. Shims connect from the same "
                "host: bind tcp://127.0.0.1:PORT (or an address this machine has)")
    if exc.errno == errno.EACCES and endpoint.startswith("tcp://"):
        return f"{exc.strerror}: ports below 1024 need privileges; use a port above 1024"
    return f"{exc.strerror}; choose another with --endpoint"


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip() or 0) or None
    except (OSError, ValueError):
        return None
