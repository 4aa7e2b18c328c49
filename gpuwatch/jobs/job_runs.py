"""One job's run, asked of Slurm for `gpuwatch job-report`: when it started and ended, on
which nodes, and which GRES indices it holds on each while it runs.

`squeue --json` answers while the job runs and for `MinJobAge` (300 s by default) after it
ends (Slurm 21.08 on); an older squeue answers `squeue -o` of fields no user writes, with
the GRES indices from the job's own `scontrol show job -d` (see `slurm_text`). Where the
controller has forgotten the job, `sacct` answers if accounting is configured. None of
them names the GPUs of a job that has ended: the job's epilog (`SLURM_JOB_GPUS`) and the
daemon's memory of it (`sightings`) do.

Each command runs as `command` runs them: a deadline, its output read up to
`MAX_OUTPUT_BYTES` and no further, nothing it started left running.

Errors are one plain line: `SlurmAbsent` where this node has no Slurm to ask at all,
`SchedulerUnavailableError` where Slurm is there but does not answer, or answers past the
cap; a job Slurm does not know is `None`, not an error: the daemon may still remember it.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from gpuwatch.errors import SchedulerUnavailableError
from gpuwatch.jobs.command import Answer, run_command
from gpuwatch.jobs.hostlist import HostlistTooLarge, hostlist_names
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
MAX_OUTPUT_BYTES = 8 << 20
"""The most a Slurm command may answer job-report (8 MiB), read so far and no further:
sacct writes a line of about 80 bytes a run of the job (one per requeue), or a task of an
array asked by its own id (100,000 lines here; Slurm's MaxArraySize is 1,001 unless
raised). 22.05's `squeue --json` lists the whole cluster's jobs: past the cap, squeue's
rows are read instead, for the job alone."""
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


class JobRun(msgspec.Struct, frozen=True):
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
            msgspec.structs.force_setattr(
                self, "nodes", tuple(printable(node) for node in self.nodes)
            )


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
    answer = _run(["squeue", "--json"], env, timeout_s)
    if answer.out is not None:
        try:
            return _from_json(json_jobs(answer.out), job_id)
        except SlurmFormatError as error:
            raise SchedulerUnavailableError(
                f"Slurm's controller does not answer: {error}"
            ) from None
    # no --json (Slurm before 21.08), or 22.05's every job of the cluster, past the cap
    argv = ["squeue", "-h", "--states=all", f"--jobs={job_id}", "-o", ROW_FORMAT]
    answer = _answered(_run(argv, env, timeout_s), argv)
    if answer.out is None:
        if "invalid job id" in answer.error.lower():
            return None
        said = answer.error or "(it said nothing)"
        raise SchedulerUnavailableError(f"Slurm's controller does not answer: {said}")
    rows, doubts = rows_from_squeue(answer.out)
    if doubts:
        raise SchedulerUnavailableError(doubts[0].why)
    rows = [row for row in rows if job_id in (row.job_id, row.raw_id)]
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
    argv = ["scontrol", "show", "job", "-d", "--oneliner", raw_id]
    answer = _answered(_run(argv, env, timeout_s), argv)
    if answer.out is None:
        raise SchedulerUnavailableError(
            f"scontrol does not answer: {answer.error or '(it said nothing)'}"
        )
    found: dict[str, list[int]] = {}
    for node in nodes:
        try:
            indices = detail_indices(answer.out, node)
        except ValueError as error:  # a forged detail group, garbled indices
            raise SchedulerUnavailableError(str(error)) from None
        if indices is not None:
            found[node] = indices
    return found


def _from_json(jobs: list[Any], job_id: str) -> JobRun | None:
    """The job in `squeue --json`'s answer (22.05 lists every job, its filters aside);
    `SchedulerUnavailableError` where its record cannot be read (other records that
    cannot be read are not this job's concern)."""
    for entry in jobs:
        try:
            if job_id not in (json_job_id(entry), str(int(number(entry.get("job_id")) or 0))):
                continue
        except (TypeError, ValueError, AttributeError, OverflowError):
            continue
        try:
            return _json_run(entry, job_id)
        except (TypeError, ValueError, AttributeError, OverflowError) as error:
            raise SchedulerUnavailableError(
                f"Slurm's record of job {job_id} cannot be read: {clean(str(error))}"
            ) from None
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
    """The job in accounting; `None` where there is none (sacct absent or too slow,
    accounting off, no record); `SchedulerUnavailableError` where sacct answers more than
    any one job's record could need."""
    argv = ["sacct", "-j", job_id, "-X", "-P", "-n", "-o", SACCT_FIELDS]
    try:
        answer = _run(argv, env, timeout_s)
    except SchedulerUnavailableError:
        return None
    answer = _answered(answer, argv)
    return job_run_from_sacct(answer.out, job_id) if answer.out is not None else None


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
            nodes=_sacct_nodes(nodes),
            gres_indices=None,
            source="sacct",
        )
    return found


def _sacct_nodes(expression: str) -> tuple[str, ...]:
    try:
        return tuple(hostlist_names(expression))
    except HostlistTooLarge as error:
        raise SchedulerUnavailableError(f"sacct's node list cannot be read: {error}") from None


def _run(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> Answer:
    """A Slurm command's answer, read up to `MAX_OUTPUT_BYTES`; `SchedulerUnavailableError`
    when it is missing or outlives `timeout_s`."""
    answer = run_command(argv, env, timeout_s, MAX_OUTPUT_BYTES)
    if answer.why == "absent":
        raise SchedulerUnavailableError(f"{argv[0]} is not found")
    if answer.why == "timeout":
        raise SchedulerUnavailableError(f"{argv[0]} did not answer in {timeout_s:g}s")
    return answer


def _answered(answer: Answer, argv: Sequence[str]) -> Answer:
    """`answer`, unless it went past the cap: then `SchedulerUnavailableError`, saying so."""
    if answer.why == "too large":
        raise SchedulerUnavailableError(
            f"`{' '.join(argv[:3])}` answered more than {MAX_OUTPUT_BYTES >> 20} MiB, more "
            "than one job's record could need (for an array, ask for one task: JOBID_TASK)"
        )
    return answer
