"""What `gpuwatch status` costs over a bare interpreter while the daemon is up.

With the daemon up, status loads no driver: what is left is its own imports and work.

- wall and CPU time of the console script (`gpuwatch status`, the table, and
  `gpuwatch status --json`) beside `python -c pass`, runs interleaved, median and
  range (CPU is the children's user + system time, less noisy than wall);
- the imports that cost most (`python -X importtime`, each module's best of the runs);
- the work after the imports, phase by phase (best and median of the runs).

The daemon serves a simulated node (`--sim GPUS`, default 8), and a job holds a
lease on one of its GPUs, as on a machine where pick is used. Modules are read
from their bytecode caches, as from an installed package (PYTHONDONTWRITEBYTECODE
is dropped, and a first run writes them). Run:
python bench/status_startup.py [RUNS] [GPUS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pick_startup import GPUWATCH, PYTHON, imports, phases, spread, start_daemon, timed

# The steps of a one-shot `gpuwatch status`, timed one by one.
PHASES = """
import io, json, sys, time
marks = [("start", time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
from gpuwatch.cli import main
mark("import gpuwatch.cli (click, the group)")
from gpuwatch.cli.group import command
command("status")
mark("import gpuwatch.cli.status")
from gpuwatch.backends.daemon_client import DaemonBackend
mark("import the daemon client")
from gpuwatch.leases.directory import LeaseDir
lease_dir = LeaseDir.read_only()
leases = lease_dir.read().leases if lease_dir is not None else []
mark("read the lease directory")
snapshot = DaemonBackend().sample()
mark("fetch and read the snapshot")
from gpuwatch.cli.table import Style, render
mark("import the table")
text = render(snapshot, leases=leases, style=Style(color=False, unicode=True), width=120)
mark("draw the table")
print(json.dumps([(name, (t - marks[i][1]) * 1e3) for i, (name, t) in enumerate(marks[1:])]))
"""

COMMANDS = {
    "python -c pass": [PYTHON, "-c", "pass"],
    "gpuwatch status": [GPUWATCH, "status"],
    "gpuwatch status --json": [GPUWATCH, "status", "--json"],
}


def startup(env: dict[str, str], runs: int) -> None:
    walls: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpus: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(runs):
        for name, argv in COMMANDS.items():
            wall, cpu = timed(argv, env)
            walls[name].append(wall)
            cpus[name].append(cpu)
    print(f"{runs} runs each, interleaved; median (min to max):")
    for name in COMMANDS:
        print(f"  {name:<28} wall {spread(walls[name])}   CPU {spread(cpus[name])}")
    bare = "python -c pass"
    for name in list(COMMANDS)[1:]:
        over_wall = statistics.median(walls[name]) - statistics.median(walls[bare])
        over_cpu = statistics.median(cpus[name]) - statistics.median(cpus[bare])
        print(f"  {name} over bare python: wall {over_wall:+.1f} ms, CPU {over_cpu:+.1f} ms")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    gpus = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    work = Path(tempfile.mkdtemp())
    daemon, socket_path = start_daemon(work, str(gpus))
    env = {
        **os.environ,
        "GPUWATCH_SOCKET": socket_path,
        "GPUWATCH_LEASE_DIR": str(work / "l"),
        "COLUMNS": "120",
    }
    for name in (
        *("GPUWATCH_SIM", "GPUWATCH_BACKEND", "CUDA_VISIBLE_DEVICES", "NO_COLOR"),
        "PYTHONDONTWRITEBYTECODE",
    ):
        env.pop(name, None)
    job = subprocess.Popen([GPUWATCH, "pick", "--", "sleep", "3600"], env=env)
    try:
        while not any((work / "l").glob("*.lease")) and job.poll() is None:
            time.sleep(0.1)
        for argv in COMMANDS.values():  # writes the bytecode caches
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
        print(f"gpuwatch daemon --sim {gpus} up; GPUWATCH_SOCKET={socket_path}; one job leasing")
        print(f"load average: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
        startup(env, runs)
        imports(env, max(5, runs // 2), argv=["status"])
        phases(env, max(5, runs // 2), PHASES, "status's phases, best and median of {runs}:")
    finally:
        job.terminate()
        job.wait()
        daemon.terminate()
        daemon.wait()


if __name__ == "__main__":
    main()
