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

from tests.shim_helpers import ROOT, books_of, wait_until
from trainer_shim import telemetry
from trainer_shim.wire import RecordKind

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
    wait_until(lambda: any(b.received for b in books_of(rx.messages()).values()))
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
    # 7 records a step on the default channel (the timer's too), 2 on the other.
    wait_until(lambda: sum(b.received for b in books_of(shim.messages()).values()) >= 9 * STEPS + 1)
    books = {(b.role, b.worker): b for b in books_of(shim.messages()).values()}
    got = books[("trainer", "c0")]
    names = [r[1] for r in got.records if r[1] != "warmup"]
    assert len(names) == 7 * STEPS and got.consistent()
    assert {n: names.count(n) for n in set(names)} == {
        "forward_ms": STEPS, "batches": STEPS, "tokens": STEPS, "lr": STEPS, "bucket": STEPS,
        "loss": STEPS, "block_ms": STEPS}
    assert all(isinstance(r[2], float) and r[2] >= 0 for r in got.records if r[1] == "block_ms")
    assert all(isinstance(r[2], float) for r in got.records if r[1] == "loss")
    assert [r[2] for r in got.records if r[1] == "tokens"] == [4] * STEPS
    assert len(books[("trainer", "c1")].records) == 2 * STEPS
    assert main["dropped"] == {} and side["dropped"] == {}


def queued_or_sent() -> int:
    """The default channel's records so far. After a flush: while the flusher sends a batch its
    records are neither queued nor counted as sent yet."""
    assert telemetry.flush(wait_s=20)
    st = telemetry.stats()[("trainer", "c0")]
    return int(st["pending"] + st["records_total"] + sum(st["dropped"].values()))


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_timer_does_not_make_dynamo_skip_the_function(backend: str, shim: Any) -> None:
    """Dynamo used to fall back to eager for the whole function (a clock read inside a context
    manager). In compiled code the timer is two shim operators around the block: no graph
    break, one timing per call (host time between the two operators)."""

    def with_timer(x: torch.Tensor) -> torch.Tensor:
        with telemetry.timer("block_ms"):
            y = x.sin()
        return y.cos()

    before = queued_or_sent()
    assert compiled_run(with_timer, backend, lambda i: torch.randn(4)) == {
        "graphs": 1, "graph_breaks": 0, "recompiles": 0}
    assert queued_or_sent() - before == STEPS
    with telemetry.timer("eager_block_ms"):  # outside compiled code it times as before
        pass
    assert queued_or_sent() - before == STEPS + 1


def nested_timers(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with telemetry.timer("outer_ms"):
        with telemetry.timer("inner_ms"):
            c = a @ b
        c = (c @ b).relu()
    with telemetry.timer("second_ms"):
        c = c @ b
    return c.sum()


def test_timer_in_inductor_code_calls_the_python_bodies_directly(shim: Any) -> None:
    """Inductor's wrapper code calls the timer operators' Python bodies directly, not through
    the dispatcher (about 1 us a block instead of 6, ``bench/bench_compile_calls.py``). The clock
    is read when the graph runs: every step records its own times, and an outer block, whose
    operators enclose the inner one's, never records less than it."""
    torch._dynamo.reset()
    counters.clear()
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(nested_timers, backend="inductor", fullgraph=True)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    _, codes = run_and_get_code(compiled, a, b)
    code = "\n".join(codes)
    assert code.count("dflash_sidecar_timer_start(") == 3
    assert code.count("dflash_sidecar_timer_end(") == 3
    assert "torch.ops.dflash_sidecar" not in code
    for _ in range(STEPS - 1):
        compiled(a, b)
    assert dynamo_counts() == {"graph_breaks": 0, "recompiles": 0}
    assert telemetry.flush(wait_s=20)
    wait_until(lambda: sum(b.received for b in books_of(shim.messages()).values()) >= 3 * STEPS + 1)
    book = {(b.role, b.worker): b for b in books_of(shim.messages()).values()}[("trainer", "c0")]
    times: dict[str, list[float]] = {}
    for r in book.records:
        if r[1] != "warmup":
            times.setdefault(r[1], []).append(r[2])
    assert sorted(times) == ["inner_ms", "outer_ms", "second_ms"]
    assert all(len(v) == STEPS and all(isinstance(t, float) and t > 0 for t in v)
               for v in times.values())
    assert all(o >= i for o, i in zip(times["outer_ms"], times["inner_ms"], strict=True))
    assert len(set(times["outer_ms"])) > 1  # read at run time, not a constant of the trace


@torch.compiler.nested_compile_region
def timed_region(x: torch.Tensor) -> torch.Tensor:
    with telemetry.timer("region_ms"):
        return x.sin() @ x


def test_timer_in_a_nested_compile_region_is_a_direct_call_of_the_subgraph(shim: Any) -> None:
    """A region compiled once and called twice is a subgraph with its own wrapper function in
    inductor's code: the direct calls stand in it, their import at the top of the module, and
    each call of the region records once."""
    torch._dynamo.reset()
    counters.clear()
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(lambda x: timed_region(x) + timed_region(x * 2), backend="inductor",
                             fullgraph=True)
    before = queued_or_sent()
    _, codes = run_and_get_code(compiled, torch.randn(8, 8))
    code = "\n".join(codes)
    assert code.count("import _timer_start as dflash_sidecar_timer_start") == 1
    assert "torch.ops.dflash_sidecar" not in code
    for _ in range(STEPS - 1):
        compiled(torch.randn(8, 8))
    assert dynamo_counts() == {"graph_breaks": 0, "recompiles": 0}
    assert queued_or_sent() - before == 2 * STEPS


def test_where_the_direct_call_cannot_be_written_the_dispatcher_call_is(shim: Any,
                                                                        monkeypatch: Any) -> None:
    """Inductor internals that changed (here: the generated module's import buffer) must not
    fail the compile: the operators are then dispatcher calls, and still record."""
    from torch._inductor.utils import IndentedBuffer, run_and_get_code

    def broken(self: Any, line: str) -> bool:
        raise AttributeError("no such internal")

    monkeypatch.setattr(IndentedBuffer, "contains", broken)
    torch._dynamo.reset()
    counters.clear()

    def timed(x: torch.Tensor) -> torch.Tensor:
        with telemetry.timer("fallback_ms"):
            y = x.sin() @ x
        return y

    compiled = torch.compile(timed, backend="inductor", fullgraph=True)
    before = queued_or_sent()
    with torch._inductor.config.patch(fx_graph_cache=False):
        _, codes = run_and_get_code(compiled, torch.randn(4, 4))
    assert "torch.ops.dflash_sidecar.timer_start.default(" in "\n".join(codes)
    compiled(torch.randn(4, 4))
    assert queued_or_sent() - before == 2
    torch._dynamo.reset()


def test_operators_imported_before_dynamo_still_register() -> None:
    """Importing the operators' module before dynamo (a trainer or tool importing it directly)
    must not make registering the shim with dynamo fail halfway: registering inductor's direct
    calls while that module is imported would import inductor, and with it dynamo, whose import
    hook would then register the shim with a module imported halfway."""
    code = textwrap.dedent("""
        import sys
        import torch
        assert "torch._dynamo" not in sys.modules
        from trainer_shim import telemetry
        from trainer_shim import compile_ops  # noqa: F401 - imported directly, before dynamo
        telemetry.configure(endpoint="ipc:///nonexistent/x.sock")

        def fn(x):
            with telemetry.timer("t_ms"):
                y = x.sin()
            telemetry.count("n")
            return y

        compiled = torch.compile(fn, backend="inductor", fullgraph=True)
        for _ in range(3):
            compiled(torch.randn(4))
        st = telemetry.stats()[("trainer", "MainThread")]
        print(st["pending"] + st["records_total"] + sum(st["dropped"].values()))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "trainer_shim" not in proc.stderr, proc.stderr
    assert proc.stdout.split() == ["6"]


class Block(torch.nn.Module):
    """A submodule whose ``forward`` dynamo inlines into the compiled step."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        telemetry.count("block_calls")
        CHANNELS["c1"].gauge("block_width", x.shape[-1])
        return torch.tanh(x)


BLOCK = Block()


def log_profile(step: int, lr: float, y: torch.Tensor) -> None:
    """A helper dynamo inlines: publish with a dict, an int and a float that change every step,
    a tensor."""
    telemetry.publish(step, {"helper_ms": 1.5, "tokens": 4, "lr": lr})
    telemetry.gauge("step", step)
    telemetry.category("bucket", "short")
    telemetry.scalar("helper_loss", y.sum())


def step_inlining(x: torch.Tensor, step: int, lr: float) -> torch.Tensor:
    y = BLOCK(x)
    log_profile(step, lr, y)
    return y.cos()


def step_inlining_plain(x: torch.Tensor, step: int, lr: float) -> torch.Tensor:
    return torch.tanh(x).cos()


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_calls_in_inlined_functions_arrive_without_graph_break(backend: str, shim: Any) -> None:
    """Calls made in a submodule's ``forward`` and in a helper (both inlined by dynamo, where
    its reorderable logging calls are dropped) arrive, each once per step, and break nothing.
    ``publish`` with its dict does not break the graph. The step, a Python int that changes
    every call, and a Python float that does, cost one recompile together (dynamo then makes
    them symbolic), no graph break; inductor used to recompile for every new float."""
    inputs = (lambda i: torch.randn(4, 8)), (lambda i: i), (lambda i: i / 1024)
    assert compiled_run(step_inlining_plain, backend, *inputs) == {
        "graphs": 1, "graph_breaks": 0, "recompiles": 0}
    got = compiled_run(step_inlining, backend, *inputs)
    assert got["graph_breaks"] == 0 and got["graphs"] == 2  # the one recompile for the step
    assert telemetry.flush(wait_s=20)
    wait_until(lambda: sum(b.received for b in books_of(shim.messages()).values()) >= 6 * STEPS + 1)
    books = {(b.role, b.worker): b for b in books_of(shim.messages()).values()}
    records = books[("trainer", "c0")].records
    main = [r for r in records if r[1] != "warmup" and r[0] != RecordKind.PROFILE]
    names = [r[1] for r in main]
    assert {n: names.count(n) for n in set(names)} == {
        "block_calls": STEPS, "step": STEPS, "bucket": STEPS, "helper_loss": STEPS}, names
    assert [r[2] for r in main if r[1] == "step"] == list(range(STEPS))
    assert all(isinstance(r[2], float) for r in main if r[1] == "helper_loss")
    profiles = [r for r in records if r[0] == RecordKind.PROFILE]
    assert [p[1] for p in profiles] == list(range(STEPS))
    assert [p[2] for p in profiles] == [{"helper_ms": 1.5, "tokens": 4.0, "lr": i / 1024}
                                        for i in range(STEPS)]
    assert [r[2] for r in books[("trainer", "c1")].records] == [8] * STEPS
    assert all(s["dropped"] == {} for s in telemetry.stats().values())


def test_arguments_without_an_operator_break_the_graph_and_still_record(shim: Any) -> None:
    """A value no operator takes (here a str timing, a profile with a str value) goes through
    the original function behind ``torch.compiler.disable``: one graph break per call, and the
    record is queued as in eager code (the daemon counts it invalid)."""

    def odd_arguments(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        telemetry.publish(7, {"note": "text"})
        return y.cos()

    assert telemetry.flush(wait_s=20)  # nothing between the queue and the sent count
    before = telemetry.stats()[("trainer", "c0")]
    got = compiled_run(odd_arguments, "eager", lambda i: torch.randn(4), steps=3)
    assert got["graph_breaks"] == 1 and got["recompiles"] == 0
    assert telemetry.flush(wait_s=20)
    after = telemetry.stats()[("trainer", "c0")]
    assert (after["pending"] + after["records_total"]) - (
        before["pending"] + before["records_total"]) == 3


def test_torch_is_never_imported_by_the_shim_and_registration_follows_dynamo() -> None:
    code = textwrap.dedent("""
        import sys
        from trainer_shim import telemetry
        telemetry.configure(endpoint="ipc:///nonexistent/x.sock")
        telemetry.count("x")
        ch = telemetry.channel(worker="w")
        assert "torch" not in sys.modules, "the shim imported torch"
        import torch._dynamo
        from torch._dynamo.trace_rules import _polyfilled_function_ids as fns
        assert all(id(f) in fns for f in (telemetry.count, telemetry.scalar, ch.gauge, ch.publish))
        later = telemetry.channel(worker="later")
        assert id(later.timing) in fns
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True,
                          text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_without_operators_the_fallback_says_what_it_loses() -> None:
    """Where the shim's operators cannot be defined, the functions become dynamo's reorderable
    logging calls: a warning says that calls in inlined functions record nothing, and the
    compiled function's own calls still arrive without a graph break (pinned: on torch 2.13
    dynamo drops the inlined one, so a torch that stops dropping it shows up here)."""
    code = textwrap.dedent("""
        import sys
        sys.modules["trainer_shim.compile_ops"] = None  # its import fails, as on an older torch
        from trainer_shim import telemetry
        telemetry.configure(endpoint="ipc:///nonexistent/x.sock")
        import torch
        from torch._dynamo.testing import CompileCounter
        from torch._dynamo.utils import counters

        def helper():
            telemetry.count("inlined")

        def fn(x):
            telemetry.count("root")
            helper()
            return x.sin()

        cc = CompileCounter()
        compiled = torch.compile(fn, backend=cc)
        for _ in range(3):
            compiled(torch.randn(4))
        st = telemetry.stats()[("trainer", "MainThread")]
        print(cc.frame_count, sum(counters["graph_break"].values()),
              st["pending"] + st["records_total"] + sum(st["dropped"].values()))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "calls in functions dynamo inlines record nothing" in proc.stderr
    assert proc.stdout.split() == ["1", "0", "3"]  # 3 root calls; the 3 inlined ones are lost


class ShimMLP(torch.nn.Module):
    """An MLP whose ``forward`` makes every kind of shim call: 8 records a step on the default
    channel."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        with telemetry.timer("forward_block_ms"):
            loss = (self.net(x) * y).mean()  # the prediction is not kept for backward
        telemetry.count("batches")
        telemetry.count("samples", x.shape[0])  # a SymInt: the batch size changes
        telemetry.timing("forward_ms", 1.5)
        telemetry.gauge("lr", 0.01)
        telemetry.category("bucket", "short")
        telemetry.publish(step, {"data_ms": 0.5, "tokens": 8})
        telemetry.scalar("loss", loss)
        return loss


TRAIN_STEPS = 200
BATCHES = [4 + i % 3 for i in range(TRAIN_STEPS)]


def compiled_optimizer(opt: torch.optim.Optimizer, backend: str, with_shim: bool) -> tuple[
        Callable[[], None], CompileCounterWithBackend]:
    """``opt.step`` compiled (torch's optimizer breaks the graph around its step by design, so
    not ``fullgraph``), with or without a shim call after it."""
    cc = CompileCounterWithBackend(backend)

    def opt_step() -> None:
        opt.step()
        if with_shim:
            telemetry.count("optimizer_steps")

    return torch.compile(opt_step, backend=cc), cc


def dynamo_counts() -> dict[str, int]:
    return {"graph_breaks": sum(counters["graph_break"].values()),
            "recompiles": sum(counters["recompiles"].values())}


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_training_loop_with_every_call_kind(backend: str, shim: Any) -> None:
    """A compiled MLP (``torch.compile(model, fullgraph=True, dynamic=True)``, parameters and
    inputs with grad) trained with AdamW for 200 steps, the optimizer step compiled too and
    counting: nothing raises, one graph for the model, no graph break, no recompile although
    the batch size and the step change, the optimizer's graphs and breaks are those of the same
    step without the call, and exactly one record per call. Inductor used to raise
    ``UnboundLocalError`` on every step (a ``count`` operator without a tensor argument)."""
    torch.manual_seed(0)
    model = ShimMLP()
    torch._dynamo.reset()
    counters.clear()
    plain_step, cc_plain = compiled_optimizer(torch.optim.AdamW(model.parameters()), backend, False)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for _ in range(3):
        plain_step()
    plain = {"graphs": cc_plain.frame_count, **dynamo_counts()}

    torch._dynamo.reset()
    counters.clear()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_step, cc_opt = compiled_optimizer(opt, backend, True)
    cc_model = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=cc_model, fullgraph=True, dynamic=True)
    for step, batch in enumerate(BATCHES):
        x = torch.randn(batch, 8, requires_grad=True)
        loss = compiled(x, torch.randn(batch, 1), step)
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=False)
    assert x.grad is not None and model.net[0].weight.grad is not None
    assert cc_model.frame_count == 1
    assert {"graphs": cc_opt.frame_count, **dynamo_counts()} == plain
    assert plain["recompiles"] == 0
    assert telemetry.flush(wait_s=20)
    wait_until(lambda: sum(b.received for b in books_of(shim.messages()).values())
               >= 9 * TRAIN_STEPS + 1)
    book = {(b.role, b.worker): b for b in books_of(shim.messages()).values()}[("trainer", "c0")]
    records = [r for r in book.records if r[1] != "warmup"]
    names = [r[1] for r in records if r[0] != RecordKind.PROFILE]
    assert {n: names.count(n) for n in set(names)} == {
        n: TRAIN_STEPS for n in ("batches", "samples", "forward_ms", "lr", "bucket", "loss",
                                 "optimizer_steps", "forward_block_ms")}
    assert [r[2] for r in records if r[1] == "samples"] == BATCHES
    assert [r[2] for r in records if r[1] == "batches"] == [1] * TRAIN_STEPS
    assert all(isinstance(r[2], float) for r in records if r[1] == "loss")
    assert all(isinstance(r[2], float) and r[2] > 0 for r in records if r[1] == "forward_block_ms")
    assert [(r[1], r[2]) for r in records if r[0] == RecordKind.PROFILE] == [
        (i, {"data_ms": 0.5, "tokens": 8.0}) for i in range(TRAIN_STEPS)]
    assert book.consistent() and telemetry.stats()[("trainer", "c0")]["dropped"] == {}


class ShimLM(torch.nn.Module):
    """A Hugging Face GPT-2 (tiny, random weights) whose training forward makes shim calls."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        self.lm = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                             n_head=2))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.lm(input_ids=ids).logits  # (its own loss logs a warning: a graph break)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        telemetry.count("sequences", ids.shape[0])
        telemetry.count("lm_steps")
        telemetry.gauge("tokens", ids.numel())
        telemetry.publish(0, {"lm_ms": 1.0})
        telemetry.scalar("lm_loss", loss.detach())
        return loss


def test_compiled_hf_model_training_step(shim: Any) -> None:
    """``torch.compile(model, fullgraph=True)`` (inductor) of a Hugging Face model's training
    forward with shim calls, then backward and an AdamW step: one graph, no recompile, one
    record per call. (A step int passed in would cost one recompile, calls or not: see the
    inlining test.)"""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = ShimLM()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cc = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=cc, fullgraph=True)
    steps = 3
    for _ in range(steps):
        loss = compiled(torch.randint(0, 64, (4, 8)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert cc.frame_count == 1 and dynamo_counts() == {"graph_breaks": 0, "recompiles": 0}
    assert telemetry.flush(wait_s=20)
    wait_until(lambda: sum(b.received for b in books_of(shim.messages()).values()) >= 5 * steps + 1)
    book = {(b.role, b.worker): b for b in books_of(shim.messages()).values()}[("trainer", "c0")]
    records = [r for r in book.records if r[1] != "warmup"]
    assert [(r[1], r[2]) for r in records if r[0] != RecordKind.PROFILE and r[1] != "lm_loss"] == [
        ("sequences", 4), ("lm_steps", 1), ("tokens", 32)] * steps
    assert len([r for r in records if r[1] == "lm_loss"]) == steps
    assert [r[2] for r in records if r[0] == RecordKind.PROFILE] == [{"lm_ms": 1.0}] * steps
