"""The run ledger places a sender's last message where its receipt put it on the unix clock, the
same in every window. Derived at each window from the window's end less the message's age, the
placement moved with every correction of the unix clock against the monotonic one (a VM's time
daemon slews it by tens of milliseconds a second): a restart gap came out 32 ms longer than the
ledger's own record of the sender's last message, in a fresh-clone run on a quiet machine."""

from __future__ import annotations

import dataclasses

import msgspec

from sidecar.aggregation.ledger.facts import window_facts
from sidecar.aggregation.senders import SenderRegistry
from sidecar.model.messages import BatchMessage, HelloMessage
from sidecar.model.window import IngestReport, WindowReport
from sidecar.sources.decode import decode
from tests.insight_synth import sender
from trainer_shim import wire

START = 1_800_000_000.0


def _report(end_unix_s: float, age_s: float, received_unix_s: float) -> IngestReport:
    silent = dataclasses.replace(sender("drafter", "0", last_seen_age_s=age_s), last_seen_unix_s=received_unix_s)
    return IngestReport(WindowReport(end_unix_s, 0.5, ()), (silent,), {}, {}, {}, 0, 0, 0, 0, 0)


def test_a_silent_sender_is_placed_alike_in_every_window_whatever_the_unix_clock_does() -> None:
    received = START + 0.3  # its last message, read on the unix clock when it came
    # two windows 0.5 s apart on the monotonic clock; between them the unix clock was corrected
    # forward by 32 ms, so the second window's end is 0.532 s after the first's
    first = window_facts(_report(START + 0.5, 0.2, received))
    second = window_facts(_report(START + 1.032, 0.7, received))
    assert first.senders[0].end == second.senders[0].end == received


def test_the_receipt_time_reaches_the_window_view_from_hello_and_batch() -> None:
    registry = SenderRegistry()
    hello = {"pid": 1, "role": "drafter", "worker": "0"}
    state = registry.on_hello(HelloMessage(7, 0, hello), 10.0, START + 10.0)
    assert state is not None and state.view(12.0).last_seen_unix_s == START + 10.0
    frame = wire.encode_batch(msgspec.msgpack.Encoder(), 7, 1, "drafter", "0", None, 0, {}, [])
    batch = decode(frame)
    assert isinstance(batch, BatchMessage)
    assert registry.on_batch(batch, 11.0, START + 11.0) is state
    assert state.view(12.0).last_seen_unix_s == START + 11.0


def test_a_sender_whose_first_message_was_refused_has_a_receipt_time_too() -> None:
    # a state exists from its first message on, refused or not: its receipt time is never missing
    registry = SenderRegistry()
    claim = wire.encode_batch(msgspec.msgpack.Encoder(), 7, 0, "drafter", "0", None, 10**12, {}, [])
    batch = decode(claim)
    assert isinstance(batch, BatchMessage) and registry.on_batch(batch, 10.0, START + 10.0) is None
    assert registry.messages_dropped == {"impossible_count": 1}
    [state] = registry
    assert state.view(12.0).last_seen_unix_s == START + 10.0
