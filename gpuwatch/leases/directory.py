"""Leases: who holds which GPU, kept safe across processes with no daemon.

A lease is a small JSON file in the lease directory, locked with `flock` by
the process that took it. The lock travels with the open file into the
command that process runs, and the kernel drops it when the last process
holding the file exits, however it exits (SIGKILL too). A file whose lock
nobody holds is stale, and is removed by the next picker.

Choosing GPUs and claiming them happen under a lock on the directory itself,
so pickers started together see each other's claims. The lock is held only
around file operations, never across a driver or daemon call, and is waited on
with a deadline: any user can take it, and one who keeps it is named in the
error. Jobs waiting for GPUs queue as `.wait` files, locked the same way, in
arrival order.

The directory is `$GPUWATCH_LEASE_DIR`, else `/run/gpuwatch/leases` when
every user may write there (the systemd unit makes it so), else `/tmp/gpuwatch`
(see `gpuwatch.paths`); a simulated node's leases go to a directory of the user's
own for that simulation, so that they never hold a real GPU's lease. Users
share it, so nothing in it is trusted: symlinks are never followed, only
regular files are read, records are checked field by field (a bad one is
skipped and counted), a lease's user is its file's owner, and a waiting ticket
counts only while the process it names lives, belongs to the file's owner and
holds the file's lock. A held lease holds its GPU whatever its other fields
say, and a record is published whole or not at all.

Leases are advisory: a user who could remove them could as well run on any
GPU without one. So a directory another user could tamper with is used, with a
warning naming them, and one that cannot be used at all gives jobs no lease
(`LeaseDir.for_job`), never a failure; a path that is no directory is refused
and left as it is.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from gpuwatch.errors import LeaseBusyError, LeaseDirError, LeaseError, UnreadableFileError
from gpuwatch.leases.locking import file_key, flock_holders, flock_within, process_uids
from gpuwatch.leases.records import (
    MAX_COMMAND_CHARS,
    lease_from,
    record_from,
    request_record,
    waiter_from,
)
from gpuwatch.models import Device, GpuSample, Lease
from gpuwatch.paths import MAKE_SHARED_LEASE_DIR, default_lease_dir, open_regular_file
from gpuwatch.record_fields import Malformed
from gpuwatch.request import Request, Waiter

ENV_VARIABLE = "GPUWATCH_LEASE_DIR"
HELD_VARIABLE = "GPUWATCH_HELD"
"""Lease ids a job holds, passed down to the processes it starts: their GPUs are its own."""
_SHARED_MODE = 0o1777  # everyone may add files; only a file's owner may remove it
_FILE_MODE = 0o644
_MAX_FILE_BYTES = 64 << 10
_HIGH_FD = 512  # where a lease's descriptor goes in a command: out of the way of shell redirections
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_OWN_SUFFIXES = ("lease", "wait", "tmp")
LOCK_WAIT_S = 10.0
"""The longest a picker waits for the directory lock, which is held for milliseconds."""


class LeaseFiles(msgspec.Struct, frozen=True):
    """What a look at the lease directory found."""

    leases: list[Lease]
    skipped: int = 0
    """Files held by a live process but malformed (bad JSON, fields out of range, not a
    regular file): ignored, as if absent."""


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
        if self.fd < 0:
            return  # nothing held (see `Unleased`)
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

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        writing: bool = True,
        simulation: str | None = None,
    ) -> None:
        """The directory at `path`, else the default one for real GPUs or, for the
        simulated node `simulation` (`Backend.simulation`), that simulation's own."""
        self.path = os.fspath(path) if path is not None else default_lease_dir(simulation)
        self._locked = False
        self._unreadable = 0
        self.warning: str | None = None
        """Who could tamper with the leases here, when someone besides root and this user can."""
        self._prepare(writing)

    @classmethod
    def for_job(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        say: Callable[[str], None],
        simulation: str | None = None,
    ) -> LeaseDir:
        """The lease directory a job picks in, never refusing the job for it.

        `say` is told, in one line, who could tamper with the directory, or that
        the job is picked without a lease because the default directory cannot
        be used at all (another user made it unwritable). A directory the user
        named (`path`, `$GPUWATCH_LEASE_DIR`) that is not one raises `LeaseDirError`:
        a mistake they can fix.
        """
        try:
            lease_dir = cls(path, simulation=simulation)
        except LeaseError as error:
            named = path is not None or bool(os.environ.get(ENV_VARIABLE))
            if named and isinstance(error, LeaseDirError):
                raise
            say(f"picking without a lease, so another job may be given the same GPU: {error}")
            return Unleased(os.fspath(path) if path is not None else "")
        if lease_dir.warning is not None:
            say(lease_dir.warning)
        return lease_dir

    @classmethod
    def read_only(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        on_refused: Callable[[str], None] | None = None,
        simulation: str | None = None,
    ) -> LeaseDir | None:
        """The lease directory for looking only; `None` when there is none (yet), or when it
        cannot be used (then `on_refused` is told why, as it is who could tamper with one
        that is used)."""
        try:
            path = os.fspath(path) if path is not None else default_lease_dir(simulation)
            if not os.path.lexists(path):
                return None  # not made yet: nobody has leased
            lease_dir = cls(path, writing=False)
        except LeaseError as error:
            if on_refused is not None:
                on_refused(f"leases are not shown: {error}")
            return None
        if lease_dir.warning is not None and on_refused is not None:
            on_refused(lease_dir.warning)
        return lease_dir

    @contextmanager
    def locked(self, timeout_s: float = LOCK_WAIT_S) -> Iterator[None]:
        """Holds the directory-wide lock for file operations: re-read leases and claim
        inside it, never call the driver or the daemon inside it.

        The lock is on the directory itself, which no user can replace or
        chmod away from the others. Raises `LeaseBusyError`, naming the
        holder, when it stays held for `timeout_s`.
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if not flock_within(fd, timeout_s):
                raise LeaseBusyError(self._busy_message(fd, timeout_s))
            self._locked = True
            yield
        finally:
            self._locked = False
            os.close(fd)

    def _busy_message(self, fd: int, waited_s: float) -> str:
        pids = flock_holders().get(file_key(os.fstat(fd)), [])
        holders = ", ".join(_process_named(pid) for pid in pids if pid > 0)
        return (
            f"the lease directory {self.path} stayed locked for {waited_s:.1f}s by "
            f"{holders or 'a process not visible here'}, where a lock lasts milliseconds; "
            "ask its owner to stop it, or try again later"
        )

    def leases(self) -> list[Lease]:
        """The leases in force. Under `locked()`, stale files are removed too."""
        return self.read().leases

    def read(self) -> LeaseFiles:
        """The leases in force, and how many malformed files were skipped."""
        found, skipped = [], 0
        for name, data, info in self._live_entries(".lease"):
            try:
                found.append(
                    lease_from(
                        data, lease_id=name.removesuffix(".lease"), user=user_name(info.st_uid)
                    )
                )
            except Malformed:
                skipped += 1
        return LeaseFiles(found, skipped + self._unreadable)

    def claim(self, gpu: Device, *, mem_bytes: int | None, command: str) -> HeldLease:
        """Takes a lease on `gpu` (or a MIG device) for this process. Call it under `locked()`."""
        record = {
            "gpu_uuid": str(gpu.uuid),
            "gpu_index": gpu.index if isinstance(gpu, GpuSample) else gpu.gpu_index,
            "pid": os.getpid(),
            "command": command[:MAX_COMMAND_CHARS],
            "started_at": time.time(),
            "mem_bytes": mem_bytes,
        }
        try:
            lease = lease_from(record, lease_id="", user=user_name(os.getuid()))
        except Malformed as error:  # a GPU no reader would believe, say from a scenario
            raise LeaseError(f"cannot lease {gpu.uuid}: {error}") from None
        fd, path = self._publish("lease", record)
        lease_id = os.path.basename(path).removesuffix(".lease")
        return HeldLease(fd, path, msgspec.structs.replace(lease, lease_id=lease_id))

    def drop(self, lease: Lease) -> None:
        """Removes a lease that no longer means anything (its MIG device is gone), even while
        its holder runs. Call it under `locked()`; another user's file stays, harmlessly."""
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.path, os.path.basename(f"{lease.lease_id}.lease")))

    def enqueue(self, request: Request, command: str) -> HeldFile:
        """Joins the line of waiting jobs; the returned ticket leaves it when released."""
        record = {
            "pid": os.getpid(),
            "command": command[:MAX_COMMAND_CHARS],
            "request": request_record(request),
        }
        return HeldFile(*self._publish("wait", record))

    def waiting_before(self, ticket: HeldFile | None) -> list[Waiter]:
        """Jobs that joined the line before `ticket` (all of them when `None`), oldest first.

        A ticket counts only while the process it names is alive, belongs to the
        ticket file's owner and holds the file's lock: anyone can write a ticket,
        but not for someone else's process. `Waiter.waited_s` comes from the
        file's name, which a forger cannot date in the future.
        """
        entries = sorted(self._live_entries(".wait"), key=lambda entry: entry[0])
        if ticket is not None:
            mine = os.path.basename(ticket.path)
            entries = [entry for entry in entries if entry[0] < mine]
        holders = flock_holders() if entries else {}
        now_ns = time.monotonic_ns()
        waiters = []
        for name, data, info in entries:
            with contextlib.suppress(Malformed):
                waiters.append(
                    waiter_from(
                        name, data, info, user_name(info.st_uid), holders=holders, now_ns=now_ns
                    )
                )
        return waiters

    def _prepare(self, writing: bool) -> None:
        """Makes the directory if missing; refuses a path that is not one, never altering it,
        and, when `writing`, one this user cannot write.

        A directory another user made (or can empty) is used all the same, with
        `warning` saying who could tamper with it: leases are advisory, and a user
        who could remove them could as well run on any GPU without one.
        """
        try:
            os.mkdir(self.path, _SHARED_MODE)
            os.chmod(self.path, _SHARED_MODE)  # mkdir's mode is cut by the umask
        except FileExistsError:
            pass
        except OSError as error:
            raise LeaseDirError(
                f"cannot create the lease directory {self.path}: {error.strerror}; "
                f"set {ENV_VARIABLE} to a writable directory"
            ) from error
        info = os.lstat(self.path)
        if not stat.S_ISDIR(info.st_mode):
            raise LeaseDirError(
                f"the lease directory {self.path} is {_kind_of(info)}, not a directory: left as "
                f"it is; remove it or set {ENV_VARIABLE} to a directory"
            )
        if writing and not os.access(self.path, os.W_OK | os.X_OK):
            raise LeaseError(
                f"cannot write in the lease directory {self.path} (of {user_name(info.st_uid)}, "
                f"mode {stat.S_IMODE(info.st_mode):04o}); an administrator makes one for all "
                f"with `{MAKE_SHARED_LEASE_DIR}`"
            )
        self.warning = self._tamper_warning(info)

    def _tamper_warning(self, info: os.stat_result) -> str | None:
        """Who, besides root and this user, could remove or forge leases here; `None`: nobody."""
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            who = "every user" if info.st_mode & 0o002 else "its group"
            fix = f"`chmod +t {self.path}`"
        elif not self._owner_trusted(info):
            who, fix = user_name(info.st_uid), f"`{MAKE_SHARED_LEASE_DIR}`"
        else:
            return None
        return (
            f"the lease directory {self.path} lets {who} remove or forge leases (they are "
            f"advisory: anyone can use any GPU anyway); an administrator fixes it with {fix}"
        )

    def _owner_trusted(self, info: os.stat_result) -> bool:
        """Root, this user, or whoever could create it in a directory only they may write."""
        if info.st_uid in (0, os.getuid()):
            return True
        parent = os.stat(os.path.dirname(os.path.abspath(self.path)))
        return not parent.st_mode & 0o022 and parent.st_uid == 0

    def publish(self, suffix: str, record: dict[str, Any]) -> HeldFile:
        """Publishes `record` beside the leases, as a file held until released: how other
        kinds of record (training reports) are shared. `suffix` names the kind; the
        directory's own kinds are refused, so no such record reads as a lease or a ticket."""
        if not suffix.isalnum() or suffix in _OWN_SUFFIXES:
            raise ValueError(f"suffix {suffix!r}: give a word other than {_OWN_SUFFIXES}")
        return HeldFile(*self._publish(suffix, record))

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
            _write_all(fd, json.dumps(record).encode())
            final = os.path.join(self.path, f"{stem}.{suffix}")
            os.rename(draft, final)
        except BaseException as error:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(draft)
            if isinstance(error, OSError):
                raise LeaseError(
                    f"cannot write a {suffix} in {self.path}: {error.strerror or error}; "
                    f"free space there, or set {ENV_VARIABLE}"
                ) from error
            raise
        return fd, final

    def _live_entries(self, suffix: str) -> list[tuple[str, dict[str, Any], os.stat_result]]:
        """(file name, record, file status) of each held file ending in `suffix`.

        Held files that cannot be read as a record are counted in `_unreadable`.
        """
        try:
            names = [entry.name for entry in os.scandir(self.path)]
        except OSError as error:
            raise LeaseError(f"cannot list {self.path}: {error.strerror}") from error
        entries, self._unreadable = [], 0
        for name in names:
            if name.endswith(suffix):
                try:
                    found = self.read_held(os.path.join(self.path, name))
                except Malformed:
                    self._unreadable += 1
                    continue
                if found is not None:
                    entries.append((name, *found))
            elif name.endswith(".tmp") and self._locked:
                with contextlib.suppress(Malformed):  # removes a dead draft
                    self.read_held(os.path.join(self.path, name))
        return entries

    def read_held(self, path: str) -> tuple[dict[str, Any], os.stat_result] | None:
        """(record, status) of a file in this directory that a live process holds; `None`
        when it is gone or stale (and then removed, under the lock). Raises `Malformed` for
        anything else: not a regular file (a symlink), too large, not a JSON object."""
        try:
            with open_regular_file(path, _MAX_FILE_BYTES, follow_symlinks=False) as file:
                if _held(file.fd, path):
                    return record_from(file.read(), path), file.status
                if self._locked:
                    # Another user's file in a sticky directory cannot go: harmless, unlocked.
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                return None
        except UnreadableFileError as error:
            if error.errno == errno.ENOENT:
                return None  # removed meanwhile
            raise Malformed(path) from error  # a symlink, no regular file, unreadable, too large


def _held(fd: int, path: str) -> bool:
    """Whether a live process holds the file open at `fd` (its lock, shared with no one);
    `Malformed` where that cannot be told."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno != errno.EWOULDBLOCK:
            raise Malformed(path) from error
        return True
    return False


class Unleased(LeaseDir):
    """A lease directory that cannot be used: no leases are seen, and none is held.

    Jobs are still picked (as by `pick` without a command), so that a directory
    another user spoiled never fails a job.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.warning = None
        self._locked = False
        self._unreadable = 0

    @contextmanager
    def locked(self, timeout_s: float = LOCK_WAIT_S) -> Iterator[None]:
        yield

    def read(self) -> LeaseFiles:
        return LeaseFiles([])

    def waiting_before(self, ticket: HeldFile | None) -> list[Waiter]:
        return []

    def drop(self, lease: Lease) -> None:
        pass

    def _publish(self, suffix: str, record: dict[str, Any]) -> tuple[int, str]:
        return -1, ""  # a file held by nobody, released as a no-op


def _write_all(fd: int, data: bytes) -> None:
    """Writes all of `data`, or raises: a short write (a nearly full disk) would leave a
    record cut short, that readers would skip as malformed."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _kind_of(info: os.stat_result) -> str:
    """`a symlink`, `a FIFO`, ...: what stands where a directory was expected."""
    kinds = (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(info.st_mode)), "a special file")


def _process_named(pid: int) -> str:
    """`pid 4242 (alice)`, for messages about another process."""
    uids = process_uids(pid)
    return f"pid {pid} ({user_name(uids[0])})" if uids else f"pid {pid}"
