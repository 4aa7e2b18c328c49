"""`NodeJobs` and how it is told: time left, idle marks, the daemon's answer checked field
by field, and the job line of `gpuwatch status` at every width."""

from __future__ import annotations

import math

import pytest

from gpuwatch.backends.sim import SimBackend
from gpuwatch.cli.table import render
from gpuwatch.jobs.job_table import Job, JobTable, table_record
from gpuwatch.sampling.node_jobs import (
    NO_JOBS,
    NodeJobs,
    idle_text,
    jobs_from_daemon,
    time_left_text,
)

NOW = 1_800_000_000.0


def job(limit_s: float | None, started_ago_s: float | None = 600.0) -> Job:
    started = None if started_ago_s is None else NOW - started_ago_s
    return Job("1234", "alice", "train-llm", (0, 1), started, limit_s)


@pytest.mark.parametrize(
    ("limit_s", "started_ago_s", "said"),
    [
        (600 + 2 * 3600 + 13 * 60 + 5, 600.0, "2:13:05 left"),
        (600 + 86400 + 4 * 3600, 600.0, "1-04:00:00 left"),
        (300.0, 600.0, "0:00:00 left"),
        (None, 600.0, "no time limit"),
        (3600.0, None, ""),
    ],
    ids=["hours", "days", "overdue", "unlimited", "start-unknown"],
)
def test_time_left_is_said_as_slurm_writes_it(
    limit_s: float | None, started_ago_s: float | None, said: str
) -> None:
    assert time_left_text(job(limit_s, started_ago_s), NOW) == said


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (45, "45s"),
        (12 * 60 + 59, "12m"),
        (3 * 3600 + 5 * 60, "3h05m"),
        (2 * 86400 + 4 * 3600, "2d04h"),
    ],
)
def test_idle_is_said_in_the_largest_units(seconds: float, said: str) -> None:
    assert idle_text(seconds) == f"allocated, idle {said}"


def daemon_record(**changes: object) -> dict[str, object]:
    table = JobTable((job(7200.0),), NOW)
    record: dict[str, object] = {
        **table_record(table),
        "allocated_idle_s": {"GPU-1": 1200.0},
        "idle_window_s": 600.0,
    }
    record.update(changes)
    return record


@pytest.mark.parametrize(
    ("changes", "idle", "window"),
    [
        ({}, {"GPU-1": 1200.0}, 600.0),
        ({"idle_window_s": math.nan}, {"GPU-1": 1200.0}, None),
        ({"idle_window_s": True}, {"GPU-1": 1200.0}, None),
        ({"idle_window_s": "600"}, {"GPU-1": 1200.0}, None),
        (
            {"allocated_idle_s": {"GPU-1": -5, "GPU-2": math.inf, "GPU-3": 3.0}},
            {"GPU-3": 3.0},
            600.0,
        ),
        ({"allocated_idle_s": {"GPU-\x1b[2J": 5.0}}, {}, 600.0),
        ({"allocated_idle_s": [1, 2]}, {}, 600.0),
    ],
    ids=["good", "nan-window", "bool-window", "text-window", "bad-seconds", "escape", "list"],
)
def test_the_daemons_idle_times_are_checked_field_by_field(
    changes: dict[str, object], idle: dict[str, float], window: float | None
) -> None:
    # WHEN a daemon's answer with odd fields is read
    jobs = jobs_from_daemon(daemon_record(**changes), scheduler_here=False)
    # THEN the table stands, and only believable idle times and window are kept
    assert jobs.table is not None and jobs.table.job("1234") is not None
    assert dict(jobs.allocated_idle_s) == idle and jobs.idle_window_s == window


def test_a_daemon_without_slurm_on_a_node_without_slurm_shows_nothing() -> None:
    record = table_record(None, error="absent")
    assert jobs_from_daemon(record, scheduler_here=False) is NO_JOBS
    shown = jobs_from_daemon(record, scheduler_here=True)
    assert shown.scheduler and shown.unknown_why == "squeue not found"


def test_a_malformed_daemon_answer_is_jobs_unknown_saying_so() -> None:
    jobs = jobs_from_daemon({"known": True, "jobs": [{"job_id": 5}]}, scheduler_here=False)
    assert jobs.table is None and jobs.scheduler
    assert jobs.unknown_why is not None and jobs.unknown_why.startswith("the daemon's answer")


@pytest.mark.parametrize("width", [40, 60, 80, 120, 200])
def test_every_status_line_fits_the_terminal_with_jobs(width: int) -> None:
    # GIVEN a node where a long-named job holds GPUs 0 and 1, GPU 1 idle past the window
    snapshot = SimBackend(4, clock=lambda: NOW).sample()
    long = Job("123456_78", "a-user-with-a-long-name", "x" * 80, (0, 1), NOW - 60, 86400.0 * 3)
    uuid = snapshot.gpus[1].uuid or ""
    jobs = NodeJobs(JobTable((long,), NOW), None, {uuid: 7200.0}, 600.0, True)
    # WHEN the table is drawn
    lines = render(snapshot, jobs=jobs, width=width, now=NOW).splitlines()
    # THEN no line is wider, and both GPUs name the job
    assert max(len(line) for line in lines) <= width
    job_lines = [line for line in lines if line.startswith("  job")]
    assert len(job_lines) == 2 and all("123456_78" in line for line in job_lines)
    if width >= 80:
        assert "allocated, idle 2h00m" in job_lines[1] and "2-23:59:00 left" in job_lines[0]


def test_jobs_unknown_is_one_line_under_the_header() -> None:
    snapshot = SimBackend(2, clock=lambda: NOW).sample()
    lines = render(snapshot, jobs=NodeJobs(None, "Slurm did not answer within 1s", scheduler=True))
    assert lines.splitlines()[1] == "jobs unknown: Slurm did not answer within 1s"
