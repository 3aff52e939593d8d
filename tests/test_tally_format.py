"""The sender's tally in process: torn writes, ownership, bounded claims, reconciling arithmetic."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from sidecar.aggregation.senders import SenderRegistry
from sidecar.model.messages import BatchMessage
from sidecar.sources.tallies import TallyDirectory
from trainer_shim import wire
from trainer_shim.tally import TallyWriter


def _tally(end: wire.TallyEnd, *channels: wire.TallyChannel, pid: int = 4242) -> wire.Tally:
    return wire.Tally(wire.TALLY_VERSION, pid, 1, time.time() - 100, int(end), 0.1, list(channels))


def _read(path: Path) -> wire.Tally | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        payload = wire.read_tally_slots(lambda off, n: os.pread(fd, n, off))
    finally:
        os.close(fd)
    return None if payload is None else msgspec.msgpack.decode(payload, type=wire.Tally)


def test_a_torn_slot_leaves_the_previous_write(tmp_path: Path) -> None:
    """A process killed in the middle of a write: the other slot's totals are read."""
    directory = tmp_path / "s.sock.tallies"
    directory.mkdir()
    w = TallyWriter(f"ipc://{tmp_path}/s.sock", time.time(), 0.1)
    entry = wire.TallyChannel(7, "r", "w", 10, 0, 0, True, {})
    assert w.write([entry], wire.TallyEnd.RUNNING, 0.0)
    seq = w._seq
    assert w.write([entry], wire.TallyEnd.RUNNING, 0.0) and w._seq == seq  # unchanged: not rewritten
    assert w.write([wire.TallyChannel(7, "r", "w", 20, 0, 0, True, {})], wire.TallyEnd.RUNNING, 0.0)
    (path,) = directory.glob("*" + wire.TALLY_SUFFIX)  # beside it: the exit-status file
    assert wire.parse_tally_file_name(path.name) is not None
    tally = _read(path)
    assert tally is not None and tally.channels[0].records_total == 20
    with open(path, "r+b") as f:  # tear the newer slot (the second write went to slot 1)
        f.seek(wire.TALLY_SLOT_OFFSETS[1] + 24)
        f.write(b"\xff\xff")
    tally = _read(path)
    assert tally is not None and tally.channels[0].records_total == 10


def test_no_directory_no_tally(tmp_path: Path) -> None:
    """The shim never creates the directory (the daemon does): no directory, no file, no error."""
    w = TallyWriter(f"ipc://{tmp_path}/s.sock", time.time(), 0.1)
    assert not w.write([], wire.TallyEnd.RUNNING, 0.0)
    assert list(tmp_path.iterdir()) == []
    assert TallyWriter("tcp://127.0.0.1:5", time.time(), 0.1).directory is None


def test_a_tally_in_the_deprecated_folder_is_still_read(tmp_path: Path) -> None:
    """The tally folder was ``<socket>.ledger`` until the previous release (files ``*.ledger``):
    for one release the daemon also makes that folder and reads the tallies its shims write there;
    a shim of this release writes only ``<socket>.tallies/*.tally``."""
    endpoint = f"ipc://{tmp_path}/s.sock"
    tallies = TallyDirectory([endpoint])
    tallies.prepare()
    assert tallies.directories == [f"{tmp_path}/s.sock.tallies", f"{tmp_path}/s.sock.ledger"]
    new = TallyWriter(endpoint, time.time(), 0.1)
    assert new.write([wire.TallyChannel(7, "r", "w", 10, 0, 0, True, {})], wire.TallyEnd.CLOSED, 0.0)
    assert new.path is not None and new.path.startswith(f"{tmp_path}/s.sock.tallies/")
    assert new.path.endswith(".tally")
    old_tally = wire.Tally(wire.TALLY_VERSION, os.getpid(), 1, time.time() - 100, int(wire.TallyEnd.CLOSED), 0.1,
                           [wire.TallyChannel(8, "r", "old", 20, 0, 0, True, {})])
    old = tmp_path / "s.sock.ledger" / f"{os.getpid()}-1-abc{wire.DEPRECATED_TALLY_SUFFIX}"
    old.write_bytes(wire.encode_tally_slot(0, msgspec.msgpack.encode(old_tally)))
    ready = {r.path: r.tally for r in tallies.scan(0.0, grace_s=0.0).ready}
    assert ready[str(old)].channels[0].records_total == 20
    assert ready[new.path].channels[0].records_total == 10
    tallies.remove(str(old))
    tallies.remove(new.path)
    tallies.close()
    assert list(tmp_path.iterdir()) == []  # both folders go when empty


def _seen(reg: SenderRegistry, sender: int, records_total: int, uid: int) -> None:
    state = reg.on_batch(BatchMessage(sender, 0, "r", "w", None, records_total, {}, []), 1.0, time.time(), 4242)
    assert state is not None
    state.peer_uid = uid


def test_reconciling_a_seen_sender() -> None:
    """What the tally holds beyond what arrived: ``lost_at_exit`` for a final tally, the shim's
    own drops as ``sender_*``; a frame arriving afterwards is never counted again."""
    reg = SenderRegistry()
    _seen(reg, 7, 100, uid=os.getuid())
    entry = wire.TallyChannel(7, "r", "w", 130, 5, 0, True, {"transport_error": 9})
    assert len(reg.reconcile_tally(_tally(wire.TallyEnd.CLOSED, entry), os.getuid(), True, 2.0, time.time())) == 1
    totals = reg.totals["r", "w"]
    assert totals.dropped == {"before_join": 100, "lost_at_exit": 35, "sender_transport_error": 9}
    assert reg.on_batch(BatchMessage(7, 1, "r", "w", None, 130, {}, []), 3.0, time.time(), 4242) is None
    assert reg.messages_dropped == {"after_exit": 1}
    assert len(reg.reconcile_tally(_tally(wire.TallyEnd.CLOSED, entry), os.getuid(), True, 2.0, time.time())) == 0


def test_a_gone_senders_tally_waits_until_its_senders_are_silent() -> None:
    """``reconcile_gone``: not while one of its senders spoke within the grace (its last frames may
    still be on the way), then reconciled once, the channels reconciled returned."""
    reg = SenderRegistry()
    _seen(reg, 7, 100, uid=os.getuid())  # last heard at 1.0
    entry = wire.TallyChannel(7, "r", "w", 130, 5, 0, True, {})
    tally = _tally(wire.TallyEnd.CLOSED, entry)
    assert reg.reconcile_gone(tally, os.getuid(), True, 2.0, time.time(), grace_s=5.0) is None
    assert reg.totals["r", "w"].dropped == {"before_join": 100} and not reg.ended
    assert reg.reconcile_gone(tally, os.getuid(), True, 6.5, time.time(), grace_s=5.0) == [entry]
    assert reg.totals["r", "w"].dropped == {"before_join": 100, "lost_at_exit": 35}
    assert reg.reconcile_gone(tally, os.getuid(), True, 7.0, time.time(), grace_s=5.0) == []  # reconciled once


def test_another_users_tally_is_refused() -> None:
    """A tally file owned by another user than the sender's process, or naming another pid,
    reconciles nothing (``tally_refused``)."""
    reg = SenderRegistry()
    _seen(reg, 7, 100, uid=1000)
    entry = wire.TallyChannel(7, "r", "w", 10**9, 0, 0, True, {})
    assert len(reg.reconcile_tally(_tally(wire.TallyEnd.CLOSED, entry), 1001, True, 2.0, time.time())) == 0
    _seen(reg, 8, 100, uid=1000)
    other = wire.TallyChannel(8, "r", "w", 10**9, 0, 0, True, {})
    assert len(reg.reconcile_tally(_tally(wire.TallyEnd.CLOSED, other, pid=99), 1000, True, 2.0, time.time())) == 0
    assert reg.messages_dropped == {"tally_refused": 2}
    assert "lost_at_exit" not in reg.totals["r", "w"].dropped


def test_unseen_sender_and_impossible_claims() -> None:
    """A sender this daemon never heard: what it sent before its last subscriber joined is
    ``before_join``, the rest ``lost_at_exit`` (unclean: ``ended_unclean``); a claim beyond
    10 M calls/s over the process's age is refused."""
    reg = SenderRegistry()
    entry = wire.TallyChannel(9, "r", "x", 50, 3, 20, True, {"no_receiver": 100})
    assert len(reg.reconcile_tally(_tally(wire.TallyEnd.RUNNING, entry), 1000, False, 2.0, time.time())) == 1
    assert reg.totals["r", "x"].dropped == {"before_join": 20, "ended_unclean": 33, "sender_no_receiver": 100}
    forged = wire.TallyChannel(10, "r", "y", 2**62, 0, 0, True, {})
    assert len(reg.reconcile_tally(_tally(wire.TallyEnd.CLOSED, forged), 1000, True, 2.0, time.time())) == 0
    assert reg.messages_dropped == {"tally_refused": 1} and ("r", "y") not in reg.totals
