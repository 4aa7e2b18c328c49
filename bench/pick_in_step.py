"""What choosing inside a Slurm step adds to `gpuwatch pick -- true`: reading gres.conf, the
jobs floor's imports, and sampling the GPUs with their minor numbers.

The same pick runs outside a step and inside one (`SLURM_JOB_ID`, `SLURM_STEP_GPUS=0` and a
gres.conf beside `SLURM_CONF`, made here), runs interleaved so that the machine's load falls
on both alike, over the daemon (a simulated node, tests/jobs/data/slurm-node.toml) and over
the sim backend alone. Prints the median and range of wall and CPU time (the children's user +
system time) of each. Run:
python bench/pick_in_step.py [RUNS]
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import start_daemon

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
NODE = Path(__file__).resolve().parents[1] / "tests" / "jobs" / "data" / "slurm-node.toml"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = (time.perf_counter() - start) * 1e3
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e3
    return wall, cpu


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} ms ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = ",".join(f"{work}/nvidia{minor}" for minor in (7, 5, 6, 4))
        (work / "gres.conf").write_text(f"Name=gpu File={files}\n")
        base = {
            **os.environ,
            "GPUWATCH_LEASE_DIR": str(work / "leases"),
            "GPUWATCH_SIM": str(NODE),
        }
        for name in ("SLURM_JOB_ID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
            base.pop(name, None)
        step = {
            "SLURM_JOB_ID": "1",
            "SLURM_STEP_GPUS": "0",
            "SLURM_CONF": str(work / "slurm.conf"),
            "SLURMD_NODENAME": "node1",
            "CUDA_VISIBLE_DEVICES": "3",  # as under a device cgroup: the step's GPU, no note
        }
        daemon, socket_path = start_daemon(work, str(NODE))
        try:
            backends = {
                "daemon": {**base, "GPUWATCH_BACKEND": "daemon", "GPUWATCH_SOCKET": socket_path},
                "sim": {**base, "GPUWATCH_BACKEND": "sim"},
            }
            cases = {
                f"{where:6} {label}": {**env, **extra}
                for where, env in backends.items()
                for label, extra in (("outside a step", {}), ("in a step     ", step))
            }
            argv = [GPUWATCH, "pick", "--allow-busy", "--", "true"]
            for env in cases.values():
                timed(argv, env)  # warm the page cache
            walls: dict[str, list[float]] = {name: [] for name in cases}
            cpus: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(runs):
                for name, env in cases.items():
                    wall, cpu = timed(argv, env)
                    walls[name].append(wall)
                    cpus[name].append(cpu)
        finally:
            daemon.terminate()
            daemon.wait()
    print(f"gpuwatch pick --allow-busy -- true, {runs} runs each, interleaved; median (range)")
    for name in cases:
        print(f"  {name}  wall {summary(walls[name])}  CPU {summary(cpus[name])}")


if __name__ == "__main__":
    main()
