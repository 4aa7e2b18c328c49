"""Which job, when and on which GPUs, asked of stand-in Slurm commands: scontrol first, sacct
where scontrol has forgotten the job, and each way the answer can be "no"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuwatch.errors import JobUnknownError, SchedulerUnavailableError
from gpuwatch.jobs.job_runs import job_gpus

DATA = Path(__file__).parent / "data"
RUNNING = DATA / "scontrol-job-running-22.05.txt"
FORGOTTEN = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"


def command(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This node is `vm`; its gres.conf lists the GPU files out of order (7, 5, 6, 4)."""
    (tmp_path / "gres.conf").write_text(f"Name=gpu File={tmp_path}/nvidia[7,5,6,4]\n")
    return {"SLURM_CONF": str(tmp_path / "slurm.conf"), "SLURMD_NODENAME": "vm", **extra}


def test_a_running_job_has_the_gpus_of_its_gres_indices(tmp_path: Path) -> None:
    # GIVEN scontrol's answer for a running job holding GRES index 2
    scontrol = command(tmp_path, "scontrol", f"cat {DATA / 'scontrol-job-running-22.05.txt'}")
    # WHEN the job is looked up THEN it holds the GPU of gres.conf's third file: minor 6
    found = job_gpus("2", env=environment(tmp_path), scontrol=scontrol)
    assert (found.minor_numbers, found.gpus_from, found.run.end_s) == ((6,), "scontrol", None)


def test_a_job_scontrol_forgot_is_read_from_sacct_without_its_gpus(tmp_path: Path) -> None:
    # GIVEN scontrol that no longer knows the job, and sacct that does
    scontrol = command(tmp_path, "scontrol", FORGOTTEN)
    sacct = command(
        tmp_path, "sacct", "echo '7|7|COMPLETED|2026-11-25T10:00:00|2026-11-25T11:00:00|vm'"
    )
    # WHEN it is looked up
    found = job_gpus("7", env=environment(tmp_path), scontrol=scontrol, sacct=sacct)
    # THEN its run comes from sacct, and its GPUs are said to be unknown
    assert found.run.source == "sacct" and found.run.end_s is not None
    assert found.minor_numbers is None and "no longer says which GPUs" in found.why_unknown


def test_its_own_slurm_job_gpus_name_the_gpus_of_a_job_that_ended(tmp_path: Path) -> None:
    scontrol = command(tmp_path, "scontrol", f"cat {DATA / 'scontrol-job-completed-22.05.txt'}")
    env = environment(tmp_path, SLURM_JOB_ID="1", SLURM_JOB_GPUS="0,3")
    found = job_gpus("1", env=env, scontrol=scontrol)
    assert (found.minor_numbers, found.gpus_from) == ((4, 7), "SLURM_JOB_GPUS")


@pytest.mark.parametrize(
    ("scontrol_body", "sacct_body", "error", "says"),
    [
        pytest.param(FORGOTTEN, "echo 'Slurm accounting storage is disabled' >&2; exit 1",
                     JobUnknownError, "Slurm knows no job 2", id="unknown"),
        pytest.param(f"sed 's/NodeList=vm/NodeList=gpu01/' {RUNNING}",
                     "exit 1", JobUnknownError, "ran on gpu01, not on this node (vm)",
                     id="another-node"),
        pytest.param(f"sed 's/JobState=RUNNING/JobState=PENDING/' {RUNNING}",
                     "exit 1", JobUnknownError, "has not started", id="pending"),
        pytest.param("echo 'Unable to contact slurm controller' >&2; exit 1", "exit 1",
                     SchedulerUnavailableError, "scontrol failed: Unable to contact", id="down"),
        pytest.param("exec sleep 30", "exit 1", SchedulerUnavailableError,
                     "did not answer in 0.5s", id="hung"),
    ],
)  # fmt: skip
def test_each_no_from_slurm_is_its_own_error(
    tmp_path: Path, scontrol_body: str, sacct_body: str, error: type[Exception], says: str
) -> None:
    scontrol = command(tmp_path, "scontrol", scontrol_body)
    sacct = command(tmp_path, "sacct", sacct_body)
    with pytest.raises(error, match=re.escape(says)):
        job_gpus("2", env=environment(tmp_path), timeout_s=0.5, scontrol=scontrol, sacct=sacct)


def test_no_slurm_on_the_node_is_said_plainly(tmp_path: Path) -> None:
    missing = str(tmp_path / "scontrol")
    with pytest.raises(SchedulerUnavailableError, match="not found: is this a Slurm node"):
        job_gpus("2", env=environment(tmp_path), scontrol=missing)
