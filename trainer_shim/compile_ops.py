"""The custom operators that carry shim calls through ``torch.compile`` (imported only by
``trainer_shim.compile_support``, once the trainer has imported ``torch._dynamo``): a compiled
``timer``'s two calls always, the other calls where they cannot be deferred to the end of the
graph (``trainer_shim.compile_deferred``, which costs a fraction of an operator call).

Inside compiled code such a recording function is replaced (``torch.compiler.substitute_in_graph``)
by a small function that dynamo traces and that calls one of these operators. An operator call
is a node of the graph like any torch op, in the compiled function and in every function dynamo
inlines into it (a submodule's ``forward``, a helper), so no call is lost, the graph does not
break, and an int that dynamo has made symbolic (a step counter) is passed as a ``SymInt``. The
operators are registered as ordered side effects (never eliminated or reordered) and as unsafe
in a CUDA graph (inductor keeps them out of captured regions). At run time an operator calls the
original recording function with the real values, as plain Python.

How an operator call runs depends on the backend. Inductor's Python wrapper code calls the
operator's Python body directly (``register_direct_calls``): a ``timer`` block (two calls)
costs 1-2 us inside a compiled step, the graph's fixed share included (the effect token and the
carrier input), and a record operator about 2 us with its argument tensors. With
``backend="eager"``, with inductor's C++ wrapper, and with an inductor whose internal table for
that is missing, it is a dispatcher call into the body (a timer block about 8-9 us); with
``aot_eager`` each call runs through the ``with_effects`` higher-order operator (a timer block
about 70 us). Medians of ``bench/bench_compile_calls.py --backend ...`` in
``bench/RESULTS_LOOPS.md``.

The operators take only what an operator schema can: an int naming the recording function
(an index into ``_fns``), a str, an int, a tensor; a float travels as a 0-d tensor
(``_as_tensor``). Every operator takes at least one tensor: an operator without one (an int or
str record) has no device for inductor, whose scheduler then does not flush the CPU kernels it
holds back before emitting the call; the held-back kernel ran after the frees planned for it
(``UnboundLocalError: buf0`` in a training graph). ``record_int`` and ``record_str`` take the
empty CPU tensor ``CARRIER`` for that (a graph input, no kernel). A ``publish`` dict becomes
one call: its names joined by ``SEP`` and its values as one float64 tensor. Whatever does not
fit (a non-str name, a value of another type, a dict with non-number values) goes through the
original function behind ``torch.compiler.disable``: the graph breaks there, the record arrives.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from time import perf_counter_ns
from typing import Any

import torch

SEP = "\x1f"
"""Joins a profile's names in one str argument; a control character, so never part of a valid
metric name (a name containing it is sent through the eager fallback instead)."""

_fns: list[Callable[..., Any]] = []


def _float(fid: int, name: str, value: torch.Tensor) -> None:
    _fns[fid](name, value.item())  # a 0-d float64 tensor: see _as_tensor


def _int(carrier: torch.Tensor, fid: int, name: str, value: int) -> None:
    _fns[fid](name, value)  # value is a SymInt in the graph, an int here


def _str(carrier: torch.Tensor, fid: int, name: str, value: str) -> None:
    _fns[fid](name, value)


def _tensor(fid: int, name: str, value: torch.Tensor) -> None:
    _fns[fid](name, value)  # the tensor the graph computed


def _profile(fid: int, step: int, names: str, values: torch.Tensor) -> None:
    _fns[fid](step, dict(zip(names.split(SEP), values.tolist(), strict=True)) if names else {})


_starts = threading.local()
"""Per thread: the host clock (ns) at each open compiled timer, innermost last."""


def _timer_start(carrier: torch.Tensor, fid: int, name: str) -> None:
    stack = getattr(_starts, "stack", None)
    if stack is None or len(stack) > 64:  # > 64: blocks left by exceptions, never closed
        stack = _starts.stack = []
    stack.append(perf_counter_ns())


def _timer_end(carrier: torch.Tensor, fid: int, name: str) -> None:
    stack = getattr(_starts, "stack", None)
    if stack:
        _fns[fid](name, (perf_counter_ns() - stack.pop()) * 1e-6)


_direct_calls = False
"""Whether inductor's wrapper codegen has been told to call the operators' bodies directly
(``register_direct_calls``), or cannot be."""


def _fake(*args: object) -> None:
    """The fake kernel: at trace time an operator records nothing. Its first call registers the
    direct calls with inductor, which by then has been imported completely if it compiles the
    graph (registering while this module is imported could import it halfway through)."""
    if not _direct_calls:
        register_direct_calls()


_SCHEMAS: dict[Callable[..., None], str] = {
    _float: "record_float(int fid, str name, Tensor value) -> ()",
    _int: "record_int(Tensor carrier, int fid, str name, SymInt value) -> ()",
    _str: "record_str(Tensor carrier, int fid, str name, str value) -> ()",
    _tensor: "record_tensor(int fid, str name, Tensor value) -> ()",
    _profile: "record_profile(int fid, SymInt step, str names, Tensor values) -> ()",
    _timer_start: "timer_start(Tensor carrier, int fid, str name) -> ()",
    _timer_end: "timer_end(Tensor carrier, int fid, str name) -> ()",
}
IMPLS: tuple[Callable[..., None], ...] = tuple(_SCHEMAS)
"""The operators' Python bodies (``compile_support`` makes dynamo run them as plain Python)."""
_BODIES = {schema.split("(")[0]: impl for impl, schema in _SCHEMAS.items()}

# A plain Library definition with a CompositeExplicitAutograd kernel: a direct call measured
# less than half of a ``torch.library.custom_op`` one (whose kernel adds wrappers).
_lib = torch.library.Library("dflash_sidecar", "DEF")
_tags = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)
for _impl, _schema in _SCHEMAS.items():
    _name = _schema.split("(")[0]
    _lib.define(_schema, tags=_tags)
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"dflash_sidecar::{_name}", _fake, lib=_lib)
    # Ordered effects: never dead-code eliminated (they return nothing), never reordered.
    torch.library._register_effectful_op(f"dflash_sidecar::{_name}",
                                         torch.library.EffectType.ORDERED, lib=_lib)


def register_direct_calls() -> None:
    """Have inductor's Python wrapper call each operator's Python body directly (a line
    ``dflash_sidecar_<op>(args)`` and an import of the body) instead of
    ``torch.ops.dflash_sidecar.<op>.default(args)``, a dispatcher call that unpacks the arguments
    and calls back into Python: a timer block 1.4 us instead of 8.3 us, a record operator 2.2 us
    instead of 4.75 us inside a compiled step (medians, ``bench/bench_compile_calls.py``).
    Inductor's table of custom wrapper code for extern kernels is internal
    (``torch._inductor.codegen.custom_extern_kernel_codegen``); without it the operators are
    dispatcher calls, as with the other backends and inductor's C++ wrapper.
    Idempotent (the operators' fake kernel calls it at the first trace); never raises."""
    global _direct_calls
    _direct_calls = True
    try:
        from torch._inductor.codegen.custom_extern_kernel_codegen import (
            CUSTOM_EXTERN_KERNEL_CODEGEN,
            CustomCodegen,
        )

        for name in _BODIES:
            CUSTOM_EXTERN_KERNEL_CODEGEN[f"torch.ops.dflash_sidecar.{name}.default"] = CustomCodegen(
                python=_direct_call(name))
    except Exception:  # noqa: BLE001, S110 - another torch: dispatcher calls, as before
        pass


def _direct_call(name: str) -> Callable[[Any, Callable[[str], None]], None]:
    """Inductor's wrapper code for operator ``name``: the import of its body at the top of the
    generated module (of the outermost one, for a subgraph's wrapper), and its call; the
    dispatcher call inductor would have written where the import cannot be added."""
    alias = f"dflash_sidecar_{name}"
    line = f"from {__name__} import {_BODIES[name].__name__} as {alias}"

    def codegen(node: Any, writeline: Callable[[str], None]) -> None:
        args = ", ".join([*node.codegen_args(), *node.codegen_kwargs()])
        try:
            from torch._inductor.virtualized import V

            root: Any = V.graph.wrapper_code
            while getattr(root, "parent_wrapper", None) is not None:
                root = root.parent_wrapper
            if not root.imports.contains(line):
                root.imports.writeline(line)
            target = alias
        except Exception:  # noqa: BLE001 - never fail the trainer's compile over this
            target = f"torch.ops.dflash_sidecar.{name}.default"
        writeline(f"{target}({args})")

    return codegen


CARRIER = torch.empty(0, device="cpu")
"""The tensor argument of the operators whose values are no tensor (see the module docstring)."""
_ops = torch.ops.dflash_sidecar
record_float = _ops.record_float.default
record_int = _ops.record_int.default
record_str = _ops.record_str.default
record_tensor = _ops.record_tensor.default
record_profile = _ops.record_profile.default
timer_start = _ops.timer_start.default
timer_end = _ops.timer_end.default


def _as_tensor(value: float) -> torch.Tensor:
    """A float as a 0-d float64 CPU tensor computed in the graph (CPU whatever the default
    device: reading it must not synchronize with a GPU). A float schema argument makes
    inductor specialize on the value (a recompile for every new value, until dynamo's limit runs
    the frame eagerly); as an operand of a tensor op, a float that dynamo has made symbolic stays
    a graph input."""
    return torch.zeros((), dtype=torch.float64, device="cpu") + value


class _GraphTimer:
    """What ``timer(name)`` is inside compiled code: two operator calls around the block. The
    time recorded (ms) is host wall time between the two calls when the graph runs, which
    inductor may not bracket the block's own kernels exactly (it orders the operators only among
    themselves): a kernel that fuses work inside the block with work after it runs after the
    block's end."""

    def __init__(self, fid: int, name: str) -> None:
        self.fid = fid
        self.name = name

    def __enter__(self) -> None:
        timer_start(CARRIER, self.fid, self.name)

    def __exit__(self, *exc: object) -> None:
        timer_end(CARRIER, self.fid, self.name)


def timer_in_graph(timing: Callable[[str, float], None]) -> Callable[[object], AbstractContextManager[None]]:
    """The function dynamo traces instead of a channel's ``timer``: ``timing`` records."""
    fid = len(_fns)
    _fns.append(timing)

    def compiled_timer(name: object) -> AbstractContextManager[None]:
        if type(name) is not str:
            return contextlib.nullcontext()  # no operator takes it; nothing recorded
        return _GraphTimer(fid, name)

    return compiled_timer


def plain_publish(step: object, profile: object) -> bool:
    """Whether ``publish(step, profile)`` has the form both compiled forms take (an int step, a
    dict of str keys without ``SEP`` to int or float values); anything else runs eagerly. Read
    while dynamo traces: the answer is a constant of the graph."""
    if type(step) is bool or not isinstance(step, int) or type(profile) is not dict:
        return False
    return all(type(key) is str and SEP not in key and type(value) is not bool and isinstance(value, (int, float))
               for key, value in profile.items())


def eager_fallback(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` behind ``torch.compiler.disable``: what compiled code calls for arguments no traced
    form takes (the graph breaks there, the record arrives)."""
    return torch.compiler.disable(fn, reason="trainer_shim: argument types without an operator")


def guarded_publish(fn: Callable[..., object], traced: Callable[[Any, Any], None]) -> Callable[..., None]:
    """The ``publish`` dynamo traces instead of recording function ``fn``: ``traced(step,
    profile)`` for a call of the form ``plain_publish`` accepts, else ``fn`` eagerly."""
    fallback = eager_fallback(fn)

    def publish_in_graph(step: object, profile: object) -> None:
        if not plain_publish(step, profile):
            fallback(step, profile)
            return
        traced(step, profile)

    return publish_in_graph


def in_graph(kind: str, fn: Callable[..., Any]) -> Callable[..., None]:
    """The function dynamo traces instead of recording function ``fn`` (``kind``: its name,
    ``publish`` or one of the (name, value) calls)."""
    fid = len(_fns)
    _fns.append(fn)
    if kind == "publish":
        def publish_operator(step: Any, profile: Any) -> None:
            names = list(profile)
            values = [_as_tensor(value) for value in profile.values()]
            record_profile(fid, step, SEP.join(names),
                           torch.stack(values) if values else torch.zeros(0, dtype=torch.float64, device="cpu"))

        return guarded_publish(fn, publish_operator)

    fallback = eager_fallback(fn)

    def record_in_graph(name: object, value: object = 1) -> None:
        if type(name) is not str or type(value) is bool:
            fallback(name, value)
        elif isinstance(value, torch.Tensor):
            record_tensor(fid, name, value)
        elif isinstance(value, int):
            record_int(CARRIER, fid, name, value)
        elif isinstance(value, float):
            record_float(fid, name, _as_tensor(value))
        elif isinstance(value, str):
            record_str(CARRIER, fid, name, value)
        else:
            fallback(name, value)

    return record_in_graph
