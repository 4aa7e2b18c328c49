"""Leases: who holds which GPU, kept safe across processes with no daemon.

A lease is a small JSON file in the lease directory, locked with `flock` by
the process that took it. The lock travels with the open file into the
command that process runs, and the kernel drops it when the last holder
exits, however it exits (SIGKILL too): a lease never outlives its job. A file
whose lock nobody holds is stale, and is removed by the next picker.

Choosing GPUs and claiming them happen under one directory-wide lock, so
pickers started together see each other's claims. Jobs waiting for GPUs
queue as `.wait` files, locked the same way, in arrival order.

The directory is `$GPUWATCH_LEASE_DIR`, else `/run/gpuwatch` when every user
may write there (the systemd unit makes it so), else `/tmp/gpuwatch`. Users
share it, so nothing in it is trusted: symlinks are never followed, only
regular files are read, and a file that does not parse is ignored.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager

from gpuwatch.errors import LeaseError
from gpuwatch.models import GpuSample, Lease
from gpuwatch.policy import Request, Waiter

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

# Paths are plain strings here: pathlib costs `gpuwatch pick` start-up time.

ENV_VARIABLE = "GPUWATCH_LEASE_DIR"
SYSTEM_DIR = "/run/gpuwatch"
FALLBACK_DIR = "/tmp/gpuwatch"
_SHARED_MODE = 0o1777  # everyone may add files; only a file's owner may remove it
_MAX_FILE_BYTES = 64 << 10
_MAX_COMMAND_CHARS = 4096
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def default_lease_dir() -> str:
    """Where leases live on this machine (see the module docstring)."""
    if configured := os.environ.get(ENV_VARIABLE):
        return configured
    try:
        info = os.lstat(SYSTEM_DIR)
    except OSError:
        return FALLBACK_DIR
    shared = stat.S_ISDIR(info.st_mode) and info.st_mode & _SHARED_MODE == _SHARED_MODE
    return SYSTEM_DIR if shared else FALLBACK_DIR


def current_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


class HeldFile:
    """A locked file this process holds: the lock lasts until `release()` or every holder exits."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    def pass_to_child(self) -> None:
        """Lets a command this process execs inherit the lock, and keep it while it runs."""
        os.set_inheritable(self.fd, True)

    def release(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):  # already gone: the lock is what counts
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1


class HeldLease(HeldFile):
    """A lease this process holds on one GPU."""

    def __init__(self, fd: int, path: str, lease: Lease) -> None:
        super().__init__(fd, path)
        self.lease = lease


class LeaseDir:
    """The shared directory of leases and waiting jobs."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = os.fspath(path) if path is not None else default_lease_dir()
        self._locked = False
        self._prepare()

    @classmethod
    def read_only(cls, path: str | os.PathLike[str] | None = None) -> LeaseDir | None:
        """The lease directory for looking only; `None` when there is none yet."""
        path = os.fspath(path) if path is not None else default_lease_dir()
        if not os.path.isdir(path):
            return None
        try:
            return cls(path)
        except LeaseError:
            return None

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Holds the directory-wide lock: choose and claim inside it."""
        fd = self._open(os.path.join(self.path, ".lock"), os.O_RDONLY | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._locked = True
            yield
        finally:
            self._locked = False
            os.close(fd)

    def leases(self) -> list[Lease]:
        """The leases in force. Under `locked()`, stale lease files are removed too."""
        found = []
        for data in self._live_entries(".lease"):
            try:
                found.append(Lease(**data))
            except TypeError:
                continue
        return found

    def claim(self, gpu: GpuSample, *, mem_bytes: int | None, command: str) -> HeldLease:
        """Takes a lease on `gpu` for this process. Call it under `locked()`."""
        lease = Lease(
            gpu_uuid=str(gpu.uuid),
            gpu_index=gpu.index,
            pid=os.getpid(),
            user=current_user(),
            command=command[:_MAX_COMMAND_CHARS],
            started_at=time.time(),
            mem_bytes=mem_bytes,
        )
        fd, path = self._publish("lease", lease.to_dict())
        return HeldLease(fd, path, lease)

    def enqueue(self, request: Request, command: str) -> HeldFile:
        """Joins the line of waiting jobs; the returned ticket leaves it when released."""
        record = {
            "pid": os.getpid(),
            "user": current_user(),
            "command": command,
            "request": request.to_dict(),
        }
        return HeldFile(*self._publish("wait", record))

    def waiting_before(self, ticket: HeldFile | None) -> list[Waiter]:
        """Jobs that joined the line before `ticket` (all of them when `None`), oldest first."""
        waiters = []
        for name, data in sorted(self._live_entries(".wait", with_names=True)):
            if ticket is not None and name >= os.path.basename(ticket.path):
                break
            try:
                waiters.append(
                    Waiter(int(data["pid"]), str(data["user"]), Request.from_dict(data["request"]))
                )
            except (KeyError, TypeError, ValueError):
                continue
        return waiters

    def _prepare(self) -> None:
        try:
            os.mkdir(self.path, _SHARED_MODE)
            os.chmod(self.path, _SHARED_MODE)  # mkdir's mode is cut by the umask
        except FileExistsError:
            pass
        except OSError as error:
            raise LeaseError(
                f"cannot create the lease directory {self.path}: {error.strerror}; "
                f"set {ENV_VARIABLE} to a writable directory"
            ) from error
        info = os.lstat(self.path)
        if not stat.S_ISDIR(info.st_mode):
            raise LeaseError(
                f"{self.path} is not a directory (a symlink?); remove it or set {ENV_VARIABLE}"
            )
        if info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX:
            raise LeaseError(
                f"{self.path} is writable by everyone but not sticky, so anyone "
                f"could remove leases; chmod 1777 it or set {ENV_VARIABLE}"
            )
        if info.st_uid not in (0, os.getuid()) and not info.st_mode & stat.S_ISVTX:
            raise LeaseError(f"{self.path} belongs to another user; set {ENV_VARIABLE}")

    def _open(self, path: str, flags: int, mode: int = 0o644) -> int:
        try:
            fd = os.open(path, flags | _OPEN_FLAGS, mode)
        except OSError as error:
            raise LeaseError(f"cannot open {path}: {error.strerror}") from error
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LeaseError(f"{path} is not a regular file; remove it")
        return fd

    def _publish(self, suffix: str, record: dict[str, Any]) -> tuple[int, str]:
        """Writes `record` to a new locked file, made visible only once locked and complete."""
        stem = f"{time.time_ns():020d}-{os.getpid()}-{os.urandom(4).hex()}"
        draft = os.path.join(self.path, f".{stem}.tmp")
        fd = self._open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, json.dumps(record).encode())
            final = os.path.join(self.path, f"{stem}.{suffix}")
            os.rename(draft, final)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(draft)
            raise
        return fd, final

    def _live_entries(self, suffix: str, *, with_names: bool = False) -> Iterator[Any]:
        try:
            names = [entry.name for entry in os.scandir(self.path) if entry.name.endswith(suffix)]
        except OSError as error:
            raise LeaseError(f"cannot list {self.path}: {error.strerror}") from error
        for name in names:
            data = self._read_if_held(os.path.join(self.path, name))
            if data is not None:
                yield (name, data) if with_names else data

    def _read_if_held(self, path: str) -> dict[str, Any] | None:
        try:
            fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        except OSError:
            return None  # removed meanwhile, or a symlink
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_FILE_BYTES:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as error:
                if error.errno != errno.EWOULDBLOCK:
                    return None
                data = json.loads(os.read(fd, _MAX_FILE_BYTES) or b"null")
                return data if isinstance(data, dict) else None
            self._remove_stale(path)
            return None
        except ValueError:
            return None
        finally:
            os.close(fd)

    def _remove_stale(self, path: str) -> None:
        if self._locked:
            # Another user's file in a sticky directory cannot go: harmless, since unlocked.
            with contextlib.suppress(OSError):
                os.unlink(path)
