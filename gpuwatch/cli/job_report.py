"""`gpuwatch job-report JOBID`: what a Slurm job did with each of its GPUs on this node,
from the daemon's history (the GPU half of `seff`), during the job or after it.

Slurm says when the job ran (`gpuwatch.jobs.job_runs`) while it remembers the job; the
daemon says which GPUs the job held (it remembers every job it saw, as long as its
history: `/v1/jobs/seen`), which NVML GPU has each device file (its snapshot's
`minor_number`) and what each GPU did (`/v1/history`); `gpuwatch.reports.job_gpu_report`
puts it together and sums it up. What the history does not cover is said in plain lines
under the table, never filled in, and the exit code says it too.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import click
import msgspec

from gpuwatch.backends.daemon_client import DaemonBackend, http_get, parse_series
from gpuwatch.cli.group import short_help
from gpuwatch.cli.options import Command
from gpuwatch.errors import (
    DaemonUnavailableError,
    InvalidValueError,
    JobHistoryShortError,
    JobUnknownError,
    RemoteError,
    SchedulerUnavailableError,
)
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.jobs.gres import (
    default_gres_conf,
    minors_of_indices,
    node_gpu_minors,
    parse_index_list,
)
from gpuwatch.jobs.gres_conf import GresOrderUnknown, detected_gpus
from gpuwatch.jobs.job_runs import SlurmAbsent, slurm_run
from gpuwatch.jobs.sightings import sighting_from_record
from gpuwatch.jobs.slurm import slurm_node_name
from gpuwatch.jobs.slurm_places import configured_slurm_conf
from gpuwatch.models import GpuSample, Snapshot
from gpuwatch.record_fields import BadRecord
from gpuwatch.reports.job_gpu_report import (
    DaemonMemory,
    GpuJobUsage,
    JobOnNode,
    SlurmAnswer,
    about,
    clock_time,
    gpu_job_usage,
    job_on_node,
    shortfalls,
)
from gpuwatch.units import format_size

_JOB_ID = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,12})?$")
_DAEMON_TIMEOUT_S = 10.0
_BUSY_RETRIES_S = (0.2, 0.5, 1.0, 0.0)


class _Row(msgspec.Struct):
    gpu: GpuSample
    usage: GpuJobUsage


class _Report(msgspec.Struct):
    job: JobOnNode
    end_s: float
    rows: list[_Row] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)


@click.command("job-report", cls=Command, short_help=short_help("job-report"))
@click.argument("job_id", metavar="JOBID")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    help="The daemon's socket.  [default: $GPUWATCH_SOCKET, else where the daemon listens]",
)
def job_report(job_id: str, as_json: bool, socket_path: str | None) -> int:
    """Per GPU of Slurm job JOBID on this node, over its run: mean and peak utilisation,
    peak memory and time idle, read from the daemon's history. Works while the job runs
    and after it ends, by hand or from Slurm's epilog (examples/slurm/epilog.sh): the
    daemon remembers which GPUs each job held as long as its --history, with or without
    Slurm's accounting. Lines under the table say what the history does not cover; then
    the exit code is 8. A job neither Slurm nor the daemon knows exits 7.

    \b
    Example:
      gpuwatch job-report 4242
      gpuwatch job-report 4242_7 --json
    """
    if not _JOB_ID.match(job_id):
        raise InvalidValueError(
            f"{job_id[:40]!r} is not a Slurm job id: give a number (4242) or an array task (4242_7)"
        )
    env = dict(os.environ)
    slurm = _ask_slurm(job_id, env)
    daemon = _daemon(socket_path, job_id, slurm)
    snapshot = daemon.sample()
    node = slurm_node_name(env)
    memory = _memory(daemon.socket_path, job_id)
    given = _gpus_given(job_id, node, env, slurm, snapshot)
    job = job_on_node(job_id, node, slurm, memory, given)
    report = _report(job, daemon.socket_path, snapshot)
    click.echo(json.dumps(_document(report), indent=2) if as_json else _text(report))
    if any(row.usage.history_short or not row.usage.samples for row in report.rows):
        raise JobHistoryShortError(
            f"the daemon's history is shorter than job {job_id}: the figures cover only part of it"
        )
    return 0


def _ask_slurm(job_id: str, env: dict[str, str]) -> SlurmAnswer:
    try:
        run = slurm_run(job_id, env)
    except SlurmAbsent as error:
        return SlurmAnswer(None, f"there is no Slurm on this node to ask ({error})")
    except SchedulerUnavailableError as error:
        return SlurmAnswer(None, f"Slurm cannot be asked: {error}", unavailable=True)
    if run is None:
        return SlurmAnswer(
            None,
            f"Slurm knows no job {job_id} (its controller forgets a job MinJobAge, 300 s by "
            "default, after it ends, and accounting has no record of it)",
        )
    return SlurmAnswer(run)


def _gpus_given(
    job_id: str, node: str, env: dict[str, str], slurm: SlurmAnswer, snapshot: Snapshot
) -> tuple[tuple[int, ...], str] | None:
    """The job's GPUs by GRES index: its own `SLURM_JOB_GPUS` (its epilog, or the job
    itself), else Slurm's while it runs; `None` where neither names them."""
    in_job = env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_JOB_GPUS", "").strip()
    indices = parse_index_list(env["SLURM_JOB_GPUS"]) if in_job else None
    source = "SLURM_JOB_GPUS"
    run = slurm.run
    if indices is None and run is not None and run.gres_indices and run.state == "RUNNING":
        indices, source = run.gres_indices.get(node), run.source
    if indices is None:
        return None
    conf = configured_slurm_conf(env)
    try:
        minors = node_gpu_minors(
            default_gres_conf(env),
            Path(conf) if conf is not None else None,
            node,
            detected_gpus(snapshot.gpus),
        )
    except GresOrderUnknown as error:
        raise JobUnknownError(f"which GPUs GRES indices name here is not known: {error}") from None
    return minors_of_indices(indices, minors), source


def _daemon(socket_path: str | None, job_id: str, slurm: SlurmAnswer) -> DaemonBackend:
    """The daemon; where none answers and Slurm knows no such job either, the job was
    never seen (7), else the report cannot be made (6)."""
    try:
        return DaemonBackend(socket_path)
    except DaemonUnavailableError as error:
        if slurm.run is None:
            memory = DaemonMemory(None, None, reading=False, absent=str(error))
            job_on_node(job_id, "", slurm, memory, None)  # raises: never seen
        raise RemoteError(
            "no daemon running: job-report reads the daemon's history; start `gpuwatch "
            f"daemon` ({error})"
        ) from None


def _memory(socket_path: str, job_id: str) -> DaemonMemory:
    """What the daemon remembers of the job; nothing, from a daemon without the route."""
    data = _get_json(socket_path, f"/v1/jobs/seen?job_id={job_id}")
    if not isinstance(data, dict) or "seen" not in data:
        return DaemonMemory(None, None, reading=False)
    since = data.get("memory_since")
    since = float(since) if isinstance(since, int | float) and not isinstance(since, bool) else None
    try:
        seen = sighting_from_record(data["job"]) if data.get("seen") is True else None
    except BadRecord as error:
        raise RemoteError(f"the daemon's memory of job {job_id} is malformed: {error}") from None
    if seen is not None and seen.job.job_id != job_id:
        raise RemoteError(f"the daemon answered for job {seen.job.job_id[:40]}, not {job_id}")
    return DaemonMemory(seen, since, data.get("reading") is not False)


def _get_json(socket_path: str, path: str) -> object:
    try:
        for wait_s in _BUSY_RETRIES_S:  # 503: two other answers are being built (epilogs)
            status, body = http_get(socket_path, path, _DAEMON_TIMEOUT_S)
            if status != 503:
                break
            time.sleep(wait_s)
        return json.loads(body) if status == 200 else None
    except (OSError, ValueError) as error:
        raise RemoteError(f"the daemon cannot be read: {error}") from None


def _report(job: JobOnNode, socket_path: str, snapshot: Snapshot) -> _Report:
    gpus = {gpu.minor_number: gpu for gpu in snapshot.gpus}
    report = _Report(job, job.end_s if job.end_s is not None else time.time())
    report.notes.extend(job.notes)
    if job.end_s is None:
        report.notes.append(f"job {job.job_id} still runs: the figures are up to now")
    history, interval_s = _history(socket_path, job.start_s, report)
    for minor in job.minor_numbers:
        gpu = gpus.get(minor)
        if gpu is None:
            report.notes.append(f"/dev/nvidia{minor}: not among the daemon's GPUs")
            continue
        series = _series_of(gpu, history)
        usage = gpu_job_usage(series, job.start_s, report.end_s, interval_s)
        report.rows.append(_Row(gpu, usage))
    report.notes.extend(shortfalls([row.usage for row in report.rows]))
    return report


def _history(socket_path: str, start_s: float, report: _Report) -> tuple[list[GpuSeries], float]:
    """Every GPU's history since a little before `start_s`, and the sampling interval."""
    data = _get_json(socket_path, f"/v1/history?since={start_s - 5:.3f}")
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise RemoteError("the daemon sent no history")
    if data.get("truncated") is True:
        report.notes.append("the daemon sent only its newest samples: older ones were left out")
    interval_s = data.get("interval_s")
    if not isinstance(interval_s, int | float) or not 0 < interval_s <= 3600:
        interval_s = 1.0
    return [s for item in data["gpus"] if (s := parse_series(item)) is not None], interval_s


def _series_of(gpu: GpuSample, history: list[GpuSeries]) -> GpuSeries:
    """`gpu`'s series: by UUID, else by index; an empty one when the history has none."""
    for series in history:
        if (gpu.uuid and series.uuid == gpu.uuid) or (not gpu.uuid and series.index == gpu.index):
            return series
    return GpuSeries(gpu.index, gpu.uuid, [], [], [], [], [])


def _text(report: _Report) -> str:
    job = report.job
    head = (
        f"job {job.job_id} on {job.node}: {job.state}, from {clock_time(job.start_s)} for "
        f"{about(report.end_s - job.start_s)} (GPUs from {job.gpus_from})"
    )
    table: list[tuple[str, ...]] = [
        ("GPU", "NAME", "MEAN UTIL", "PEAK UTIL", "PEAK MEMORY", "IDLE", "COVERED")
    ]
    table += [_cells(row) for row in report.rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    return "\n".join([head, *(line.rstrip() for line in lines), *report.notes])


def _cells(row: _Row) -> tuple[str, ...]:
    usage = row.usage
    mean = usage.mean_utilization_pct
    peak_memory = usage.peak_memory_used_bytes
    covered_pct = 100 * usage.covered_s / usage.job_s if usage.job_s > 0 else 0.0
    covered_pct = covered_pct if usage.samples else 0.0
    return (
        str(row.gpu.index),
        (row.gpu.name or "?")[:32],
        "?" if mean is None else f"{mean:.0f}%",
        "?" if usage.peak_utilization_pct is None else f"{usage.peak_utilization_pct}%",
        "?" if peak_memory is None else format_size(peak_memory),
        about(usage.idle_s),
        f"{covered_pct:.0f}%",
    )


def _document(report: _Report) -> dict[str, Any]:
    job = report.job
    return {
        "job_id": job.job_id,
        "node": job.node,
        "state": job.state,
        "start_time": job.start_s,
        "end_time": job.end_s,
        "running": job.end_s is None,
        "duration_s": report.end_s - job.start_s,
        "jobs_source": job.jobs_from,
        "gpus_source": job.gpus_from,
        "gpus": [_gpu_document(row) for row in report.rows],
        "notes": report.notes,
    }


def _gpu_document(row: _Row) -> dict[str, Any]:
    usage = row.usage
    mean = usage.mean_utilization_pct
    return {
        "index": row.gpu.index,
        "uuid": row.gpu.uuid,
        "name": row.gpu.name,
        "minor_number": row.gpu.minor_number,
        "mean_utilization_pct": None if mean is None else round(mean, 1),
        "peak_utilization_pct": usage.peak_utilization_pct,
        "peak_memory_used_bytes": usage.peak_memory_used_bytes,
        "idle_s": round(usage.idle_s, 3),
        "covered_s": round(usage.covered_s, 3),
        "samples": usage.samples,
        "history_short": usage.history_short,
        "starts_late_s": round(usage.starts_late_s, 3),
        "gaps": usage.gaps,
    }
