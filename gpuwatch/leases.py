"""Leases: who holds which GPU, kept safe across processes with no daemon.

A lease is a small JSON file in the lease directory, locked with `flock` by
the process that took it. The lock travels with the open file into the
command that process runs, and the kernel drops it when the last process
holding the file exits, however it exits (SIGKILL too). A file whose lock
nobody holds is stale, and is removed by the next picker.

Choosing GPUs and claiming them happen under a lock on the directory itself,
so pickers started together see each other's claims. Jobs waiting for GPUs
queue as `.wait` files, locked the same way, in arrival order.

The directory is `$GPUWATCH_LEASE_DIR`, else `/run/gpuwatch` when every user
may write there (the systemd unit makes it so), else `/tmp/gpuwatch`. Users
share it, so nothing in it is trusted: symlinks are never followed, only
regular files are read, records are checked field by field, a lease's user is
its file's owner, and a directory that another user could empty is refused.
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
from gpuwatch.models import Device, GpuSample, Lease

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

    from gpuwatch.policy import Request, Waiter

# Paths are plain strings here: pathlib costs `gpuwatch pick` start-up time.

ENV_VARIABLE = "GPUWATCH_LEASE_DIR"
HELD_VARIABLE = "GPUWATCH_HELD"
"""Lease ids a job holds, passed down to the processes it starts: their GPUs are its own."""
SYSTEM_DIR = "/run/gpuwatch"
FALLBACK_DIR = "/tmp/gpuwatch"
_SHARED_MODE = 0o1777  # everyone may add files; only a file's owner may remove it
_FILE_MODE = 0o644
_MAX_FILE_BYTES = 64 << 10
_MAX_COMMAND_CHARS = 4096
_HIGH_FD = 512  # where a lease's descriptor goes in a command: out of the way of shell redirections
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_LEASE_FIELDS = {
    "gpu_uuid": (str,),
    "gpu_index": (int,),
    "pid": (int,),
    "command": (str,),
    "started_at": (int, float),
}


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


def held_by_this_job() -> frozenset[str]:
    """Ids of the leases held by this process or a job it runs under."""
    return frozenset(filter(None, os.environ.get(HELD_VARIABLE, "").split(",")))


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no passwd entry here, as in many containers
        return str(uid)


class HeldFile:
    """A locked file this process holds: the lock lasts until `release()` or every holder exits."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    def pass_to_child(self) -> None:
        """Lets a command this process execs inherit the lock, and keep it while it runs.

        The descriptor moves high, so that a shell script's `exec 3>log` and the
        like do not close it by accident.
        """
        high = fcntl.fcntl(self.fd, fcntl.F_DUPFD, _HIGH_FD)
        os.close(self.fd)
        self.fd = high
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
        """The lease directory for looking only; `None` when there is none (yet)."""
        path = os.fspath(path) if path is not None else default_lease_dir()
        if not os.path.isdir(path):
            return None
        try:
            return cls(path)
        except LeaseError:
            return None

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Holds the directory-wide lock: choose and claim inside it.

        The lock is on the directory itself, which no user can replace or
        chmod away from the others.
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._locked = True
            yield
        finally:
            self._locked = False
            os.close(fd)

    def leases(self) -> list[Lease]:
        """The leases in force. Under `locked()`, stale files are removed too."""
        found = []
        for name, data, owner in self._live_entries(".lease"):
            if (
                lease := _lease_from(data, lease_id=name.removesuffix(".lease"), user=owner)
            ) is not None:
                found.append(lease)
        return found

    def claim(self, gpu: Device, *, mem_bytes: int | None, command: str) -> HeldLease:
        """Takes a lease on `gpu` (or a MIG device) for this process. Call it under `locked()`."""
        record = {
            "gpu_uuid": str(gpu.uuid),
            "gpu_index": gpu.index if isinstance(gpu, GpuSample) else gpu.gpu_index,
            "pid": os.getpid(),
            "command": command[:_MAX_COMMAND_CHARS],
            "started_at": time.time(),
            "mem_bytes": mem_bytes,
        }
        fd, path = self._publish("lease", record)
        name = os.path.basename(path).removesuffix(".lease")
        lease = _lease_from(record, lease_id=name, user=user_name(os.getuid()))
        assert lease is not None
        return HeldLease(fd, path, lease)

    def drop(self, lease: Lease) -> None:
        """Removes a lease that no longer means anything (its MIG device is gone), even while
        its holder runs. Call it under `locked()`; another user's file stays, harmlessly."""
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.path, os.path.basename(f"{lease.lease_id}.lease")))

    def enqueue(self, request: Request, command: str) -> HeldFile:
        """Joins the line of waiting jobs; the returned ticket leaves it when released."""
        record = {
            "pid": os.getpid(),
            "command": command[:_MAX_COMMAND_CHARS],
            "request": request.to_dict(),
        }
        return HeldFile(*self._publish("wait", record))

    def waiting_before(self, ticket: HeldFile | None) -> list[Waiter]:
        """Jobs that joined the line before `ticket` (all of them when `None`), oldest first."""
        from gpuwatch.policy import Request, Waiter  # only pickers read the line

        waiters = []
        for name, data, owner in sorted(self._live_entries(".wait")):
            if ticket is not None and name >= os.path.basename(ticket.path):
                break
            try:
                waiters.append(
                    Waiter(_field(data, "pid", int), owner, Request.from_dict(data["request"]))
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue  # a malformed ticket: whoever wrote it is not in line
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
        if not self._owner_trusted(info):
            raise LeaseError(
                f"{self.path} belongs to {user_name(info.st_uid)}, who could remove anyone's "
                f"leases; have an administrator create {SYSTEM_DIR} (mode 1777, see README) "
                f"or set {ENV_VARIABLE}"
            )

    def _owner_trusted(self, info: os.stat_result) -> bool:
        """Root, this user, or whoever could create it in a directory only they may write."""
        if info.st_uid in (0, os.getuid()):
            return True
        parent = os.stat(os.path.dirname(os.path.abspath(self.path)))
        return not parent.st_mode & 0o022 and parent.st_uid == 0

    def _publish(self, suffix: str, record: dict[str, Any]) -> tuple[int, str]:
        """Writes `record` to a new locked file, made visible only once locked and complete."""
        # CLOCK_MONOTONIC is the same for every process on the machine and never steps back,
        # so names sort in arrival order.
        stem = f"{time.monotonic_ns():020d}-{os.getpid()}-{os.urandom(4).hex()}"
        draft = os.path.join(self.path, f".{stem}.tmp")
        try:
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, _FILE_MODE)
        except OSError as error:
            raise LeaseError(f"cannot write in {self.path}: {error.strerror}") from error
        try:
            os.fchmod(fd, _FILE_MODE)  # readable by all, whatever the umask
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

    def _live_entries(self, suffix: str) -> Iterator[tuple[str, dict[str, Any], str]]:
        """(file name, record, owner's name) of each held file ending in `suffix`."""
        try:
            names = [entry.name for entry in os.scandir(self.path)]
        except OSError as error:
            raise LeaseError(f"cannot list {self.path}: {error.strerror}") from error
        for name in names:
            if name.endswith(suffix):
                found = self._read_if_held(os.path.join(self.path, name))
                if found is not None:
                    yield name, found[0], user_name(found[1])
            elif name.endswith(".tmp") and self._locked:
                self._read_if_held(os.path.join(self.path, name))  # removes a dead draft

    def _read_if_held(self, path: str) -> tuple[dict[str, Any], int] | None:
        """(record, owner uid) of a held file; removes it (under the lock) when stale."""
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
                return (data, info.st_uid) if isinstance(data, dict) else None
            if self._locked:
                # Another user's file in a sticky directory cannot go: harmless, since unlocked.
                with contextlib.suppress(OSError):
                    os.unlink(path)
            return None
        except (ValueError, RecursionError):  # not JSON, or JSON nested to crash parsers
            return None
        finally:
            os.close(fd)


def _lease_from(data: dict[str, Any], *, lease_id: str, user: str) -> Lease | None:
    """A lease from a record, checked field by field; `None` when anything is off."""
    try:
        values = {name: _field(data, name, *kinds) for name, kinds in _LEASE_FIELDS.items()}
        mem_bytes = data.get("mem_bytes")
        if mem_bytes is not None:
            mem_bytes = _field(data, "mem_bytes", int)
    except (KeyError, TypeError):
        return None
    values["started_at"] = float(values["started_at"])
    return Lease(user=user, mem_bytes=mem_bytes, lease_id=lease_id, **values)


def _field(data: dict[str, Any], name: str, *kinds: type) -> Any:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"{name}: {value!r}")
    return value
