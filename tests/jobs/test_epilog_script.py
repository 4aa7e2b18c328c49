"""examples/slurm/epilog.sh never fails the epilog (a failing epilog drains the node) and
writes only where it should, whatever gpuwatch does: a stand-in `gpuwatch` plays each case."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers.other_user import as_other_user, other_user

EPILOG = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "epilog.sh"


def run_epilog(
    tmp_path: Path, gpuwatch_body: str, **slurm: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Runs the epilog as slurmd would, with `gpuwatch` a script of `gpuwatch_body`."""
    gpuwatch = tmp_path / "gpuwatch"
    gpuwatch.write_text(f"#!/bin/sh\n{gpuwatch_body}\n")
    gpuwatch.chmod(0o755)
    reports = tmp_path / "reports"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GPUWATCH": str(gpuwatch),
        "GPUWATCH_JOB_REPORT_DIR": str(reports),
        "GPUWATCH_JOB_REPORT_TIMEOUT": "1",
        **slurm,
    }
    done = subprocess.run(
        ["sh", str(EPILOG)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    return done, reports


def test_the_report_is_appended_to_the_jobs_file(tmp_path: Path) -> None:
    # GIVEN a job of GPUs ending, whose report gpuwatch prints
    done, reports = run_epilog(
        tmp_path, 'echo "report of $2"', SLURM_JOB_ID="42", SLURM_JOB_GPUS="0,1"
    )
    # THEN the epilog succeeds, and the job's file holds the report, for root's eyes only
    assert done.returncode == 0
    report = reports / "42.txt"
    assert report.read_text() == "report of 42\n"
    assert report.stat().st_mode & 0o077 == 0
    assert sorted(path.name for path in reports.iterdir()) == ["42.txt"]


@pytest.mark.parametrize(
    ("gpuwatch_body", "written"),
    [
        ("echo 'gpuwatch: error: no daemon running' >&2; exit 6", "no daemon running"),
        ("exec sleep 30", "no answer in 1s"),
    ],
    ids=["gpuwatch-fails", "gpuwatch-hangs"],
)
def test_a_failing_or_hung_report_never_fails_the_epilog(
    tmp_path: Path, gpuwatch_body: str, written: str
) -> None:
    done, reports = run_epilog(tmp_path, gpuwatch_body, SLURM_JOB_ID="42", SLURM_JOB_GPUS="0")
    assert done.returncode == 0
    assert written in (reports / "42.txt").read_text()


@pytest.mark.parametrize(
    "slurm",
    [{"SLURM_JOB_ID": "42"}, {"SLURM_JOB_ID": "../../etc/x", "SLURM_JOB_GPUS": "0"}, {}],
    ids=["no-gpu", "odd-job-id", "not-an-epilog"],
)
def test_nothing_is_written_for_a_job_without_gpus_or_with_an_odd_id(
    tmp_path: Path, slurm: dict[str, str]
) -> None:
    done, reports = run_epilog(tmp_path, "echo report", **slurm)
    assert done.returncode == 0 and not reports.exists()


def test_a_report_directory_that_cannot_be_made_never_fails_the_epilog(tmp_path: Path) -> None:
    blocker = tmp_path / "reports"
    blocker.write_text("a file where the directory should be")
    done, _ = run_epilog(tmp_path, "echo report", SLURM_JOB_ID="42", SLURM_JOB_GPUS="0")
    assert done.returncode == 0 and blocker.read_text().startswith("a file")


def test_the_user_whose_job_it_was_can_read_the_report(tmp_path: Path) -> None:
    # GIVEN a report folder two levels below folders that do not exist yet (as
    # /var/log/gpuwatch/jobs on a fresh node), and a job of another user
    entry = other_user()
    base = Path(tempfile.mkdtemp(prefix="gpuwatch-epilog-"))  # pytest's tmp_path is root's
    try:
        base.chmod(0o755)
        reports = base / "log" / "gpuwatch" / "jobs"
        gpuwatch = script_file(base / "gpuwatch", 'echo "report of $2"')
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GPUWATCH": str(gpuwatch),
            "GPUWATCH_JOB_REPORT_DIR": str(reports),
            "SLURM_JOB_ID": "42",
            "SLURM_JOB_GPUS": "0",
            "SLURM_JOB_UID": str(entry.pw_uid),
        }
        # WHEN the epilog runs, as slurmd runs it (as root, under umask 022 or stricter)
        done = subprocess.run(
            ["sh", "-c", f"umask 077; exec sh {EPILOG}"], env=env, timeout=30, check=False
        )
        assert done.returncode == 0
        # THEN that user can read their report; another's name stays unlisted
        read = subprocess.run(
            as_other_user(["cat", str(reports / "42.txt")]),
            capture_output=True,
            text=True,
            check=False,
        )
        assert read.stdout == "report of 42\n", read.stderr
        listed = subprocess.run(
            as_other_user(["ls", str(reports)]), capture_output=True, check=False
        )
        assert listed.returncode != 0
    finally:
        shutil.rmtree(base)


def script_file(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path
