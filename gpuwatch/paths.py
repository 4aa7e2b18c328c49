"""Where the daemon's socket and the shared lease directory are: one answer for everyone.

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
"""

from __future__ import annotations

import os
import re
import stat
import zlib

from gpuwatch.errors import DaemonError, InvalidValueError, LeaseError

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
