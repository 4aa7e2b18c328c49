"""What the detail view says of one process beyond its row: parents and environment.

Read from this machine's /proc (`gpuwatch.procfs`), each part failing on its own
into a sentence (another user's environment is not readable, a process in
another container is not visible).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gpuwatch import procfs
from gpuwatch.tui.common.render import printable

MAX_PARENTS = 32


@dataclass(frozen=True, slots=True)
class ProcessDetails:
    command: str | None
    """The command line as typed (arguments quoted), when readable."""
    parents: tuple[str, ...]
    """`pid user name` of each ancestor, nearest first; or one line saying why not."""
    environment: tuple[str, ...]
    """`NAME=value` lines, sorted; or one line saying why not."""


def read_details(pid: int, proc: str = procfs.PROC) -> ProcessDetails:
    if not procfs.visible(pid, proc):
        gone = ("not visible from this machine (another container, or it has exited)",)
        return ProcessDetails(None, gone, gone)
    return ProcessDetails(_command(pid, proc), _parents(pid, proc), _environment(pid, proc))


def _command(pid: int, proc: str) -> str | None:
    try:
        argv = procfs.read_cmdline(pid, proc)
    except OSError:
        return None
    while argv and not argv[-1]:
        argv.pop()  # the kernel's terminating NUL, or a rewritten command line's padding
    return printable(shlex.join(argv)) if argv else None


def _parents(pid: int, proc: str) -> tuple[str, ...]:
    from gpuwatch.leases.directory import user_name

    try:
        parent = procfs.parent_pid(pid, proc)
    except (OSError, ValueError) as error:
        return (f"not readable: {type(error).__name__}",)
    lines: list[str] = []
    while parent > 0 and len(lines) < MAX_PARENTS:
        try:
            stat = procfs.read_stat(parent, proc)
            user = user_name(procfs.owner_uid(parent, proc))
            lines.append(f"{parent:>8}  {user:<10} {printable(procfs.stat_name(stat))}")
            parent = procfs.stat_parent_pid(stat)
        except (OSError, ValueError, IndexError):
            lines.append(f"{parent:>8}  (not readable)")
            break
    return tuple(lines) or ("(none)",)


def _environment(pid: int, proc: str) -> tuple[str, ...]:
    try:
        environment = procfs.read_environ(pid, proc)
    except PermissionError:
        return ("not readable by you (only its owner and root may read it)",)
    except OSError as error:
        return (f"not readable: {type(error).__name__}",)
    return tuple(printable(f"{name}={value}") for name, value in sorted(environment.items()))


def remote_details() -> ProcessDetails:
    elsewhere = ("on another machine: only what gpuwatch status reports there is shown",)
    return ProcessDetails(None, elsewhere, elsewhere)
