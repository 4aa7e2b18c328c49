"""Slurm's answers about running jobs, parsed: `squeue --json` and `scontrol show job -d
--oneliner` text in, this node's `Job`s out. Pure: no process is run here.

Both shapes of `squeue --json` are read: Slurm 21.08-22.05 (`openapi/v0.0.37`-`38`: plain
numbers, `job_state` a string, `job_resources.nodes` a hostlist) and 23.02 on (`v0.0.39`
and later: numbers as `{"set", "infinite", "number"}`, `job_state` a list, from 23.11
`job_resources.nodes` an object with `list` and `allocation`). `gres_detail[i]` describes
the i-th node of the job's node list. A job entry of the wrong shape is skipped; the rest
of the answer stands.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from gpuwatch.jobs.gres import expand_hostlist, gpu_indices, minors_of_indices
from gpuwatch.jobs.job_table import Job

MAX_TEXT_CHARS = 256
"""Job names and users longer than this are cut: they are shown, never parsed further."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_KEY = re.compile(r"(?:^|(?<= ))([A-Za-z][A-Za-z0-9_/:]*)=")
_LIMIT = re.compile(r"^(?:(\d+)-)?(?:(?:(\d+):)?(\d+):)?(\d+)$")
_DURATION_FIELDS_S = (86400, 3600, 60, 1)


class SlurmFormatError(ValueError):
    """Slurm's answer as a whole is not what was asked for (not JSON, errors reported)."""


def jobs_from_squeue_json(text: str, node: str, minors: Sequence[int | None]) -> list[Job]:
    """The running jobs on `node` in `squeue --json`'s answer, with the GPUs each holds
    there (`minors[i]`: the minor number of gres.conf's i-th GPU file).

    `SlurmFormatError` when the answer is no job list or reports errors (squeue exits 0
    with `errors` when slurmctld cannot be reached).
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise SlurmFormatError(f"squeue --json printed no JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise SlurmFormatError("squeue --json printed no `jobs` list")
    if data.get("errors"):
        raise SlurmFormatError(f"squeue --json reported errors: {_clean(str(data['errors']))}")
    jobs = []
    for entry in data["jobs"]:
        try:
            job = _json_job(entry, node, minors)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
            continue
        if job is not None:
            jobs.append(job)
    return jobs


def _json_job(entry: Any, node: str, minors: Sequence[int | None]) -> Job | None:
    state = entry.get("job_state")
    states = state if isinstance(state, list) else [state]
    if "RUNNING" not in states:
        return None
    nodes = _json_nodes(entry)
    if node not in nodes:
        return None
    details = entry.get("gres_detail") or []
    if not isinstance(details, list):
        raise TypeError("gres_detail is not a list")
    position = nodes.index(node)
    detail = details[position] if position < len(details) else ""
    indices = _held(_string(detail))
    limit_min = _number(entry.get("time_limit"))
    return Job(
        job_id=_json_job_id(entry),
        user=_text(entry.get("user_name")),
        name=_text(entry.get("name")),
        gpu_minor_numbers=minors_of_indices(indices, minors),
        started_at=_positive(_number(entry.get("start_time"))),
        time_limit_s=None if limit_min is None else limit_min * 60.0,
        state="RUNNING",
    )


def _held(gres: str) -> list[int]:
    """The GPU indices of a node's GRES detail; `ValueError` (the job is skipped) when they
    are garbled: a job whose GPUs are unknown is not shown holding none."""
    indices = gpu_indices(gres)
    if indices is None:
        raise ValueError(f"garbled GRES indices: {gres[:80]!r}")
    return indices


def _json_nodes(entry: Any) -> list[str]:
    """The job's nodes in order: gres_detail's order."""
    resources = entry.get("job_resources")
    nodes: Any = resources.get("nodes") if isinstance(resources, dict) else None
    if isinstance(nodes, dict):  # 23.11 on
        allocation = nodes.get("allocation")
        if isinstance(allocation, list) and allocation:
            return [_string(item.get("name")) for item in allocation]
        nodes = nodes.get("list")
    if not isinstance(nodes, str) or not nodes:
        nodes = entry.get("nodes")
    return expand_hostlist(_string(nodes))


def _json_job_id(entry: Any) -> str:
    job_id = _number(entry.get("job_id"))
    if job_id is None or job_id <= 0:
        raise ValueError("no job id")
    task = _number(entry.get("array_task_id"))
    array = _number(entry.get("array_job_id"))
    if task is not None and array:
        return f"{int(array)}_{int(task)}"
    return str(int(job_id))


def _number(value: Any) -> float | None:
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


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"not a string: {type(value).__name__}")
    return value


def _text(value: Any) -> str | None:
    """A name to show: control characters out, cut to `MAX_TEXT_CHARS`."""
    if value is None or value == "":
        return None
    return _clean(_string(value))


def _clean(text: str) -> str:
    return _CONTROL.sub("?", text[:MAX_TEXT_CHARS])


def jobs_from_scontrol(text: str, node: str, minors: Sequence[int | None]) -> list[Job]:
    """The running jobs on `node` in `scontrol show job -d --oneliner` (one job a line;
    `-d` adds `Nodes=... GRES=gpu:2(IDX:0-1)` for each group of the job's nodes)."""
    jobs = []
    for line in text.splitlines():
        try:
            job = _scontrol_job(line, node, minors)
        except (TypeError, ValueError, OverflowError):
            continue
        if job is not None:
            jobs.append(job)
    return jobs


def _scontrol_job(line: str, node: str, minors: Sequence[int | None]) -> Job | None:
    fields = _fields(line)
    if _first(fields, "JobState") != "RUNNING":
        return None
    indices = _scontrol_indices(fields, node)
    if indices is None:
        return None
    job_id = _first(fields, "JobId")
    if not job_id.isdecimal():
        raise ValueError("no job id")
    array, task = _first(fields, "ArrayJobId"), _first(fields, "ArrayTaskId")
    user = _first(fields, "UserId").rpartition("(")[0]
    limit = _first(fields, "TimeLimit")
    return Job(
        job_id=f"{array}_{task}" if array.isdecimal() and task.isdecimal() else job_id,
        user=_text(user),
        name=_text(_first(fields, "JobName")),
        gpu_minor_numbers=minors_of_indices(indices, minors),
        started_at=_timestamp(_first(fields, "StartTime")),
        time_limit_s=parse_duration_s(limit),
        state="RUNNING",
    )


def _fields(line: str) -> list[tuple[str, str]]:
    """`Key=value` pairs in order; a value runs to the next ` Key=` (Command= and WorkDir=
    may hold spaces). A job name holding ` Key=` text is ambiguous here: the JSON answer,
    used wherever Slurm gives one, is not."""
    marks = list(_KEY.finditer(line))
    if not marks:
        return []
    ends = [mark.start() for mark in marks[1:]] + [len(line)]
    pairs = zip(marks, ends, strict=True)
    return [(mark.group(1), line[mark.end() : end].strip()) for mark, end in pairs]


def _first(fields: list[tuple[str, str]], key: str) -> str:
    return next((value for name, value in fields if name == key), "")


def _scontrol_indices(fields: list[tuple[str, str]], node: str) -> list[int] | None:
    """The job's GPU indices on `node` from the `-d` detail (`Nodes=` then `GRES=`);
    `None` when the job does not run there."""
    current: list[str] = []
    for name, value in fields:
        if name == "Nodes":
            current = expand_hostlist(value)
        elif name == "GRES" and node in current:
            return _held(value)
    return [] if node in expand_hostlist(_first(fields, "NodeList")) else None


def _timestamp(text: str) -> float | None:
    """scontrol's local time `2026-11-23T22:35:11` as a Unix time."""
    import datetime as dt  # here: squeue's JSON, the usual answer, needs none of it

    try:
        return dt.datetime.fromisoformat(text).timestamp()
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
