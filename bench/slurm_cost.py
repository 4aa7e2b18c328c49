"""The Slurm job reader's cost per refresh with 50 running jobs, and with a hung squeue.

Starts bench's one-node Slurm (bench/_slurm.py: slurm-wlm and munge, as root), submits
50 `sleep` jobs (4 holding a GPU each, 46 none), then times:
- a refresh through `squeue --json`, and as on a Slurm without it (`squeue -o` rows, then
  each job's `scontrol show job -d`) (wall, the child's CPU, and the parse alone);
- a cached `table()` call;
- with a squeue stand-in that sleeps: the first call (bounded by the timeout) and the calls
  made while that refresh hangs (served from the cache).
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _slurm import Cluster, cluster, why_not

from gpuwatch.jobs.slurm import SlurmJobs
from gpuwatch.jobs.slurm_text import jobs_from_squeue_json

JOBS = 50
GPU_JOBS = 4
ROUNDS = 20
TIMEOUT_S = 2.0


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def refresh_cost(cluster: Cluster, squeue: str) -> tuple[float, float, int]:
    """Median wall ms and mean child CPU ms of a refresh from scratch; jobs seen."""
    walls, cpus, seen = [], [], 0
    for _ in range(ROUNDS):
        reader = SlurmJobs(
            node=cluster.node,
            gres_conf=cluster.gres_conf,
            env=cluster.env,
            squeue=squeue,
            timeout_s=10,
        )
        cpu, start = child_cpu_s(), time.perf_counter()
        table = reader.table()
        walls.append((time.perf_counter() - start) * 1000)
        cpus.append((child_cpu_s() - cpu) * 1000)
        seen = len(table.jobs) if table is not None else -1
    return statistics.median(walls), statistics.mean(cpus), seen


def parse_cost(cluster: Cluster) -> tuple[float, int]:
    text = cluster.run("squeue", "--json", "--states=RUNNING", f"--nodelist={cluster.node}")
    minors: list[int | None] = list(cluster.gpu_minors)
    start = time.perf_counter()
    for _ in range(ROUNDS):
        jobs_from_squeue_json(text, cluster.node, minors)
    return (time.perf_counter() - start) / ROUNDS * 1000, len(text)


def cached_cost(cluster: Cluster) -> float:
    reader = SlurmJobs(node=cluster.node, gres_conf=cluster.gres_conf, env=cluster.env)
    reader.table()
    start = time.perf_counter()
    for _ in range(10_000):
        reader.table()
    return (time.perf_counter() - start) / 10_000 * 1e6


def hung_cost(cluster: Cluster, work: Path) -> None:
    hung = work / "squeue-hung"
    hung.write_text("#!/bin/sh\nsleep 600\n")
    hung.chmod(0o755)
    reader = SlurmJobs(
        node=cluster.node,
        gres_conf=cluster.gres_conf,
        env=cluster.env,
        squeue=str(hung),
        timeout_s=TIMEOUT_S,
        max_age_s=0.0,
    )
    start = time.perf_counter()
    first = reader.table()
    first_ms = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    later = [reader.table() for _ in range(1000)]
    later_us = (time.perf_counter() - start) / 1000 * 1e6
    print(
        f"hung squeue (timeout {TIMEOUT_S:.0f} s): first call {first_ms:.0f} ms -> "
        f"{'jobs unknown' if first is None else 'a table'}; calls while it hangs "
        f"{later_us:.1f} us each, all {'unknown' if not any(later) else 'answered'}; "
        f"squeue started {reader.calls} time(s)"
    )


def main() -> None:
    reason = why_not()
    if reason is not None:
        sys.exit(f"cannot start a Slurm here: {reason}")
    work = Path(tempfile.mkdtemp(prefix="gpuwatch-slurm-bench-"))
    old = work / "squeue-without-json"
    old.write_text(
        '#!/bin/sh\ncase "$1" in --json) echo no --json >&2; exit 1 ;; esac\n'
        f'exec {shutil.which("squeue")} "$@"\n'
    )
    old.chmod(0o755)
    with cluster(work / "slurm", JOBS) as slurm:
        ids = [slurm.sbatch("--gres=gpu:1", wrap="sleep 600") for _ in range(GPU_JOBS)]
        ids += [slurm.sbatch(wrap="sleep 600") for _ in range(JOBS - GPU_JOBS)]
        slurm.wait_running(ids, timeout_s=120)
        print(f"{JOBS} running jobs ({GPU_JOBS} with a GPU) on {os.cpu_count()} CPUs, Slurm 22.05")
        for label, squeue in (("squeue --json", "squeue"), ("rows and details", str(old))):
            wall, cpu, seen = refresh_cost(slurm, squeue)
            print(
                f"refresh via {label}: {wall:.1f} ms wall (median of {ROUNDS}), "
                f"{cpu:.1f} ms CPU in the child, {seen} jobs read"
            )
        parse_ms, size = parse_cost(slurm)
        print(f"parse of squeue --json ({size / 1024:.0f} KiB): {parse_ms:.2f} ms")
        print(f"cached table(): {cached_cost(slurm):.2f} us per call")
        hung_cost(slurm, work)


if __name__ == "__main__":
    main()
