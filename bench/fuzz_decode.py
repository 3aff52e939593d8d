"""Coverage-guided fuzzing (atheris/libFuzzer) of everything a frame goes through in the daemon:
``decode`` -> sender accounting -> aggregation -> window roll.

    PYTHONPATH=. python bench/fuzz_decode.py -atheris_runs=2000000        # or -max_total_time=600
    PYTHONPATH=. python bench/fuzz_decode.py CORPUS_DIR -max_total_time=600  # keep the corpus

Each input is either raw bytes taken as one frame, or (most of the time) a structure built from
the input with ``FuzzedDataProvider``: one to four frames (hellos and batches with fuzzed
headers, sender ids from a small pool so that sequences and counters interact, records of every
kind with hostile names and values), then encoded with msgpack and optionally truncated or
bit-flipped. For every input:

- ``decode`` returns a message or raises ``DecodeError`` with a known reason, nothing else;
- ``IngestLoop.handle_frame`` never counts an internal error (it would mean an exception escaped
  the validation and was only caught by the loop's last-resort handler);
- for every sender, ``records_total == before_join + lost_in_transit + received`` and
  ``received == accepted + sum(rejected)``; a window roll afterwards succeeds.

A violation raises, which libFuzzer reports as a crash with the input saved to ``crash-*``.
The instrumented modules are the daemon's own (the msgpack codec is C and not instrumented).
libFuzzer prints ``Done N runs`` at the end: the number recorded in ``bench/RESULTS_SOAK.md``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

with atheris.instrument_imports(include=["sidecar", "trainer_shim"]):
    import msgspec

    from sidecar.core.ingest import IngestLoop
    from sidecar.core.pipeline import Pipeline
    from sidecar.model.handoff import Received
    from sidecar.sources.decode import DecodeError, decode
    from sidecar.sources.receiver import ReceiverStats
    from trainer_shim import wire

REASONS = {"oversized", "malformed", "unknown_version"}
_enc = msgspec.msgpack.Encoder()
SENDERS = [0, 1, 7, 2**63 - 1]
NAMES = ["t_ms", "tokens", "q", "", "x" * 129, "a b/c", "ctrl\x01", "é" * 64, "dflash_trainer_step", "_ms",
         "step_total", "t", "T_MS", 0, 5, None, b"bytes", 1.5, -1]
LABELS = ["drafter", "target", "0", "", "w" * 65, "tab\t", 3, -1, None, 2**64 - 1, "é"]


class _NoSocket:
    endpoints: list[str] = []
    stats = ReceiverStats()

    def poll(self, timeout_ms: int) -> list[tuple[bytes, int | None]]:
        return []

    def received(self) -> Received:
        return Received()

    def close(self) -> None:
        pass


def _scalar(fdp: atheris.FuzzedDataProvider) -> object:
    pick = fdp.ConsumeIntInRange(0, 11)
    return [lambda: fdp.ConsumeInt(9), lambda: fdp.ConsumeFloat(), lambda: math.nan, lambda: -math.inf,
            lambda: fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 80)), lambda: None, lambda: True,
            lambda: fdp.ConsumeBytes(4), lambda: fdp.ConsumeIntInRange(0, 5),
            lambda: fdp.ConsumeIntInRange(0, 2**64 - 1), lambda: -fdp.ConsumeIntInRange(0, 2**63),
            lambda: fdp.PickValueInList(NAMES)][pick]()


def _value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> object:
    pick = fdp.ConsumeIntInRange(0, 5 if depth < 3 else 2)
    if pick <= 2:
        return _scalar(fdp)
    if pick == 3:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    if pick == 4:
        return {fdp.PickValueInList(NAMES) if fdp.ConsumeBool() else _scalar(fdp): _value(fdp, depth + 1)
                for _ in range(fdp.ConsumeIntInRange(0, 4))}
    return [fdp.ConsumeIntInRange(0, 2**40) for _ in range(3)]


def _record(fdp: atheris.FuzzedDataProvider) -> object:
    if fdp.ConsumeIntInRange(0, 9) == 0:
        return _value(fdp)
    kind = fdp.ConsumeIntInRange(0, 9)
    name = fdp.PickValueInList(NAMES) if fdp.ConsumeBool() else _scalar(fdp)
    return [kind, name, _value(fdp)]


def _message(fdp: atheris.FuzzedDataProvider, state: dict[int, list[int]]) -> object:
    sender = fdp.PickValueInList(SENDERS) if fdp.ConsumeIntInRange(0, 7) else _scalar(fdp)
    seq_total = state.setdefault(sender if isinstance(sender, int) else -1, [0, 0])
    version = 1 if fdp.ConsumeIntInRange(0, 7) else _scalar(fdp)
    if fdp.ConsumeIntInRange(0, 5) == 0:
        info = {fdp.PickValueInList(["pid", "role", "worker", "host", "devices", "wandb_run_id", "x"]): _value(fdp)
                for _ in range(fdp.ConsumeIntInRange(0, 6))}
        return [version, 1, sender, seq_total[0], info]
    records = [_record(fdp) for _ in range(fdp.ConsumeIntInRange(0, 12))]
    seq_total[0] += 1 if fdp.ConsumeIntInRange(0, 3) else fdp.ConsumeIntInRange(-2, 5)
    seq_total[1] += len(records) + (fdp.ConsumeIntInRange(-20, 20) if fdp.ConsumeIntInRange(0, 4) == 0 else 0)
    dropped = {fdp.PickValueInList(["buffer_full", "no_receiver", "", 5, "x" * 70]): fdp.ConsumeIntInRange(0, 50)
               for _ in range(fdp.ConsumeIntInRange(0, 3))}
    header = [version, 2, sender, seq_total[0], fdp.PickValueInList(LABELS), fdp.PickValueInList(LABELS),
              fdp.PickValueInList([None, 0, 10, -1, "s"]), seq_total[1], dropped, records]
    if fdp.ConsumeIntInRange(0, 15) == 0:
        header[fdp.ConsumeIntInRange(0, 9)] = _value(fdp)
    return header


def frames_from(data: bytes) -> list[bytes]:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeIntInRange(0, 4) == 0:
        return [fdp.ConsumeBytes(fdp.remaining_bytes())]
    out = []
    state: dict[int, list[int]] = {}
    for _ in range(fdp.ConsumeIntInRange(1, 4)):
        try:
            frame = _enc.encode(_message(fdp, state))
        except (TypeError, OverflowError, ValueError):
            continue  # not representable in msgpack: the shim could not send it either
        mutation = fdp.ConsumeIntInRange(0, 7)
        if mutation == 0 and frame:
            frame = frame[: fdp.ConsumeIntInRange(0, len(frame) - 1)]
        elif mutation == 1 and frame:
            i = fdp.ConsumeIntInRange(0, len(frame) - 1)
            frame = frame[:i] + bytes([frame[i] ^ (1 << fdp.ConsumeIntInRange(0, 7))]) + frame[i + 1:]
        out.append(frame)
    return out


def test_one_input(data: bytes) -> None:
    frames = frames_from(data)
    for frame in frames:
        try:
            decode(frame)
        except DecodeError as exc:
            if exc.reason not in REASONS:
                raise AssertionError(f"unknown decode reason {exc.reason!r}") from None
    loop = IngestLoop(_NoSocket(), 10.0, Pipeline())
    for frame in frames:
        loop.handle_frame(frame)
    if loop.pipeline.internal_errors:
        raise AssertionError(f"ingest caught {loop.pipeline.internal_errors} internal error(s) on {frames!r:.2000}")
    for s in loop.pipeline.registry:
        if s.received != s.accepted + sum(s.rejected.values()):
            raise AssertionError(f"received != accepted + rejected for sender {s.sender}: {s}")
        if s.before_join + s.lost_in_transit + s.received != s.records_total:
            raise AssertionError(f"records_total not accounted for sender {s.sender}: {s}")
    loop._roll(1.0, 1.0)


def seed_corpus(directory: Path) -> None:
    """A few well-formed frames as a starting point for the raw-bytes inputs."""
    directory.mkdir(parents=True, exist_ok=True)
    hello = wire.encode_hello(_enc, 7, 0, wire.Hello(pid=1, host="h", role="drafter", worker="0", shim_version="0.1"))
    batch = wire.encode_batch(_enc, 7, 1, "drafter", "0", 3, 5, {"buffer_full": 1},
                              [[1, "t_ms", 1.5], [2, "tokens", 10], [3, "q", 0.5], [4, "bucket", 3],
                               [6, 3, {"step_ms": 2.0, "frac": 0.5}]])
    for i, frame in enumerate([hello, batch]):
        (directory / f"seed-{i}").write_bytes(frame)


def main() -> None:
    args = sys.argv
    corpus = [a for a in args[1:] if not a.startswith("-")]
    if corpus:
        seed_corpus(Path(corpus[0]))
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
