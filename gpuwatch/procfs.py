"""The one reader of Linux's `/proc`: what the kernel says of processes, locks and boot.

Two halves. The `parse_*` and `stat_*` functions are pure: a file's text in, facts out,
a `ValueError` (or `None`) for text that is not what proc(5) describes; they are tested
over recorded file contents. The `read_*` functions open the files, each read bounded,
and raise `OSError` for a process that is gone, hidden (`hidepid`) or in another PID
namespace; callers decide what that means for them.

Everything here is input another local user controls in part (a process names itself,
writes its own command line and environment): nothing read is trusted beyond its type.
Every function takes `proc`, the mount point, so tests can hand a directory of their own.
It imports nothing beyond `os`: `gpuwatch pick` loads it on its way to a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

PROC = "/proc"
INITIAL_PID_NAMESPACE = "pid:[4026531836]"  # the kernel's PROC_PID_INIT_INO, fixed since 3.8

# Positions in /proc/PID/stat counted from the field after the ")" that closes the
# command name (proc(5) numbers them from 1 at the pid: subtract 3).
STAT_STATE, STAT_PPID = 0, 1
STAT_UTIME, STAT_STIME, STAT_STARTTIME, STAT_RSS_PAGES = 11, 12, 19, 21

_STAT_BYTES = 1 << 12
_CMDLINE_BYTES = 1 << 16
_STATUS_BYTES = 64 << 10
_ENVIRON_BYTES = 1 << 20
_CGROUP_BYTES = 16 << 10
LOCKS_BYTES = 8 << 20  # a user can take many locks; never read without bound

FileKey = tuple[int, int, int]
"""(major, minor, inode): a file as `/proc/locks` names it."""


# --- pure: text in, facts out ---------------------------------------------------------------


def stat_fields(stat: str) -> list[str]:
    """The fields of /proc/PID/stat after the command name, which may hold spaces and
    parentheses of its own: the last ")" closes it. Index with the `STAT_*` positions."""
    return stat[stat.rfind(")") + 2 :].split()


def stat_name(stat: str) -> str:
    """The command name of /proc/PID/stat (`comm`, at most 15 characters, any bytes)."""
    return stat[stat.find("(") + 1 : stat.rfind(")")]


def stat_parent_pid(stat: str) -> int:
    """The parent's pid in /proc/PID/stat; `ValueError` (or `IndexError`) if it has none."""
    return int(stat_fields(stat)[STAT_PPID])


def parse_cmdline(raw: str) -> list[str]:
    """/proc/PID/cmdline split at its NULs (a trailing empty argument is the kernel's
    terminator; a rewritten command line padded with NULs keeps its empty tail here)."""
    return raw.split("\0")


def parse_boot_time(stat_lines: list[str]) -> float:
    """The boot time (seconds since the epoch) from the lines of /proc/stat."""
    for line in stat_lines:
        if line.startswith("btime "):
            return float(line.split()[1])
    raise ValueError("no btime line in /proc/stat")


def parse_status_uids(status: str) -> tuple[int, ...] | None:
    """The real, effective, saved and filesystem uids of /proc/PID/status; `None` when
    the `Uid:` line is absent or garbled."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            try:
                return tuple(int(uid) for uid in line.split()[1:])
            except ValueError:
                return None
    return None


def parse_locks(table: str) -> dict[FileKey, list[int]]:
    """Pids holding a `flock` on each file of /proc/locks; other lines are passed over."""
    holders: dict[FileKey, list[int]] = {}
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2171846 0 EOF"; waiters show "->" after the id.
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            key = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        holders.setdefault(key, []).append(pid)
    return holders


def parse_environ(raw: str) -> dict[str, str]:
    """/proc/PID/environ as names and values; an entry without `=` is passed over."""
    environment = {}
    for entry in raw.split("\0"):
        name, equals, value = entry.partition("=")
        if equals and name:
            environment[name] = value
    return environment


def parse_cgroup_paths(cgroup: str) -> list[str]:
    """The cgroup paths of /proc/PID/cgroup (`ID:CONTROLLERS:PATH` lines, v1 and v2);
    lines without two colons are passed over."""
    paths = []
    for line in cgroup.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3:
            paths.append(fields[2])
    return paths


def parse_meminfo(meminfo: str) -> dict[str, int]:
    """/proc/meminfo as bytes by name (`MemTotal`, `MemAvailable`, `SwapFree`, ...);
    lines that are not `Name: N kB` (or a bare count) are passed over."""
    sizes = {}
    for line in meminfo.splitlines():
        name, colon, rest = line.partition(":")
        words = rest.split()
        if not colon or not words or not words[0].isdigit():
            continue
        sizes[name] = int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    return sizes


def parse_cpu_times(stat: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot, from the `cpu` line of /proc/stat.

    Busy is all but idle and iowait, as `top` and psutil count; guest time is already
    inside user and nice, so it is not added again."""
    for line in stat.splitlines():
        if line.startswith("cpu "):
            ticks = [int(word) for word in line.split()[1:9]]
            if len(ticks) < 5:
                break
            total = sum(ticks)
            return total - ticks[3] - ticks[4], total
    raise ValueError("no cpu line in /proc/stat")


# --- reading ----------------------------------------------------------------------------------


def read_text(path: str, limit: int = _CMDLINE_BYTES) -> str:
    """At most `limit` bytes of `path`, decoded leniently (a process names itself)."""
    # os.open/os.read: a third of the cost of open() for these small files.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)


def open_stat(pid: int, proc: str = PROC) -> int:
    """/proc/PID/stat, opened: `pread_stat` of it describes the process afresh each time,
    and its `fstat` owner is the process's user."""
    return os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)


def pread_stat(fd: int) -> str:
    """The stat file open at `fd`, read again from its start."""
    return os.pread(fd, _STAT_BYTES, 0).decode(errors="replace")


def read_stat(pid: int, proc: str = PROC) -> str:
    return read_text(f"{proc}/{pid}/stat", _STAT_BYTES)


def read_cmdline(pid: int, proc: str = PROC) -> list[str]:
    return parse_cmdline(read_text(f"{proc}/{pid}/cmdline", _CMDLINE_BYTES))


def read_environ(pid: int, proc: str = PROC) -> dict[str, str]:
    """The environment `pid` started with; `PermissionError` unless it is ours (or root)."""
    return parse_environ(read_text(f"{proc}/{pid}/environ", _ENVIRON_BYTES))


def read_cgroup_paths(pid: int, proc: str = PROC) -> list[str]:
    """The cgroups `pid` belongs to (one path per hierarchy; a single one under cgroup v2)."""
    return parse_cgroup_paths(read_text(f"{proc}/{pid}/cgroup", _CGROUP_BYTES))


def owner_uid(pid: int, proc: str = PROC) -> int:
    """The uid that owns `pid`'s directory: its effective user."""
    return os.stat(f"{proc}/{pid}").st_uid


def parent_pid(pid: int, proc: str = PROC) -> int:
    """`pid`'s parent; `OSError` when it is not visible, `ValueError` for a garbled stat."""
    try:
        return stat_parent_pid(read_stat(pid, proc))
    except IndexError:
        raise ValueError(f"{proc}/{pid}/stat has no parent field") from None


def read_uids(pid: int, proc: str = PROC) -> tuple[int, ...] | None:
    """The uids of `pid` (real, effective, saved, filesystem); `None` when not visible."""
    try:
        return parse_status_uids(read_text(f"{proc}/{pid}/status", _STATUS_BYTES))
    except OSError:
        return None


def read_flock_holders(proc: str = PROC) -> dict[FileKey, list[int]]:
    """The holders of each `flock` in /proc/locks; empty when it cannot be read."""
    try:
        with open(f"{proc}/locks", "rb") as table:
            text = table.read(LOCKS_BYTES).decode("ascii", "replace")
    except OSError:
        return {}
    return parse_locks(text)


def read_boot_time(proc: str = PROC) -> float:
    with open(f"{proc}/stat") as stat:  # can be long: read it line by line
        for line in stat:
            if line.startswith("btime "):
                return parse_boot_time([line])
    raise ValueError(f"no btime line in {proc}/stat")


def read_meminfo(proc: str = PROC) -> dict[str, int]:
    return parse_meminfo(read_text(f"{proc}/meminfo", _STATUS_BYTES))


def read_cpu_times(proc: str = PROC) -> tuple[int, int]:
    # The cpu line comes first; the rest of the file (one line per CPU, interrupts) can be long.
    return parse_cpu_times(read_text(f"{proc}/stat", _STAT_BYTES))


def read_start_time(pid: int, proc: str = PROC) -> float:
    """When `pid` started (seconds since the epoch), as `ps` tells it."""
    started_ticks = int(stat_fields(read_stat(pid, proc))[STAT_STARTTIME])
    return read_boot_time(proc) + started_ticks / os.sysconf("SC_CLK_TCK")


def visible(pid: int, proc: str = PROC) -> bool:
    """Whether `pid` names a process this one can see (not gone, not hidden)."""
    try:
        os.stat(f"{proc}/{pid}")
    except OSError:
        return False
    return True


def in_initial_pid_namespace(proc: str = PROC) -> bool:
    """Whether this process sees the host's pids (true too when the kernel will not say)."""
    try:
        return os.readlink(f"{proc}/self/ns/pid") == INITIAL_PID_NAMESPACE
    except OSError:
        return True


def self_maps_mention(library: str, proc: str = PROC) -> bool:
    """Whether this process has `library` mapped; `OSError` when its maps are unreadable."""
    with open(f"{proc}/self/maps") as maps:
        return any(library in line for line in maps)


class Link:
    """One process as its family tree needs it: parent, owner's uid and name.

    A plain slotted class: a dataclass would import `dataclasses` into `gpuwatch pick`."""

    __slots__ = ("name", "pid", "ppid", "uid")

    def __init__(self, pid: int, ppid: int, uid: int, name: str) -> None:
        self.pid, self.ppid, self.uid, self.name = pid, ppid, uid, name

    def __repr__(self) -> str:
        return f"Link(pid={self.pid}, ppid={self.ppid}, uid={self.uid}, name={self.name!r})"


def read_lineage(pids: Iterable[int], proc: str = PROC, limit: int = 4096) -> list[Link]:
    """Each of `pids` and its ancestors below init; one not visible ends its chain there
    (gone, hidden, or in another PID namespace). At most `limit` processes in all."""
    found: dict[int, Link] = {}
    for start in pids:
        pid = start
        while pid > 1 and pid not in found and len(found) < limit:
            try:
                stat = read_stat(pid, proc)
                uid = owner_uid(pid, proc)
                ppid = stat_parent_pid(stat)
            except (OSError, ValueError, IndexError):
                break
            found[pid] = Link(pid, ppid, uid, stat_name(stat))
            pid = ppid
    return list(found.values())
