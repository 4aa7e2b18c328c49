"""A real Slurm on this machine, for tests: munged, slurmctld and slurmd in a temporary directory.

Debian's `slurm-wlm` and `munge` (22.05 on bookworm) run from a configuration of their own:
free ports, state, spool and logs under the directory, a munge key and socket of their own,
and four GPUs as character devices (major 195, as the NVIDIA driver's) made with `mknod` in
the directory, named in gres.conf with `AutoDetect=off`. Nothing of the system's Slurm or
munge is used or touched; `SLURM_CONF` points the client commands at this cluster.

`why_not()` says why a cluster cannot start here (a sentence, for a skip), or `None`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatch.jobs.slurm import SlurmJobs
from tests.helpers.wait import wait_until

NVIDIA_MAJOR = 195
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "sinfo", "scancel")
START_TIMEOUT_S = 60.0


def why_not() -> str | None:
    """Why a test cluster cannot start on this machine, or `None` when it can."""
    if os.geteuid() != 0:
        return "the Slurm harness runs slurmd as root (SlurmUser=root) and tests are not root"
    missing = [name for name in (*DAEMONS, *CLIENTS) if _which(name) is None]
    if missing:
        return (
            f"Slurm or munge missing ({', '.join(missing)} not found): "
            "apt-get install slurm-wlm munge (.ci/run does)"
        )
    return None


def _which(name: str) -> str | None:
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def free_port() -> int:
    """A TCP port nobody listens on now (the kernel's choice, released at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class SlurmCluster:
    """A one-node Slurm cluster running from `root`; `close()` stops it and removes nothing
    outside `root`."""

    root: Path
    node: str
    gpu_minors: tuple[int, ...]
    oversubscribe: int = 1
    epilog: Path | None = None
    min_job_age_s: int = 2
    gres_text: str | None = None
    """gres.conf as given (`{dev}`: the cluster's device folder, `{node}`: its node);
    `None`: one line naming the device files in `gpu_minors`' order."""
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def device_files(self) -> list[Path]:
        """The GPUs' device files, in gres.conf's order: GRES index i is `device_files[i]`."""
        return [self.root / "dev" / f"nvidia{minor}" for minor in self.gpu_minors]

    @property
    def gres_conf(self) -> Path:
        return self.root / "gres.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm's client commands, pointed at this cluster."""
        return {
            **os.environ,
            "SLURM_CONF": str(self.conf),
            "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin",
        }

    def run(self, *argv: str, timeout_s: float = 20.0) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster; raises on failure."""
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout_s, check=True
        )

    def sbatch(self, *options: str, wrap: str = "sleep 120") -> str:
        """Submits a batch job; its id."""
        output = f"--output={self.root}/job-%j.out"
        out = self.run("sbatch", "--parsable", output, *options, "--wrap", wrap).stdout
        return out.strip().split(";")[0]

    def queued(self, *states: str) -> set[str]:
        """The ids of the jobs squeue shows (in `states`, by default pending or running)."""
        chosen = ["-t", ",".join(states)] if states else []
        return set(self.run("squeue", "-h", *chosen, "-o", "%i").stdout.split())

    def wait_running(self, job_ids: Sequence[str], timeout_s: float = 60.0) -> None:
        """Waits until every job is RUNNING."""
        wanted = set(job_ids)
        wait_until(
            lambda: wanted <= self.queued("R"),
            f"jobs {sorted(wanted)} running",
            timeout_s=timeout_s,
        )

    def wait_gone(self, job_ids: Sequence[str], timeout_s: float = 60.0) -> None:
        """Waits until no job of `job_ids` is pending or running."""
        wait_until(
            lambda: not self.queued() & set(job_ids),
            f"jobs {list(job_ids)} gone from the queue",
            timeout_s=timeout_s,
        )

    def cancel_all(self) -> None:
        """Cancels every job and waits until none is left."""
        self.run("scancel", "--user", "root")
        wait_until(lambda: not self.queued(), "no job queued after scancel")

    def stop(self, name: str) -> None:
        """Stops one daemon (`slurmctld`, `slurmd`, `munged`) and waits for it."""
        child = self.children.pop(name, None)
        if child is None or child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=15)

    def restart(self, name: str) -> None:
        """Starts a daemon stopped by `stop` again and waits for the node to answer."""
        _start_daemon(self, name)
        _wait_idle(self, states=("idle", "mix", "alloc"))

    def minors_of(self, gres_indices: str) -> tuple[int, ...]:
        """The minor numbers of GRES indices as a job's SLURM_JOB_GPUS gives them (`0,2`)."""
        return tuple(sorted(self.gpu_minors[int(i)] for i in gres_indices.split(",") if i))

    def close(self) -> None:
        """Cancels the jobs, then stops everything that was started, slurmd first."""
        if "slurmctld" in self.children and "slurmd" in self.children:
            with contextlib.suppress(subprocess.SubprocessError, TimeoutError):
                self.cancel_all()
        for name in ("slurmd", "slurmctld", "munged"):
            self.stop(name)
        _kill_stray_steps(self.root)

    def log(self, name: str) -> str:
        """The tail of a daemon's log, for failure messages."""
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"


def start_cluster(
    root: Path,
    gpu_minors: Sequence[int] = (0, 1, 2, 3),
    oversubscribe: int = 1,
    *,
    epilog: Path | None = None,
    min_job_age_s: int = 2,
    gres_conf: str | None = None,
) -> SlurmCluster:
    """Writes the configuration under `root` and starts munged, slurmctld and slurmd;
    returns once `sinfo` shows the node idle. Stops what it started if that fails.

    `epilog`: slurm.conf's `Epilog=`, run by slurmd as root when each job ends on the node;
    `min_job_age_s`: how long scontrol still shows a job that ended; `gres_conf`: the
    text of gres.conf (`{dev}`: the folder of the device files, `{node}`: the node), where
    it is not one line naming `gpu_minors` in order."""
    cluster = SlurmCluster(
        root=root,
        node=socket.gethostname().split(".")[0],
        gpu_minors=tuple(gpu_minors),
        oversubscribe=oversubscribe,
        epilog=epilog,
        min_job_age_s=min_job_age_s,
        gres_text=gres_conf,
    )
    try:
        _write_files(cluster)
        _start_munged(cluster)
        for name in ("slurmctld", "slurmd"):
            _start_daemon(cluster, name)
        _wait_idle(cluster)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _write_files(cluster: SlurmCluster) -> None:
    root = cluster.root
    for sub in ("state", "spool", f"spool/{cluster.node}", "log", "dev", "munge"):
        (root / sub).mkdir(mode=0o700, exist_ok=True)
    for path, minor in zip(cluster.device_files, cluster.gpu_minors, strict=True):
        os.mknod(path, 0o600 | 0o020000, os.makedev(NVIDIA_MAJOR, minor))
    files = ",".join(str(path) for path in cluster.device_files)
    text = cluster.gres_text or "AutoDetect=off\nName=gpu File={files}\n"
    cluster.gres_conf.write_text(text.format(files=files, dev=root / "dev", node=cluster.node))
    cluster.conf.write_text(_slurm_conf(cluster))
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)


def _slurm_conf(cluster: SlurmCluster) -> str:
    root, node = cluster.root, cluster.node
    gpus = len(cluster.gpu_minors)
    cpus = os.cpu_count() or 1
    epilog = f"Epilog={cluster.epilog}\n" if cluster.epilog is not None else ""
    return f"""\
ClusterName=gpuwatch-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
MailProg=/bin/true
ReturnToService=2
MpiDefault=none
SchedulerType=sched/builtin
KillWait=2
MinJobAge={cluster.min_job_age_s}
{epilog}SlurmdTimeout=30
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=512 Gres=gpu:{gpus} State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP \
OverSubscribe=FORCE:{cluster.oversubscribe}
"""


def _start_munged(cluster: SlurmCluster) -> None:
    munge = cluster.root / "munge"
    socket_path = munge / "munge.socket"
    cluster.children["munged"] = _spawn(
        cluster,
        "munged",
        [
            "munged",
            "--foreground",
            "--force",
            f"--socket={socket_path}",
            f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'munged.seed'}",
            f"--log-file={cluster.root / 'log' / 'munged.log'}",
        ],
    )
    _wait_for(socket_path.exists, cluster, "munged", "its socket")


def _start_daemon(cluster: SlurmCluster, name: str) -> None:
    argv = [name, "-D", "-f", str(cluster.conf)]
    if name == "slurmd":
        argv += ["-N", cluster.node]
    cluster.children[name] = _spawn(cluster, name, argv)


def _spawn(cluster: SlurmCluster, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    binary = _which(argv[0])
    if binary is None:
        raise FileNotFoundError(f"{argv[0]} not found")
    console = (cluster.root / "log" / f"{name}.console").open("wb")
    with console:
        return subprocess.Popen(
            [binary, *argv[1:]],
            env=cluster.env,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_idle(cluster: SlurmCluster, states: Sequence[str] = ("idle",)) -> None:
    def ready() -> bool:
        try:
            out = cluster.run("sinfo", "-h", "-N", "-o", "%t", timeout_s=5).stdout
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            return False
        return out.strip() in states  # "idle*" and the like: not responding yet

    _wait_for(ready, cluster, "slurmd", f"the node to be {' or '.join(states)} in sinfo")


def _wait_for(ready: Callable[[], bool], cluster: SlurmCluster, name: str, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        for child_name, child in cluster.children.items():
            if child.poll() is not None:
                raise RuntimeError(
                    f"{child_name} exited ({child.returncode}) while waiting for {what}:\n"
                    f"{cluster.log(child_name)}\n{_console(cluster, child_name)}"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{START_TIMEOUT_S:.0f} s without {what}:\n{cluster.log(name)}\n"
                f"{_console(cluster, name)}"
            )
        time.sleep(0.2)


def _console(cluster: SlurmCluster, name: str) -> str:
    path = cluster.root / "log" / f"{name}.console"
    return path.read_text(errors="replace")[-2000:] if path.exists() else ""


def _kill_stray_steps(root: Path) -> None:
    """slurmstepd processes of this cluster that outlived slurmd (their command lines do not
    name the cluster, but their environment names its slurm.conf)."""
    conf = str(root / "slurm.conf")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"SLURM_CONF={conf}".encode() in environ.split(b"\0"):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


GRES_ORDER = (7, 5, 6, 4)
"""The minor numbers of the cluster's GPU files in gres.conf's order: GRES index 0 is
/dev/nvidia7. Not sorted, so that no test can pass by taking an index for a minor number."""


READ_TIMEOUT_S = 10.0  # generous: the test machine's two cores are shared


def slurm_reader(cluster: SlurmCluster, **settings: float) -> SlurmJobs:
    """A reader of `cluster`'s jobs, as gpuwatch on its node would make one."""
    settings.setdefault("timeout_s", READ_TIMEOUT_S)
    return SlurmJobs(node=cluster.node, gres_conf=cluster.gres_conf, env=cluster.env, **settings)


def job_env(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """The environment the job's script ran with (it wrote `env -0` to a file)."""
    path = cluster.root / f"env-{job_id}"
    wait_until(lambda: path.read_bytes().endswith(b"\0"), f"job {job_id}'s environment")
    entries = path.read_bytes().decode().split("\0")
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


def gpu_job(cluster: SlurmCluster, gpus: int) -> str:
    """A running job holding `gpus` GPUs, which writes its environment and its pid."""
    root = cluster.root
    job_id = cluster.sbatch(
        f"--gres=gpu:{gpus}",
        "--job-name=train",
        wrap=f"echo $$ > {root}/pid-$SLURM_JOB_ID; env -0 > {root}/env-$SLURM_JOB_ID; "
        "exec sleep 120",
    )
    cluster.wait_running([job_id])
    return job_id
