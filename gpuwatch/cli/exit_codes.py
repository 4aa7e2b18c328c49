"""Exit codes: chosen here, and only here, from the error that ended a command."""

from __future__ import annotations

import enum

from gpuwatch.errors import (
    CommandNotExecutableError,
    CommandNotFoundError,
    DriverNotFoundError,
    GpuwatchError,
    InvalidValueError,
    JobHistoryShortError,
    JobUnknownError,
    LeaseBusyError,
    NoGpuError,
    NotEnoughGpusError,
    RemoteError,
    ScenarioError,
    WaitTimeoutError,
)


class ExitCode(enum.IntEnum):
    """What `gpuwatch` exits with. docs/reference/exit-codes.md lists the same table.

    `gpuwatch pick -- CMD` exits with CMD's own status once CMD runs.
    """

    OK = 0
    FAILED = 1
    """Any other failure; the message says what."""
    USAGE = 2
    """A bad command line or environment: unknown option, bad value, bad `--sim` or
    scenario file, malformed CUDA_VISIBLE_DEVICES, a Slurm step's GPUs that gres.conf cannot
    tell, a request no GPU could ever meet (more GPUs than exist, more memory than any GPU
    has, a MIG profile none has), waiting or not."""
    NO_GPU = 3
    """No NVIDIA driver, or the driver reports no GPU."""
    NOT_ENOUGH_GPUS = 4
    """`pick`: fewer GPUs qualify than asked for (without --wait); `where`: no node fits."""
    TIMEOUT = 5
    """`pick --wait --timeout`: still not enough GPUs when the time was up; or `pick`:
    another process kept the lease directory locked for 10s (without --wait) or past
    --timeout."""
    REMOTE = 6
    """`status --host`: the host cannot be reached, or has no gpuwatch; `fleet`, `where`:
    the fleet source (a Prometheus server) cannot be read; `job-report`: no daemon answers
    (its history is the source), or Slurm cannot be asked (down, too slow, or answering more
    than one command's 8 MiB)."""
    JOB_UNKNOWN = 7
    """`job-report`: the job was never seen (neither Slurm nor the daemon knows it), it has
    not started, ran on another node or held no GPU here, or which GPUs it held is not
    known."""
    HISTORY_SHORT = 8
    """`job-report`: the job was seen and its report printed, but the daemon's history is
    shorter than the job (it starts after the job, or has gaps)."""
    CANNOT_EXECUTE = 126
    """`pick -- CMD`: CMD was found but cannot be executed."""
    COMMAND_NOT_FOUND = 127
    """`pick -- CMD`: no such command."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C (SIGINT)."""


# Most specific first: the first match wins.
_BY_ERROR: tuple[tuple[type[GpuwatchError], ExitCode], ...] = (
    (InvalidValueError, ExitCode.USAGE),
    (ScenarioError, ExitCode.USAGE),
    (DriverNotFoundError, ExitCode.NO_GPU),
    (NoGpuError, ExitCode.NO_GPU),
    (RemoteError, ExitCode.REMOTE),
    (JobUnknownError, ExitCode.JOB_UNKNOWN),
    (JobHistoryShortError, ExitCode.HISTORY_SHORT),
    (WaitTimeoutError, ExitCode.TIMEOUT),
    (LeaseBusyError, ExitCode.TIMEOUT),
    (NotEnoughGpusError, ExitCode.NOT_ENOUGH_GPUS),
    (CommandNotFoundError, ExitCode.COMMAND_NOT_FOUND),
    (CommandNotExecutableError, ExitCode.CANNOT_EXECUTE),
)


def exit_code_for(error: GpuwatchError) -> ExitCode:
    """The exit code for an error gpuwatch raised on purpose."""
    for error_type, code in _BY_ERROR:
        if isinstance(error, error_type):
            return code
    return ExitCode.FAILED
