"""One job's run asked of stand-in Slurm commands (recorded 22.05 answers): `squeue --json`,
an old squeue's `-o` rows with the job's own scontrol detail, sacct where the controller
forgot the job, and each way the answer can be "no"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from gpuwatch.errors import SchedulerUnavailableError
from gpuwatch.jobs.job_runs import MAX_OUTPUT_BYTES, SlurmAbsent, job_run_from_sacct, slurm_run
from gpuwatch.jobs.slurm_text import timestamp

DATA = Path(__file__).parent / "data"
NO_JSON = "echo \"squeue: unrecognized option '--json'\" >&2; exit 1"


def commands(tmp_path: Path, **bodies: str) -> dict[str, str]:
    """An environment whose PATH holds only stand-ins `name` running `body`, and a
    slurm.conf (empty: it is only looked for)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, body in bodies.items():
        path = folder / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    (tmp_path / "slurm.conf").write_text("")
    return {"PATH": f"{folder}:/usr/bin:/bin", "SLURM_CONF": str(tmp_path / "slurm.conf")}


def test_a_running_job_has_its_gres_indices_on_each_node(tmp_path: Path) -> None:
    # GIVEN squeue --json's recorded answer, where job 2 holds GRES index 2 on vm
    env = commands(tmp_path, squeue=f"cat {DATA / 'squeue-22.05.json'}")
    # WHEN job 2 is asked THEN it runs on vm since its start, with that index
    run = slurm_run("2", env)
    assert run is not None and run.source == "squeue --json"
    assert (run.state, run.nodes, run.gres_indices, run.end_s) == (
        "RUNNING",
        ("vm",),
        {"vm": [2]},
        None,
    )
    assert run.start_s == 1795473311.0


def test_an_old_squeue_is_read_by_rows_and_the_jobs_own_detail(tmp_path: Path) -> None:
    # GIVEN a squeue without --json, and scontrol's real answer for job 10 ("train")
    row = "10|10|N/A|RUNNING|root|2026-11-27T07:00:22|NONE|UNLIMITED|vm"
    squeue = f'case "$1" in --json) {NO_JSON} ;; esac; echo "{row}"'
    scontrol = f"cat {DATA / 'scontrol-job-train-22.05.txt'}"
    env = commands(tmp_path, squeue=squeue, scontrol=scontrol)
    # WHEN job 10 is asked THEN its GPUs are the detail's, its start the row's
    run = slurm_run("10", env)
    assert run is not None and run.source == "squeue"
    assert run.gres_indices == {"vm": [1, 2]} and run.start_s == timestamp("2026-11-27T07:00:22")


def test_a_forged_detail_in_a_jobs_name_makes_slurm_unusable_not_wrong(tmp_path: Path) -> None:
    row = "9|9|N/A|RUNNING|root|2026-11-27T07:00:22|NONE|1:30:00|vm"
    squeue = f'case "$1" in --json) {NO_JSON} ;; esac; echo "{row}"'
    scontrol = f"cat {DATA / 'scontrol-job-forged-name-22.05.txt'}"
    env = commands(tmp_path, squeue=squeue, scontrol=scontrol)
    with pytest.raises(SchedulerUnavailableError, match="free text"):
        slurm_run("9", env)


def test_an_array_task_is_found_by_its_name(tmp_path: Path) -> None:
    job = {
        "job_id": 8, "array_job_id": 7, "array_task_id": 1, "job_state": "CANCELLED",
        "nodes": "vm", "gres_detail": [], "start_time": 100, "end_time": 160, "name": "w",
    }  # fmt: skip
    (tmp_path / "answer.json").write_text(json.dumps({"jobs": [job]}))
    env = commands(tmp_path, squeue=f"cat {tmp_path / 'answer.json'}")
    run = slurm_run("7_1", env)
    assert run is not None and (run.state, run.start_s, run.end_s) == ("CANCELLED", 100.0, 160.0)
    assert run.gres_indices == {}


def test_a_job_the_controller_forgot_comes_from_sacct(tmp_path: Path) -> None:
    env = commands(
        tmp_path,
        squeue=f"cat {DATA / 'squeue-22.05.json'}",
        sacct="echo '77|77|COMPLETED|2026-11-25T10:00:00|2026-11-25T11:00:00|vm'",
    )
    run = slurm_run("77", env)
    assert run is not None and run.source == "sacct" and run.gres_indices is None


def test_a_job_nobody_knows_is_none_not_an_error(tmp_path: Path) -> None:
    env = commands(
        tmp_path,
        squeue=f"cat {DATA / 'squeue-22.05.json'}",
        sacct="echo 'Slurm accounting storage is disabled' >&2; exit 1",
    )
    assert slurm_run("1_2", env) is None


@pytest.mark.parametrize(
    ("squeue", "says"),
    [
        pytest.param(
            """echo '{"jobs": [], "errors": [{"description": "Unable to contact slurmctld"}]}'""",
            "controller does not answer", id="controller-down",
        ),
        pytest.param(
            "echo 'squeue: error: resolve_ctls_from_dns_srv: res_nsearch error' >&2; exit 1",
            "controller does not answer: squeue: error: resolve_ctls", id="no-controller",
        ),
        pytest.param("exec sleep 30", "did not answer in 0.5s", id="hung"),
    ],
)  # fmt: skip
def test_a_slurm_that_does_not_answer_says_so_in_one_plain_line(
    tmp_path: Path, squeue: str, says: str
) -> None:
    env = commands(tmp_path, squeue=squeue)
    with pytest.raises(SchedulerUnavailableError, match=says) as raised:
        slurm_run("2", env, timeout_s=0.5)
    assert "\n" not in str(raised.value)


def test_no_slurm_on_the_node_is_absent(tmp_path: Path) -> None:
    env = commands(tmp_path, sacct="exit 1")
    env["PATH"] = str(tmp_path / "bin")  # the stand-ins alone: not this machine's squeue
    with pytest.raises(SlurmAbsent, match="squeue is not on PATH"):
        slurm_run("2", env)


def test_squeue_without_slurm_conf_is_no_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a client package's squeue, but no slurm.conf where Slurm's commands look
    env = commands(tmp_path, squeue="exit 1")
    del env["SLURM_CONF"]
    monkeypatch.setattr(
        "gpuwatch.jobs.slurm_places.SLURM_CONF_PLACES", (str(tmp_path / "no.conf"),)
    )
    # THEN there is no Slurm to ask, said so (not squeue's own error)
    with pytest.raises(SlurmAbsent, match=r"no slurm\.conf"):
        slurm_run("2", env)


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
    assert (run.start_s, run.end_s) == (
        timestamp("2026-11-25T10:06:00"),
        timestamp("2026-11-25T11:00:00"),
    )
    assert run.gres_indices is None


def test_sacct_for_a_running_job_has_no_end() -> None:
    run = job_run_from_sacct("8|8|RUNNING|2026-11-25T10:06:00|Unknown|gpu01\n", "8")
    assert run is not None and run.start_s is not None and run.end_s is None
    assert job_run_from_sacct("8|8|RUNNING\n", "8") is None


HUGE = "yes '1234|1234|COMPLETED|2026-11-27T07:00:22|2026-11-27T08:00:22|vm' | head -c 67108864"
"""64 MiB of sacct rows: more than any one job's record, read in part only."""


def test_accounting_past_the_cap_is_one_line_read_in_bounded_memory(tmp_path: Path) -> None:
    # GIVEN a controller that forgot the job, and a sacct answering 64 MiB
    env = commands(tmp_path, squeue="echo '{\"jobs\": []}'", sacct=HUGE)
    # WHEN the job is asked
    tracemalloc.start()
    try:
        with pytest.raises(SchedulerUnavailableError) as raised:
            slurm_run("1234", env)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # THEN it is one line naming the cap, having held about the cap, never the whole
    message = str(raised.value)
    assert f"more than {MAX_OUTPUT_BYTES >> 20} MiB" in message and "\n" not in message
    assert peak_bytes < 4 * MAX_OUTPUT_BYTES


def test_job_report_on_accounting_past_the_cap_exits_6_in_one_line(tmp_path: Path) -> None:
    # GIVEN no daemon to remember the job, and Slurm's accounting answering 64 MiB
    env = {**os.environ, **commands(tmp_path, squeue="echo '{\"jobs\": []}'", sacct=HUGE)}
    # WHEN its report is asked
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "job-report", "1234", "--socket", str(tmp_path / "s")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # THEN Slurm cannot be asked (6), said in one line: never "no such job" (7)
    (line,) = done.stderr.splitlines()
    assert done.returncode == 6 and "answered more than" in line, done


def test_a_whole_clusters_json_past_the_cap_gives_way_to_the_jobs_row(tmp_path: Path) -> None:
    # GIVEN 22.05's squeue --json listing the cluster's every job, past the cap; its rows
    # (which squeue filters) name job 10, and scontrol its GPUs
    many = DATA / "squeue-22.05.json"
    row = "10|10|N/A|RUNNING|root|2026-11-27T07:00:22|NONE|UNLIMITED|vm"
    big = f'case "$1" in --json) while :; do cat {many}; done ;; esac; echo "{row}"'
    scontrol = f"cat {DATA / 'scontrol-job-train-22.05.txt'}"
    env = commands(tmp_path, squeue=big, scontrol=scontrol)
    # WHEN job 10 is asked THEN it is found, by its row
    run = slurm_run("10", env)
    assert run is not None and run.source == "squeue" and run.gres_indices == {"vm": [1, 2]}
