"""A fake CUDA backend for the zero-sync scalar path (``trainer_shim.cuda_scalar.CudaBackend``):
fake tensors, slots, streams and events that write every operation, with the thread that made
it, to one shared log, so tests check the order of operations the GPU would see and which thread
issued each. Nothing here may call a synchronizing method, and a fake CUDA tensor refuses every
attribute that is not plain metadata (``numel``, ``dim``, ``detach``, ``reshape``, ``dtype``,
``device``): arithmetic, conversions, ``clone`` or ``to`` would launch a kernel on the caller's
thread."""

from __future__ import annotations

import threading
from typing import Any


class Log(list[tuple[Any, ...]]):
    """Operations in order; ``threads[i]`` names the thread that made operation ``i``."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def append(self, entry: tuple[Any, ...]) -> None:
        super().append(entry)
        self.threads.append(threading.current_thread().name)

    def clear(self) -> None:
        super().clear()
        self.threads.clear()

    def names(self) -> list[str]:
        return [entry[0] for entry in self]

    def on(self, thread: str) -> list[str]:
        """The operation names made on ``thread``."""
        return [entry[0] for entry, name in zip(self, self.threads) if name == thread]


class FakeStream:
    def __init__(self, name: str, log: Log | None = None) -> None:
        self.name, self.log = name, log
        self.device = "cuda:0"

    def wait_event(self, event: FakeEvent) -> None:
        if self.log is not None:
            self.log.append(("stream.wait_event", self.name, event.ident))

    def __repr__(self) -> str:
        return self.name


class FakeEvent:
    def __init__(self, log: Log, ident: int) -> None:
        self.log, self.ident, self.done = log, ident, False
        self.recorded_on: FakeStream | None = None

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
    """A CUDA tensor with metadata only: any other attribute would run a kernel or synchronize."""

    is_cuda = True
    device = "cuda:0"

    def __init__(self, log: Log, value: float, numel: int = 1, dtype: str = "float32") -> None:
        self.log, self.value, self._numel, self.dtype = log, value, numel, dtype

    def numel(self) -> int:
        return self._numel

    def detach(self) -> FakeCudaTensor:
        return self

    def dim(self) -> int:
        return 0

    def reshape(self, shape: tuple[int, ...]) -> FakeCudaTensor:
        return self

    def record_stream(self, stream: FakeStream) -> None:
        self.log.append(("src.record_stream", stream))

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"tensor.{name}: a kernel launch or a synchronization on a CUDA tensor")

    def item(self) -> float:
        raise AssertionError(".item() on a CUDA tensor synchronizes")

    def cpu(self) -> None:
        raise AssertionError(".cpu() on a CUDA tensor synchronizes")

    def __float__(self) -> float:
        raise AssertionError("float() on a CUDA tensor synchronizes")

    def _kernel(self, *args: Any) -> Any:
        raise AssertionError("arithmetic on a CUDA tensor launches a kernel")

    __add__ = __mul__ = __sub__ = __truediv__ = __neg__ = __radd__ = __rmul__ = _kernel


class FakeBackend:
    def __init__(self, slots: int = 4, capturing: bool = False) -> None:
        self.log = Log()
        self.stream = FakeStream("current", self.log)
        self.side = FakeStream("side", self.log)
        self.is_capturing = capturing
        self.free_slots = [FakeSlot(self.log, i, "float32") for i in range(slots)]
        self.free_events: list[FakeEvent] = []
        self.events_made = 0
        self.events: list[FakeEvent] = []  # every event ever made
        self.setups: list[Any] = []

    def setup(self, device: Any) -> None:
        self.log.append(("setup", device))
        self.setups.append(device)

    def current_stream(self, tensor: Any) -> FakeStream:
        self.log.append(("current_stream",))
        return self.stream

    def capturing(self, tensor: Any) -> bool:
        self.log.append(("capturing",))
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
        event.recorded_on = None
        self.free_events.append(event)

    def copy_after(self, slot: FakeSlot, src: FakeCudaTensor, stream: FakeStream) -> FakeStream:
        event = self.new_event(stream)
        event.record(stream)
        self.side.wait_event(event)
        slot.copy_(src, non_blocking=True)
        return self.side

    def top_up(self) -> None:
        """Nothing to make ahead: the fake's slots exist from the start."""

    def complete(self) -> int:
        """Let every event recorded so far complete (the GPU caught up); returns how many."""
        n = 0
        for event in self.events:
            if event.recorded_on is not None and not event.done:
                event.done, n = True, n + 1
        return n
