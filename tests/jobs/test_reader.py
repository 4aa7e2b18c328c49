"""SlurmJobs against stand-ins for squeue and scontrol: absent, failing, hung, answering."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpuwatch.jobs.job_table import Job
from gpuwatch.jobs.slurm import SlurmJobs, job_id_of_process
from tests.helpers.wait import wait_until

DATA = Path(__file__).parent / "data"
HUNG_S = 60  # a stand-in that hangs sleeps this long: far past any timeout used here
SLEEP = shutil.which("sleep") or "/bin/sleep"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stand_in(tmp_path: Path, name: str, body: str) -> str:
    """A script that logs each call to `<name>.calls` and runs `body`."""
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / name}.calls\n{body}\n')
    path.chmod(0o755)
    return str(path)


def calls(tmp_path: Path, name: str) -> int:
    log = tmp_path / f"{name}.calls"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def gres_conf(tmp_path: Path) -> Path:
    path = tmp_path / "gres.conf"
    path.write_text("AutoDetect=off\nName=gpu File=/nonexistent/nvidia[4-7]\n")
    return path


def reader(
    tmp_path: Path, gres_conf: Path, squeue: str, scontrol: str = "", **kw: object
) -> SlurmJobs:
    return SlurmJobs(
        node="vm",
        gres_conf=gres_conf,
        squeue=squeue,
        scontrol=scontrol or stand_in(tmp_path, "scontrol", "exit 1"),
        env={"PATH": os.environ["PATH"]},
        **kw,  # type: ignore[arg-type]
    )


def test_jobs_come_from_squeue_json_by_gres_conf_minor_numbers(
    tmp_path: Path, gres_conf: Path
) -> None:
    # GIVEN squeue answering the recorded 22.05 JSON, and gres.conf naming nvidia4-7
    squeue = stand_in(tmp_path, "squeue", f"cat {DATA / 'squeue-22.05.json'}")
    # WHEN the table is read
    table = reader(tmp_path, gres_conf, squeue).table()
    # THEN each GPU is held by its job, by minor number
    assert table is not None and table.source == "squeue --json"
    assert {minor: job.job_id for minor, job in table.by_minor_number.items()} == {
        4: "1",
        5: "1",
        6: "2",
    }
    assert table.job_on(7) is None


def test_answers_are_cached_for_max_age(tmp_path: Path, gres_conf: Path) -> None:
    # GIVEN a reader with a 5 s cache
    squeue = stand_in(tmp_path, "squeue", f"cat {DATA / 'squeue-22.05.json'}")
    clock = Clock()
    jobs = reader(tmp_path, gres_conf, squeue, clock=clock, max_age_s=5.0)
    # WHEN it is asked three times within 5 s
    first = jobs.table()
    clock.now += 4
    assert jobs.table() is first
    # THEN squeue ran once; once the answer is older, it runs again (in the background)
    assert calls(tmp_path, "squeue") == 1
    clock.now += 2
    jobs.table()
    wait_until(lambda: not jobs.refreshing, "the refresh to end")
    assert calls(tmp_path, "squeue") == 2


def test_without_squeue_jobs_are_unknown(tmp_path: Path, gres_conf: Path) -> None:
    # GIVEN no squeue at all WHEN the table is read THEN jobs are unknown, not "none"
    jobs = reader(tmp_path, gres_conf, str(tmp_path / "no-such-squeue"))
    assert jobs.table() is None
    assert jobs.last_error == "absent"


def test_slurm_down_makes_jobs_unknown(tmp_path: Path, gres_conf: Path) -> None:
    # GIVEN squeue exiting 0 with the controller's error, as 22.05 does when slurmctld is down
    squeue = stand_in(
        tmp_path,
        "squeue",
        """echo '{"jobs": [], "errors": [{"description": "Unable to contact slurmctld"}]}'""",
    )
    # WHEN the table is read THEN jobs are unknown and scontrol is not asked
    jobs = reader(tmp_path, gres_conf, squeue)
    assert jobs.table() is None
    assert "errors" in (jobs.last_error or "")
    assert calls(tmp_path, "scontrol") == 0


OLD_SQUEUE = """case "$1" in --json) echo "squeue: unrecognized option '--json'" >&2; exit 1 ;; esac
cat {rows}"""
SCONTROL_BY_JOB = """case "$5" in 9) cat {forged} ;; 10) cat {train} ;; *) exit 1 ;; esac"""


def old_slurm(tmp_path: Path, gres_conf: Path, rows: str, **kw: object) -> SlurmJobs:
    """A reader of a Slurm whose squeue has no --json: `rows` (squeue -o lines) are its
    answer, and scontrol answers the recorded 22.05 details of jobs 9 and 10."""
    (tmp_path / "rows").write_text(rows)
    squeue = stand_in(tmp_path, "squeue", OLD_SQUEUE.format(rows=tmp_path / "rows"))
    scontrol = stand_in(
        tmp_path,
        "scontrol",
        SCONTROL_BY_JOB.format(
            forged=DATA / "scontrol-job-forged-name-22.05.txt",
            train=DATA / "scontrol-job-train-22.05.txt",
        ),
    )
    return reader(tmp_path, gres_conf, squeue, scontrol, **kw)


def test_a_squeue_without_json_falls_back_to_rows_and_details_for_good(
    tmp_path: Path, gres_conf: Path
) -> None:
    # GIVEN an old squeue that refuses --json, answering job 10's row; scontrol its detail
    row = (DATA / "squeue-rows-22.05.txt").read_text().splitlines()[1] + "\n"
    clock = Clock()
    jobs = old_slurm(tmp_path, gres_conf, row, clock=clock)
    # WHEN the table is read twice, past the cache
    table = jobs.table()
    clock.now += 10
    jobs.table()
    wait_until(lambda: not jobs.refreshing, "the refresh to end")
    # THEN job 10 holds GRES 1-2 (nvidia5, 6), and squeue --json was not asked again
    assert table is not None and table.source == "squeue, scontrol"
    assert {minor: job.job_id for minor, job in table.by_minor_number.items()} == {5: "10", 6: "10"}
    assert table.job("10") == Job("10", "root", "train", (5, 6), table.job("10").started_at, None)  # type: ignore[union-attr]
    assert (calls(tmp_path, "squeue"), calls(tmp_path, "scontrol")) == (3, 2)


def test_without_json_a_job_name_forging_gpus_makes_that_jobs_gpus_unknown(
    tmp_path: Path, gres_conf: Path
) -> None:
    # GIVEN an old squeue, and a running job (9) whose name forges a GRES detail of 4 GPUs,
    # beside job 10 on GRES 1-2
    jobs = old_slurm(tmp_path, gres_conf, (DATA / "squeue-rows-22.05.txt").read_text())
    # WHEN the table is read
    table = jobs.table()
    # THEN job 10 stands; job 9 is a doubt naming no GPU, saying why: never all 4 to it
    assert table is not None and [job.job_id for job in table.jobs] == ["10"]
    (doubt,) = table.doubts
    assert doubt.whole_node and doubt.why.startswith("job 9: ") and "free text" in doubt.why


def test_a_hung_squeue_gives_unknown_by_the_deadline_and_is_not_piled_on(
    tmp_path: Path, gres_conf: Path
) -> None:
    # GIVEN a squeue that hangs (and a child of it that holds its output open)
    squeue = stand_in(tmp_path, "squeue", f"sleep {HUNG_S} & echo $! > {tmp_path}/child; wait")
    clock_start = time.monotonic()
    jobs = reader(tmp_path, gres_conf, squeue, timeout_s=0.5, max_age_s=0.1)
    # WHEN the table is read, and read again at once
    first = jobs.table()
    second = jobs.table()
    took_s = time.monotonic() - clock_start
    # THEN jobs are unknown, long before squeue would have answered
    assert first is None and second is None
    assert took_s < HUNG_S / 2
    # AND the stand-in and its child are killed, and squeue was started at most twice
    # (once, plus once after the first call ended on its deadline)
    wait_until(lambda: not jobs.refreshing, "the refresh to end")
    child = int((tmp_path / "child").read_text())
    assert (
        not Path(f"/proc/{child}").exists()
        or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    )
    assert calls(tmp_path, "squeue") <= 2


def test_a_hung_refresh_serves_the_previous_answer(tmp_path: Path, gres_conf: Path) -> None:
    # GIVEN a reader that answered once, then whose squeue hangs
    script = tmp_path / "answer"
    script.write_text(f"cat {DATA / 'squeue-22.05.json'}")
    squeue = stand_in(tmp_path, "squeue", f". {script}")
    clock = Clock()
    jobs = reader(tmp_path, gres_conf, squeue, clock=clock, timeout_s=2.0, max_age_s=5.0)
    before = jobs.table()
    script.write_text(f"sleep {HUNG_S}")
    # WHEN the cache is stale and the table is read twice while squeue hangs
    clock.now += 6
    during = [jobs.table()]
    wait_until(lambda: calls(tmp_path, "squeue") >= 2, "squeue to be asked again")
    during.append(jobs.table())
    # THEN the previous answer is served at once, and squeue is not started again
    assert before is not None and during == [before, before]
    assert jobs.refreshing
    assert calls(tmp_path, "squeue") == 2


def test_without_gres_conf_jobs_are_unknown(tmp_path: Path) -> None:
    # GIVEN no gres.conf: GRES indices cannot be mapped to GPUs
    squeue = stand_in(tmp_path, "squeue", f"cat {DATA / 'squeue-22.05.json'}")
    jobs = reader(tmp_path, tmp_path / "missing.conf", squeue)
    # WHEN the table is read THEN jobs are unknown, with the reason, and Slurm is not asked
    assert jobs.table() is None
    assert "missing.conf" in (jobs.last_error or "")
    assert calls(tmp_path, "squeue") == 0


def test_a_gres_conf_naming_no_gpu_file_makes_jobs_unknown(tmp_path: Path) -> None:
    # GIVEN a gres.conf that leaves the GPUs to slurmd's autodetection
    conf = tmp_path / "gres.conf"
    conf.write_text("AutoDetect=nvml\n")
    squeue = stand_in(tmp_path, "squeue", f"cat {DATA / 'squeue-22.05.json'}")
    # WHEN the table is read THEN jobs are unknown: their GPUs would otherwise look free
    jobs = reader(tmp_path, conf, squeue)
    assert jobs.table() is None
    assert "names no GPU" in (jobs.last_error or "")


@pytest.mark.parametrize(
    ("cgroup", "environ", "job"),
    [
        pytest.param("4:memory:/slurm/uid_1000/job_42/step_0/task_0\n", {}, "42", id="cgroup-v1"),
        pytest.param(
            "0::/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0\n", {}, "77", id="v2"
        ),
        pytest.param("0::/user.slice\n", {"SLURM_JOB_ID": "9", "HOME": "/root"}, "9", id="environ"),
        pytest.param("0::/user.slice\n", {"SLURM_JOB_ID": "9; rm"}, None, id="environ-garbled"),
        pytest.param("0::/user.slice\n", {}, None, id="outside-slurm"),
    ],
)
def test_a_process_is_placed_in_its_job(
    tmp_path: Path, cgroup: str, environ: dict[str, str], job: str | None
) -> None:
    # GIVEN a process started with ENVIRON, and a /proc that puts it in CGROUP
    process = subprocess.Popen([SLEEP, "60"], env=environ)
    try:
        # until it has exec'd, the child's /proc/PID/environ is still its parent's
        wait_until(lambda: _execed(process.pid), f"pid {process.pid} to exec {SLEEP}")
        (tmp_path / str(process.pid)).mkdir()
        (tmp_path / str(process.pid) / "cgroup").write_text(cgroup)
        # WHEN its job is asked THEN the cgroup's word comes first, the environment second
        assert job_id_of_process(process.pid, proc=str(tmp_path)) == job
    finally:
        process.kill()
        process.wait()


def test_a_process_that_is_gone_has_no_job(tmp_path: Path) -> None:
    assert job_id_of_process(123, proc=str(tmp_path)) is None


def test_start_asks_slurm_ahead_so_table_needs_not_wait(tmp_path: Path, gres_conf: Path) -> None:
    # GIVEN a reader that is told to start before the caller reads its GPUs
    squeue = stand_in(tmp_path, "squeue", f"cat {DATA / 'squeue-22.05.json'}")
    jobs = reader(tmp_path, gres_conf, squeue)
    pending = jobs.start()
    # WHEN the refresh ends while the caller does other work, and then the table is read
    assert pending is not None
    pending.join(30)
    table = jobs.table()
    # THEN the answer started ahead is the one given, and squeue ran once
    assert table is not None and table.job("1") is not None
    assert calls(tmp_path, "squeue") == 1


def _execed(pid: int) -> bool:
    try:
        return os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(SLEEP)
    except OSError:
        return False
