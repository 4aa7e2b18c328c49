"""Exit codes: chosen here, and only here, from the error that ended a command."""

from __future__ import annotations

import enum

from gpuwatch.errors import (
    DriverNotFoundError,
    GpuwatchError,
    InvalidValueError,
    NoGpuError,
    ScenarioError,
)


class ExitCode(enum.IntEnum):
    """What `gpuwatch` exits with. README.md ("Exit codes") lists the same table."""

    OK = 0
    FAILED = 1
    """Any other failure; the message says what."""
    USAGE = 2
    """A bad command line: unknown option, bad value, bad `--sim` or scenario file."""
    NO_GPU = 3
    """No NVIDIA driver, or the driver reports no GPU."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C (SIGINT)."""


_BY_ERROR: tuple[tuple[type[GpuwatchError], ExitCode], ...] = (
    (InvalidValueError, ExitCode.USAGE),
    (ScenarioError, ExitCode.USAGE),
    (DriverNotFoundError, ExitCode.NO_GPU),
    (NoGpuError, ExitCode.NO_GPU),
)


def exit_code_for(error: GpuwatchError) -> ExitCode:
    """The exit code for an error gpuwatch raised on purpose."""
    for error_type, code in _BY_ERROR:
        if isinstance(error, error_type):
            return code
    return ExitCode.FAILED
