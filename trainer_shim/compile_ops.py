"""The custom operators that carry shim calls through ``torch.compile`` (imported only by
``trainer_shim.compile_support``, once the trainer has imported ``torch._dynamo``).

Inside compiled code each recording function is replaced (``torch.compiler.substitute_in_graph``)
by a small function that dynamo traces and that calls one of these operators. An operator call
is a node of the graph like any torch op, in the compiled function and in every function dynamo
inlines into it (a submodule's ``forward``, a helper), so no call is lost, the graph does not
break, and an int that dynamo has made symbolic (a step counter) is passed as a ``SymInt``. The
operators are registered as ordered side effects (never eliminated or reordered) and as unsafe
in a CUDA graph (inductor keeps them out of captured regions). At run time an operator calls the
original recording function with the real values, as plain Python.

The operators take only what an operator schema can: an int naming the recording function
(an index into ``_fns``), a str, an int, a float, a tensor, a list of floats. A ``publish`` dict
becomes one call: its names joined by ``SEP`` and its values as a list. Whatever does not fit
(a non-str name, a value of another type, a dict with non-number values) goes through the
original function behind ``torch.compiler.disable``: the graph breaks there, the record arrives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

SEP = "\x1f"
"""Joins a profile's names in one str argument; a control character, so never part of a valid
metric name (a name containing it is sent through the eager fallback instead)."""

_fns: list[Callable[..., Any]] = []
_NS = "dflash_sidecar"
_tags = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)


def _float(fid: int, name: str, value: float) -> None:
    _fns[fid](name, value)


def _int(fid: int, name: str, value: int) -> None:
    _fns[fid](name, value)  # value is a SymInt in the graph, an int here


def _str(fid: int, name: str, value: str) -> None:
    _fns[fid](name, value)


def _tensor(fid: int, name: str, value: torch.Tensor) -> None:
    _fns[fid](name, value)  # the tensor the graph computed


def _profile(fid: int, step: int, names: str, values: list[float]) -> None:
    _fns[fid](step, dict(zip(names.split(SEP), values, strict=True)) if names else {})


IMPLS = (_float, _int, _str, _tensor, _profile)
"""The operators' Python bodies (``compile_support`` makes dynamo run them as plain Python)."""
record_float, record_int, record_str, record_tensor, record_profile = (
    torch.library.custom_op(f"{_NS}::record{fn.__name__}", fn, mutates_args=(), tags=_tags)
    for fn in IMPLS)
for _op in (record_float, record_int, record_str, record_tensor, record_profile):
    _op.register_fake(lambda *args: None)
    _op.register_effect(torch.library.EffectType.ORDERED)


def in_graph(kind: str, fn: Callable[..., Any]) -> Callable[..., None]:
    """The function dynamo traces instead of recording function ``fn`` (``kind``: its name,
    ``publish`` or one of the (name, value) calls)."""
    fid = len(_fns)
    _fns.append(fn)
    fallback = torch.compiler.disable(fn, reason="trainer_shim: argument types without an operator")

    if kind == "publish":
        def publish_in_graph(step: Any, profile: Any) -> None:
            if type(step) is bool or not isinstance(step, int) or type(profile) is not dict:
                fallback(step, profile)
                return
            names: list[str] = []
            values: list[float] = []
            for key, value in profile.items():
                if (type(key) is not str or SEP in key or type(value) is bool
                        or not isinstance(value, (int, float))):
                    fallback(step, profile)
                    return
                names.append(key)
                values.append(float(value))
            record_profile(fid, step, SEP.join(names), values)

        return publish_in_graph

    def record_in_graph(name: Any, value: Any = 1) -> None:
        if type(name) is not str or type(value) is bool:
            fallback(name, value)
        elif isinstance(value, torch.Tensor):
            record_tensor(fid, name, value)
        elif isinstance(value, int):
            record_int(fid, name, value)
        elif isinstance(value, float):
            record_float(fid, name, value)
        elif isinstance(value, str):
            record_str(fid, name, value)
        else:
            fallback(name, value)

    return record_in_graph
