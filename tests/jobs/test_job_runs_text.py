"""One job's run read from Slurm's answers: scontrol's, recorded from the 22.05 test cluster
while a job ran, in its epilog (COMPLETING) and after it ended; sacct's format."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gpuwatch.jobs.slurm_runs_text import job_run_from_sacct, job_run_from_scontrol

DATA = Path(__file__).parent / "data"


def local(text: str) -> float:
    """scontrol's and sacct's local time as a Unix time."""
    return dt.datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize("state", ["completed", "completing"])
def test_an_ended_job_has_its_times_but_no_gpu_indices(state: str) -> None:
    # GIVEN scontrol's answer for a 2-GPU job after it ended, and in its epilog
    text = (DATA / f"scontrol-job-{state}-22.05.txt").read_text()
    # WHEN it is read
    run = job_run_from_scontrol(text, "1")
    # THEN it ran on vm from StartTime to EndTime; Slurm no longer names its GPU indices
    assert run is not None and run.state == state.upper()
    assert run.nodes == ("vm",)
    assert run.end_s is not None and run.start_s is not None and run.end_s > run.start_s
    assert run.gres_indices == {"vm": []}


def test_a_running_job_has_its_gpus_and_no_end() -> None:
    # GIVEN scontrol's answer for a running job given GRES index 2, with a 90 min limit
    text = (DATA / "scontrol-job-running-22.05.txt").read_text()
    # WHEN it is read
    run = job_run_from_scontrol(text, "2")
    # THEN its start is known, its end is not (EndTime is only where the limit falls)
    assert run is not None and run.state == "RUNNING"
    assert run.start_s == local("2026-11-25T19:36:54")
    assert run.end_s is None
    assert run.gres_indices == {"vm": [2]}


def test_another_jobs_answer_is_not_taken_for_this_one() -> None:
    text = (DATA / "scontrol-job-running-22.05.txt").read_text()
    assert job_run_from_scontrol(text, "1") is None
    assert job_run_from_scontrol("garbage\n", "2") is None


def test_sacct_gives_the_latest_run_and_no_gpus() -> None:
    # GIVEN sacct's answer for a job requeued once, cancelled in its second run
    text = (
        "7|7|REQUEUED|2026-11-25T10:00:00|2026-11-25T10:05:00|gpu[01-02]\n"
        "7|7|CANCELLED by 0|2026-11-25T10:06:00|2026-11-25T11:00:00|gpu01\n"
    )
    # WHEN it is read
    run = job_run_from_sacct(text, "7")
    # THEN the latest run counts, and its GPUs are unknown (sacct names no GRES index)
    assert run is not None and run.state == "CANCELLED" and run.nodes == ("gpu01",)
    assert (run.start_s, run.end_s) == (local("2026-11-25T10:06:00"), local("2026-11-25T11:00:00"))
    assert run.gres_indices is None


def test_sacct_for_a_running_job_has_no_end() -> None:
    run = job_run_from_sacct("8|8|RUNNING|2026-11-25T10:06:00|Unknown|gpu01\n", "8")
    assert run is not None and run.start_s is not None and run.end_s is None
    assert job_run_from_sacct("8|8|RUNNING\n", "8") is None
