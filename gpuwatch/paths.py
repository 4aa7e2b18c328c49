"""Where the daemon's socket and the shared lease directory are, one answer for everyone;
and the one reader of files another user or machine may have written.

    /run/gpuwatch/              the daemon's: only it (or root) may write here
    /run/gpuwatch/gpuwatch.sock the API, open to every local user
    /run/gpuwatch/leases/       leases of every user: world-writable and sticky, like /tmp

Nobody but the daemon can put anything at its socket's path, so no other user
can stop it from starting or answer in its name. The daemon listens on
`--socket`, else `$RUNTIME_DIRECTORY/gpuwatch.sock` under systemd, else
`$XDG_RUNTIME_DIR/gpuwatch.sock`; without either (ssh without logind, cron,
containers) root takes the system socket, and any other user a directory of
their own: `/run/user/UID`, else `/tmp/gpuwatch-UID`. Clients look at
`$GPUWATCH_SOCKET`, else at the system socket, then at the user's own places.

A simulated node is nobody else's business: its daemon never takes the system
socket unless told to (`--socket`), and its leases live apart from real ones, in a
directory of the user's own for each simulation (`sim_lease_dir`), so that two users'
simulations, whose GPUs have the same made-up UUIDs, never collide.

A path a user gives gpuwatch to make something at (`--socket`, a lease
directory, a report) is checked with `existing`: only a thing of the kind
gpuwatch makes there may be reused or replaced; anything else is refused.

A file another user or machine may have written (a lease, a config, a report) is
read with `read_regular_file` (or `open_regular_file`), and by nothing else:

- No device is opened, and nothing blocks: the path is looked at (`stat`) before it
  is opened, so that a device is refused unopened (opening one can act: a tape
  rewinds, a terminal becomes the controlling one); it is opened with `O_NONBLOCK`,
  since a FIFO opened to read waits for a writer, for good if none comes; and the
  open file is looked at again (`fstat`), so that nothing swapped in between is read.
- At most `max_bytes` are read: a file past its cap is refused, saying "larger than
  X", never read in part, unless the caller asks for the head of a file
  (`RegularFile.read_head`, to tell what a file is by its first bytes).
- `O_CLOEXEC` (no command started meanwhile inherits the file) and `O_NOCTTY`; with
  `follow_symlinks=False` a symbolic link is refused (`lstat`, then `O_NOFOLLOW`),
  where a link would let its writer point the reader elsewhere (the lease
  directory, the jobs cache).

Every refusal is an `UnreadableFileError` whose message says what was wrong, without
the path, which each caller words into its own one-line message.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from gpuwatch.errors import DaemonError, InvalidValueError, LeaseError, UnreadableFileError
from gpuwatch.units import format_size

ENV_SOCKET = "GPUWATCH_SOCKET"
ENV_LEASE_DIR = "GPUWATCH_LEASE_DIR"
SOCKET_NAME = "gpuwatch.sock"
SYSTEM_DIR = "/run/gpuwatch"
SYSTEM_SOCKET = f"{SYSTEM_DIR}/{SOCKET_NAME}"
SYSTEM_LEASE_DIR = f"{SYSTEM_DIR}/leases"
FALLBACK_LEASE_DIR = "/tmp/gpuwatch"
SIM_LEASES = "gpuwatch-sim-leases"
"""Under a directory of the user's own: the leases of each simulation they run."""
MAKE_SHARED_LEASE_DIR = f"sudo install -d -m 1777 {SYSTEM_LEASE_DIR}"
"""The one command that gives every user of a machine a lease directory they can share."""
_STICKY_SHARED = 0o1777
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK_BYTES = 64 << 10  # what a read asks for beyond the size the file had when opened


def socket_candidates() -> list[str]:
    """Where clients look for a daemon, in order."""
    if configured := os.environ.get(ENV_SOCKET):
        return [configured]
    candidates = [SYSTEM_SOCKET]
    if runtime_dir := os.environ.get("XDG_RUNTIME_DIR"):
        candidates.append(os.path.join(runtime_dir, SOCKET_NAME))
    else:
        candidates.append(os.path.join(_user_run_dir(), SOCKET_NAME))
    candidates.append(os.path.join(_user_tmp_dir(), SOCKET_NAME))
    return candidates


def daemon_socket_path(*, simulated: bool = False) -> str:
    """Where a daemon started without `--socket` listens; makes its directory if needed.

    A `simulated` node's daemon listens in the user's own places only: at the system's
    socket (or systemd's runtime directory, which is it) every user's clients would take
    it for the machine's GPUs. Raises `DaemonError` where no such place is this user's
    alone (see `_own_dir`)."""
    variables = ("XDG_RUNTIME_DIR",) if simulated else ("RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR")
    for variable in variables:
        if directory := os.environ.get(variable):
            # systemd may list several runtime directories, separated by colons.
            return os.path.join(directory.split(":")[0], SOCKET_NAME)
    if not simulated and os.geteuid() == 0 and _private_dir(SYSTEM_DIR, 0o755):
        return SYSTEM_SOCKET
    return os.path.join(_own_dir(), SOCKET_NAME)


def sim_lease_dir(simulation: str) -> str:
    """Where the leases of the simulated node `simulation` go (unless `$GPUWATCH_LEASE_DIR`
    says): a directory of this user's own for it, under `$XDG_RUNTIME_DIR`, else
    `/tmp/gpuwatch-UID`; the directory above it is made if missing.

    `simulation` names the simulated node (`Backend.simulation`): a GPU count, a
    scenario file or a simulated daemon's socket. Anything but letters, digits, `.`, `_`
    and `-` in it becomes `_`. Raises `LeaseError` where neither place is this user's
    alone: a place of one run's own would hide its leases from the next run.
    """
    name = re.sub(r"[^A-Za-z0-9._-]", "_", simulation)[:100].lstrip(".") or "_"
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir and _private_dir(parent := os.path.join(runtime_dir, SIM_LEASES), 0o700):
        return os.path.join(parent, name)
    own = _user_tmp_dir()
    if _private_dir(own, 0o700) and _private_dir(parent := os.path.join(own, SIM_LEASES), 0o700):
        return os.path.join(parent, name)
    raise LeaseError(
        f"no directory of this user's own for simulated leases: {own} is not this user's "
        f"alone; remove it, or set XDG_RUNTIME_DIR or {ENV_LEASE_DIR}"
    )


def served_simulation(socket_path: str) -> str:
    """The `simulation` (see `sim_lease_dir`) of a simulated node a daemon serves at
    `socket_path`: the daemon and its clients, knowing the same socket, name it alike."""
    # A checksum tells a user's few sockets apart; hashlib would load OpenSSL for it
    # (11 M instructions, a tenth of a command's own start-up).
    digest = zlib.crc32(os.path.realpath(socket_path).encode())
    return f"daemon-{digest:08x}"


def default_lease_dir(simulation: str | None = None) -> str:
    """`$GPUWATCH_LEASE_DIR`, else for a simulated node its own (`sim_lease_dir`), else
    the system's shared directory when it is there, else `/tmp/gpuwatch` (which other users
    use with a warning unless root made it: see `MAKE_SHARED_LEASE_DIR`)."""
    if configured := os.environ.get(ENV_LEASE_DIR):
        return configured
    if simulation is not None:
        return sim_lease_dir(simulation)
    try:
        info = os.lstat(SYSTEM_LEASE_DIR)
    except OSError:
        return FALLBACK_LEASE_DIR
    shared = stat.S_ISDIR(info.st_mode) and info.st_mode & _STICKY_SHARED == _STICKY_SHARED
    return SYSTEM_LEASE_DIR if shared else FALLBACK_LEASE_DIR


_KINDS = {
    stat.S_IFSOCK: "socket",
    stat.S_IFDIR: "directory",
    stat.S_IFREG: "regular file",
    stat.S_IFLNK: "symbolic link",
    stat.S_IFIFO: "FIFO",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}


def existing(path: str, kind: int, option: str) -> os.stat_result | None:
    """What is at `path` (not following a link) when it is of `kind` (`stat.S_IFSOCK`,
    `stat.S_IFDIR`, ...); `None` when nothing is. Anything else there is refused, and
    left untouched: a path given to gpuwatch never makes it replace what it did not make.

    Raises `InvalidValueError` (a usage error) naming `option`, the path and what is there.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise InvalidValueError(f"{option} {path}: cannot look there ({error.strerror})") from None
    found = stat.S_IFMT(info.st_mode)
    if found != kind:
        raise InvalidValueError(
            f"{option} {path}: a {_KINDS.get(found, 'file')} is there, not a {_KINDS[kind]}; "
            "it is left alone: give another path"
        )
    return info


class RegularFile:
    """A regular file, open for reading and checked: its `status` (as `fstat` says) and
    what is left of it to read, at most `max_bytes` in all."""

    def __init__(self, fd: int, status: os.stat_result, max_bytes: int) -> None:
        self.fd = fd
        self.status = status
        self.max_bytes = max_bytes
        self._offset = 0

    def read(self, max_bytes: int | None = None) -> bytes:
        """The rest of the file; `UnreadableFileError` ("larger than X") where it holds more
        than `max_bytes` (by default, what is left of the file's cap)."""
        cap = self.max_bytes - self._offset if max_bytes is None else max_bytes
        data = self._read_up_to(cap + 1)
        if len(data) > cap:
            raise _too_large(cap)
        return data

    def read_head(self, size_bytes: int) -> bytes:
        """The next `size_bytes` of the file, or fewer where it ends first: the head of a
        file, cut short on purpose."""
        return self._read_up_to(min(size_bytes, self.max_bytes - self._offset))

    def _read_up_to(self, size_bytes: int) -> bytes:
        # The first read asks for the size the file had, and one byte more: a file read whole
        # in one call, into one buffer no larger than the file, however large the cap.
        chunks, left = [], size_bytes
        want = max(self.status.st_size - self._offset + 1, _CHUNK_BYTES)
        try:
            while left > 0 and (chunk := os.read(self.fd, min(left, want))):
                chunks.append(chunk)
                left -= len(chunk)
                want = _CHUNK_BYTES
        except OSError as error:
            raise _refusal(error) from None
        self._offset += size_bytes - left
        return b"".join(chunks)


def read_regular_file(
    path: str | os.PathLike[str], max_bytes: int, *, follow_symlinks: bool = True
) -> bytes:
    """All of the regular file at `path`, at most `max_bytes`; `UnreadableFileError` saying
    why not (missing, forbidden, no regular file, a symlink not followed, larger)."""
    with open_regular_file(path, max_bytes, follow_symlinks=follow_symlinks) as file:
        return file.read()


@contextmanager
def open_regular_file(
    path: str | os.PathLike[str], max_bytes: int, *, follow_symlinks: bool = True
) -> Iterator[RegularFile]:
    """The regular file at `path`, open for as long as the block runs, for a caller that
    looks at its status (its owner, its size) or locks it before reading, or reads its head.

    Refused (`UnreadableFileError`) before anything is read where it is missing, forbidden,
    no regular file, a symlink not to be followed, or larger than `max_bytes` already.
    """
    try:
        _check(os.stat(path, follow_symlinks=follow_symlinks), max_bytes)
        fd = os.open(path, _OPEN_FLAGS if follow_symlinks else _OPEN_FLAGS | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno == errno.ELOOP and not follow_symlinks:  # swapped in after the lstat
            link = f"a {_KINDS[stat.S_IFLNK]}"
            raise UnreadableFileError(f"{link}, not a regular file", kind=link) from None
        raise _refusal(error) from None
    try:
        status = os.fstat(fd)
        _check(status, max_bytes)
        yield RegularFile(fd, status, max_bytes)
    finally:
        os.close(fd)


def _too_large(max_bytes: int) -> UnreadableFileError:
    """The refusal of a file over its cap: "larger than 1MiB"."""
    return UnreadableFileError(
        f"larger than {format_size(max_bytes, precision=0)}", max_bytes=max_bytes
    )


def _check(status: os.stat_result, max_bytes: int) -> None:
    found = stat.S_IFMT(status.st_mode)
    if found != stat.S_IFREG:
        kind = f"a {_KINDS.get(found, 'special file')}"
        raise UnreadableFileError(f"{kind}, not a regular file", kind=kind)
    if status.st_size > max_bytes:
        raise _too_large(max_bytes)


def _refusal(error: OSError) -> UnreadableFileError:
    """The system's error in its own words: "Permission denied"."""
    return UnreadableFileError(error.strerror or str(error), errno=error.errno)


def _own_dir() -> str:
    """A directory of this user's alone, made if missing: `/run/user/UID`, else
    `/tmp/gpuwatch-UID`. Raises `DaemonError` when someone else took both: a socket
    anywhere else is one no client looks for."""
    for path in (_user_run_dir(), _user_tmp_dir()):
        if _private_dir(path, 0o700):
            return path
    raise DaemonError(
        f"no directory of this user's own for the socket: {_user_tmp_dir()} is not this "
        f"user's alone; remove it, or set XDG_RUNTIME_DIR, or give --socket PATH"
    )


def _user_run_dir() -> str:
    return f"/run/user/{os.geteuid()}"


def _user_tmp_dir() -> str:
    return f"/tmp/gpuwatch-{os.geteuid()}"


def _private_dir(path: str, mode: int) -> bool:
    """Makes `path` (a directory of this user) if missing; whether it is this user's alone."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022
