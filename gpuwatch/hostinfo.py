"""What the host knows of a process the GPU driver reports: user, command, CPU, RSS.

The driver gives only pids. A pid may belong to another PID namespace (a
container), may have exited since, or may be hidden from this user (`hidepid`);
each of these gives no details, never an error.

Read straight from Linux's /proc: the five fields cost three small reads per
process, and `gpuwatch status` starts faster than it would through psutil.
"""

from __future__ import annotations

import os
import pwd
import time
from dataclasses import dataclass

_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# Positions in /proc/PID/stat after the ")" that closes the command name (see proc(5)).
_UTIME, _STIME, _STARTTIME, _RSS_PAGES = 11, 12, 19, 21


@dataclass(frozen=True, slots=True)
class HostProcess:
    """Host-side details of one process; `None` where the host would not tell."""

    user: str | None
    command: str | None
    cpu_pct: float | None
    rss_bytes: int | None
    started_at: float | None


class HostProcessTable:
    """Looks up pids, remembering each process so CPU use can be measured between looks.

    CPU use is never measured by sleeping: the first look at a process gives its
    lifetime average (as `ps` does), later looks the average since the last one
    (as `top` does).
    """

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        # pid -> (start time in clock ticks, CPU seconds, wall time) at the last look
        self._seen: dict[int, tuple[int, float, float]] = {}
        self._boot_time_s: float | None = None

    def lookup(self, pids: set[int]) -> dict[int, HostProcess]:
        """Details for each visible pid in `pids`; forgets processes not asked for."""
        for gone in self._seen.keys() - pids:
            del self._seen[gone]
        found = {}
        for pid in pids:
            details = self._lookup_one(pid)
            if details is not None:
                found[pid] = details
        return found

    def _lookup_one(self, pid: int) -> HostProcess | None:
        base = f"{self._proc}/{pid}"
        try:
            with open(f"{base}/stat", "rb") as stat_file:
                stat = stat_file.read().decode(errors="replace")
            with open(f"{base}/cmdline", "rb") as cmdline_file:
                argv = cmdline_file.read().decode(errors="replace").split("\0")
            uid = os.stat(base).st_uid
        except OSError:  # exited, another namespace, or hidden from us
            self._seen.pop(pid, None)
            return None
        name, fields = (
            stat[stat.find("(") + 1 : stat.rfind(")")],
            stat[stat.rfind(")") + 2 :].split(),
        )
        start_ticks = int(fields[_STARTTIME])
        cpu_s = (int(fields[_UTIME]) + int(fields[_STIME])) / _CLOCK_TICKS_PER_S
        started_at = self._boot_time() + start_ticks / _CLOCK_TICKS_PER_S
        now = time.time()
        seen_start, seen_cpu_s, seen_wall_s = self._seen.get(pid, (-1, 0.0, 0.0))
        if seen_start == start_ticks:
            cpu_pct = _percent(cpu_s - seen_cpu_s, now - seen_wall_s)
        else:  # first sight, or the pid now names another process
            cpu_pct = _percent(cpu_s, now - started_at)
        self._seen[pid] = (start_ticks, cpu_s, now)
        return HostProcess(
            user=_user_name(uid),
            command=" ".join(arg for arg in argv if arg) or name,
            cpu_pct=cpu_pct,
            rss_bytes=int(fields[_RSS_PAGES]) * _PAGE_BYTES,
            started_at=started_at,
        )

    def _boot_time(self) -> float:
        if self._boot_time_s is None:
            with open(f"{self._proc}/stat") as stat_file:
                line = next(line for line in stat_file if line.startswith("btime "))
            self._boot_time_s = float(line.split()[1])
        return self._boot_time_s


def _percent(cpu_s: float, wall_s: float) -> float | None:
    return round(100.0 * cpu_s / wall_s, 1) if wall_s > 0 else None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no passwd entry here, as in many containers
        return str(uid)


def lineage(pid: int | None = None, proc: str = "/proc") -> set[int]:
    """`pid` (default: this process) and its ancestors, up to the first one out of sight."""
    found: set[int] = set()
    current = os.getpid() if pid is None else pid
    while current > 0 and current not in found:
        found.add(current)
        try:
            with open(f"{proc}/{current}/stat", "rb") as stat_file:
                stat = stat_file.read().decode(errors="replace")
        except OSError:
            break
        current = int(stat[stat.rfind(")") + 2 :].split()[1])  # field 4, the parent's pid
    return found
