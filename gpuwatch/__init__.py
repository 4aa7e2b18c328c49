"""gpuwatch: watch the GPUs of a shared machine, and pick free ones before CUDA starts.

>>> import gpuwatch
>>> with gpuwatch.open_backend(sim="2") as backend:
...     snapshot = backend.sample()
>>> [gpu.index for gpu in snapshot.gpus]
[0, 1]

`import gpuwatch` is cheap: it loads neither torch, textual, click nor pynvml,
and the rest of the public API below is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuwatch._version import __version__
from gpuwatch.errors import (
    AlreadySelectedError,
    BackendError,
    CudaAlreadyInitializedError,
    DriverNotFoundError,
    GpuwatchError,
    InvalidValueError,
    LeaseError,
    NoGpuError,
    NotEnoughGpusError,
    ScenarioError,
    SelectionError,
    VisibleDevicesError,
    WaitTimeoutError,
)

if TYPE_CHECKING:  # what the lazy door below opens, named for type checkers
    from gpuwatch.backends import open_backend
    from gpuwatch.backends.base import Backend, SampleScope
    from gpuwatch.models import GpuSample, Lease, MigDevice, ProcessKind, ProcessUsage, Snapshot
    from gpuwatch.placement.selection import Selection, device, select

_LAZY = {
    "select": "gpuwatch.placement.selection",
    "device": "gpuwatch.placement.selection",
    "Selection": "gpuwatch.placement.selection",
    "open_backend": "gpuwatch.backends",
    "Backend": "gpuwatch.backends",
    "SampleScope": "gpuwatch.backends",
    "GpuSample": "gpuwatch.models",
    "Lease": "gpuwatch.models",
    "MigDevice": "gpuwatch.models",
    "ProcessKind": "gpuwatch.models",
    "ProcessUsage": "gpuwatch.models",
    "Snapshot": "gpuwatch.models",
}

__all__ = [
    "AlreadySelectedError",
    "Backend",
    "BackendError",
    "CudaAlreadyInitializedError",
    "DriverNotFoundError",
    "GpuSample",
    "GpuwatchError",
    "InvalidValueError",
    "Lease",
    "LeaseError",
    "MigDevice",
    "NoGpuError",
    "NotEnoughGpusError",
    "ProcessKind",
    "ProcessUsage",
    "SampleScope",
    "ScenarioError",
    "Selection",
    "SelectionError",
    "Snapshot",
    "VisibleDevicesError",
    "WaitTimeoutError",
    "__version__",
    "device",
    "open_backend",
    "select",
]


def __getattr__(name: str) -> Any:
    """The one lazy door: `import gpuwatch` stays cheap, and each public name is imported
    from its module the first time it is used."""
    if name == "torch":  # the subpackage `gpuwatch.torch` (it imports torch only in watch())
        import gpuwatch.torch

        return gpuwatch.torch
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'gpuwatch' has no attribute {name!r}")
    value = getattr(__import__(module_name, fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
