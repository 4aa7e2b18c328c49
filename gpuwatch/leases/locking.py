"""File locks shared with other users: taken with a deadline, and their holders named.

`flock()` has no timeout, and a lock that any user can take must never be
waited on without one: here it is tried without blocking, in short pauses,
until the deadline. The kernel's table of locks, `/proc/locks`, says which
process holds a lock on which file (by device and inode), so that a message
can name it and a waiting ticket can be checked against its real holder.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable

from gpuwatch import procfs

FileKey = procfs.FileKey
"""(major, minor, inode): a file as `/proc/locks` names it."""
_FIRST_PAUSE_S = 0.002
_LONGEST_PAUSE_S = 0.05


def flock_within(
    fd: int,
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Takes an exclusive `flock` on `fd` within `timeout_s`; False when it stayed held."""
    deadline = clock() + max(0.0, timeout_s)
    pause_s = _FIRST_PAUSE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        left_s = deadline - clock()
        if left_s <= 0:
            return False
        sleep(min(pause_s, left_s))
        pause_s = min(pause_s * 2, _LONGEST_PAUSE_S)


def file_key(info: os.stat_result) -> FileKey:
    return os.major(info.st_dev), os.minor(info.st_dev), info.st_ino


def flock_holders() -> dict[FileKey, list[int]]:
    """Pids holding a `flock` on each locked file; empty when the table cannot be read.

    A pid is as this process's pid namespace sees it; 0 for a holder outside it.
    """
    return procfs.read_flock_holders()


def process_uids(pid: int) -> tuple[int, ...] | None:
    """The real, effective and saved uids of `pid`; `None` when no such process is
    visible here."""
    return procfs.read_uids(pid)
