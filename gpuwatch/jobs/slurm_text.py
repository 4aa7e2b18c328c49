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
  are unknown, never the forger's choice. The name shown for such a job is display
  only, cut from the same answer.

A record that cannot be believed (a field of the wrong type or out of range, a job id that
is none, GRES indices that do not parse, a forged detail group) is dropped alone, never the
whole answer, and never silently: it becomes a `Doubt` naming the GPUs it holds where they
can be read, else none (then any of the node's may be its). Each job kept passes the
checks the daemon's clients apply to `/v1/jobs` (`job_table.believed`).

Names and user names are data: control and other unprintable characters become `?`, and
they are cut to `MAX_TEXT_CHARS`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from gpuwatch.jobs.gres import gpu_indices, minors_of_indices
from gpuwatch.jobs.hostlist import expand_hostlist, hostlist_names
from gpuwatch.jobs.job_table import Doubt, Job, believed
from gpuwatch.text import printable

MAX_TEXT_CHARS = 256
"""Job names and users longer than this are cut: they are shown, never parsed further."""
MAX_SLURM_ID = (1 << 32) - 1
"""Slurm's ids of jobs, arrays and tasks are 32-bit numbers."""
MAX_DOUBTS = 64
"""The most records of one answer kept as doubts, one by one (see `kept_doubts`)."""
ROW_FORMAT = "%A|%F|%K|%T|%u|%S|%e|%l|%N"
"""`squeue -o`: raw job id, array job id, array task id, state, user, start, end, time
limit, nodes: no field a job's owner writes."""
_ROW_FIELDS = ROW_FORMAT.count("|") + 1
_DETAIL = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=\S*(?: Mem=\S*)? GRES(?:_IDX)?=(\S*)")
_LIMIT = re.compile(r"^(?:([0-9]{1,9})-)?(?:(?:([0-9]{1,9}):)?([0-9]{1,9}):)?([0-9]{1,9})$")
_ID = re.compile(r"[0-9]{1,10}")
_JSON_DIGITS = 32
_DURATION_FIELDS_S = (86400, 3600, 60, 1)


class SlurmFormatError(ValueError):
    """Slurm's answer is not what was asked for (not JSON, errors reported, a row that does
    not parse), or is ambiguous (a forged detail group): the jobs are unknown."""


def jobs_from_squeue_json(
    text: str, node: str, minors: Sequence[int | None]
) -> tuple[list[Job], list[Doubt]]:
    """The running jobs on `node` in `squeue --json`'s answer, with the GPUs each holds
    there (`minors[i]`: the minor number of GRES index i), and the records that cannot be
    believed, each dropped alone as a `Doubt` (see `json_job`).

    `SlurmFormatError` when the answer is no job list, or reports errors (squeue exits 0
    with `errors` when slurmctld cannot be reached): then nothing of it stands.
    """
    jobs: list[Job] = []
    doubts: list[Doubt] = []
    for entry in json_jobs(text):
        found = json_job(entry, node, minors)
        if isinstance(found, Job):
            jobs.append(found)
        elif found is not None:
            doubts.append(found)
    return jobs, kept_doubts(doubts)


def kept_doubts(doubts: list[Doubt]) -> list[Doubt]:
    """At most `MAX_DOUBTS`: the rest as one that names the whole node (a list of bad
    records is input too, and could be long)."""
    if len(doubts) <= MAX_DOUBTS:
        return doubts
    left = len(doubts) - MAX_DOUBTS + 1
    return [*doubts[: MAX_DOUBTS - 1], Doubt(f"{left} more records could not be believed")]


def json_job(entry: Any, node: str, minors: Sequence[int | None]) -> Job | Doubt | None:
    """One `squeue --json` record: a `Job` running on `node`; `None` for one that does not
    run there (pending, ended, elsewhere); a `Doubt` for one that may run there but cannot
    be believed (a field of the wrong type or out of range), naming its GPUs where they
    can be read, else none (then any of the node's may be its)."""
    if not isinstance(entry, dict):
        return Doubt(f"squeue --json listed a job that is no object: {clean(repr(entry))}")
    label = _label(entry)
    place = _place(entry, node, label)
    if place is None or isinstance(place, Doubt):
        return place
    position, surely_running = place
    try:
        held = minors_of_indices(json_gres_indices(entry, position), minors)
    except (TypeError, ValueError) as error:
        return Doubt(f"{label}: its GPUs cannot be read ({clean(str(error))})")
    if not surely_running:
        return Doubt(f"{label}: job_state cannot be read", held)
    return _json_fields(entry, label, held)


def _place(entry: dict[str, Any], node: str, label: str) -> tuple[int, bool] | Doubt | None:
    """Where `node` is among the job's nodes (its place in `gres_detail`), and whether the
    job surely runs (False: its state cannot be read); `None` where it surely does not run
    there."""
    try:
        running: bool | None = "RUNNING" in json_states(entry)
    except (TypeError, ValueError):
        running = None  # perhaps
    if running is False:
        return None
    try:
        nodes = json_nodes(entry)
    except (TypeError, ValueError, AttributeError) as error:
        return Doubt(f"{label}: its nodes cannot be read ({clean(str(error))})")
    return (nodes.index(node), running is True) if node in nodes else None


def _json_fields(entry: dict[str, Any], label: str, held: tuple[int, ...]) -> Job | Doubt:
    """The job of a record running here, its GPUs `held`; a `Doubt` naming them where
    another field cannot be believed."""
    try:
        limit_min = number(entry.get("time_limit"))
        job = Job(
            job_id=json_job_id(entry),
            user=text_of(entry.get("user_name")),
            name=text_of(entry.get("name")),
            gpu_minor_numbers=held,
            started_at=positive(number(entry.get("start_time"))),
            time_limit_s=None if limit_min is None else limit_min * 60.0,
            state="RUNNING",
        )
    except (TypeError, ValueError, OverflowError) as error:
        return Doubt(f"{label}: {clean(str(error))}", held)
    return believed(job)


def _label(entry: dict[str, Any]) -> str:
    """`job 1234` where the record's id reads as one, else `a job`: for messages."""
    try:
        return f"job {json_job_id(entry)}"
    except (TypeError, ValueError, OverflowError):
        return "a job"


def json_jobs(text: str) -> list[Any]:
    """The `jobs` list of `squeue --json`'s answer; `SlurmFormatError` when there is none."""
    try:
        data = json.loads(text, parse_int=_json_int)
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


def json_states(entry: Any) -> list[str]:
    """The job's states: 22.05's one string, or 23.11's list of them."""
    state = entry.get("job_state")
    states = state if isinstance(state, list) else [state]
    if not all(isinstance(item, str) for item in states):
        raise TypeError(f"job_state is not text: {clean(repr(state))}")
    return states


def json_gres_indices(entry: Any, position: int) -> list[int]:
    """The GPU GRES indices of the job's `position`-th node; `ValueError` or `TypeError`
    where they cannot be read (a job whose GPUs are unknown is never shown holding none)."""
    details = entry.get("gres_detail") or []
    if not isinstance(details, list):
        raise TypeError(f"gres_detail is not a list: {clean(repr(details))}")
    detail = details[position] if position < len(details) else ""
    if not isinstance(detail, str):
        raise TypeError(f"gres_detail is not text: {clean(repr(detail))}")
    indices = gpu_indices(detail)
    if indices is None:
        raise ValueError(f"garbled GRES indices {clean(detail[:80])!r}")
    return indices


def _json_int(text: str) -> int | float:
    """A JSON integer; one of more digits than any Slurm number has is infinite (which no
    field takes): a record holding one is doubted alone, where Python's own limit on
    digits would fail the whole answer."""
    return int(text) if len(text) <= _JSON_DIGITS else math.inf


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
    return expand_hostlist(string(nodes))


def json_job_id(entry: Any) -> str:
    """`1234`, or `1234_7` for an array's task, as Slurm names them; `ValueError` for
    what is no Slurm id (a whole number from 1 to `MAX_SLURM_ID`)."""
    job_id = _slurm_id(entry.get("job_id"), "job_id")
    if job_id is None or job_id == 0:
        raise ValueError(f"job_id is no job id: {clean(repr(entry.get('job_id')))}")
    task = _slurm_id(entry.get("array_task_id"), "array_task_id")
    array = _slurm_id(entry.get("array_job_id"), "array_job_id")
    if task is not None and array:
        return f"{array}_{task}"
    return str(job_id)


def _slurm_id(value: Any, name: str) -> int | None:
    """A Slurm id (a job's, an array's, a task's: 32 bits), or `None` where it is unset."""
    found = number(value)
    if found is None:
        return None
    if not (0 <= found <= MAX_SLURM_ID and found == int(found)):
        raise ValueError(f"{name} is no Slurm id: {clean(repr(value))}")
    return int(found)


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


class JobRow(msgspec.Struct, frozen=True):
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


def rows_from_squeue(text: str) -> tuple[list[JobRow], list[Doubt]]:
    """The jobs of `squeue -h -o ROW_FORMAT`, and each line that is no such row as a
    `Doubt` naming no GPU (no field of a row is free text, so which job a bad line is, and
    where it runs, is not known)."""
    rows: list[JobRow] = []
    doubts: list[Doubt] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rows.append(_row(line))
        except ValueError as error:
            doubts.append(Doubt(f"squeue printed {clean(line[:80])!r}, not a job row: {error}"))
    return rows, kept_doubts(doubts)


def _row(line: str) -> JobRow:
    parts = line.split("|")
    if len(parts) != _ROW_FIELDS or not _is_id(parts[0]):
        raise ValueError(f"{_ROW_FIELDS} fields and a job id wanted")
    raw, array, task, state, user, start, end, limit, nodes = parts
    return JobRow(
        raw_id=raw,
        job_id=f"{array}_{task}" if _is_id(array) and _is_id(task) else raw,
        state=state.strip(),
        user=text_of(user.strip()),
        start_s=timestamp(start),
        end_s=timestamp(end),
        time_limit_s=parse_duration_s(limit),
        nodes=tuple(expand_hostlist(nodes)),
    )


def _is_id(text: str) -> bool:
    return _ID.fullmatch(text) is not None and int(text) <= MAX_SLURM_ID


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
