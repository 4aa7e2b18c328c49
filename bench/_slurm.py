"""The benchmarks' own Slurm: a one-node cluster (munged, slurmctld, slurmd from Debian's
slurm-wlm) in a folder of its own, and stand-in `squeue` scripts printing a job list. Small
on purpose: the tests' harness (tests/helpers/slurm.py) checks far more, and bench imports
nothing from tests/.

Both name the node's GPUs by device files made with `mknod` (major 195), listed in gres.conf
as nvidia7, 5, 6, 4: GRES index 0 is /dev/nvidia7, never NVML index 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from _common import REPO

RECORDED = REPO / "tests" / "jobs" / "data" / "squeue-22.05.json"
"""A recorded `squeue --json` (Slurm 22.05): the shape of the answers made here."""
GRES_ORDER = (7, 5, 6, 4)
_SBIN = "/usr/sbin"


def many_jobs(count: int, started_ago_s: float = 600.0) -> str:
    """`squeue --json` of `count` running jobs on node `vm`, the first four holding one GPU
    each (a node busy with small jobs)."""
    data = json.loads(RECORDED.read_text())
    model = data["jobs"][0]
    jobs = []
    for number in range(1, count + 1):
        job = {**model, "job_id": number, "name": f"job-{number}", "user_name": f"u{number % 7}"}
        job["start_time"] = int(time.time() - started_ago_s)
        job["gres_detail"] = [f"gpu:1(IDX:{number - 1})"] if number <= 4 else []
        jobs.append(job)
    return json.dumps({**data, "jobs": jobs})


def stand_in_node(root: Path, base: Mapping[str, str], squeue_body: str) -> dict[str, str]:
    """A Slurm node `vm` whose squeue runs `squeue_body` (sh); the environment that makes
    gpuwatch use it (with a private XDG_RUNTIME_DIR for status's cache)."""
    (root / "bin").mkdir(parents=True)
    (root / "run").mkdir(mode=0o700)
    (root / "slurm.conf").write_text("# the stand-in reads nothing here\n")
    (root / "gres.conf").write_text(f"NodeName=vm Name=gpu File={root}/dev/nvidia[7,5,6,4]\n")
    squeue = root / "bin" / "squeue"
    squeue.write_text(f"#!/bin/sh\n{squeue_body}\n")
    squeue.chmod(0o755)
    return {
        **base,
        "PATH": f"{root / 'bin'}{os.pathsep}{base.get('PATH', '')}",
        "SLURM_CONF": str(root / "slurm.conf"),
        "SLURMD_NODENAME": "vm",
        "XDG_RUNTIME_DIR": str(root / "run"),
    }


def why_not() -> str | None:
    """Why a cluster cannot start here, or `None`."""
    if os.geteuid() != 0:
        return "slurmd runs as root (SlurmUser=root): run the benchmark as root"
    path = f"{os.environ.get('PATH', '')}:{_SBIN}"
    missing = [
        name for name in ("munged", "slurmctld", "slurmd") if not shutil.which(name, path=path)
    ]
    return f"{', '.join(missing)} not found (apt-get install slurm-wlm munge)" if missing else None


@dataclass
class Cluster:
    """A running one-node cluster in `root`."""

    root: Path
    node: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    gpu_minors: tuple[int, ...] = GRES_ORDER
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.root / "gres.conf"

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SLURM_CONF": str(self.conf),
            "PATH": f"{os.environ.get('PATH', '')}:{_SBIN}",
        }

    def run(self, *argv: str) -> str:
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=60, check=True
        ).stdout

    def sbatch(self, *options: str, wrap: str) -> str:
        """Submits a batch job; its id."""
        out = self.run("sbatch", "--parsable", "--output=/dev/null", *options, "--wrap", wrap)
        return out.strip().split(";")[0]

    def wait_running(self, job_ids: list[str], timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not set(job_ids) <= set(self.run("squeue", "-h", "-t", "R", "-o", "%i").split()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs not running after {timeout_s:g}s")
            time.sleep(0.5)


@contextlib.contextmanager
def cluster(root: Path, jobs: int, gpu_minors: tuple[int, ...] = GRES_ORDER) -> Iterator[Cluster]:
    """A cluster of one node whose GPUs have `gpu_minors` in gres.conf's order, with room
    for `jobs` jobs at once."""
    root.mkdir(parents=True, exist_ok=True)
    started = Cluster(root, gpu_minors=gpu_minors)
    _write(started, jobs)
    try:
        munge = root / "munge"
        files = {"socket": "socket", "key-file": "key", "pid-file": "pid", "seed-file": "seed"}
        options = [f"--{option}={munge / name}" for option, name in files.items()]
        options.append(f"--log-file={root / 'munged.log'}")
        started.daemons.append(_spawn(started, "munged", "--foreground", "--force", *options))
        _wait((munge / "socket").exists, "munged")
        started.daemons.append(_spawn(started, "slurmctld", "-D", "-f", str(started.conf)))
        started.daemons.append(
            _spawn(started, "slurmd", "-D", "-f", str(started.conf), "-N", started.node)
        )
        _wait(lambda: _idle(started), "the node to be idle")
        yield started
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            started.run("scancel", "--user", "root")
        for daemon in reversed(started.daemons):
            daemon.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(timeout=20)
        _kill_steps_of(started)


def _kill_steps_of(started: Cluster) -> None:
    """The job steps (slurmstepd and the jobs' processes) that outlived slurmd: those whose
    environment names this cluster's slurm.conf."""
    mark = f"SLURM_CONF={started.conf}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)


def _write(started: Cluster, jobs: int) -> None:
    root, node = started.root, started.node
    for sub in ("state", "spool", "dev", "munge"):
        (root / sub).mkdir(mode=0o700)
    for minor in started.gpu_minors:
        os.mknod(root / "dev" / f"nvidia{minor}", 0o600 | 0o020000, os.makedev(195, minor))
    files = ",".join(f"{root}/dev/nvidia{minor}" for minor in started.gpu_minors)
    started.gres_conf.write_text(f"AutoDetect=off\nName=gpu File={files}\n")
    key = root / "munge" / "key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    ports = [_free_port(), _free_port()]
    started.conf.write_text(
        f"ClusterName=bench\nSlurmctldHost={node}(127.0.0.1)\nSlurmctldPort={ports[0]}\n"
        f"SlurmdPort={ports[1]}\nSlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\n"
        f"CredType=cred/munge\nAuthInfo=socket={root}/munge/socket\n"
        f"StateSaveLocation={root}/state\nSlurmdSpoolDir={root}/spool\n"
        f"SlurmctldPidFile={root}/slurmctld.pid\nSlurmdPidFile={root}/slurmd.pid\n"
        f"SlurmctldLogFile={root}/slurmctld.log\nSlurmdLogFile={root}/slurmd.log\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nGresTypes=gpu\n"
        "MailProg=/bin/true\nReturnToService=2\nSchedulerType=sched/builtin\nMinJobAge=2\n"
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} RealMemory=512 "
        f"Gres=gpu:{len(started.gpu_minors)} State=UNKNOWN\n"
        f"PartitionName=bench Nodes={node} Default=YES MaxTime=INFINITE State=UP "
        f"OverSubscribe=FORCE:{jobs}\n"
    )


def _spawn(started: Cluster, name: str, *args: str) -> subprocess.Popen[bytes]:
    binary = shutil.which(name, path=started.env["PATH"]) or name
    with (started.root / f"{name}.console").open("wb") as console:
        return subprocess.Popen(
            [binary, *args], env=started.env, stdin=subprocess.DEVNULL, stdout=console,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _idle(started: Cluster) -> bool:
    try:
        return started.run("sinfo", "-h", "-N", "-o", "%t").strip() == "idle"
    except subprocess.SubprocessError:
        return False


def _wait(ready: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{timeout_s:g}s without {what}")
        time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
