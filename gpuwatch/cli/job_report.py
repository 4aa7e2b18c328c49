"""`gpuwatch job-report JOBID`: what a Slurm job did with each of its GPUs on this node,
from the daemon's history (the GPU half of `seff`).

Slurm says when the job ran and which GPUs it held (`gpuwatch.jobs.job_runs`); the daemon
says which NVML GPU has each device file (its snapshot's `minor_number`) and what each GPU
did (`/v1/history`); `gpuwatch.reports.job_gpu_report` sums it up. What the history does
not cover is said in plain lines under the table, never filled in.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import click

from gpuwatch.backends.daemon_client import DaemonBackend, http_get, parse_series
from gpuwatch.cli.options import Command
from gpuwatch.errors import DaemonUnavailableError, InvalidValueError, JobUnknownError, RemoteError
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.jobs.job_runs import JobGpus, job_gpus
from gpuwatch.models import GpuSample
from gpuwatch.reports.job_gpu_report import GpuJobUsage, about, gpu_job_usage, shortfalls
from gpuwatch.units import format_size

_JOB_ID = re.compile(r"^[0-9]{1,12}(?:_[0-9]{1,12})?$")
_HISTORY_TIMEOUT_S = 10.0
_BUSY_RETRIES_S = (0.2, 0.5, 1.0, 0.0)


@dataclass
class _Row:
    gpu: GpuSample
    usage: GpuJobUsage


@dataclass
class _Report:
    found: JobGpus
    end_s: float
    rows: list[_Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@click.command(
    "job-report", cls=Command, short_help="A Slurm job's use of its GPUs, from the daemon."
)
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
    peak memory and time idle, read from the daemon's history (which must cover the job:
    the daemon keeps --history worth). Lines under the table say what the history does
    not cover. Run it on the job's node while the job runs, or from Slurm's epilog
    (examples/slurm/epilog.sh): once a job has ended, Slurm no longer says which GPUs it
    held, unless SLURM_JOB_ID is JOBID and SLURM_JOB_GPUS names them.

    \b
    Example:
      gpuwatch job-report 4242
      gpuwatch job-report 4242_7 --json
    """
    if not _JOB_ID.match(job_id):
        raise InvalidValueError(
            f"{job_id[:40]!r} is not a Slurm job id: give a number (4242) or an array task (4242_7)"
        )
    found = job_gpus(job_id)
    report = _report(found, socket_path)
    click.echo(json.dumps(_document(report), indent=2) if as_json else _text(report))
    return 0


def _report(found: JobGpus, socket_path: str | None) -> _Report:
    run = found.run
    if found.minor_numbers is None:
        raise JobUnknownError(found.why_unknown)
    if not found.minor_numbers:
        raise JobUnknownError(f"job {run.job_id} held no GPU on this node ({found.node})")
    daemon = _daemon(socket_path)
    gpus = {gpu.minor_number: gpu for gpu in daemon.sample().gpus}
    assert run.start_s is not None  # job_gpus answers only jobs that started
    report = _Report(found, run.end_s if run.end_s is not None else time.time())
    if run.end_s is None:
        report.notes.append(f"job {run.job_id} still runs: the figures are up to now")
    history, interval_s = _history(daemon.socket_path, run.start_s, report)
    for minor in found.minor_numbers:
        gpu = gpus.get(minor)
        if gpu is None:
            report.notes.append(f"/dev/nvidia{minor}: not among the daemon's GPUs")
            continue
        series = _series_of(gpu, history)
        usage = gpu_job_usage(series, run.start_s, report.end_s, interval_s)
        report.rows.append(_Row(gpu, usage))
    report.notes.extend(shortfalls([row.usage for row in report.rows]))
    return report


def _daemon(socket_path: str | None) -> DaemonBackend:
    try:
        return DaemonBackend(socket_path)
    except DaemonUnavailableError as error:
        raise RemoteError(
            "no daemon running: job-report reads the daemon's history; start `gpuwatch "
            f"daemon` ({error})"
        ) from None


def _history(socket_path: str, start_s: float, report: _Report) -> tuple[list[GpuSeries], float]:
    """Every GPU's history since a little before `start_s`, and the sampling interval."""
    path = f"/v1/history?since={start_s - 5:.3f}"
    try:
        for wait_s in _BUSY_RETRIES_S:  # 503: two other answers are being built (epilogs)
            status, body = http_get(socket_path, path, _HISTORY_TIMEOUT_S)
            if status != 503:
                break
            time.sleep(wait_s)
        data = json.loads(body) if status == 200 else None
    except (OSError, ValueError) as error:
        raise RemoteError(f"the daemon's history cannot be read: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise RemoteError(f"the daemon sent no history (HTTP {status})")
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
    run = report.found.run
    assert run.start_s is not None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.start_s))
    head = (
        f"job {run.job_id} on {report.found.node}: {run.state}, from {when} for "
        f"{about(report.end_s - run.start_s)} (GPUs from {report.found.gpus_from})"
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
    run = report.found.run
    return {
        "job_id": run.job_id,
        "node": report.found.node,
        "state": run.state,
        "start_time": run.start_s,
        "end_time": run.end_s,
        "running": run.end_s is None,
        "duration_s": None if run.start_s is None else report.end_s - run.start_s,
        "jobs_source": run.source,
        "gpus_source": report.found.gpus_from,
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
