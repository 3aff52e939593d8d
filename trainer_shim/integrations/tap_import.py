"""Taps with no code: ``DFLASH_SIDECAR_TAP=wandb,tensorboard,mlflow`` (or ``all``/``1``).

The distribution installs ``dflash_sidecar_tap.pth`` into site-packages; Python runs its one
line at every interpreter start. With the variable unset or empty that line is one lookup in
``os.environ`` (about 0.2 ms a start with compiling the line: ``bench/bench_taps.py
--pth-only``); set, it imports
this module and the post-import hook it uses (``trainer_shim.integrations.post_import``; both the
standard library only) and calls ``install_from_env``, which puts the hook's finder at the front
of ``sys.meta_path``: when the trainer imports a named library, the library's module runs as usual
and then the tap is put on it (``trainer_shim.integrations.taps``, imported only then). A library
imported before the hook existed is tapped at once. The finder looks at each import's name once
(a set lookup) and leaves ``sys.meta_path`` when every module it waits for has been imported.

Nothing here raises into an import: an unknown library name is said once on stderr, and a tap
that fails is said once and leaves the library as it was.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from types import ModuleType

from trainer_shim.integrations.post_import import LIBRARY_MODULES, when_imported

ENV = "DFLASH_SIDECAR_TAP"
"""Comma-separated library names to tap (``wandb``, ``tensorboard``, ``mlflow``), or
``all``/``1``/``true``/``yes``/``on`` for every one; empty, ``0``, ``false``, ``no``, ``off``: none."""

_ALL = frozenset({"all", "1", "true", "yes", "on"})
_NONE = frozenset({"", "0", "false", "no", "off"})


def libraries_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The libraries ``DFLASH_SIDECAR_TAP`` names, known ones only (an unknown one is said once
    on stderr)."""
    value = environ.get(ENV, "").strip().lower()
    if value in _NONE:
        return ()
    if value in _ALL:
        return tuple(LIBRARY_MODULES)
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in LIBRARY_MODULES]
    if unknown:
        sys.stderr.write(f"dflash-sidecar: {ENV}: unknown {', '.join(unknown)} (known: "
                         f"{', '.join(LIBRARY_MODULES)}); not tapped\n")
    return tuple(dict.fromkeys(n for n in names if n in LIBRARY_MODULES))


def install_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """Tap each library ``DFLASH_SIDECAR_TAP`` names when the trainer imports it (the .pth
    file's call). Never raises."""
    try:
        for library in libraries_from_env(environ):
            for module in LIBRARY_MODULES[library]:
                when_imported(module, functools.partial(_tap, library))
    except Exception as exc:  # noqa: BLE001 - never break the interpreter's start
        sys.stderr.write(f"dflash-sidecar: {ENV}: not tapped: {exc!r}\n")


def _tap(library: str, _module: ModuleType) -> None:
    from trainer_shim.integrations import taps

    taps.tap(library)
