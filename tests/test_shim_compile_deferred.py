"""Shim calls in compiled code are deferred to the end of the graph
(``trainer_shim.compile_deferred``): the graph holds no shim node (only a timer's two operators),
each call records once with the values it was given, also around a graph break, and where
deferring fails the calls run as shim operators instead, said once, nothing lost. Records are
read back from a real receiver."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

from tests.shim_helpers import books_of, wait_until
from trainer_shim import compile_deferred, telemetry
from trainer_shim.wire import RecordKind

pytest_plugins = ["tests.shim_fixtures"]

STEPS = 5


@pytest.fixture
def shim(ep: str, receivers: Callable[..., Any]) -> Iterator[Any]:
    """The default publisher on a real receiver (worker ``d0``), subscribed before the test."""
    rx = receivers(ep)
    telemetry.configure(endpoint=ep, role="trainer", worker="d0", flush_interval_s=0.005)
    telemetry.count("warmup")
    wait_until(lambda: any(b.received for b in books_of(rx.messages()).values()))
    yield rx
    telemetry.close()


def run(fn: Callable[..., Any], *args: Any, backend: str = "eager",
        fullgraph: bool = True) -> CompileCounterWithBackend:
    """Compile ``fn`` afresh and call it ``STEPS`` times."""
    torch._dynamo.reset()
    counters.clear()
    cc = CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, backend=cc, fullgraph=fullgraph)
    for _ in range(STEPS):
        compiled(*args)
    return cc


def shim_nodes(cc: CompileCounterWithBackend) -> list[str]:
    """The shim operators' nodes in the compiled graphs."""
    return [str(n.target) for g in cc.graphs for n in g.graph.nodes
            if n.op == "call_function" and "dflash_sidecar" in str(n.target)]


def records(rx: Any, n: int) -> list[tuple[Any, ...]]:
    """The default channel's records after the warm-up, once ``n`` of them arrived."""
    assert telemetry.flush(wait_s=20)

    def got() -> list[tuple[Any, ...]]:
        books = {(b.role, b.worker): b for b in books_of(rx.messages()).values()}
        book = books.get(("trainer", "d0"))
        return [r for r in book.records if r[1] != "warmup"] if book else []

    wait_until(lambda: len(got()) >= n)
    return got()


def every_kind(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    telemetry.count("n")
    telemetry.count("rows", x.shape[0])
    telemetry.timing("t_ms", 0.5)
    telemetry.gauge("g", 2.5)
    telemetry.category("c", "short")
    telemetry.publish(3, {"p_ms": 1.0})
    telemetry.scalar("s", y.sum())
    with telemetry.timer("block_ms"):
        y = y.cos()
    return y


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_calls_leave_only_the_timers_operators_in_the_graph(backend: str, shim: Any) -> None:
    """Every call kind but ``timer`` is a deferred call, not a graph node (a shim operator was
    one dispatcher call into Python each, some microseconds); the timer keeps its two operators
    (it reads the clock when the graph runs). One record per call, in call order."""
    cc = run(every_kind, torch.ones(4), backend=backend)
    assert cc.frame_count == 1 and sum(counters["graph_break"].values()) == 0
    assert shim_nodes(cc) == ["dflash_sidecar.timer_start.default",
                              "dflash_sidecar.timer_end.default"]
    got = records(shim, 8 * STEPS)
    assert len(got) == 8 * STEPS
    plain = [(r[1], r[2]) for r in got if r[0] not in (RecordKind.PROFILE, RecordKind.TIMING)]
    assert plain == [("n", 1), ("rows", 4), ("g", 2.5), ("c", "short"),
                     ("s", pytest.approx(4 * torch.ones(()).sin().item()))] * STEPS
    assert [r[1] for r in got if r[0] == RecordKind.TIMING].count("block_ms") == STEPS
    assert [(r[1], r[2]) for r in got if r[0] == RecordKind.PROFILE] == [(3, {"p_ms": 1.0})] * STEPS


def test_values_are_taken_at_the_call(shim: Any) -> None:
    """A deferred call runs after the graph: a tensor changed in place after the call, or a
    profile dict changed after ``publish``, must still record the value at the call (as in eager
    code). Without the snapshot the scalar recorded 103.0 and the profile ``{"a": 2.0}``."""

    def changes_after(x: torch.Tensor) -> torch.Tensor:
        t = x.sum()
        telemetry.scalar("t", t)
        t.add_(100)
        profile = {"a": 1.0}
        telemetry.publish(1, profile)
        profile["a"] = 2.0
        return t

    run(changes_after, torch.ones(3))
    got = records(shim, 2 * STEPS)
    assert [r[2] for r in got if r[1] == "t"] == [3.0] * STEPS
    assert [r[2] for r in got if r[0] == RecordKind.PROFILE] == [{"a": 1.0}] * STEPS


def helper_with_break(x: torch.Tensor) -> torch.Tensor:
    telemetry.count("inner_before")
    torch._dynamo.graph_break()
    telemetry.count("inner_after")
    return x.cos()


def test_calls_around_graph_breaks_record_once_each(shim: Any) -> None:
    """Graph breaks in the compiled frame and in a function it calls: the calls before a break
    are made after the graph before it, the others after the graphs that follow; each exactly
    once per step."""

    def breaks(x: torch.Tensor) -> torch.Tensor:
        telemetry.count("before")
        y = x.sin()
        torch._dynamo.graph_break()
        telemetry.count("between")
        y = helper_with_break(y)
        telemetry.count("after")
        return y

    cc = run(breaks, torch.ones(3), fullgraph=False)
    assert sum(counters["graph_break"].values()) >= 2 and shim_nodes(cc) == []
    got = records(shim, 5 * STEPS)
    assert [r[1] for r in got] == ["before", "between", "inner_before", "inner_after",
                                   "after"] * STEPS


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_when_deferring_fails_the_calls_run_as_operators(backend: str, shim: Any, monkeypatch: Any,
                                                         caplog: Any) -> None:
    """If dynamo's internals have changed (here: the deferred call cannot be built), a warning
    says so once and the calls are traced as shim operators: no graph break, nothing lost
    (with inductor, each a direct call of the operator's Python body, the symbolic int too)."""

    def unbuildable(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError("no such internal")

    monkeypatch.setattr(compile_deferred, "DebuggingVariable", unbuildable)
    monkeypatch.setattr(compile_deferred, "broken", False)
    with caplog.at_level(logging.WARNING, logger="trainer_shim"):
        cc = run(every_kind, torch.ones(4), backend=backend)
    warnings = [r for r in caplog.records if "cannot defer shim calls" in r.getMessage()]
    assert len(warnings) == 1
    assert cc.frame_count == 1 and sum(counters["graph_break"].values()) == 0
    assert len(shim_nodes(cc)) == 9  # 7 operators and the timer's 2
    got = records(shim, 8 * STEPS)
    assert len(got) == 8 * STEPS
    assert [r[2] for r in got if r[1] == "rows"] == [4] * STEPS
    torch._dynamo.reset()  # the frames compiled with operators stay behind otherwise


CKPT = torch.nn.Linear(4, 4)


def checkpointed(x: torch.Tensor) -> torch.Tensor:
    telemetry.count("in_checkpoint")
    return CKPT(x).tanh()


def test_a_call_inside_activation_checkpointing_is_an_operator_and_the_rest_stay_deferred(
        shim: Any) -> None:
    """Values inside a higher-order operator's subgraph (here ``checkpoint``) cannot be outputs
    of the outer graph: that one call is traced as a shim operator, the call outside stays
    deferred, and deferring stays on for every later call (it used to be switched off for the
    whole process by the first such call). Trained with backward: one record per call."""

    def step(x: torch.Tensor) -> torch.Tensor:
        y = torch.utils.checkpoint.checkpoint(checkpointed, x, use_reentrant=False)
        telemetry.count("outside")
        return y.sum()

    torch._dynamo.reset()
    counters.clear()
    cc = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, backend=cc)
    for _ in range(STEPS):
        compiled(torch.randn(2, 4, requires_grad=True)).backward()
    assert cc.frame_count == 1 and sum(counters["graph_break"].values()) == 0
    assert not compile_deferred.broken
    assert shim_nodes(cc) == []  # the outer graph: the checkpointed body is a subgraph
    body = [str(n.target) for g in cc.graphs for m in g.modules() if m is not g
            for n in getattr(m, "graph", torch.fx.Graph()).nodes if "dflash_sidecar" in str(n.target)]
    assert body == ["dflash_sidecar.record_int.default"]
    got = records(shim, 2 * STEPS)
    assert [r[1] for r in got] == ["in_checkpoint", "outside"] * STEPS
