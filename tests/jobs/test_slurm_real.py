"""SlurmJobs against a real Slurm (Debian's slurm-wlm 22.05): slurmctld and slurmd on this
machine, four GPU device files made with mknod, jobs submitted with sbatch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwatch.backends.sim import SimBackend
from gpuwatch.jobs.gres import node_gpu_minors, step_gpu_minors
from gpuwatch.jobs.job_table import JobTable
from gpuwatch.jobs.slurm import job_id_of_process
from tests.helpers.slurm import SlurmCluster, gpu_job, job_env, slurm_reader

pytestmark = pytest.mark.slow  # a real slurmctld and slurmd

DATA = Path(__file__).parent / "data"
Read = Callable[..., JobTable | None]


def test_a_job_is_seen_on_the_gpus_slurm_gave_it(slurm: SlurmCluster, read_slurm: Read) -> None:
    # GIVEN a job given 2 GPUs by Slurm
    job_id = gpu_job(slurm, 2)
    given = slurm.minors_of(job_env(slurm, job_id)["SLURM_JOB_GPUS"])
    # WHEN the reader asks Slurm
    table = read_slurm()
    # THEN the job holds exactly those GPUs, by minor number, and the other two are free
    assert table is not None
    held = {minor: job.job_id for minor, job in table.by_minor_number.items()}
    assert held == dict.fromkeys(given, job_id)
    job = table.job(job_id)
    assert job is not None and (job.user, job.name) == ("root", "train")
    assert job.started_at is not None and job.time_limit_s is None


def test_the_steps_own_variables_name_the_same_gpus(slurm: SlurmCluster, read_slurm: Read) -> None:
    # GIVEN a job given 2 GPUs, and the minor numbers of gres.conf's files as gpuwatch reads them
    job_id = gpu_job(slurm, 2)
    minors = node_gpu_minors(slurm.gres_conf, slurm.conf, slurm.node)
    # WHEN the job's SLURM_JOB_GPUS is read as gpuwatch's pick would read it in the job
    in_job = step_gpu_minors(job_env(slurm, job_id), minors)
    # THEN it names the GPUs Slurm reports the job holding
    table = read_slurm()
    assert table is not None and in_job is not None
    assert in_job == table.job(job_id).gpu_minor_numbers  # type: ignore[union-attr]


def test_a_second_job_gets_the_other_gpus(slurm: SlurmCluster, read_slurm: Read) -> None:
    # GIVEN two jobs of 2 GPUs each
    first, second = gpu_job(slurm, 2), gpu_job(slurm, 2)
    # WHEN the reader asks Slurm
    table = read_slurm()
    # THEN they hold two GPUs each, all four different, as their environments say
    assert table is not None
    for job_id in (first, second):
        given = slurm.minors_of(job_env(slurm, job_id)["SLURM_JOB_GPUS"])
        assert table.job(job_id).gpu_minor_numbers == given  # type: ignore[union-attr]
    assert sorted(table.by_minor_number) == sorted(slurm.gpu_minors)


def test_each_nvml_gpu_is_matched_to_its_job_by_minor_number(
    slurm: SlurmCluster, read_slurm: Read
) -> None:
    # GIVEN a job holding 1 GPU, on a node whose NVML indices do not follow gres.conf's order
    job_id = gpu_job(slurm, 1)
    (given,) = slurm.minors_of(job_env(slurm, job_id)["SLURM_JOB_GPUS"])
    snapshot = SimBackend(DATA / "slurm-node.toml").sample()
    # WHEN each GPU of the snapshot is looked up in the table
    table = read_slurm()
    assert table is not None
    holders = {gpu.index: table.job_of_gpu(gpu) for gpu in snapshot.gpus}
    # THEN only the GPU with the job's minor number has it
    held = [index for index, job in holders.items() if job is not None]
    assert [snapshot.gpus[index].minor_number for index in held] == [given]


def test_a_cancelled_jobs_gpus_show_free(slurm: SlurmCluster, read_slurm: Read) -> None:
    # GIVEN a job holding 2 GPUs, seen by the reader
    job_id = gpu_job(slurm, 2)
    table = read_slurm()
    assert table is not None and table.job(job_id) is not None
    # WHEN it is cancelled
    slurm.run("scancel", job_id)
    slurm.wait_gone([job_id])
    # THEN no GPU is held
    after = read_slurm()
    assert after is not None and dict(after.by_minor_number) == {}


def test_a_jobs_process_is_placed_in_it(slurm: SlurmCluster) -> None:
    # GIVEN a job's running process (no cgroup here: proctrack/linuxproc, so its environment)
    job_id = gpu_job(slurm, 1)
    pid_file = slurm.root / f"pid-{job_id}"
    job_env(slurm, job_id)
    # WHEN its job is asked THEN it is the job
    assert job_id_of_process(int(pid_file.read_text())) == job_id
    # AND a process started outside Slurm is in none
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    with subprocess.Popen(["sleep", "30"], env=env) as outside:
        try:
            assert job_id_of_process(outside.pid) is None
        finally:
            outside.kill()


def test_slurm_stopped_while_reading_gives_jobs_unknown_by_the_deadline(
    slurm: SlurmCluster,
) -> None:
    # GIVEN a reader that has seen a job, then slurmctld stopped
    job_id = gpu_job(slurm, 1)
    jobs = slurm_reader(slurm, timeout_s=1.0, max_age_s=0.0)
    assert jobs.table() is not None
    slurm.stop("slurmctld")
    try:
        # WHEN a fresh reader asks Slurm
        fresh = slurm_reader(slurm, timeout_s=1.0)
        answer = fresh.table()
        # THEN jobs are unknown: squeue was cut at the deadline (it retries for ~10 s)
        assert answer is None
        assert fresh.last_error == "timeout"
    finally:
        slurm.restart("slurmctld")
    slurm.wait_running([job_id])


# As tests/contract/test_fakenvml.py finds it: $FAKENVML_DIR, else ../shared beside the checkout.
FAKENVML = Path(
    os.environ.get("FAKENVML_DIR", Path(__file__).resolve().parents[3] / "shared" / "fakenvml")
)


@pytest.mark.skipif(
    not (FAKENVML / "Makefile").is_file(), reason="needs ../shared/fakenvml (or FAKENVML_DIR)"
)
def test_fakenvml_reports_the_minor_numbers_of_the_slurm_node(tmp_path: Path) -> None:
    # GIVEN fakenvml built, and the Slurm node's scenario in its format and in --sim's
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("building fakenvml needs make and a C compiler")
    fakenvml = FAKENVML
    build = tmp_path / "fakenvml"
    subprocess.run(["make", "-s", "-C", str(fakenvml), f"BUILD={build}"], check=True)
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(build),
        "FAKENVML_SCENARIO": str(DATA / "slurm-node.txt"),
    }
    env.pop("GPUWATCH_SIM", None)
    # WHEN the real NVML backend reads it
    code = (
        "from gpuwatch.backends.nvml import NvmlBackend\n"
        "print([g.minor_number for g in NvmlBackend().sample().gpus])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    # THEN each GPU has the minor number of the scenario, as the sim backend gives it
    sim = SimBackend(DATA / "slurm-node.toml").sample()
    assert out.strip() == str([gpu.minor_number for gpu in sim.gpus]) == "[4, 5, 6, 7]"
