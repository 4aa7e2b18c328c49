"""What the daemon's per-second look at each GPU process costs: one `pread` of its
/proc/PID/stat, kept open (`gpuwatch.procfs.read_usage`), against opening the file for each
read and against psutil's readings of the same figures.

Over PROCESSES live processes (default 100, as bench/daemon_cost.py runs), the median CPU
time of one look at all of them, repeated: the read the table makes, the same opening the
file each time, psutil's `cpu_times()` and `memory_info()` under `oneshot()`, the same with
its check that the pid still names the same process (`is_running()`), and the whole
`HostProcessTable.lookup` once it knows them. At 1 Hz, the CPU time of one look is that
share of a core.

Run: python bench/process_details_cost.py [PROCESSES]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import psutil

from gpuwatch import procfs
from gpuwatch.hostinfo import HostProcessTable

LOOKS = 10  # looks at every process in one timing
TIMINGS = 15


def cpu_s_of(look: Callable[[], object]) -> float:
    """The median CPU time of one `look`."""
    spent = []
    for _ in range(TIMINGS):
        start = time.process_time()
        for _ in range(LOOKS):
            look()
        spent.append((time.process_time() - start) / LOOKS)
    return statistics.median(spent)


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(count)]
    try:
        pids = {sleeper.pid for sleeper in sleepers}
        stat_fds = [procfs.open_stat(pid) for pid in pids]
        processes = [psutil.Process(pid) for pid in pids]
        table = HostProcessTable()
        table.lookup(pids)

        def psutil_oneshot() -> None:
            for process in processes:
                with process.oneshot():
                    process.cpu_times()
                    process.memory_info()

        def psutil_checked() -> None:
            for process in processes:
                if process.is_running():
                    with process.oneshot():
                        process.cpu_times()
                        process.memory_info()

        looks = {
            "procfs.read_usage, kept open": lambda: [procfs.read_usage(fd) for fd in stat_fds],
            "procfs.read_usage_of, opened": lambda: [procfs.read_usage_of(pid) for pid in pids],
            "psutil cpu_times+memory_info": psutil_oneshot,
            "psutil, with is_running()": psutil_checked,
            "HostProcessTable.lookup": lambda: table.lookup(pids),
        }
        print(f"one look at {count} live processes, median CPU time of {TIMINGS} x {LOOKS}:")
        for name, look in looks.items():
            spent_s = cpu_s_of(look)
            print(
                f"  {name:<30} {spent_s * 1e6 / count:6.1f} us a process   "
                f"{spent_s * 100:5.2f} % of a core at 1 Hz"
            )
        for stat_fd in stat_fds:
            os.close(stat_fd)
        table.close()
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


if __name__ == "__main__":
    main()
