"""`gpuwatch status --host`, through a stand-in `ssh` that runs the command here."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.ssh import STAND_IN_SSH


@pytest.fixture(autouse=True)
def stand_in_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(STAND_IN_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IEXEC)
    gpuwatch = shutil.which("gpuwatch") or str(Path(sys.executable).with_name("gpuwatch"))
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(gpuwatch).parent}:/usr/bin:/bin")


def test_table_of_a_remote_host() -> None:
    result = run_cli("status", "--host", "alice@node7", "--sim", "3")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("sim-node ")
    assert "[2] NVIDIA H100 80GB HBM3 |" in result.stdout


def test_remote_watch_streams_ndjson() -> None:
    result = run_cli(
        "status", "--host", "node7", "--sim", "2", "--json", "--watch", "0.1", "--count", "3"
    )
    lines = result.stdout.splitlines()
    assert result.exit_code == 0 and len(lines) == 3
    assert all(len(json.loads(line)["gpus"]) == 2 for line in lines)


@pytest.mark.parametrize(
    ("host", "message"),
    [
        (
            "bob@unreachable-node",
            "gpuwatch: error: cannot reach bob@unreachable-node: ssh: "
            "connect to host unreachable-node port 22: Connection refused\n",
        ),
        (
            "bare-node",
            "gpuwatch: error: gpuwatch is not installed on bare-node (or not on the "
            "PATH ssh gives it)\n",
        ),
    ],
    ids=["unreachable", "without-gpuwatch"],
)
def test_a_host_that_cannot_answer_is_one_line_naming_it(host: str, message: str) -> None:
    result = run_cli("status", "--host", host)
    assert result.exit_code == 6
    assert result.stderr == message


def test_a_remote_error_is_passed_on_with_the_host_name() -> None:
    result = run_cli("status", "--host", "node7", "--sim", "0")
    assert result.exit_code == 6
    assert result.stderr == ("gpuwatch: error: node7: --sim 0: a simulated node has 1 to 64 GPUs\n")


def test_no_ssh_here_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = run_cli("status", "--host", "node7")
    assert result.exit_code == 6 and "ssh is not installed here" in result.stderr
    assert os.environ["PATH"] == str(tmp_path / "empty")


def test_verbose_says_the_gpus_come_from_the_host() -> None:
    # WHEN status shows another host's GPUs with -v
    result = run_cli("status", "--host", "node7", "--sim", "2", "-v")
    # THEN it says where they were read, as it does for local GPUs
    assert result.exit_code == 0, result.stderr
    assert result.stderr == "gpuwatch: reading GPUs of node7 over ssh (gpuwatch status there)\n"
