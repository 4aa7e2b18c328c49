"""`gpuwatch job-report JOBID` against a running daemon on a simulated node, with a
stand-in `squeue` on PATH that prints `squeue --json`'s 22.05 shape for one job (its times,
state and GRES detail from the environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.wait import wait_until

# NVML indices 0-3 have minors 4-7; gres.conf lists 7, 5, 6, 4 (GRES index 0 is NVML 3).
# GPU 3 (GRES 0) is busy at 40 % with 10 GiB in use; GPU 1 (GRES 1) idles.
NODE = """
hostname = "vm"
[[gpu]]
minor = 4
[[gpu]]
minor = 5
load = "constant"
utilization_pct = 0
[[gpu]]
minor = 6
[[gpu]]
minor = 7
load = "constant"
utilization_pct = 40
[[process]]
gpu = 3
pid = 4242
user = "alice"
memory = "10GiB"
"""
SQUEUE = """\
import json, os
if os.environ.get("STATE"):
    job = {
        "job_id": int(os.environ["JOB"]), "array_job_id": 0, "array_task_id": None,
        "job_state": os.environ["STATE"], "name": "train", "user_name": "alice",
        "nodes": "vm", "job_resources": {"nodes": "vm"},
        "gres_detail": [os.environ.get("GRES", "")] if os.environ["STATE"] == "RUNNING" else [],
        "start_time": int(float(os.environ["START"])),
        "end_time": int(float(os.environ.get("END", "0"))), "time_limit": 90,
    }
    jobs = [job]
else:
    jobs = []
print(json.dumps({"meta": {}, "errors": [], "jobs": jobs}))
"""


@pytest.fixture
def slurm_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose `squeue` answers job $JOB as $STATE since $START (none without
    $STATE), and whose gres.conf is the test cluster's; no `sacct` (no accounting)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(f"#!{sys.executable}\n{SQUEUE}")
    squeue.chmod(0o755)
    (tmp_path / "slurm.conf").write_text("")
    (tmp_path / "gres.conf").write_text(f"Name=gpu File={tmp_path}/nvidia[7,5,6,4]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return {
        **env,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_CONF": str(tmp_path / "slurm.conf"),
        "SLURMD_NODENAME": "vm",
    }


def job_report(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", "job-report", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def samples_since(socket_path: Path, since_s: float) -> int:
    _, history = get_json(socket_path, "/v1/history?last=1m")
    return sum(t >= since_s for t in history["gpus"][0]["taken_at"])


def test_a_running_job_is_reported_from_the_daemons_history(
    tmp_path: Path, slurm_env: dict[str, str]
) -> None:
    # GIVEN a daemon sampling the node, and a job that started after it, on GRES 0 and 1
    with running_daemon(tmp_path, scenario=NODE) as (_, socket_path, _):
        start_s = float(int(time.time()) + 1)
        wait_until(lambda: samples_since(socket_path, start_s) >= 5, "5 samples of the job")
        _, snapshot = get_json(socket_path, "/v1/snapshot")
        env = {**slurm_env, "JOB": "2", "STATE": "RUNNING", "START": str(start_s)}
        env["GRES"] = "gpu:2(IDX:0-1)"
        # WHEN its report is asked
        done = job_report(env, "2", "--json", "--socket", str(socket_path))
    # THEN it reports NVML GPUs 1 and 3 (minors 5 and 7), with the figures the node had
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["running"] and report["gpus_source"] == "squeue --json"
    gpus = {gpu["index"]: gpu for gpu in report["gpus"]}
    assert sorted(gpus) == [1, 3]
    busy, idle = gpus[3], gpus[1]
    assert (busy["mean_utilization_pct"], busy["peak_utilization_pct"]) == (40.0, 40)
    assert busy["peak_memory_used_bytes"] == snapshot["gpus"][3]["memory_used_bytes"]
    assert busy["idle_s"] == 0
    assert idle["peak_utilization_pct"] == 0 and idle["idle_s"] == idle["covered_s"] > 0
    assert not busy["history_short"] and not idle["history_short"]
    assert report["notes"] == ["job 2 still runs: the figures are up to now"]


def test_the_table_says_when_the_history_is_shorter_than_the_job(
    tmp_path: Path, slurm_env: dict[str, str]
) -> None:
    # GIVEN a job that began an hour before the daemon
    with running_daemon(tmp_path, scenario=NODE) as (_, socket_path, _):
        env = {**slurm_env, "JOB": "2", "STATE": "RUNNING", "START": str(time.time() - 3600)}
        env["GRES"] = "gpu:1(IDX:2)"
        # WHEN its report is asked
        done = job_report(env, "2", "--socket", str(socket_path))
    # THEN the table shows its GPU, a line says how little of the job the history covers,
    # and so does the exit code
    assert done.returncode == 8, done.stderr
    assert "history is shorter than job 2" in done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split()[:2] == ["GPU", "NAME"] and lines[2].split()[0] == "2"
    assert any(
        "the history covers only the last" in line and "of this 60 min job" in line
        for line in lines
    )


def test_in_the_jobs_epilog_the_gpus_come_from_slurm_job_gpus(
    tmp_path: Path, slurm_env: dict[str, str]
) -> None:
    # GIVEN a job that ended (scontrol no longer names its GPUs), seen from its epilog
    with running_daemon(tmp_path, scenario=NODE) as (_, socket_path, _):
        start_s = float(int(time.time()) + 1)
        wait_until(lambda: samples_since(socket_path, start_s + 2) >= 1, "2 s of the job")
        env = {**slurm_env, "JOB": "1", "STATE": "COMPLETING", "START": str(start_s)}
        env |= {"END": str(start_s + 2), "SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0"}
        # WHEN its report is asked THEN it reports the GPU of GRES index 0: NVML GPU 3
        done = job_report(env, "1", "--json", "--socket", str(socket_path))
        assert done.returncode == 0, done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        assert [gpu["index"] for gpu in report["gpus"]] == [3]
        assert report["gpus_source"] == "SLURM_JOB_GPUS" and not report["running"]
        # AND outside the epilog, its GPUs are said to be unknown
        del env["SLURM_JOB_ID"]
        outside = job_report(env, "1", "--socket", str(socket_path))
    assert outside.returncode == 7
    assert "which GPUs it held is not known" in outside.stderr


@pytest.mark.parametrize(
    ("job_id", "state", "socket_name", "code", "says"),
    [
        pytest.param("12x", "RUNNING", "s", 2, "is not a Slurm job id", id="bad-job-id"),
        pytest.param(
            "999", "", "s", 7, "job 999 was never seen: Slurm knows no job", id="never-seen"
        ),
        pytest.param("2", "RUNNING", "none.sock", 6, "no daemon running", id="no-daemon"),
    ],
)
def test_bad_input_gives_one_line_and_its_exit_code(
    tmp_path: Path,
    slurm_env: dict[str, str],
    job_id: str,
    state: str,
    socket_name: str,
    code: int,
    says: str,
) -> None:
    # GIVEN Slurm's answer (none: an unknown job) and a daemon on the socket, or none
    env = {**slurm_env, "JOB": "2", "STATE": state, "START": str(time.time() - 60)}
    # WHEN the report is asked
    done = job_report(env, job_id, "--socket", str(tmp_path / socket_name))
    # THEN one line says what is wrong, and the exit code says which
    assert done.returncode == code
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpuwatch: error: ") and says in line
