"""`gpuwatch torch-report FILE` on whatever FILE turns out to be: no torch needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.reports.oom import OomReport, render
from gpuwatch.reports.training import TrainingReport
from tests.helpers.cli import run_cli

REPORT = OomReport(
    pid=4242, rank=0, world_size=1, hostname="node1", device="cuda:0", at=1.79e9, step=812,
    requested_bytes=2 << 30,
)  # fmt: skip


def torch_report_process(path: str) -> subprocess.CompletedProcess[str]:
    """`gpuwatch torch-report PATH` in its own process; the timeout turns a hang into a failure."""
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", "torch-report", path],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def fifo(tmp_path: Path) -> str:
    path = tmp_path / "report.json"
    os.mkfifo(path)
    return str(path)


def sparse(tmp_path: Path, size_bytes: int) -> str:
    path = tmp_path / "snapshot.pickle"
    with open(path, "wb") as file:
        file.truncate(size_bytes)
    return str(path)


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda tmp_path: "/dev/zero", "is not a regular file"),
        (fifo, "is not a regular file"),
        (lambda tmp_path: sparse(tmp_path, 64 << 30), "larger than any report or snapshot"),
        (lambda tmp_path: sparse(tmp_path, 2 << 30), "neither a gpuwatch OOM report"),
    ],
    ids=["dev-zero", "fifo", "huge-sparse-file", "2GiB-of-zeros"],
)
def test_torch_report_refuses_what_no_watch_wrote_at_once(
    tmp_path: Path, make: object, why: str
) -> None:
    # GIVEN a path that is a device, a FIFO nobody writes to, or a huge file
    path = make(tmp_path)  # type: ignore[operator]
    # WHEN torch-report is given it
    result = torch_report_process(path)
    # THEN it refuses it with a usage error in one line, without reading it all
    assert result.returncode == ExitCode.USAGE
    assert result.stderr.count("\n") == 1 and why in result.stderr, result.stderr
    assert result.stdout == ""


def test_torch_report_shows_the_text_copy_of_a_report(tmp_path: Path) -> None:
    # GIVEN the .txt a watch writes beside the .json, with an escape sequence planted in it
    path = tmp_path / "gpuwatch-oom.txt"
    path.write_text(render(REPORT) + "\n\x1b]0;owned\x07\n")
    # WHEN torch-report is given it
    result = run_cli("torch-report", str(path))
    # THEN it shows the report, and no escape sequence reaches the terminal
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("Out of memory on cuda:0")
    assert "What to do:" in result.stdout
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout


def test_torch_report_says_what_a_training_report_is(tmp_path: Path) -> None:
    # GIVEN a live training report (published into the lease directory)
    report = TrainingReport(
        pid=4242, rank=0, world_size=1, hostname="node1", device="cuda:0", step=3,
        published_at=1.79e9,
    )  # fmt: skip
    path = tmp_path / "report.training"
    path.write_text(json.dumps(report.to_dict()))
    # WHEN the installed torch-report is given it
    gpuwatch = str(Path(sys.executable).with_name("gpuwatch"))
    result = subprocess.run(
        [gpuwatch, "torch-report", str(path)], capture_output=True, text=True, check=False
    )
    # THEN it says, in one line, which command shows such reports: the live screen, not status
    assert result.returncode == ExitCode.USAGE and result.stderr.count("\n") == 1
    assert "live training report" in result.stderr and "`gpuwatch tui`" in result.stderr
    assert "gpuwatch status" not in result.stderr
