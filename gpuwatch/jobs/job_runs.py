"""One job's run, asked of Slurm for `gpuwatch job-report`: when it started and ended, on
which nodes, and which GRES indices it holds on each while it runs.

`squeue --json` answers while the job runs and for `MinJobAge` (300 s by default) after it
ends (Slurm 21.08 on); an older squeue answers `squeue -o` of fields no user writes, with
the GRES indices from the job's own `scontrol show job -d` (see `slurm_text`). Where the
controller has forgotten the job, `sacct` answers if accounting is configured. None of
them names the GPUs of a job that has ended: the job's epilog (`SLURM_JOB_GPUS`) and the
daemon's memory of it (`sightings`) do.

Errors are one plain line: `SlurmAbsent` where this node has no Slurm to ask at all,
`SchedulerUnavailableError` where Slurm is there but does not answer; a job Slurm does
not know is `None`, not an error: the daemon may still remember it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatch.errors import SchedulerUnavailableError
from gpuwatch.jobs.hostlist import hostlist_names
from gpuwatch.jobs.slurm_places import configured_slurm_conf
from gpuwatch.jobs.slurm_text import (
    ROW_FORMAT,
    SlurmFormatError,
    clean,
    detail_indices,
    json_gres_indices,
    json_job_id,
    json_jobs,
    json_nodes,
    json_states,
    number,
    positive,
    rows_from_squeue,
    timestamp,
)
from gpuwatch.text import printable, printable_fields

DEFAULT_TIMEOUT_S = 10.0
MAX_OUTPUT_BYTES = 256 << 20
SACCT_FIELDS = "JobIDRaw,JobID,State,Start,End,NodeList"
"""What `sacct -X -P -n -o` is asked for: no field a job's owner writes."""
ENDED = frozenset(
    [
        "COMPLETED",
        "COMPLETING",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REQUEUED",
        "REVOKED",
        "SPECIAL_EXIT",
    ]
)
"""States in which a job no longer runs: its end time is when it ended."""


class SlurmAbsent(Exception):
    """This node has no Slurm to ask (no squeue on PATH, or no slurm.conf)."""


@dataclass(frozen=True, slots=True)
class JobRun:
    """One job's run as Slurm tells it: when, where, and its GPUs' GRES indices on each
    node while it runs (`None` where Slurm did not say, as sacct never does)."""

    job_id: str
    state: str
    start_s: float | None
    """Unix time; `None` before the job started."""
    end_s: float | None
    """Unix time; `None` while it runs."""
    nodes: tuple[str, ...]
    gres_indices: dict[str, list[int]] | None
    source: str

    def __post_init__(self) -> None:
        printable_fields(self, "job_id", "state")
        if not all(node.isprintable() for node in self.nodes):
            object.__setattr__(self, "nodes", tuple(printable(node) for node in self.nodes))


def slurm_run(
    job_id: str, env: Mapping[str, str], timeout_s: float = DEFAULT_TIMEOUT_S
) -> JobRun | None:
    """Job `job_id` (`1234`, or `1234_7` for an array's task) as Slurm tells it; `None`
    when Slurm knows no such job. `SlurmAbsent`, `SchedulerUnavailableError`: see above."""
    if shutil.which("squeue", path=env.get("PATH")) is None:
        raise SlurmAbsent("squeue is not on PATH")
    if configured_slurm_conf(env) is None:
        raise SlurmAbsent("no slurm.conf is found")
    run = _from_squeue(job_id, env, timeout_s)
    return run if run is not None else _from_sacct(job_id, env, timeout_s)


def _from_squeue(job_id: str, env: Mapping[str, str], timeout_s: float) -> JobRun | None:
    code, out, err = _run(["squeue", "--json"], env, timeout_s)
    if code == 0:
        try:
            return _from_json(json_jobs(out), job_id)
        except SlurmFormatError as error:
            raise SchedulerUnavailableError(
                f"Slurm's controller does not answer: {error}"
            ) from None
    argv = ["squeue", "-h", "--states=all", f"--jobs={job_id}", "-o", ROW_FORMAT]
    code, out, err = _run(argv, env, timeout_s)
    if code != 0:
        if "invalid job id" in err.lower():
            return None
        raise SchedulerUnavailableError(f"Slurm's controller does not answer: {first_line(err)}")
    try:
        rows = [row for row in rows_from_squeue(out) if job_id in (row.job_id, row.raw_id)]
    except SlurmFormatError as error:
        raise SchedulerUnavailableError(str(error)) from None
    if not rows:
        return None
    row = rows[-1]
    indices = _detail(row.raw_id, row.nodes, env, timeout_s) if row.state == "RUNNING" else {}
    end = row.end_s if row.state.split()[0] in ENDED else None
    return JobRun(job_id, row.state, row.start_s, end, row.nodes, indices, "squeue")


def _detail(
    raw_id: str, nodes: Sequence[str], env: Mapping[str, str], timeout_s: float
) -> dict[str, list[int]]:
    """The job's GRES indices on each of its nodes, from its own scontrol answer."""
    code, out, err = _run(["scontrol", "show", "job", "-d", "--oneliner", raw_id], env, timeout_s)
    if code != 0:
        raise SchedulerUnavailableError(f"scontrol does not answer: {first_line(err)}")
    found: dict[str, list[int]] = {}
    for node in nodes:
        try:
            indices = detail_indices(out, node)
        except SlurmFormatError as error:
            raise SchedulerUnavailableError(str(error)) from None
        if indices is not None:
            found[node] = indices
    return found


def _from_json(jobs: list[Any], job_id: str) -> JobRun | None:
    """The job in `squeue --json`'s answer (22.05 lists every job, its filters aside)."""
    for entry in jobs:
        try:
            if job_id not in (json_job_id(entry), str(int(number(entry.get("job_id")) or 0))):
                continue
            return _json_run(entry, job_id)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
            continue
    return None


def _json_run(entry: Any, job_id: str) -> JobRun:
    state = str(json_states(entry)[0] or "")
    nodes = json_nodes(entry)
    started = state not in ("PENDING", "")
    indices = {}
    if state == "RUNNING":
        indices = {node: json_gres_indices(entry, i) for i, node in enumerate(nodes)}
    return JobRun(
        job_id=job_id,
        state=state,
        start_s=positive(number(entry.get("start_time"))) if started else None,
        end_s=positive(number(entry.get("end_time"))) if state in ENDED else None,
        nodes=tuple(nodes),
        gres_indices=indices,
        source="squeue --json",
    )


def _from_sacct(job_id: str, env: Mapping[str, str], timeout_s: float) -> JobRun | None:
    """The job in accounting; `None` where there is none (sacct absent, accounting off,
    no record)."""
    argv = ["sacct", "-j", job_id, "-X", "-P", "-n", "-o", SACCT_FIELDS]
    try:
        code, out, _ = _run(argv, env, timeout_s)
    except SchedulerUnavailableError:
        return None
    return job_run_from_sacct(out, job_id) if code == 0 else None


def job_run_from_sacct(text: str, job_id: str) -> JobRun | None:
    """Job `job_id` in `sacct -j JOBID -X -P -n -o SACCT_FIELDS`'s answer (`|` between
    fields); `None` when it is not there. sacct names no GRES index: the GPUs stay unknown.
    A job requeued has a line per run: the last is the latest."""
    found = None
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS.split(",")) or job_id not in parts[:2]:
            continue
        _, _, state, start, end, nodes = parts
        state = state.split()[0] if state.strip() else ""  # "CANCELLED by 0"
        found = JobRun(
            job_id=job_id,
            state=state,
            start_s=timestamp(start),
            end_s=timestamp(end) if state in ENDED else None,
            nodes=tuple(hostlist_names(nodes)),
            gres_indices=None,
            source="sacct",
        )
    return found


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
        raise SchedulerUnavailableError(f"{argv[0]} is not found") from None
    except subprocess.TimeoutExpired:
        raise SchedulerUnavailableError(f"{argv[0]} did not answer in {timeout_s:g}s") from None
    except OSError as error:
        raise SchedulerUnavailableError(f"{argv[0]} cannot run: {error.strerror}") from None
    out = done.stdout[:MAX_OUTPUT_BYTES].decode(errors="replace")
    return done.returncode, out, done.stderr[:4096].decode(errors="replace")


def first_line(text: str) -> str:
    """The first line of a command's message, printable and short; what it said, or that
    it said nothing."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return clean(lines[0][:200]) if lines else "(it said nothing)"
