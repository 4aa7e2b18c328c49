"""Slurm's answers about jobs, parsed, where no job can forge them. Pure: no process is run.

A job's name, working directory, command and comment are free text in which a user can
write anything (`UserId=alice`, `JobState=RUNNING`, `GRES=gpu:4(IDX:0-3)`, new lines too).
So only structured answers are read:

- `squeue --json` (Slurm 21.08 on), both shapes: 21.08-22.05 (plain numbers, `job_state`
  a string, `job_resources.nodes` a hostlist) and 23.02 on (numbers as `{"set",
  "infinite", "number"}`, `job_state` a list from 23.11, `job_resources.nodes` an object
  with `list` and `allocation` from 23.11). `gres_detail[i]` is the i-th node's. 22.05's
  squeue ignores `--states`/`--nodelist` with `--json`: filtering is done here.
- Where squeue has no `--json`: `squeue -o` with `ROW_FORMAT`, fields no user writes
  (ids, user name, times, node list, state), `|` between them; and for each job's GRES
  indices `scontrol show job -d --oneliner JOBID`, of which only the detail group naming
  this node is read (`Nodes=... CPU_IDs=... Mem=... GRES=gpu:2(IDX:0-1)`, or `GRES_IDX=`
  before Slurm 19.05). A forged group in a job's free text makes two: then the job's GPUs
  are unknown (and so are the node's jobs), never the forger's choice. The name shown
  for such a job is display only, cut from the same answer.

Names and user names are data: control and other unprintable characters become `?`, and
they are cut to `MAX_TEXT_CHARS`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatch.jobs.gres import gpu_indices, minors_of_indices
from gpuwatch.jobs.hostlist import hostlist_names
from gpuwatch.jobs.job_table import Job
from gpuwatch.text import printable

MAX_TEXT_CHARS = 256
"""Job names and users longer than this are cut: they are shown, never parsed further."""
ROW_FORMAT = "%A|%F|%K|%T|%u|%S|%e|%l|%N"
"""`squeue -o`: raw job id, array job id, array task id, state, user, start, end, time
limit, nodes: no field a job's owner writes."""
_ROW_FIELDS = ROW_FORMAT.count("|") + 1
_DETAIL = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=\S*(?: Mem=\S*)? GRES(?:_IDX)?=(\S*)")
_LIMIT = re.compile(r"^(?:(\d+)-)?(?:(?:(\d+):)?(\d+):)?(\d+)$")
_DURATION_FIELDS_S = (86400, 3600, 60, 1)


class SlurmFormatError(ValueError):
    """Slurm's answer is not what was asked for (not JSON, errors reported, a row that does
    not parse), or is ambiguous (a forged detail group): the jobs are unknown."""


def jobs_from_squeue_json(text: str, node: str, minors: Sequence[int | None]) -> list[Job]:
    """The running jobs on `node` in `squeue --json`'s answer, with the GPUs each holds
    there (`minors[i]`: the minor number of GRES index i).

    `SlurmFormatError` when the answer is no job list, reports errors (squeue exits 0 with
    `errors` when slurmctld cannot be reached), or a job here has garbled GRES indices. A
    job entry of the wrong shape elsewhere is skipped; the rest of the answer stands.
    """
    jobs = []
    for entry in json_jobs(text):
        try:
            job = _json_job(entry, node, minors)
        except SlurmFormatError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
            continue
        if job is not None:
            jobs.append(job)
    return jobs


def json_jobs(text: str) -> list[Any]:
    """The `jobs` list of `squeue --json`'s answer; `SlurmFormatError` when there is none."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise SlurmFormatError(f"squeue --json printed no JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise SlurmFormatError("squeue --json printed no `jobs` list")
    if data.get("errors"):
        raise SlurmFormatError(f"squeue --json reported errors: {clean(str(data['errors']))}")
    jobs: list[Any] = data["jobs"]
    return jobs


def _json_job(entry: Any, node: str, minors: Sequence[int | None]) -> Job | None:
    if "RUNNING" not in json_states(entry):
        return None
    nodes = json_nodes(entry)
    if node not in nodes:
        return None
    indices = json_gres_indices(entry, nodes.index(node))
    limit_min = number(entry.get("time_limit"))
    return Job(
        job_id=json_job_id(entry),
        user=text_of(entry.get("user_name")),
        name=text_of(entry.get("name")),
        gpu_minor_numbers=minors_of_indices(indices, minors),
        started_at=positive(number(entry.get("start_time"))),
        time_limit_s=None if limit_min is None else limit_min * 60.0,
        state="RUNNING",
    )


def json_states(entry: Any) -> list[Any]:
    state = entry.get("job_state")
    return state if isinstance(state, list) else [state]


def json_gres_indices(entry: Any, position: int) -> list[int]:
    """The GPU GRES indices of the job's `position`-th node. Garbled indices of a job here
    make the whole answer unknown: a job whose GPUs are unknown is not shown holding none."""
    details = entry.get("gres_detail") or []
    if not isinstance(details, list):
        raise TypeError("gres_detail is not a list")
    detail = details[position] if position < len(details) else ""
    indices = gpu_indices(string(detail))
    if indices is None:
        raise SlurmFormatError(f"job {json_job_id(entry)}: garbled GRES indices {detail[:80]!r}")
    return indices


def json_nodes(entry: Any) -> list[str]:
    """The job's nodes in order: gres_detail's order."""
    resources = entry.get("job_resources")
    nodes: Any = resources.get("nodes") if isinstance(resources, dict) else None
    if isinstance(nodes, dict):  # 23.11 on
        allocation = nodes.get("allocation")
        if isinstance(allocation, list) and allocation:
            return [string(item.get("name")) for item in allocation]
        nodes = nodes.get("list")
    if not isinstance(nodes, str) or not nodes:
        nodes = entry.get("nodes")
    return hostlist_names(string(nodes))


def json_job_id(entry: Any) -> str:
    """`1234`, or `1234_7` for an array's task, as Slurm names them."""
    job_id = number(entry.get("job_id"))
    if job_id is None or job_id <= 0:
        raise ValueError("no job id")
    task = number(entry.get("array_task_id"))
    array = number(entry.get("array_job_id"))
    if task is not None and array:
        return f"{int(array)}_{int(task)}"
    return str(int(job_id))


def number(value: Any) -> float | None:
    """A JSON number, or 23.02's `{"set": true, "infinite": false, "number": N}`;
    `None` for unset, infinite or absent."""
    if isinstance(value, dict):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        value = value.get("number")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return float(value)


def positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"not a string: {type(value).__name__}")
    return value


def text_of(value: Any) -> str | None:
    """A name to show: unprintable characters out, cut to `MAX_TEXT_CHARS`."""
    if value is None or value == "":
        return None
    return clean(string(value))


def clean(text: str) -> str:
    return printable(text[:MAX_TEXT_CHARS])


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job in `squeue -o ROW_FORMAT`'s answer."""

    raw_id: str
    """Slurm's own id of this job (an array task's too): what scontrol is asked for."""
    job_id: str
    """As people name it: `1234`, or `1234_7` for an array's task."""
    state: str
    user: str | None
    start_s: float | None
    end_s: float | None
    time_limit_s: float | None
    nodes: tuple[str, ...]


def rows_from_squeue(text: str) -> list[JobRow]:
    """The jobs of `squeue -h -o ROW_FORMAT`; `SlurmFormatError` for a line that is not
    such a row (no field of it is free text: a bad line means a bad answer)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != _ROW_FIELDS or not parts[0].isdecimal():
            raise SlurmFormatError(f"squeue printed {clean(line[:80])!r}, not a job row")
        raw, array, task, state, user, start, end, limit, nodes = parts
        named = f"{array}_{task}" if array.isdecimal() and task.isdecimal() else raw
        rows.append(
            JobRow(
                raw_id=raw,
                job_id=named,
                state=state.strip(),
                user=text_of(user.strip()),
                start_s=timestamp(start),
                end_s=timestamp(end),
                time_limit_s=parse_duration_s(limit),
                nodes=tuple(hostlist_names(nodes)),
            )
        )
    return rows


def detail_indices(text: str, node: str) -> list[int] | None:
    """The GPU GRES indices `scontrol show job -d --oneliner JOBID`'s answer gives `node`:
    from the one detail group naming it; `None` when none does (the job does not run
    there, or has ended: scontrol drops the groups' indices then). `SlurmFormatError` when
    two groups name it (one is forged) or the indices are garbled."""
    groups = [gres for nodes, gres in _DETAIL.findall(text) if node in hostlist_names(nodes)]
    if not groups:
        return None
    if len(groups) > 1:
        raise SlurmFormatError(
            f"scontrol's answer names node {node} in {len(groups)} GRES details: a job's "
            "free text (its name, command or folder) holds one, so which is Slurm's is not known"
        )
    indices = gpu_indices(groups[0])
    if indices is None:
        raise SlurmFormatError(f"garbled GRES indices {clean(groups[0][:80])!r}")
    return indices


def name_in_detail(text: str, user: str | None) -> str | None:
    """The job name in scontrol's answer, for display only: from `JobName=` to the first
    ` UserId=USER(`. A name holding that text shows cut; nothing else is read from it."""
    start = text.find("JobName=")
    if start < 0:
        return None
    start += len("JobName=")
    end = text.find(f" UserId={user}(", start) if user else -1
    if end < 0:
        end = text.find(" UserId=", start)
    return text_of(text[start : end if end >= 0 else None]) if end != start else None


def timestamp(text: str) -> float | None:
    """Slurm's local time `2026-11-23T22:35:11` as a Unix time; `None` for `Unknown`,
    `NONE`, `N/A` and anything else."""
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def parse_duration_s(text: str) -> float | None:
    """Slurm's `[D-][[H:]M:]S` time limit (`1-00:00:00`, `1:30:00`, `90`) in seconds;
    `None` for `UNLIMITED`, `NOT_SET` and anything else. A bare number is minutes."""
    match = _LIMIT.match(text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = match.groups()
    if hours is None and minutes is None and days is None:
        return int(seconds) * 60.0
    if minutes is None:  # D-H
        return int(days or 0) * 86400.0 + int(seconds) * 3600.0
    if days is not None and hours is None:  # D-H:M
        hours, minutes, seconds = minutes, seconds, "0"
    parts = (int(days or 0), int(hours or 0), int(minutes), int(seconds))
    return float(sum(part * unit for part, unit in zip(parts, _DURATION_FIELDS_S, strict=True)))
