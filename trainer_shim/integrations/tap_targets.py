"""The logger calls a tap wraps, one function per library, each returning its ``Patch`` list.

Every wrapper calls the library's own function first, with the caller's arguments untouched,
and returns its result; an exception of the library's goes on to the trainer as it was, and
nothing is forwarded for that call. Only after the call returned does the wrapper forward, inside
``try``: a failure of the tap is counted (``TapSink.errors``), never raised. A wrapper whose tap
is off (``TapState.sink`` is None) only calls the library.

Nothing here imports a logging library: each function gets the module the trainer imported.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer_shim.integrations.tap_values import TapSink


@dataclass
class TapState:
    """What every wrapper reads per call: the sink (None: the tap is off) and the W&B runs whose
    ``log`` is never forwarded (the sidecar's own W&B writers)."""

    sink: TapSink | None = None
    excluded: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    excluding: bool = False
    """Whether any run was ever excluded: a trainer without one skips the weak set's lookup."""


STATE = TapState()
"""The process's taps: every wrapper reads it (``taps`` sets its sink)."""


def exclude(run: Any) -> None:
    """Never forward ``run.log``: a W&B run the sidecar itself writes (its W&B exporter, in the
    daemon or a daemon run in the trainer's process), so a tapped process never sends the
    sidecar's own rows back to it. Light to import (no ZeroMQ): the exporter calls it. Never
    raises."""
    try:
        STATE.excluded.add(run)
    except TypeError:  # no weak reference to be had: not a W&B run
        return
    STATE.excluding = True


@dataclass(frozen=True)
class Patch:
    """``owner.attr`` was ``original`` and is now ``wrapper``."""

    owner: Any
    attr: str
    original: Any
    wrapper: Any

    def apply(self) -> None:
        setattr(self.owner, self.attr, self.wrapper)

    def undo(self) -> None:
        """Put the original back, unless something else replaced the wrapper since (then that
        stays, and the wrapper, still called by it, forwards nothing once the tap is off)."""
        if getattr(self.owner, self.attr, None) is self.wrapper:
            setattr(self.owner, self.attr, self.original)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    """An argument given by position ``index`` (after ``self``) or by keyword ``name``."""
    return args[index] if len(args) > index else kwargs.get(name)


def _wrap(original: Any, state: TapState,
          forward: Callable[[TapSink, tuple[Any, ...], dict[str, Any]], None]) -> Any:
    """``original`` (a method or a module function), then ``forward(sink, args, kwargs)``."""

    @functools.wraps(original)
    def tapped(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        sink = state.sink
        if sink is not None:
            try:
                forward(sink, args, kwargs)
            except Exception:  # noqa: BLE001 - the tap never raises into the trainer
                sink.count("errors")
        return result

    return tapped


# -- W&B --------------------------------------------------------------------------------------------


def wandb_patches(wandb: Any, state: TapState) -> list[Patch]:
    """``wandb.Run.log`` (every run's ``log``), and ``wandb.log`` when it is already bound to
    the active run (``wandb.init`` binds it to ``run.log`` as it is then). A call's step: its
    ``step``, else a framework's global step in the dict (``WANDB_STEP_KEYS``), else the row W&B
    puts it in (read before the call)."""
    run_cls = wandb.sdk.wandb_run.Run
    original = run_cls.__dict__["log"]
    wrapper = _wandb_log(original, state)
    patches = [Patch(run_cls, "log", original, wrapper)]
    bound = getattr(wandb, "log", None)
    run = getattr(bound, "__self__", None)
    if getattr(bound, "__func__", None) is original and run is not None:
        patches.append(Patch(wandb, "log", bound, types.MethodType(wrapper, run)))
    return patches


def _wandb_log(original: Any, state: TapState) -> Any:
    @functools.wraps(original)
    def log(self: Any, *args: Any, **kwargs: Any) -> Any:
        sink = state.sink
        if sink is None:
            return original(self, *args, **kwargs)
        try:
            mine = state.excluding and self in state.excluded
            before = None if mine else getattr(self, "_local_step", None)
        except Exception:  # noqa: BLE001 - an object that is no Run
            mine, before = False, None
        result = original(self, *args, **kwargs)
        if not mine:
            try:
                step = args[1] if len(args) > 1 else kwargs.get("step")
                data: Any = args[0] if args else kwargs.get("data")
                if step is None:
                    step = _framework_step(data, before)
                sink.mapping(step, data)
            except Exception:  # noqa: BLE001 - the tap never raises into the trainer
                sink.count("errors")
        return result

    return log


WANDB_STEP_KEYS = ("train/global_step", "trainer/global_step")
"""Keys with which frameworks log their global step to W&B without ``step=`` (the Hugging Face
Trainer's ``WandbCallback``, Lightning's ``WandbLogger``): the trainer's step, where W&B's own
row counter is not."""


def _framework_step(data: Any, row: Any) -> Any:
    """The step of a ``log`` call without ``step=``: a framework's global step in ``data``, else
    ``row`` (W&B's row)."""
    for key in WANDB_STEP_KEYS:
        if key in data:
            return data[key]
    return row


# -- TensorBoard (torch.utils.tensorboard, tensorboardX) ---------------------------------------------


def _add_scalar(sink: TapSink, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    # args[0] is the writer
    sink.one(_arg(args, kwargs, 3, "global_step"), _arg(args, kwargs, 1, "tag"),
             _arg(args, kwargs, 2, "scalar_value"))


def _add_scalars(sink: TapSink, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    main_tag = _arg(args, kwargs, 1, "main_tag")
    sink.mapping(_arg(args, kwargs, 3, "global_step"), _arg(args, kwargs, 2, "tag_scalar_dict"),
                 prefix=f"{main_tag}/")


def tensorboard_patches(writer_module: Any, state: TapState) -> list[Patch]:
    """``SummaryWriter.add_scalar`` (name: the tag) and ``add_scalars`` (names
    ``<main_tag>/<tag>``) of a writer module (``torch.utils.tensorboard.writer`` or
    ``tensorboardX.writer``)."""
    cls = writer_module.SummaryWriter
    return [Patch(cls, name, cls.__dict__[name], _wrap(cls.__dict__[name], state, forward))
            for name, forward in (("add_scalar", _add_scalar), ("add_scalars", _add_scalars))]


# -- MLflow -----------------------------------------------------------------------------------------


def _log_metric(sink: TapSink, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    sink.one(_arg(args, kwargs, 2, "step"), _arg(args, kwargs, 0, "key"), _arg(args, kwargs, 1, "value"))


def _log_metrics(sink: TapSink, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    sink.mapping(_arg(args, kwargs, 1, "step"), _arg(args, kwargs, 0, "metrics"))


def mlflow_patches(mlflow: Any, state: TapState) -> list[Patch]:
    """``mlflow.log_metric`` and ``mlflow.log_metrics``, in ``mlflow`` and in
    ``mlflow.tracking.fluent`` where they are defined (one wrapper for both names)."""
    fluent = mlflow.tracking.fluent
    patches = []
    for name, forward in (("log_metric", _log_metric), ("log_metrics", _log_metrics)):
        original = getattr(fluent, name)
        wrapper = _wrap(original, state, forward)
        patches.append(Patch(fluent, name, original, wrapper))
        if getattr(mlflow, name, None) is original:
            patches.append(Patch(mlflow, name, original, wrapper))
    return patches
