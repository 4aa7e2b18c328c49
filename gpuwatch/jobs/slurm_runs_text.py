"""One job's run in Slurm's text, parsed: `scontrol show job -d --oneliner JOBID` while
Slurm still holds the job, `sacct` after (for `gpuwatch job-report`). Pure: no process is
run here.

Apart from `slurm_text` (which reads running jobs, on every one-shot `status` of a Slurm
node) so that status does not pay for making `JobRun` at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.jobs.gres import expand_hostlist, gpu_indices
from gpuwatch.jobs.slurm_text import _fields, _first, _timestamp


@dataclass(frozen=True, slots=True)
class JobRun:
    """One job's run as Slurm tells it: when, where, and its GPUs' GRES indices on each
    node (`None` where Slurm did not say, as sacct never does)."""

    job_id: str
    state: str
    start_s: float | None
    """Unix time; `None` before the job started."""
    end_s: float | None
    """Unix time; `None` while it runs (scontrol's EndTime is then the time limit's end)."""
    nodes: tuple[str, ...]
    gres_indices: dict[str, list[int]] | None
    source: str


_ENDED = frozenset(
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
"""States in which a job no longer runs: its EndTime is when it ended."""


def job_run_from_scontrol(text: str, job_id: str) -> JobRun | None:
    """Job `job_id` in `scontrol show job -d --oneliner JOBID`'s answer; `None` when the
    answer does not hold it. An array's tasks are asked by `ARRAYID_TASKID`."""
    for line in text.splitlines():
        fields = _fields(line)
        array, task = _first(fields, "ArrayJobId"), _first(fields, "ArrayTaskId")
        ids = {_first(fields, "JobId"), f"{array}_{task}"}
        if job_id in ids:
            return _scontrol_run(fields, job_id)
    return None


def _scontrol_run(fields: list[tuple[str, str]], job_id: str) -> JobRun:
    state = _first(fields, "JobState")
    nodes = tuple(expand_hostlist(_first(fields, "NodeList")))
    indices: dict[str, list[int]] = {}
    current: list[str] = []
    for name, value in fields:
        if name == "Nodes":
            current = expand_hostlist(value)
        elif name == "GRES":
            held = gpu_indices(value)
            indices.update((node, held) for node in current if held is not None)
    return JobRun(
        job_id=job_id,
        state=state,
        start_s=_timestamp(_first(fields, "StartTime")) if state != "PENDING" else None,
        end_s=_end_time_s(fields),
        nodes=nodes,
        gres_indices=indices,
        source="scontrol",
    )


def _end_time_s(fields: list[tuple[str, str]]) -> float | None:
    """When the job ended; `None` while it runs or waits: then EndTime is only when its
    time limit would end it."""
    state = _first(fields, "JobState").split()[0] if _first(fields, "JobState") else ""
    if state not in _ENDED:
        return None
    return _timestamp(_first(fields, "EndTime"))


SACCT_FIELDS = "JobIDRaw,JobID,State,Start,End,NodeList"
"""What `sacct -X -P -n -o` is asked for; `job_run_from_sacct` reads these, in this order."""


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
            start_s=_timestamp(start),
            end_s=_timestamp(end) if state in _ENDED else None,
            nodes=tuple(expand_hostlist(nodes)),
            gres_indices=None,
            source="sacct",
        )
    return found
