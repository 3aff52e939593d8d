"""Shim calls inside ``torch.compile``d functions (inductor and ``backend="eager"``): they never
raise, add no graph break and no recompile against the same function without them, and their
records reach a real receiver. Graph breaks and recompiles are read from dynamo's own counters
(``CompileCounterWithBackend.frame_count`` counts compiled graphs, ``counters["graph_break"]``,
``counters["recompiles"]``). The limits of dynamo's logging-call mechanism are pinned too, so a
torch upgrade that changes them shows up here. Models are tiny: compiling is slow on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

from tests.shim_helpers import ROOT, ledgers, wait_until
from trainer_shim import telemetry

pytest_plugins = ["tests.shim_fixtures"]

STEPS = 30
CHANNELS: dict[str, Any] = {}


@pytest.fixture
def shim(ep: str, receivers: Callable[..., Any]) -> Iterator[Any]:
    """The default publisher on a real receiver, flushing every 5 ms so the flusher drains the
    queue while the compiled steps run (what used to fail dynamo's guards)."""
    rx = receivers(ep)
    telemetry.configure(endpoint=ep, role="trainer", worker="c0", flush_interval_s=0.005)
    CHANNELS["c1"] = telemetry.channel(worker="c1")
    telemetry.count("warmup")  # wait for the subscription, so nothing is dropped as no_receiver
    wait_until(lambda: any(b.received for b in ledgers(rx.messages()).values()))
    yield rx
    telemetry.close()


def compiled_run(fn: Callable[..., Any], backend: str, *args_per_step: Callable[[int], Any],
                 steps: int = STEPS) -> dict[str, int]:
    """Compile ``fn`` afresh and run it ``steps`` times; dynamo's counters afterwards."""
    torch._dynamo.reset()
    counters.clear()
    cc = CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, backend=cc)
    for i in range(steps):
        compiled(*(make(i) for make in args_per_step))
    return {"graphs": cc.frame_count, "graph_breaks": sum(counters["graph_break"].values()),
            "recompiles": sum(counters["recompiles"].values())}


def step_plain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ w)
    return (y * y).mean()


def step_with_shim(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ w)
    loss = (y * y).mean()
    telemetry.timing("forward_ms", 1.5)
    telemetry.count("batches")
    telemetry.count("tokens", x.shape[0])
    telemetry.gauge("lr", 0.01)
    telemetry.category("bucket", "short")
    telemetry.scalar("loss", loss)
    ch = CHANNELS["c1"]  # channels are taken outside compiled code (channel() takes a lock)
    ch.timing("forward_ms", 2.5)
    ch.scalar("loss", loss.detach())
    with telemetry.timer("block_ms"):
        loss = loss + 0
    return loss


def _inputs() -> tuple[Callable[[int], torch.Tensor], Callable[[int], torch.Tensor]]:
    w = torch.randn(8, 8)
    return (lambda i: torch.randn(4, 8)), (lambda i: w)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_calls_add_no_graph_break_no_recompile_and_arrive(backend: str, shim: Any) -> None:
    plain = compiled_run(step_plain, backend, *_inputs())
    assert plain == {"graphs": 1, "graph_breaks": 0, "recompiles": 0}
    with_shim = compiled_run(step_with_shim, backend, *_inputs())
    assert with_shim == plain
    stats = telemetry.stats()
    main, side = stats[("trainer", "c0")], stats[("trainer", "c1")]
    assert telemetry.flush(wait_s=20)
    # 6 records a step on the default channel, 2 on the other; the timer records nothing there.
    wait_until(lambda: sum(b.received for b in ledgers(shim.messages()).values()) >= 8 * STEPS + 1)
    books = {(b.role, b.worker): b for b in ledgers(shim.messages()).values()}
    got = books[("trainer", "c0")]
    names = [r[1] for r in got.records if r[1] != "warmup"]
    assert len(names) == 6 * STEPS and got.consistent()
    assert {n: names.count(n) for n in set(names)} == {
        "forward_ms": STEPS, "batches": STEPS, "tokens": STEPS, "lr": STEPS, "bucket": STEPS,
        "loss": STEPS}
    assert all(isinstance(r[2], float) for r in got.records if r[1] == "loss")
    assert [r[2] for r in got.records if r[1] == "tokens"] == [4] * STEPS
    assert len(books[("trainer", "c1")].records) == 2 * STEPS
    assert main["dropped"] == {} and side["dropped"] == {}


def test_timer_does_not_make_dynamo_skip_the_function(shim: Any) -> None:
    """Dynamo used to fall back to eager for the whole function (a clock read inside a context
    manager); the timer is a null context in compiled code and records nothing there."""

    def with_timer(x: torch.Tensor) -> torch.Tensor:
        with telemetry.timer("block_ms"):
            y = x.sin()
        return y.cos()

    assert compiled_run(with_timer, "eager", lambda i: torch.randn(4)) == {
        "graphs": 1, "graph_breaks": 0, "recompiles": 0}
    assert telemetry.stats()[("trainer", "c0")]["pending"] == 0
    with telemetry.timer("eager_block_ms"):  # outside compiled code it times as before
        pass
    assert telemetry.stats()[("trainer", "c0")]["pending"] == 1


def test_limits_of_dynamo_logging_calls(shim: Any) -> None:
    """What dynamo 2.13 does not support, pinned so a torch upgrade that changes it shows up.
    None of these raises into the trainer."""

    def helper(y: torch.Tensor) -> None:
        telemetry.count("from_inlined_helper")

    def inlined(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        helper(y)  # dynamo inlines helper and drops logging calls made there
        return y

    assert compiled_run(inlined, "eager", lambda i: torch.randn(4), steps=3)["graph_breaks"] == 0
    assert telemetry.stats()[("trainer", "c0")]["pending"] == 0

    def with_python_step(x: torch.Tensor, step: int) -> torch.Tensor:
        telemetry.gauge("step", step)  # a Python number that changes every call
        return x.sin()

    got = compiled_run(with_python_step, "eager", lambda i: torch.randn(4), lambda i: i, steps=4)
    assert got["graphs"] >= 2 and got["graph_breaks"] >= 1  # guarded, then symbolic: a break

    def with_publish(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        telemetry.publish(7, {"loss": 1.0})  # a dict cannot be replayed: one graph break
        return y.cos()

    got = compiled_run(with_publish, "eager", lambda i: torch.randn(4), steps=3)
    assert got["graph_breaks"] == 1 and got["recompiles"] == 0
    assert telemetry.stats()[("trainer", "c0")]["pending"] + telemetry.stats()[
        ("trainer", "c0")]["records_total"] >= 3


def test_torch_is_never_imported_by_the_shim_and_registration_follows_dynamo() -> None:
    code = textwrap.dedent("""
        import sys
        from trainer_shim import telemetry
        telemetry.configure(endpoint="ipc:///nonexistent/x.sock")
        telemetry.count("x")
        ch = telemetry.channel(worker="w")
        assert "torch" not in sys.modules, "the shim imported torch"
        import torch._dynamo.config as config
        fns = config.reorderable_logging_functions
        assert telemetry.count in fns and telemetry.scalar in fns and ch.gauge in fns
        later = telemetry.channel(worker="later")
        assert later.timing in fns
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True,
                          text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
