"""A fake CUDA backend for the zero-sync scalar path (``trainer_shim.cuda_scalar.CudaBackend``):
fake tensors, slots, streams and events that write every operation to one shared log, so tests
check the order of operations the GPU would see. Nothing here may call a synchronizing method."""

from __future__ import annotations

from typing import Any


class Log(list[tuple[Any, ...]]):
    def names(self) -> list[str]:
        return [entry[0] for entry in self]


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.device = "cuda:0"

    def __repr__(self) -> str:
        return self.name


class FakeEvent:
    def __init__(self, log: Log, ident: int) -> None:
        self.log, self.ident, self.done, self.recorded_on = log, ident, False, None

    def record(self, stream: FakeStream) -> None:
        self.log.append(("event.record", self.ident, stream))
        self.recorded_on = stream

    def query(self) -> bool:
        self.log.append(("event.query", self.ident, self.done))
        return self.done

    def synchronize(self) -> None:
        raise AssertionError("event.synchronize() would block the trainer")


class FakeSlot:
    """A 0-dim pinned host tensor."""

    def __init__(self, log: Log, ident: int, dtype: str) -> None:
        self.log, self.ident, self.dtype = log, ident, dtype
        self.value: float | None = None
        self.pinned = True

    def copy_(self, src: FakeCudaTensor, non_blocking: bool = False) -> None:
        self.log.append(("slot.copy_", self.ident, src.value, non_blocking))
        if not non_blocking:
            raise AssertionError("a blocking device-to-host copy synchronizes")
        self.value = src.value  # lands "later": only readable once the event completed

    def item(self) -> float:
        self.log.append(("slot.item", self.ident))
        assert self.value is not None
        return self.value


class FakeCudaTensor:
    is_cuda = True
    device = "cuda:0"

    def __init__(self, log: Log, value: float, numel: int = 1, dtype: str = "float32") -> None:
        self.log, self.value, self._numel, self.dtype = log, value, numel, dtype

    def numel(self) -> int:
        return self._numel

    def detach(self) -> FakeCudaTensor:
        return self

    def reshape(self, shape: tuple[int, ...]) -> FakeCudaTensor:
        return self

    def record_stream(self, stream: FakeStream) -> None:
        self.log.append(("src.record_stream", stream))

    def item(self) -> float:
        raise AssertionError(".item() on a CUDA tensor synchronizes")

    def cpu(self) -> None:
        raise AssertionError(".cpu() on a CUDA tensor synchronizes")

    def __float__(self) -> float:
        raise AssertionError("float() on a CUDA tensor synchronizes")


class FakeBackend:
    def __init__(self, slots: int = 4, capturing: bool = False) -> None:
        self.log = Log()
        self.stream = FakeStream("current")
        self.is_capturing = capturing
        self.free_slots = [FakeSlot(self.log, i, "float32") for i in range(slots)]
        self.free_events: list[FakeEvent] = []
        self.events_made = 0
        self.events: list[FakeEvent] = []  # every event ever made

    def current_stream(self, tensor: Any) -> FakeStream:
        self.log.append(("current_stream",))
        return self.stream

    def capturing(self, tensor: Any) -> bool:
        return self.is_capturing

    def pinned_slot(self, dtype: Any) -> FakeSlot | None:
        slot = self.free_slots.pop() if self.free_slots else None
        self.log.append(("pinned_slot", slot.ident if slot else None))
        return slot

    def release_slot(self, slot: FakeSlot) -> None:
        self.log.append(("release_slot", slot.ident))
        self.free_slots.append(slot)

    def new_event(self, stream: Any) -> FakeEvent:
        if self.free_events:
            event = self.free_events.pop()
        else:
            event = FakeEvent(self.log, self.events_made)
            self.events_made += 1
            self.events.append(event)
        self.log.append(("new_event", event.ident))
        return event

    def release_event(self, event: FakeEvent) -> None:
        self.log.append(("release_event", event.ident))
        event.done = False
        self.free_events.append(event)
