"""Build the fake NVML driver (``fake_nvml.c``) with gcc against the real ``nvml.h``.

The result is a shared library named ``libnvidia-ml.so.1`` (also its SONAME) in a per-user
cache directory under the system temp dir, keyed by a hash of the C source, the header and
the build flags, so repeated test runs compile it once. Two variants exist: ``"full"`` and
``"old"`` (built with ``-DFAKE_NVML_OLD_DRIVER``: the newer NVML functions are missing).

``nvml.h`` comes from the ``nvidia-nvml-dev`` wheel, found through its installed file list;
``DFLASH_NVML_HEADER`` may point at another copy.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
Variant = Literal["full", "old"]
_VARIANT_FLAGS: dict[str, tuple[str, ...]] = {"full": (), "old": ("-DFAKE_NVML_OLD_DRIVER",)}


class FakeNvmlUnavailable(RuntimeError):
    """The fake driver cannot be built here (no gcc or no nvml.h); the message says which."""


def find_nvml_header() -> Path | None:
    """Path of ``nvml.h`` from the installed ``nvidia-nvml-dev`` package (or ``$DFLASH_NVML_HEADER``)."""
    override = os.environ.get("DFLASH_NVML_HEADER")
    if override:
        return Path(override) if Path(override).is_file() else None
    try:
        files = importlib.metadata.files("nvidia-nvml-dev") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == "nvml.h":
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    return None


def build_fake_nvml(variant: Variant = "full") -> Path:
    """Compile (or reuse) the fake driver and return the path of its ``libnvidia-ml.so.1``.

    Raises ``FakeNvmlUnavailable`` when gcc or nvml.h is missing, ``RuntimeError`` when the
    compiler rejects the source (a real failure: e.g. a prototype that no longer matches).
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FakeNvmlUnavailable("gcc is not installed")
    header = find_nvml_header()
    if header is None:
        raise FakeNvmlUnavailable("nvml.h not found (pip install nvidia-nvml-dev)")
    flags = _VARIANT_FLAGS[variant]
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), header.read_bytes(), " ".join(flags).encode(), gcc.encode()):
        digest.update(hashlib.sha256(part).digest())
    out_dir = Path(tempfile.gettempdir()) / f"dflash-fake-nvml-{os.getuid()}" / f"{variant}-{digest.hexdigest()[:16]}"
    library = out_dir / LIBRARY_NAME
    if library.is_file():
        return library
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
    command = [
        gcc, "-shared", "-fPIC", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", *flags,
        f"-I{header.parent}", f"-Wl,-soname,{LIBRARY_NAME}", "-o", str(partial), str(SOURCE), "-lpthread",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"building the fake NVML driver failed:\n{' '.join(command)}\n{result.stderr}")
    os.replace(partial, library)  # atomic: concurrent builders never see a half-written file
    return library
