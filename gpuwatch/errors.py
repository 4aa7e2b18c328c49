"""Every error gpuwatch raises on purpose derives from `GpuwatchError`.

    GpuwatchError
    ├── InvalidValueError          a size, duration or option value that does not parse
    ├── BackendError               reading GPUs failed as a whole
    │   ├── DriverNotFoundError    no libnvidia-ml.so.1, or the kernel driver is not loaded
    │   ├── NoGpuError             the driver answers but reports no GPU
    │   └── ScenarioError          a simulated node (`--sim`) that cannot be built

Errors about a single GPU are not raised: they are reported in that GPU's
`GpuSample.error`, so that one faulty GPU never hides the others.

Each message is one line that says what went wrong and what to do about it. The
CLI maps each class to an exit code in one place (`gpuwatch.cli.exit_codes`).
"""

from __future__ import annotations


class GpuwatchError(Exception):
    """Root of every error gpuwatch raises on purpose."""


class InvalidValueError(GpuwatchError, ValueError):
    """A value given by the user (size, duration, count, ...) does not parse."""


class BackendError(GpuwatchError):
    """The GPUs could not be read at all."""


class DriverNotFoundError(BackendError):
    """The NVIDIA driver or its management library is missing or not loaded."""


class NoGpuError(BackendError):
    """The driver is loaded but reports no GPU."""


class ScenarioError(BackendError):
    """A simulated node could not be built from `--sim` or its scenario file."""
