"""What the detail view says of one process beyond its row: parents and environment.

Read from this machine through psutil, each part failing on its own
into a sentence (another user's environment is not readable, a process in
another container is not visible).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import psutil

from gpuwatch.leases.directory import user_name
from gpuwatch.tui.render import printable

MAX_PARENTS = 32


@dataclass(frozen=True, slots=True)
class ProcessDetails:
    command: str | None
    """The command line as typed (arguments quoted), when readable."""
    parents: tuple[str, ...]
    """`pid user name` of each ancestor, nearest first; or one line saying why not."""
    environment: tuple[str, ...]
    """`NAME=value` lines, sorted; or one line saying why not."""


def read_details(pid: int) -> ProcessDetails:
    try:
        process = psutil.Process(pid)
    except psutil.Error:
        gone = ("not visible from this machine (another container, or it has exited)",)
        return ProcessDetails(None, gone, gone)
    return ProcessDetails(_command(process), _parents(process), _environment(process))


def _command(process: psutil.Process) -> str | None:
    try:
        argv = process.cmdline()
    except psutil.Error:
        return None
    while argv and not argv[-1]:
        argv.pop()  # the kernel's terminating NUL, or a rewritten command line's padding
    return printable(shlex.join(argv)) if argv else None


def _parents(process: psutil.Process) -> tuple[str, ...]:
    try:
        parent = process.ppid()
    except psutil.Error as error:
        return (f"not readable: {type(error).__name__}",)
    lines: list[str] = []
    while parent > 0 and len(lines) < MAX_PARENTS:
        try:
            ancestor = psutil.Process(parent)
            with ancestor.oneshot():
                user = user_name(ancestor.uids().effective)
                lines.append(f"{parent:>8}  {user:<10} {printable(ancestor.name())}")
                parent = ancestor.ppid()
        except psutil.Error:
            lines.append(f"{parent:>8}  (not readable)")
            break
    return tuple(lines) or ("(none)",)


def _environment(process: psutil.Process) -> tuple[str, ...]:
    try:
        environment = process.environ()
    except psutil.AccessDenied:
        return ("not readable by you (only its owner and root may read it)",)
    except psutil.Error as error:
        return (f"not readable: {type(error).__name__}",)
    return tuple(printable(f"{name}={value}") for name, value in sorted(environment.items()))


def remote_details() -> ProcessDetails:
    elsewhere = ("on another machine: only what gpuwatch status reports there is shown",)
    return ProcessDetails(None, elsewhere, elsewhere)
