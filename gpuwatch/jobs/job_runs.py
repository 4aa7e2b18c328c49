"""One job's run on this node, asked of Slurm: when it started and ended, and which of
this node's GPUs it held, by device-file minor number (for `gpuwatch job-report`).

`scontrol show job -d` answers while the job runs and for `MinJobAge` (300 s by default)
after it ends; where it has forgotten the job, `sacct` answers if accounting is configured.
Neither names the GPUs of a job that has ended (scontrol drops the GRES indices then, sacct
never has them): in the job's epilog, or in the job itself, Slurm's `SLURM_JOB_GPUS` does.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.errors import JobUnknownError, SchedulerUnavailableError
from gpuwatch.jobs.gres import gres_gpu_files, minor_number_of, minors_of_indices, parse_index_list
from gpuwatch.jobs.slurm_runs_text import (
    SACCT_FIELDS,
    JobRun,
    job_run_from_sacct,
    job_run_from_scontrol,
)

DEFAULT_TIMEOUT_S = 10.0
_MAX_GRES_CONF_BYTES = 1 << 20
_MAX_OUTPUT_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class JobGpus:
    """A job's run, and the GPUs it held on `node` (`None`: not known, `why_unknown` says
    why)."""

    run: JobRun
    node: str
    minor_numbers: tuple[int, ...] | None
    gpus_from: str
    """Where the GPUs came from: `scontrol` or `SLURM_JOB_GPUS`; empty when unknown."""
    why_unknown: str = ""


def job_gpus(
    job_id: str,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    scontrol: str = "scontrol",
    sacct: str = "sacct",
) -> JobGpus:
    """Job `job_id` on this node. `JobUnknownError` when Slurm knows no such job or it ran
    elsewhere; `SchedulerUnavailableError` when Slurm cannot be asked."""
    env = dict(os.environ if env is None else env)
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    run = _ask(job_id, env, timeout_s, scontrol, sacct)
    if run.start_s is None or not run.nodes:
        raise JobUnknownError(f"job {job_id} has not started ({run.state or 'no state'})")
    if node not in run.nodes:
        raise JobUnknownError(
            f"job {job_id} ran on {','.join(run.nodes)[:200]}, not on this node ({node}): "
            "run job-report there"
        )
    return _with_gpus(run, node, env)


def _ask(job_id: str, env: dict[str, str], timeout_s: float, scontrol: str, sacct: str) -> JobRun:
    argv = [scontrol, "show", "job", "-d", "--oneliner", job_id]
    code, out, err = _run(argv, env, timeout_s)
    if code == 0 and (run := job_run_from_scontrol(out, job_id)) is not None:
        return run
    if code != 0 and "invalid job id" not in err.lower():
        raise SchedulerUnavailableError(f"scontrol failed: {_first_line(err)}")
    argv = [sacct, "-j", job_id, "-X", "-P", "-n", "-o", SACCT_FIELDS]
    try:
        code, out, err = _run(argv, env, timeout_s)
    except SchedulerUnavailableError as error:
        err, code = str(error), 1
    if code == 0 and (run := job_run_from_sacct(out, job_id)) is not None:
        return run
    raise JobUnknownError(
        f"Slurm knows no job {job_id}: scontrol forgets a job MinJobAge (300 s by default) "
        f"after it ends, and sacct has no record of it ({_first_line(err) or 'none found'})"
    )


def _with_gpus(run: JobRun, node: str, env: Mapping[str, str]) -> JobGpus:
    """The GPUs: from `SLURM_JOB_GPUS` when this runs in the job's own epilog (or in the
    job), else from scontrol's GRES indices on this node."""
    in_job = env.get("SLURM_JOB_ID") == run.job_id and env.get("SLURM_JOB_GPUS", "").strip()
    indices = parse_index_list(env["SLURM_JOB_GPUS"]) if in_job else None
    source = "SLURM_JOB_GPUS" if in_job else "scontrol"
    if indices is None and not in_job and run.gres_indices:
        indices = run.gres_indices.get(node)
    if indices is None or (not indices and run.end_s is not None):
        why = (
            f"Slurm no longer says which GPUs job {run.job_id} held on {node} (it forgets "
            "them when the job ends): run job-report while the job runs, or from Slurm's "
            "epilog (examples/slurm/epilog.sh)"
        )
        return JobGpus(run, node, None, "", why)
    minors = _gres_minors(env, node)
    if minors is None:
        why = f"gres.conf names no GPU File= for node {node}: GRES indices cannot be mapped"
        return JobGpus(run, node, None, "", why)
    return JobGpus(run, node, minors_of_indices(indices, minors), source)


def _gres_minors(env: Mapping[str, str], node: str) -> list[int | None] | None:
    """Each GRES index's minor number, from the gres.conf beside `SLURM_CONF`."""
    conf = env.get("SLURM_CONF")
    path = (Path(conf).parent if conf else Path("/etc/slurm")) / "gres.conf"
    try:
        with open(path, "rb") as file:
            text = file.read(_MAX_GRES_CONF_BYTES).decode(errors="replace")
    except OSError:
        return None
    files = gres_gpu_files(text, node)
    return [minor_number_of(name) for name in files] or None


def _run(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a Slurm command; `SchedulerUnavailableError` when it
    is missing or outlives `timeout_s`."""
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=dict(env),
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:
        raise SchedulerUnavailableError(f"{argv[0]} not found: is this a Slurm node?") from None
    except subprocess.TimeoutExpired:
        raise SchedulerUnavailableError(f"{argv[0]} did not answer in {timeout_s:g}s") from None
    except OSError as error:
        raise SchedulerUnavailableError(f"{argv[0]} cannot run: {error.strerror}") from None
    out = done.stdout[:_MAX_OUTPUT_BYTES].decode(errors="replace")
    return done.returncode, out, done.stderr[:4096].decode(errors="replace")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else ""
