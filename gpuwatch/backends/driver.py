"""This machine's GPUs through the NVIDIA driver: the `nvml` backend, opened once the
driver's library is known to load.

Asking the library first answers in a millisecond on a machine without a GPU, where
importing pynvml to be told the same costs tens.
"""

from __future__ import annotations

import ctypes

from gpuwatch.backends import BACKENDS, defined
from gpuwatch.backends.base import Backend
from gpuwatch.errors import DriverNotFoundError

NVML_LIBRARY = "libnvidia-ml.so.1"


def open_driver() -> Backend:
    """The `nvml` backend; raises `DriverNotFoundError` where the driver's library or the
    bindings do not load."""
    if not nvml_library_loads():
        raise DriverNotFoundError(f"NVIDIA driver not found ({NVML_LIBRARY} could not be loaded)")
    try:  # pynvml, imported with it, costs tens of milliseconds: only where the driver is read
        backend = defined(BACKENDS["nvml"])
    except ImportError as error:
        raise DriverNotFoundError(
            f"the NVIDIA management bindings could not be loaded ({error}): "
            "pip install nvidia-ml-py"
        ) from error
    opened: Backend = backend()
    return opened


def nvml_library_loads() -> bool:
    """Whether the driver's library is there, asked before paying to import the bindings."""
    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return False
    return True
