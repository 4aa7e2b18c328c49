"""Every error gpuwatch raises on purpose derives from `GpuwatchError`.

    GpuwatchError
    ├── InvalidValueError              a size, duration or option value that does not parse
    │   └── VisibleDevicesError        a malformed or unusable CUDA_VISIBLE_DEVICES
    ├── BackendError                   reading GPUs failed as a whole
    │   ├── DriverNotFoundError        no libnvidia-ml.so.1, or the kernel driver is not loaded
    │   ├── NoGpuError                 the driver answers but reports no GPU
    │   ├── ScenarioError              a simulated node (`--sim`) that cannot be built
    │   ├── DaemonUnavailableError     no gpuwatch daemon answers on the socket
    │   └── RemoteError                a remote host (`--host`) cannot be reached or read
    │       └── SchedulerUnavailableError  Slurm cannot be asked (no scontrol, down, too slow)
    ├── SelectionError                 GPUs could not be selected
    │   ├── NotEnoughGpusError         fewer GPUs qualify than were asked for
    │   │   └── WaitTimeoutError       ... and waiting for them timed out
    │   ├── CudaAlreadyInitializedError  CUDA started in this process before select()
    │   └── AlreadySelectedError       select() was already called in this process
    ├── LeaseError                     the lease directory is missing, unsafe or unusable
    │   ├── LeaseBusyError             its lock stayed held by another process past the deadline
    │   └── LeaseDirError              GPUWATCH_LEASE_DIR names no directory gpuwatch can use
    │                                  (also an InvalidValueError: a usage error)
    ├── JobUnknownError                the scheduler knows no such job, or not its GPUs here
    ├── UnreadableFileError            a file another may have written is not read: missing,
    │                                  forbidden, no regular file, or over its cap
    ├── DaemonError                    the daemon cannot start (socket in use, bad settings)
    │   └── ConfigFileError            its --config file is unreadable or has a bad value
    │                                  (also an InvalidValueError: a usage error)
    └── LaunchError                    the command to run on the chosen GPUs could not start
        ├── CommandNotFoundError       no such command (exit code 127, as in a shell)
        └── CommandNotExecutableError  found, but not executable (exit code 126)

Errors about a single GPU are not raised: they are reported in that GPU's
`GpuSample.error`, so that one faulty GPU never hides the others.

Each message is one line that says what went wrong and what to do about it. The
CLI maps each class to an exit code in one place (`gpuwatch.cli.exit_codes`).
"""

from __future__ import annotations

from errno import ENOENT, ENOTDIR


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


class DaemonUnavailableError(BackendError):
    """No gpuwatch daemon answers: no socket, a stale one, or a daemon without a sample yet."""


class RemoteError(BackendError):
    """A remote host cannot be reached, lacks gpuwatch, or sent something unreadable."""


class SourceError(RemoteError):
    """A fleet source (a Prometheus server) cannot be read at all, or is not what it was
    said to be; a single node that cannot be read is not an error but a node that is down."""


class SchedulerUnavailableError(RemoteError):
    """The cluster's scheduler cannot be asked: its command is missing, fails, or outlives
    its deadline (`gpuwatch job-report`)."""


class JobUnknownError(GpuwatchError):
    """The scheduler knows no such job, it has not started, or it says of this node's GPUs
    nothing that could be reported (`gpuwatch job-report`)."""


class JobHistoryShortError(GpuwatchError):
    """A job's report was made, but the daemon's history covers only part of the job
    (`gpuwatch job-report`: the report is printed, and this says so)."""


class ScenarioError(BackendError):
    """A simulated node could not be built from `--sim` or its scenario file."""


class VisibleDevicesError(InvalidValueError):
    """`CUDA_VISIBLE_DEVICES` is malformed or names GPUs this machine does not have."""


class SelectionError(GpuwatchError):
    """GPUs could not be selected."""


class NotEnoughGpusError(SelectionError):
    """Fewer GPUs qualify than were asked for.

    `reasons` holds one line per GPU that was not chosen, saying why
    ("GPU 3: 2.1GiB free < 8.0GiB"); the message ends with them, one indented
    line each, as `gpuwatch pick` prints them.
    """

    def __init__(self, message: str, reasons: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.reasons = reasons

    @property
    def summary(self) -> str:
        """The message's first line, without the reasons."""
        return super().__str__()

    def __str__(self) -> str:
        return "\n".join([self.summary, *(f"  {reason}" for reason in self.reasons)])


class WaitTimeoutError(NotEnoughGpusError):
    """Waiting for enough GPUs to qualify took longer than the timeout."""


class CudaAlreadyInitializedError(SelectionError):
    """CUDA was initialised in this process, so CUDA_VISIBLE_DEVICES can no longer take effect."""


class AlreadySelectedError(SelectionError):
    """`select()` already chose GPUs for this process."""


class UnreadableFileError(GpuwatchError):
    """A file that `gpuwatch.paths.read_regular_file` does not read, and why, in the message
    (without the path, which the caller words into its own): the system's words
    ("Permission denied"), "a FIFO, not a regular file", "larger than 1MiB".

    Callers that word the reason their own way tell the cases apart by `errno` (the
    system's error, where there was one), `kind` (what stands there instead of a regular
    file: "a FIFO", "a symlink", ...) and `max_bytes` (the cap it is over).
    """

    def __init__(
        self,
        message: str,
        *,
        errno: int | None = None,
        kind: str | None = None,
        max_bytes: int | None = None,
    ) -> None:
        super().__init__(message)
        self.errno = errno
        self.kind = kind
        self.max_bytes = max_bytes

    @property
    def missing(self) -> bool:
        """Whether there is no such file (or a folder on its path is no folder)."""
        return self.errno in (ENOENT, ENOTDIR)


class LeaseError(GpuwatchError):
    """The lease directory is missing, unsafe (symlinks, foreign owners) or unusable."""


class LeaseBusyError(LeaseError):
    """Another process kept the lease directory's lock longer than a picker may wait."""


class LeaseDirError(LeaseError, InvalidValueError):
    """The lease directory asked for (`GPUWATCH_LEASE_DIR`) is not a directory gpuwatch
    can use (a file, a symlink, a FIFO, or a path it cannot create): left as it is."""


class DaemonError(GpuwatchError):
    """The daemon cannot start or reload: its socket is in use, or a setting is wrong."""


class ConfigFileError(DaemonError, InvalidValueError):
    """The daemon's `--config` file cannot be read, or one of its values is out of range."""


class LaunchError(GpuwatchError):
    """The command to run on the chosen GPUs could not be started."""


class CommandNotFoundError(LaunchError):
    """No such command on PATH."""


class CommandNotExecutableError(LaunchError):
    """The command exists but cannot be executed (permissions, a directory, a bad binary)."""
