"""What reading Slurm's jobs costs the daemon: CPU (% of one core) at 1 Hz on a simulated
8-GPU node, with jobs off, beside the same daemon reading 50 running jobs (8 holding a GPU)
from a stand-in `squeue --json` (a script printing a recorded answer grown to 50 jobs), and
beside one whose squeue hangs (killed at each deadline).

All daemons run at once and are measured over the same SECONDS (default 120), so that the
load of a shared machine falls on all alike. CPU is the daemon's own (utime + stime from
/proc/PID/stat) and, beside it, with the Slurm commands it started and reaped (cutime +
cstime): what the node pays. With `--real-slurm` (root, slurm-wlm and munge installed; run
it under `flock /tmp/slurm.lock`), a daemon also reads the tests' one-node Slurm
(tests/helpers/slurm.py) running 50 jobs.

Run: python bench/daemon_slurm_cost.py [SECONDS] [--real-slurm]
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _slurm import Cluster, cluster, why_not

from gpuwatch.backends.daemon_client import http_get

REPO = Path(__file__).resolve().parents[1]
GPUWATCH = [sys.executable, "-m", "gpuwatch"]
TICKS = os.sysconf("SC_CLK_TCK")
JOBS, GPU_JOBS, GPUS = 50, 8, 8
NODE = "bench"
SCENARIO = f'hostname = "{NODE}"\n' + "".join(
    f'[[gpu]]\nminor = {minor}\nload = "constant"\nutilization_pct = {0 if minor % 2 else 70}\n'
    for minor in range(GPUS)
)


def squeue_answer() -> str:
    """squeue --json of 50 running jobs on NODE, the first 8 holding one GPU each, each job
    as big as a recorded one (~2.7 KB)."""
    recorded = json.loads((REPO / "tests" / "jobs" / "data" / "squeue-22.05.json").read_text())
    model = recorded["jobs"][0]
    jobs = []
    for number in range(1, JOBS + 1):
        job = copy.deepcopy(model)
        job.update(job_id=number, nodes=NODE, name=f"job-{number}")
        job["job_resources"]["nodes"] = NODE
        job["gres_detail"] = [f"gpu:1(IDX:{number - 1})"] if number <= GPU_JOBS else []
        jobs.append(job)
    return json.dumps({**recorded, "jobs": jobs})


def stand_ins(work: Path) -> tuple[Path, Path]:
    """Folders with a squeue that answers and one that hangs; slurm.conf and gres.conf."""
    answering, hanging = work / "answering", work / "hanging"
    (work / "squeue.json").write_text(squeue_answer())
    for folder, body in ((answering, f"exec cat {work}/squeue.json"), (hanging, "exec sleep 600")):
        folder.mkdir()
        for name in ("squeue", "scontrol"):
            script = folder / name
            script.write_text(f"#!/bin/sh\n{body}\n")
            script.chmod(0o755)
    (work / "slurm.conf").write_text(f"SlurmdSpoolDir={work}/spool\n")
    (work / "spool").mkdir()
    files = f"/nonexistent/nvidia[0-{GPUS - 1}]"
    (work / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={files}\n")
    return answering, hanging


def cpu_s(pid: int) -> tuple[float, float]:
    """(the process's CPU seconds, with those of its reaped children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / TICKS
    return own, own + (int(fields[13]) + int(fields[14])) / TICKS


@contextmanager
def daemon(work: Path, name: str, args: list[str], env: dict[str, str]) -> Iterator[int]:
    """A daemon over the simulated node; yields its pid once it serves."""
    folder = work / name
    folder.mkdir()
    (folder / "node.toml").write_text(SCENARIO)
    sock = str(folder / "gpuwatch.sock")
    argv = [*GPUWATCH, "daemon", "--sim", str(folder / "node.toml"), "--socket", sock, *args]
    process = subprocess.Popen(
        argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not _serves(sock):
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"{name}: the daemon did not start")
            time.sleep(0.2)
        yield process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def _serves(sock: str) -> bool:
    try:
        return http_get(sock, "/v1/health")[0] == 200
    except OSError:
        return False


def configurations(work: Path, slurm: Cluster | None) -> dict[str, tuple[list[str], dict]]:
    answering, hanging = stand_ins(work)
    conf = ["--slurm-conf", str(work / "slurm.conf")]
    node = {"SLURMD_NODENAME": NODE}
    path = os.environ["PATH"]
    found = {
        "jobs off": (["--jobs", "off"], {}),
        "Slurm, 50 jobs, every 30s (default)": (
            ["--jobs", "slurm", *conf],
            {**node, "PATH": f"{answering}:{path}"},
        ),
        "Slurm, 50 jobs, every 1s": (
            ["--jobs", "slurm", "--jobs-refresh", "1s", *conf],
            {**node, "PATH": f"{answering}:{path}"},
        ),
        "Slurm hung, every 30s (default)": (
            ["--jobs", "slurm", *conf],
            {**node, "PATH": f"{hanging}:{path}"},
        ),
    }
    if slurm is not None:
        found["real Slurm 22.05, 50 jobs, every 30s"] = (
            ["--jobs", "slurm", "--slurm-conf", str(slurm.conf)],
            {"SLURMD_NODENAME": slurm.node, "PATH": slurm.env["PATH"]},
        )
    return found


def real_cluster(work: Path, stack: ExitStack) -> Cluster:
    if (reason := why_not()) is not None:
        raise SystemExit(f"--real-slurm: {reason}")
    slurm = stack.enter_context(cluster(work / "slurm", JOBS, tuple(range(GPUS))))
    ids = [slurm.sbatch("--gres=gpu:1", wrap="sleep 3600") for _ in range(GPU_JOBS)]
    ids += [slurm.sbatch(wrap="sleep 3600") for _ in range(JOBS - GPU_JOBS)]
    slurm.wait_running(ids, timeout_s=120)
    return slurm


def main(seconds: float, real: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="daemon-slurm-cost-"))
    with ExitStack() as stack:
        slurm = real_cluster(work, stack) if real else None
        pids = {
            name: stack.enter_context(daemon(work, f"d{n}", args, env))
            for n, (name, (args, env)) in enumerate(configurations(work, slurm).items())
        }
        time.sleep(5)  # past start-up: the steady state
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        start = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - start
        after = {name: cpu_s(pid) for name, pid in pids.items()}
    print(
        f"gpuwatch daemon at 1 Hz, {GPUS} simulated GPUs, all measured at once over {elapsed:.0f} s"
    )
    print(f"{'':40} {'daemon':>10} {'+ Slurm commands':>18}   (% of one core)")
    for name in pids:
        own = 100 * (after[name][0] - before[name][0]) / elapsed
        total = 100 * (after[name][1] - before[name][1]) / elapsed
        print(f"  {name:38} {own:9.2f} % {total:16.2f} %")


if __name__ == "__main__":
    numbers = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    main(float(numbers[0]) if numbers else 120.0, "--real-slurm" in sys.argv)
