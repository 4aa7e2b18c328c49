"""gpuwatch: watch the GPUs of a shared machine, and pick free ones before CUDA starts.

>>> import gpuwatch
>>> with gpuwatch.open_backend(sim="2") as backend:
...     snapshot = backend.sample()
>>> [gpu.index for gpu in snapshot.gpus]
[0, 1]

Importing this package loads neither torch, textual, click nor pynvml.
"""

from gpuwatch._version import __version__
from gpuwatch.backends import Backend, SampleScope, open_backend
from gpuwatch.errors import (
    BackendError,
    DriverNotFoundError,
    GpuwatchError,
    InvalidValueError,
    NoGpuError,
    ScenarioError,
)
from gpuwatch.models import GpuSample, ProcessKind, ProcessUsage, Snapshot

__all__ = [
    "Backend",
    "BackendError",
    "DriverNotFoundError",
    "GpuSample",
    "GpuwatchError",
    "InvalidValueError",
    "NoGpuError",
    "ProcessKind",
    "ProcessUsage",
    "SampleScope",
    "ScenarioError",
    "Snapshot",
    "__version__",
    "open_backend",
]
