"""Everything is declared in pyproject.toml; this file only ships ``dflash_sidecar_tap.pth``
into site-packages, in a wheel and in an editable install alike (a .pth file is no package data:
setuptools has no declaration for it). The file's one line taps the logging libraries named by
``DFLASH_SIDECAR_TAP`` and costs one environment lookup when that is unset
(``trainer_shim/integrations/tap_import.py``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).resolve().parent / "dflash_sidecar_tap.pth"


class BuildPyWithPth(build_py):
    """The regular build: the .pth goes to the wheel's root, which is site-packages."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH), str(Path(self.build_lib) / PTH.name))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib) / PTH.name)]


class EditableWheelWithPth(editable_wheel):
    """``pip install -e``: the editable wheel's root is site-packages too (setuptools >= 64)."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):  # type: ignore[no-untyped-def]
        result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copy(PTH, Path(unpacked_wheel) / PTH.name)
        return result


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
