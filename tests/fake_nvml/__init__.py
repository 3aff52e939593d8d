"""A fake NVML driver for the tests: a C library built with gcc against the real nvml.h,
loaded by the real pynvml, scripted through a control file (see ``control.py``)."""

from .build import FakeNvmlUnavailable, build_fake_nvml, find_nvml_header
from .control import H200_COSTS_US, UNSUPPORTED, FakeNvml, error

__all__ = ["H200_COSTS_US", "UNSUPPORTED", "FakeNvml", "FakeNvmlUnavailable", "build_fake_nvml", "error",
           "find_nvml_header"]
