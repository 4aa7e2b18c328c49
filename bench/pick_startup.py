"""What `gpuwatch pick -n 2 -- true` costs over a bare interpreter while the daemon is up.

With the daemon up, pick loads no driver: what is left is its own imports and work.

- wall and CPU time of the console script beside `python -c pass`, runs interleaved,
  median and range (CPU is the children's user + system time, less noisy than wall);
- the imports that cost most (`python -X importtime`, each module's best of the runs);
- the work after the imports, phase by phase (best and median of the runs).

The daemon serves a simulated node (`--sim GPUS`, default 8). Run:
python bench/pick_startup.py [RUNS] [GPUS]
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _common import start_daemon

PYTHON = sys.executable
GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))  # the console script users run
PICK_ARGV = ("pick", "-n", "2", "--", "true")

# The steps of `gpuwatch pick -n 2 -- true`, timed one by one (the exec is left out).
PHASES = """
import json, os, sys, time
marks = [("start", time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
from gpuwatch.cli import main
mark("import gpuwatch.cli (click, the group)")
from gpuwatch.cli.group import command
pick = command("pick")
mark("import gpuwatch.cli.pick")
from gpuwatch.choices import Format
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.placement.acquire import acquire, passed_down
from gpuwatch.placement.visible import child_environment
from gpuwatch.placement.wanted import wanted as wanted_from
from gpuwatch.request import Request
wanted = wanted_from(Request(count=2), (), environ=os.environ, by_pick=True)
lease_dir = LeaseDir.for_job(say=print)
mark("read options, open lease directory")
from gpuwatch.backends.daemon_client import DaemonBackend
mark("import the daemon client")
backend = DaemonBackend()
mark("fetch and read the snapshot")
chosen, leases = acquire(backend, wanted, lease_dir=lease_dir, command="true")
mark("choose and lease (under the lock)")
env = passed_down(leases, child_environment(chosen, Format.UUID, os.environ))
for lease in leases:
    lease.pass_to_child()
mark("environment for the command")
print(json.dumps([(name, (t - marks[i][1]) * 1e3) for i, (name, t) in enumerate(marks[1:])]))
"""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall * 1e3, cpu * 1e3


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} ms  ({min(values):5.1f} to {max(values):5.1f})"


def startup(env: dict[str, str], runs: int) -> None:
    commands = {
        "python -c pass": [PYTHON, "-c", "pass"],
        "gpuwatch pick -n 2 -- true": [GPUWATCH, "pick", "-n", "2", "--", "true"],
    }
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            wall, cpu = timed(argv, env)
            walls[name].append(wall)
            cpus[name].append(cpu)
    print(f"{runs} runs each, interleaved; median (min to max):")
    for name in commands:
        print(f"  {name:<28} wall {spread(walls[name])}   CPU {spread(cpus[name])}")
    pick, bare = "gpuwatch pick -n 2 -- true", "python -c pass"
    over_wall = statistics.median(walls[pick]) - statistics.median(walls[bare])
    over_cpu = statistics.median(cpus[pick]) - statistics.median(cpus[bare])
    print(f"  pick over bare python: wall {over_wall:+.1f} ms, CPU {over_cpu:+.1f} ms")


def imports(
    env: dict[str, str], runs: int, shown: int = 12, argv: Sequence[str] = PICK_ARGV
) -> None:
    best: dict[str, int] = {}
    line = re.compile(r"import time:\s+(\d+) \|\s+\d+ \| +(\S+)")
    for _ in range(runs):
        result = subprocess.run(
            [PYTHON, "-X", "importtime", GPUWATCH, *argv],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        for match in line.finditer(result.stderr):
            us, name = int(match.group(1)), match.group(2)
            best[name] = min(best.get(name, us), us)
    bare = subprocess.run(
        [PYTHON, "-X", "importtime", "-c", "pass"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    at_start = {match.group(2) for match in line.finditer(bare.stderr)}
    ours = {name: us for name, us in best.items() if name not in at_start}
    print(
        f"imports beyond bare python's: {len(ours)} modules, {sum(ours.values()) / 1e3:.1f} ms "
        f"(each module's own time, best of {runs}); the costliest:"
    )
    for name, us in sorted(ours.items(), key=lambda item: -item[1])[:shown]:
        print(f"  {name:<32} {us / 1e3:5.2f} ms")


def phases(
    env: dict[str, str],
    runs: int,
    script: str = PHASES,
    title: str = "pick's phases, best and median of {runs} (the exec of the command left out):",
) -> None:
    """Runs `script`, which prints `[[phase, ms], ...]` last, `runs` times; prints each phase."""
    times: dict[str, list[float]] = {}
    for _ in range(runs):
        out = subprocess.run(
            [PYTHON, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout
        for name, ms in json.loads(out.splitlines()[-1]):
            times.setdefault(name, []).append(ms)
    print(title.format(runs=runs))
    for name, values in times.items():
        print(f"  {name:<36} {min(values):5.2f} ms  {statistics.median(values):5.2f} ms")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    gpus = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    work = Path(tempfile.mkdtemp())
    daemon, socket_path = start_daemon(work, str(gpus))
    env = {**os.environ, "GPUWATCH_SOCKET": socket_path, "GPUWATCH_LEASE_DIR": str(work / "l")}
    for name in ("GPUWATCH_SIM", "GPUWATCH_BACKEND", "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    try:
        print(f"gpuwatch daemon --sim {gpus} up; GPUWATCH_SOCKET={socket_path}")
        startup(env, runs)
        imports(env, max(5, runs // 2))
        phases(env, max(5, runs // 2))
    finally:
        daemon.terminate()
        daemon.wait()


if __name__ == "__main__":
    main()
